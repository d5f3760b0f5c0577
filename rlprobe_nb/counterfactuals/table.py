"""The ``branches`` table: pass counts of every planned context, keyed on the token tables
and computed in resumable shards.

What its rows depend on (``branches_settings``): the policy models' identities, the
rollouts table, the plan itself (positions, arms, substituted tokens, categories), n, the
temperature, the response limit, the seed, the prompt template, the dtype and the grader.
``lineage.derived_key`` adds the token tables the plan was drawn from and the code, so the
table is refused as stale (``lineage.read_derived``) once any of them changes. Batch size
and prefix sharing are in no key: continuations do not depend on them (seeds follow the
context; see ``continuations``).

Work goes shard by shard into ``branches_shards`` (shards: policy model × a chunk of
rollouts, each named by the hash of its part of the plan), keyed like the table, so an
interrupted run resumes where it stopped and a run with other inputs is refused unless
``overwrite``. Once every shard exists they become the one ``branches`` table (written
through ``lineage.write_derived``) and the shard folder is removed. One model is in
memory at a time. With several GPUs the missing shards are shared among one worker process
per GPU (``distributed.run_shards``); a shard's rows do not depend on which worker wrote
it, so the table is the same for any number of workers.
"""

from __future__ import annotations

import shutil
from typing import Callable

import pandas as pd

from rlprobe_nb import distributed
from rlprobe_nb.counterfactuals.passes import pass_counts, with_prefix_len
from rlprobe_nb.suite import models
from rlprobe_nb.suite.params import Params
from rlprobe_nb.tables import keys, lineage, schemas, storage

UNIQUE = ["model", "rollout_id", "kind", "pos", "arm"]


def plan_records(plan: pd.DataFrame) -> list[dict]:
    """The plan as sorted plain records (what the key and the shard names hash)."""
    cols = sorted(plan.columns)
    df = plan[cols].sort_values(UNIQUE).astype(object).where(plan[cols].notna(), None)
    return df.to_dict("records")


def branches_settings(P: Params, plan: pd.DataFrame, rollouts_sha: str, *, checkpoint: str,
                      n: int, temperature: float, max_new_tokens: int, seed: int,
                      continuation_tokens: int | None = None, stop_at_box: bool = False) -> dict:
    """Everything the rows of a branches run depend on besides the token tables."""
    names = sorted(plan["model"].unique())
    return {"checkpoint": checkpoint, "rollouts": rollouts_sha,
            "models": {m: models.model_identity(m, P) for m in names},
            "plan": keys.key_sha(plan_records(plan)), "rows": len(plan),
            "sampling": {"n": int(n), "temperature": float(temperature),
                         "max_new_tokens": int(max_new_tokens), "seed": int(seed),
                         "continuation_tokens": continuation_tokens,
                         "stop_at_box": bool(stop_at_box)},
            "template": P.prompt_template, "dtype": P.runtime.dtype,
            "grader": {"timeout_s": P.grading.timeout_s,
                       **{p: lineage.package_version(p) for p in lineage.GRADER_PACKAGES}}}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def shard_jobs(plan: pd.DataFrame, rollouts_per_shard: int,
               run: Callable[[str, pd.DataFrame], pd.DataFrame]) -> list[tuple[str, Callable]]:
    """(content-keyed shard name, job) per (model, chunk of rollouts in id order)."""
    jobs = []
    for model, rows in plan.groupby("model", sort=True):
        ids = sorted(rows["rollout_id"].unique())
        for i in range(0, len(ids), max(1, rollouts_per_shard)):
            part = rows[rows["rollout_id"].isin(ids[i:i + rollouts_per_shard])]
            name = f"{_safe(model)}__{keys.key_sha(plan_records(part))}"
            jobs.append((name, (lambda m=model, p=part: run(m, p))))
    return jobs


def to_rows(counted: pd.DataFrame, tokenizer, *, suite: str, checkpoint: str,
            temperature: float, max_new_tokens: int, seed: int,
            continuation_tokens: int | None = None) -> pd.DataFrame:
    """pass_counts' output in the table's columns."""
    def text(ids):
        return [None if pd.isna(i) else tokenizer.decode([int(i)]) for i in ids]

    df = counted.copy()
    for col in ("rule", "category", "ground_truth", "result_is_answer", "matched_pos", "match",
                "entropy_ref", "written_id", "substituted_id", "substituted_rank"):
        if col not in df:
            df[col] = None
    df = df.assign(suite=suite, checkpoint=checkpoint, temperature=float(temperature),
                   max_new_tokens=int(max_new_tokens), seed=int(seed),
                   continuation_tokens=continuation_tokens,
                   written_token=text(df["written_id"]),
                   substituted_token=text(df["substituted_id"]))
    for col in ("written_id", "substituted_id", "substituted_rank", "matched_pos",
                "continuation_tokens"):
        df[col] = pd.array([None if pd.isna(v) else int(v) for v in df[col]], dtype="Int32")
    df["result_is_answer"] = pd.array([None if v is None or pd.isna(v) else bool(v)
                                       for v in df["result_is_answer"]], dtype="boolean")
    return df[schemas.BRANCHES.names]


def run_branches(P: Params, plan: pd.DataFrame, rollouts: pd.DataFrame, gold: dict[str, str],
                 loader: Callable[[str], models.LoadedModel], settings: dict, manifest: dict, *,
                 checkpoint: str, n: int, temperature: float, max_new_tokens: int, seed: int,
                 continuation_tokens: int | None = None, stop_at_box: bool = False,
                 batch_rows: int = 32, rollouts_per_shard: int = 4, overwrite: bool = False,
                 producer: str = "notebooks/08_counterfactuals") -> pd.DataFrame:
    """Sample and grade every context of ``plan`` (columns of ``passes.PLAN_COLUMNS`` plus
    ``model`` and any carried columns) into the suite's ``branches`` table and return it.
    A complete table with the same key (``settings`` + the current token tables) is
    reused; one with another key is refused unless ``overwrite``."""
    plan = with_prefix_len(plan)
    done, work = lineage.begin_derived(P, "branches", settings, schemas.BRANCHES, UNIQUE,
                                       overwrite, producer)
    if done is not None:
        return done
    loaded: dict = {}

    def run(model_name: str, part: pd.DataFrame) -> pd.DataFrame:
        if model_name not in loaded:
            loaded.clear()  # one model in memory at a time
            loaded[model_name] = loader(model_name)
        lm = loaded[model_name]
        counted = pass_counts(lm.model, lm.tokenizer, part, rollouts, gold,
                              model_name=model_name, n=n, temperature=temperature,
                              max_new_tokens=max_new_tokens, seed=seed, batch_rows=batch_rows,
                              continuation_tokens=continuation_tokens, stop_at_box=stop_at_box,
                              timeout_s=P.grading.timeout_s, workers=P.grading.workers)
        return to_rows(counted, lm.tokenizer, suite=P.suite, checkpoint=checkpoint,
                       temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                       continuation_tokens=continuation_tokens)

    jobs = shard_jobs(plan, rollouts_per_shard, run)
    if jobs:
        distributed.run_shards(work, jobs, manifest)
        frame = storage.read_table(work.folder)
    else:  # nothing to branch at: an empty table, keyed all the same
        work.release()
        frame = schemas.BRANCHES.empty_table().to_pandas()
    loaded.clear()
    lineage.write_derived(P, "branches", frame, schemas.BRANCHES, manifest, settings, producer)
    shutil.rmtree(work.folder, ignore_errors=True)
    return lineage.read_derived(P, "branches")

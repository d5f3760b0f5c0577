"""The ``takeover`` table: every rule's response for every checkpoint, problem and sample,
graded, keyed on the token tables its thresholds came from, in resumable shards.

What its rows depend on (``takeover_settings``): the models' identities, the problems,
the rules (criteria, budgets and their thresholds), samples, temperature, the response
limit, stop_at_box, the seed, the prompt template, the dtype and the grader;
``lineage.derived_key`` adds the token tables and the code. The batch size is in no key
(it changes the matrix shapes, so a token only where two draws tie to float rounding).

Work goes shard by shard (one checkpoint and a chunk of problems) into
``takeover_shards``, so an interrupted run resumes where it stopped; the reference stays
loaded and one checkpoint at a time beside it, and the reference's prompts, prefilled
alone, are kept for every checkpoint's shards (``lockstep.PromptCache``: the same tensors
a new prefill would give).
"""

from __future__ import annotations

import shutil
from typing import Callable

import pandas as pd

from rlprobe_nb import distributed
from rlprobe_nb.counterfactuals.continuations import BoxWatch
from rlprobe_nb.generation import rollouts
from rlprobe_nb.problems import grading
from rlprobe_nb.progress import tqdm
from rlprobe_nb.suite import models, prompting
from rlprobe_nb.suite.params import Params
from rlprobe_nb.tables import keys, lineage, schemas, storage
from rlprobe_nb.takeover import lockstep

UNIQUE = ["checkpoint", "criterion", "budget", "problem_id", "sample"]


def rules_of(thresholds: pd.DataFrame, checkpoint: str) -> list[tuple[lockstep.Rule, float | None]]:
    """(rule, budget) for one checkpoint: the two ends, then every (criterion, budget)."""
    rows = thresholds[thresholds.checkpoint == checkpoint]
    return [(lockstep.NEVER, None), (lockstep.ALWAYS, None)] + [
        (lockstep.Rule(r.criterion, float(r.threshold)), float(r.budget))
        for r in rows.itertuples()]


def takeover_settings(P: Params, checkpoints: list[str], thresholds: pd.DataFrame,
                      problems: pd.DataFrame, *, samples: int, temperature: float,
                      max_new_tokens: int, stop_at_box: bool, seed: int) -> dict:
    """Everything the rows depend on besides the token tables."""
    names = sorted(set(checkpoints) | {P.reference})
    cols = ["checkpoint", "criterion", "budget", "threshold"]
    return {"models": {m: models.model_identity(m, P) for m in names},
            "problems": keys.key_sha(problems[["problem_id", "problem", "answer"]]
                                     .astype(object).to_dict("records")),
            "rules": keys.key_sha(thresholds[cols].astype(object).to_dict("records")),
            "checkpoints": list(checkpoints),
            "sampling": {"samples": int(samples), "temperature": float(temperature),
                         "max_new_tokens": int(max_new_tokens), "stop_at_box": bool(stop_at_box),
                         "seed": int(seed)},
            "template": P.prompt_template, "dtype": P.runtime.dtype,
            "grader": {"timeout_s": P.grading.timeout_s,
                       **{p: lineage.package_version(p) for p in lineage.GRADER_PACKAGES}}}


def write_rules(ref, ckpt, tokenizer, problems: pd.DataFrame, rules, *, P: Params,
                checkpoint: str, samples: int, temperature: float, max_new_tokens: int,
                stop_at_box: bool, seed: int, batch_rows: int, scorer=None,
                ref_prompts: lockstep.PromptCache | None = None,
                stats: dict | None = None) -> pd.DataFrame:
    """Every rule's graded response for each problem and sample, in the table's columns
    (``scorer``: the checkpoint's ``calibrated.Scorer``, for calibrated rules; ``stats``
    gets the decoder's cost, see ``lockstep.takeover_generate``)."""
    requests, where = [], []
    for pid, text in zip(problems.problem_id, problems.problem):
        prompt = tuple(prompting.prompt_ids(tokenizer, text, P.prompt_template))
        for s in range(samples):
            requests.append(lockstep.Request(prompt, rollouts.sample_seed(seed, pid, s),
                                             tuple(rule for rule, _ in rules)))
            where.append((pid, s))
    bar = tqdm(total=len(requests) * len(rules), desc=f"takeover {checkpoint}", leave=False)
    finish = BoxWatch(tokenizer).reason if stop_at_box else None
    written = lockstep.takeover_generate(
        ref, ckpt, requests, rollouts.eos_ids(ref, tokenizer), temperature=temperature,
        max_new_tokens=max_new_tokens, batch=batch_rows, finish=finish,
        progress=bar.update, calibrated=scorer, ref_prompts=ref_prompts, stats=stats)
    bar.close()
    gold = dict(zip(problems.problem_id, problems.answer))
    records = []
    for (pid, s), req, per in zip(where, requests, written):
        for (rule, budget), w in zip(rules, per):
            records.append({"criterion": rule.criterion, "budget": budget,
                            "threshold": None if budget is None else rule.threshold,
                            "problem_id": pid, "sample": s, "seed": req.seed,
                            "response_ids": w.ids, "finish_reason": w.finish,
                            "taken": w.taken, "changed": w.changed})
    df = pd.DataFrame(records)
    df["response"] = [tokenizer.decode(ids, skip_special_tokens=True) for ids in df.response_ids]
    graded = _grade_distinct(df, gold, P)
    df["extracted"] = [graded[(p, r)][0] for p, r in zip(df.problem_id, df.response)]
    df["correct"] = [graded[(p, r)][1] for p, r in zip(df.problem_id, df.response)]
    run = P.run_of(checkpoint)
    return df.assign(suite=P.suite, checkpoint=checkpoint, run=run,
                     step=P.steps.get(checkpoint, 0), n_tokens=df.response_ids.map(len),
                     temperature=float(temperature))[schemas.TAKEOVER.names]


def _grade_distinct(df: pd.DataFrame, gold: dict, P: Params) -> dict:
    """(problem, response) -> (extracted, correct), each distinct response graded once."""
    distinct = df[["problem_id", "response"]].drop_duplicates()
    grades = grading.grade_many(list(distinct.response), [gold[p] for p in distinct.problem_id],
                                timeout_s=P.grading.timeout_s, workers=P.grading.workers)
    return {(p, r): (g.extracted, bool(g.correct))
            for p, r, g in zip(distinct.problem_id, distinct.response, grades)}


def run_takeover(P: Params, checkpoints: list[str], thresholds: pd.DataFrame,
                 problems: pd.DataFrame, loader: Callable[[str], models.LoadedModel],
                 settings: dict, manifest: dict, *, samples: int, temperature: float,
                 max_new_tokens: int, stop_at_box: bool, seed: int, batch_rows: int,
                 problems_per_shard: int = 50, overwrite: bool = False,
                 producer: str = "notebooks/09_takeover", scorers: dict | None = None
                 ) -> pd.DataFrame:
    """Write the suite's ``takeover`` table (or reuse it: same key) and return it
    (``scorers``: checkpoint -> its ``calibrated.Scorer``, for calibrated rules)."""
    done, work = lineage.begin_derived(P, "takeover", settings, schemas.TAKEOVER, UNIQUE,
                                       overwrite, producer)
    if done is not None:
        return done
    loaded: dict = {}
    kept: dict = {}  # the reference's prompts, prefilled once for every checkpoint

    def model(name: str):
        if name not in loaded:
            for other in [n for n in loaded if n != P.reference]:
                del loaded[other]  # the reference and one checkpoint in memory
            loaded[name] = loader(name)
        return loaded[name]

    def job(checkpoint: str, part: pd.DataFrame) -> Callable[[], pd.DataFrame]:
        def run() -> pd.DataFrame:
            ref, ckpt = model(P.reference), model(checkpoint)
            if "prompts" not in kept or kept["prompts"].model is not ref.model:
                kept["prompts"] = lockstep.PromptCache(ref.model)
            return write_rules(ref.model, ckpt.model, ref.tokenizer, part,
                               rules_of(thresholds, checkpoint), P=P, checkpoint=checkpoint,
                               samples=samples, temperature=temperature,
                               max_new_tokens=max_new_tokens, stop_at_box=stop_at_box,
                               seed=seed, batch_rows=batch_rows,
                               scorer=(scorers or {}).get(checkpoint),
                               ref_prompts=kept["prompts"])
        return run

    jobs = []
    for checkpoint in checkpoints:
        for i in range(0, len(problems), problems_per_shard):
            part = problems.iloc[i:i + problems_per_shard]
            name = f"{checkpoint}__{keys.key_sha(list(part.problem_id))}"
            jobs.append((name, job(checkpoint, part)))
    distributed.run_shards(work, jobs, manifest)
    frame = storage.read_table(work.folder)
    loaded.clear()
    kept.clear()
    grading.shutdown()
    lineage.write_derived(P, "takeover", frame, schemas.TAKEOVER, manifest, settings, producer)
    shutil.rmtree(work.folder, ignore_errors=True)
    return lineage.read_derived(P, "takeover")

"""Sampling answers and rollouts from a model, reproducibly, with the token ids kept.

Each (problem, sample) has its own seed, ``sha256(seed, problem_id, sample)``, and its
tokens are drawn by ``sampling`` (Gumbel-max with counter-based noise of (seed, step,
token)) in the book's decode loop (``decoding.generate``): a sample does not depend on
which other samples share its batch, on the order of the work, on the process or on the
device; what remains is the logits' own rounding, which differs between batch shapes and
devices in the last bits and could flip a draw that sits on a tie. We record
``batch_size`` (the number of slots) in the manifest.

Stored per rollout: prompt ids (the chat template, as ``prompting.prompt_ids`` builds it),
response ids exactly as generated (EOS included when the model stopped, nothing after it,
no padding), text = decode(ids, skip_special_tokens=True), temperature, seed,
finish_reason ("stop" or "length") and the grade.

``sample_to_table`` writes a table in shards of a few batches' worth of problems; with
several processes (``distributed``) each takes a deterministic share of the shards.
"""

from __future__ import annotations

from typing import Callable, Iterable

import pandas as pd

from rlprobe_nb import distributed
from rlprobe_nb.generation import decoding, sampling
from rlprobe_nb.problems import grading
from rlprobe_nb.progress import tqdm
from rlprobe_nb.statistics import seed_from
from rlprobe_nb.suite import stop_tokens
from rlprobe_nb.suite.prompting import prompt_ids
from rlprobe_nb.tables import schemas, storage

ANSWER_COLUMNS = schemas.ANSWERS.names

# What a response is, in the order the book reports them.
FAILURE_TYPES = ("correct", "boxed_wrong", "empty_box", "no_box", "truncated", "imported",
                 "ungraded")


def sample_seed(seed: int, problem_id: str, sample: int) -> int:
    return seed_from("rollout", int(seed), problem_id, int(sample))


# The HF logits processor with the seeded draws, under the name other modules import.
PerRowSampler = sampling.SeededLogitsProcessor


def eos_ids(model, tokenizer) -> list[int]:
    """The ids sampling stops at: the model's generation config (``models.load_model``
    writes the suite's stop tokens there, exactly), else its tokenizer's EOS."""
    configured = getattr(model.generation_config, "eos_token_id", None)
    if configured is None:
        return stop_tokens.default_ids(model, tokenizer)
    return sorted({int(configured)} if isinstance(configured, int) else {int(i) for i in configured})


def temperature_of(temperatures: list[float], sample: int) -> float:
    return float(temperatures[sample % len(temperatures)])


def generate_batch(model, tokenizer, prompts: list[list[int]], temperatures: list[float],
                   seeds: list[int], max_new_tokens: int, batch_size: int | str | None = None,
                   progress=None, compiled: bool = False) -> list[tuple[list[int], str]]:
    """(response ids, finish_reason) per prompt, through ``decoding.generate`` with
    ``batch_size`` slots (default: one per prompt); ``compiled``: its compiled step."""
    stop = eos_ids(model, tokenizer)
    requests = [decoding.Request(tuple(int(t) for t in p), float(t), int(s), int(max_new_tokens))
                for p, t, s in zip(prompts, temperatures, seeds)]
    return decoding.generate(model, requests, stop, slots=batch_size or len(requests),
                             compiled=compiled, pad=tokenizer.pad_token_id, progress=progress)


def check_context(model, prompt_of: dict[str, list[int]], max_new_tokens: int,
                  model_name: str) -> None:
    """Every prompt with its response budget fits the model's context (its config's
    ``max_position_embeddings``), or a ValueError naming the longest problems."""
    context = getattr(model.config, "max_position_embeddings", None)
    if not context:
        return
    over = sorted(((len(ids), pid) for pid, ids in prompt_of.items()
                   if len(ids) + max_new_tokens > context), reverse=True)
    if over:
        raise ValueError(
            f"{len(over)} problems' prompts with max_new_tokens={max_new_tokens} do not fit "
            f"the context of {model_name} ({context} tokens), e.g. "
            + ", ".join(f"{pid} ({n} prompt tokens)" for n, pid in over[:3])
            + "; drop or shorten those problems, or lower max_new_tokens")


def _tasks(problems: pd.DataFrame, n_per_problem: int, temperatures: list[float], seed: int,
           samples: Iterable[int] | None = None) -> list[dict]:
    samples = list(range(n_per_problem)) if samples is None else list(samples)
    return [{"problem_id": pid, "sample": s, "temperature": temperature_of(temperatures, s),
             "seed": sample_seed(seed, pid, s)}
            for pid in problems["problem_id"] for s in samples]


def generate_rollouts(model, tokenizer, problems: pd.DataFrame, *, model_name: str,
                      template: str, n_per_problem: int, temperatures: list[float],
                      max_new_tokens: int, seed: int, batch_size: int,
                      timeout_s: float = 5.0, workers: int = 2,
                      progress: bool | str = True, compile_decode: bool = False) -> pd.DataFrame:
    """Sample ``n_per_problem`` responses per problem and grade them (schemas.ROLLOUTS).

    Sample s uses temperature ``temperatures[s % len(temperatures)]`` (0 = greedy).
    """
    if n_per_problem < 1:
        raise ValueError(f"n_per_problem must be >= 1, got {n_per_problem}")
    if not temperatures or any(t < 0 for t in temperatures):
        raise ValueError(f"temperatures must be a non-empty list of values >= 0, got {temperatures}")
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError("batch_size and max_new_tokens must be >= 1")
    if problems["problem_id"].duplicated().any():
        raise ValueError("duplicate problem ids in the problems given to generate_rollouts")
    tasks = _tasks(problems, n_per_problem, temperatures, seed)
    text = problems.set_index("problem_id")["problem"]
    gold = problems.set_index("problem_id")["answer"]
    prompt_of = {pid: prompt_ids(tokenizer, text[pid], template) for pid in problems["problem_id"]}
    check_context(model, prompt_of, max_new_tokens, model_name)
    label = progress if isinstance(progress, str) else f"sampling {model_name}"
    bar = tqdm(total=len(tasks), desc=label, disable=progress is False, leave=False)
    out = generate_batch(model, tokenizer, [prompt_of[t["problem_id"]] for t in tasks],
                         [t["temperature"] for t in tasks], [t["seed"] for t in tasks],
                         max_new_tokens, batch_size, progress=lambda: bar.update(1),
                         compiled=compile_decode)
    bar.close()
    for t, (ids, reason) in zip(tasks, out):
        t.update(response_ids=ids, finish_reason=reason)
    for t in tasks:
        t["response"] = tokenizer.decode(t["response_ids"], skip_special_tokens=True)
    grades = grading.grade_many([t["response"] for t in tasks],
                                [gold[t["problem_id"]] for t in tasks], timeout_s, workers)
    rows = [{
        "model": model_name, "problem_id": t["problem_id"],
        "rollout_id": f"{t['problem_id']}#{t['sample']}", "sample": t["sample"],
        "temperature": t["temperature"], "seed": t["seed"],
        "prompt_ids": prompt_of[t["problem_id"]], "response_ids": t["response_ids"],
        "response": t["response"], "n_tokens": len(t["response_ids"]),
        "finish_reason": t["finish_reason"], "token_method": "generated",
        "extracted": g.extracted, "grade_method": g.method, "n_boxes": g.n_boxes,
        "correct": g.correct, "failure_type": failure_type(g.correct, t["finish_reason"], g.method),
        "flags": ""} for t, g in zip(tasks, grades)]
    df = pd.DataFrame(rows, columns=schemas.ROLLOUTS.names)
    return df.sort_values(["problem_id", "sample"], kind="stable").reset_index(drop=True)


def to_answers(rollouts: pd.DataFrame) -> pd.DataFrame:
    """The ANSWERS view of rollouts (01's table: no token ids)."""
    return rollouts[ANSWER_COLUMNS].reset_index(drop=True)


SHARD_BATCHES = 4


def problem_chunks(problem_ids: list[str], per_chunk: int) -> list[list[str]]:
    ids = sorted(problem_ids)
    per_chunk = max(1, int(per_chunk))
    return [ids[i:i + per_chunk] for i in range(0, len(ids), per_chunk)]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def sample_to_table(folder, schema, model_names: list[str], loader: Callable,
                    problems: pd.DataFrame, *, template: str, n_per_problem: int,
                    temperatures: list[float], max_new_tokens: int, seed: int,
                    batch_size: int, timeout_s: float, workers: int, manifest: dict,
                    key: dict, overwrite: bool = False,
                    compile_decode: bool = False) -> pd.DataFrame:
    """Sample every model over ``problems`` into a sharded, resumable table.

    Shards are (model, chunk of problems in id order), a chunk holding SHARD_BATCHES
    batches' worth of samples (a shard's decode loop refills its slots from its own
    waiting samples); with several processes each takes a contiguous share of the missing
    shards (``distributed.run_shards``: models load where they sample). ``key`` (``tables.lineage``) is everything
    the rows depend on: a complete table with the same key is read back without loading a
    model; another key is refused, naming the differences, unless ``overwrite``.
    ``loader(name)`` returns an object with ``.model``, ``.tokenizer`` and ``.provenance``
    (models.LoadedModel). ``schema`` is schemas.ROLLOUTS, or schemas.ANSWERS to keep the
    answers view only.
    """
    model_names = list(dict.fromkeys(model_names))  # target == reference: sample once
    table = storage.ShardedTable(folder, schema, unique=["model", "problem_id", "sample"])
    if table.begin(key, overwrite=overwrite, what=f"(sampling {', '.join(model_names)})"):
        table.release()
        print(f"reusing {table.folder}: complete, same inputs (key {storage.read_manifest(folder)['key_sha']})")
        return storage.read_table(table.folder)
    chunks = problem_chunks(problems["problem_id"].tolist(),
                            max(1, SHARD_BATCHES * batch_size // n_per_problem))
    by_id = problems.set_index("problem_id", drop=False)
    loaded: dict = {}

    def job(name: str, chunk: list[str]) -> Callable[[], pd.DataFrame]:
        def sample() -> pd.DataFrame:
            if name not in loaded:
                loaded.clear()  # one model in memory at a time
                decoding.release()  # and its decode engine
                loaded[name] = loader(name)
                storage.atomic_write_json(table.folder / f"_prov-{_safe(name)}.json",
                                          loaded[name].provenance)
            lm = loaded[name]
            df = generate_rollouts(lm.model, lm.tokenizer, by_id.loc[chunk].reset_index(drop=True),
                                   model_name=name, template=template,
                                   n_per_problem=n_per_problem, temperatures=temperatures,
                                   max_new_tokens=max_new_tokens, seed=seed,
                                   batch_size=batch_size, timeout_s=timeout_s,
                                   workers=workers, progress=False,
                                   compile_decode=compile_decode)
            return df[schema.names]
        return sample

    jobs = [(f"{_safe(name)}__{i:04d}", job(name, chunk))
            for name in model_names for i, chunk in enumerate(chunks)]
    settings = dict(models=model_names, template=template, n_per_problem=n_per_problem,
                    temperatures=[float(t) for t in temperatures],
                    max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size,
                    compile_decode=compile_decode)

    def provenance() -> dict:
        return {**manifest, "sampling": settings,
                "models": [storage.read_json(p) for p in sorted(table.folder.glob("_prov-*.json"))]}

    distributed.run_shards(table, jobs, provenance)
    loaded.clear()
    decoding.release()
    return storage.read_table(table.folder)


def failure_type(correct: bool, finish_reason: str, grade_method: str) -> str:
    """What kind of answer a response is (FAILURE_TYPES). A response cut at the token
    limit is "truncated" unless it was graded right: it did not finish its reasoning, so
    its last box (if any) is not its answer."""
    if correct:
        return "correct"
    if finish_reason == "length":
        return "truncated"
    if finish_reason == "imported":
        return "imported"
    if grade_method in ("no_box", "empty_box"):
        return grade_method
    if grade_method in ("math_verify", "string", "too_long", "too_deep"):
        return "boxed_wrong"
    return "ungraded"  # the grader timed out, refused or failed: not the model's answer


def with_failure_types(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its ``failure_type`` column (from correct, finish_reason, grade_method)."""
    return df.assign(failure_type=[failure_type(bool(c), f, g) for c, f, g in
                                   zip(df["correct"], df["finish_reason"], df["grade_method"])])

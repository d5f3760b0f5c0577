"""Sampling answers and rollouts from a model, reproducibly, with the token ids kept.

Each (problem, sample) has its own random stream: a ``torch.Generator`` seeded with
``sha256(seed, problem_id, sample)``. HF ``generate`` runs greedy decoding over a logits
processor that draws each row's next token from that row's own generator at the row's
own temperature (0 = greedy) and masks every other token. So a sample does not depend on
which other samples share its batch, nor on the order of batches; the remaining source of
batch dependence is floating point (logits of a left-padded batch can differ in the last
bits from an unpadded one), which can flip a draw that sits on a boundary. Reruns with
the same batch size are bit-identical on CPU; we record ``batch_size`` in the manifest.

Stored per rollout: prompt ids (the chat template, as ``prompting.prompt_ids`` builds it),
response ids exactly as generated (EOS included when the model stopped, nothing after it,
no padding), text = decode(ids, skip_special_tokens=True), temperature, seed,
finish_reason ("stop" or "length") and the grade.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import pandas as pd
import torch
from .progress import tqdm

from . import grading, schemas, storage
from .prompting import prompt_ids
from .statistics import seed_from

ANSWER_COLUMNS = schemas.ANSWERS.names

# What a response is, in the order the book reports them.
FAILURE_TYPES = ("correct", "boxed_wrong", "empty_box", "no_box", "truncated", "imported",
                 "ungraded")


def sample_seed(seed: int, problem_id: str, sample: int) -> int:
    return seed_from("rollout", int(seed), problem_id, int(sample))


class PerRowSampler:
    """A logits processor that picks each row's token with the row's own generator.

    Returns scores that are -inf except at the chosen token, so greedy decoding in
    ``generate`` takes exactly that token.
    """

    def __init__(self, temperatures: list[float], seeds: list[int]):
        self.temperatures = [float(t) for t in temperatures]
        self.generators = []
        for s in seeds:
            g = torch.Generator(device="cpu")
            g.manual_seed(int(s))
            self.generators.append(g)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logits = scores.detach().to(device="cpu", dtype=torch.float32)
        chosen = torch.empty(logits.shape[0], dtype=torch.long)
        for row, (t, g) in enumerate(zip(self.temperatures, self.generators)):
            if t <= 0.0:
                chosen[row] = int(torch.argmax(logits[row]))
            else:
                probs = torch.softmax(logits[row] / t, dim=-1)
                chosen[row] = int(torch.multinomial(probs, 1, generator=g))
        out = torch.full_like(scores, -math.inf)
        out[torch.arange(scores.shape[0], device=scores.device), chosen.to(scores.device)] = 0.0
        return out


def eos_ids(model, tokenizer) -> list[int]:
    ids = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update([source] if isinstance(source, int) else source)
    if not ids:
        raise ValueError("the tokenizer and model define no EOS token; generation could not stop")
    return sorted(int(i) for i in ids)


def temperature_of(temperatures: list[float], sample: int) -> float:
    return float(temperatures[sample % len(temperatures)])


@torch.no_grad()
def generate_batch(model, tokenizer, prompts: list[list[int]], temperatures: list[float],
                   seeds: list[int], max_new_tokens: int) -> list[tuple[list[int], str]]:
    """Generate one batch; returns (response ids, finish_reason) per prompt."""
    from transformers import GenerationConfig

    stop = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    device = next(model.parameters()).device
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=int(max_new_tokens),
                              eos_token_id=stop, pad_token_id=pad, bos_token_id=None)
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                         generation_config=config,
                         logits_processor=[PerRowSampler(temperatures, seeds)])
    new = out[:, width:].cpu().tolist()
    results = []
    for row in new:
        cut = next((k for k, t in enumerate(row) if t in stop), None)
        if cut is None:
            results.append((row[:max_new_tokens], "length"))
        else:
            results.append((row[:cut + 1], "stop"))
    return results


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
                      progress: bool | str = True) -> pd.DataFrame:
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
    # Longest prompts first, so batches hold similar lengths and the first batch shows
    # the worst-case memory.
    order = sorted(range(len(tasks)), key=lambda i: (-len(prompt_of[tasks[i]["problem_id"]]), i))
    label = progress if isinstance(progress, str) else f"sampling {model_name}"
    bar = tqdm(total=len(tasks), desc=label, disable=progress is False, leave=False)
    for start in range(0, len(order), batch_size):
        batch = [tasks[i] for i in order[start:start + batch_size]]
        out = generate_batch(model, tokenizer, [prompt_of[t["problem_id"]] for t in batch],
                             [t["temperature"] for t in batch], [t["seed"] for t in batch],
                             max_new_tokens)
        for t, (ids, reason) in zip(batch, out):
            t.update(response_ids=ids, finish_reason=reason)
        bar.update(len(batch))
    bar.close()
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
                    key: dict, overwrite: bool = False) -> pd.DataFrame:
    """Sample every model over ``problems`` into a sharded, resumable table.

    Shards are (model, chunk of problems in id order). ``key`` (suite_keys) is everything
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
    chunks = problem_chunks(problems["problem_id"].tolist(), max(1, batch_size // n_per_problem))
    by_id = problems.set_index("problem_id", drop=False)
    loaded: dict = {}

    def job(name: str, chunk: list[str]) -> Callable[[], pd.DataFrame]:
        def sample() -> pd.DataFrame:
            if name not in loaded:
                loaded.clear()  # one model in memory at a time
                loaded[name] = loader(name)
                storage.atomic_write_json(table.folder / f"_prov-{_safe(name)}.json",
                                          loaded[name].provenance)
            lm = loaded[name]
            df = generate_rollouts(lm.model, lm.tokenizer, by_id.loc[chunk].reset_index(drop=True),
                                   model_name=name, template=template,
                                   n_per_problem=n_per_problem, temperatures=temperatures,
                                   max_new_tokens=max_new_tokens, seed=seed,
                                   batch_size=batch_size, timeout_s=timeout_s,
                                   workers=workers, progress=False)
            return df[schema.names]
        return sample

    jobs = [(f"{_safe(name)}__{i:04d}", job(name, chunk))
            for name in model_names for i, chunk in enumerate(chunks)]
    settings = dict(models=model_names, template=template, n_per_problem=n_per_problem,
                    temperatures=[float(t) for t in temperatures],
                    max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size)

    def provenance() -> dict:
        return {**manifest, "sampling": settings,
                "models": [storage.read_json(p) for p in sorted(table.folder.glob("_prov-*.json"))]}

    storage.run_shards(table, jobs, provenance)
    loaded.clear()
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

"""Evaluating trained adapters: greedy and sampled responses of each model to held-out
problems, graded one row per response, and the JSONL file they are written to."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from rlprobe_nb.demo.grpo.advantages import is_correct
from rlprobe_nb.demo.grpo.checkpoints import load_adapter_weights
from rlprobe_nb.demo.grpo.generation import generate
from rlprobe_nb.suite import prompting


def evaluate(policy, sampler, tokenizer, problems: list[dict], models: dict, device: str,
             n_samples: int = 4, temperature: float = 0.7, max_new_tokens: int = 256,
             seed: int = 1234, workers: int = 8, progress: bool = True) -> list[dict]:
    """Graded responses of each model to each problem: greedy (sample 0) + n samples.

    ``models`` maps a name to an adapter folder, or to None for the base model (the
    adapter switched off). Returns one dict per (model, problem, sample).
    """
    from rlprobe_nb.problems import grading
    from rlprobe_nb.progress import tqdm

    prompts = [prompting.prompt_ids(tokenizer, p["problem"]) for p in problems]
    golds = [p["answer"] for p in problems]
    rows = []
    policy.eval()
    for name, adapter in tqdm(models.items(), disable=not progress, desc="evaluating"):
        if adapter is not None:
            load_adapter_weights(policy, adapter)
        sampler.sync(policy, use_adapter=adapter is not None)
        greedy, g_stop = generate(sampler.model, tokenizer, prompts, max_new_tokens, None, device,
                                  batch_size=2048)
        torch.manual_seed(seed)
        sampled, s_stop = generate(sampler.model, tokenizer,
                                   [p for p in prompts for _ in range(n_samples)],
                                   max_new_tokens, temperature, device, batch_size=2048)
        texts = tokenizer.batch_decode(greedy + sampled, skip_special_tokens=True)
        all_golds = golds + [g for g in golds for _ in range(n_samples)]
        grades = grading.grade_many(texts, all_golds, timeout_s=5.0, workers=workers)
        stops = g_stop + s_stop
        lens = [len(c) for c in greedy + sampled]
        for i, (text, grade) in enumerate(zip(texts, grades)):
            if i < len(problems):
                pi, sample = i, 0
            else:
                pi, sample = (i - len(problems)) // n_samples, (i - len(problems)) % n_samples + 1
            rows.append({
                "model": name, "problem_id": problems[pi]["unique_id"],
                "level": problems[pi]["level"], "kind": problems[pi].get("kind"),
                "sample": sample,
                "temperature": 0.0 if sample == 0 else temperature,
                "seed": seed, "response": text, "n_tokens": lens[i],
                "finish_reason": "stop" if stops[i] else "length",
                "extracted": grade.extracted, "grade_method": grade.method,
                "n_boxes": grade.n_boxes,
                # correct: math-verify agrees AND the answer is a plain number (the
                # demo's verdict); grader_correct: math-verify's verdict alone.
                "correct": is_correct(grade, True), "grader_correct": bool(grade.correct),
            })
    return rows


def evaluation_models(*adapter_dirs: Path) -> dict:
    """``dpo`` (the start model: the adapter switched off) and every adapter saved under
    the given ``adapters/`` folders, run by run, each in step order."""
    models = {"dpo": None}
    for folder in adapter_dirs:
        found = sorted((p for p in Path(folder).glob("*_step_*") if p.is_dir()),
                       key=lambda p: int(p.name.rsplit("_", 1)[1]))
        models.update({p.name: p for p in found})
    return models


def write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)

"""A small suite for notebook runs through papermill: the demo's reference (its GGUF
model, or a copy, with the shipped supervised adapter) as the reference, sums as problems
from a file, everything sized to run 01 -> 03 in a couple of minutes on 2 CPU cores."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

DEMO_ADAPTERS = Path(__file__).resolve().parents[1] / "data" / "demo" / "shipped" / "adapters"
DEMO_STOPS = ["<|im_start|>", "<|im_end|>"]


def write_problems(path: Path, pairs) -> Path:
    """Problems "What is $a + b$?" for each (a, b) of ``pairs``, as a JSONL file."""
    path.write_text("".join(json.dumps(
        {"unique_id": f"p/{i}", "problem": f"What is ${a} + {b}$?", "answer": str(a + b)}) + "\n"
        for i, (a, b) in enumerate(pairs)))
    return path


def write_suite(folder: Path, gguf: Path, problems: Path, max_rollouts: int) -> Path:
    """``folder``/suite.yaml of suite "mini" (reference "dpo", target rlvr_step_1200)."""
    folder.mkdir(parents=True, exist_ok=True)
    suite_file = folder / "suite.yaml"
    suite_file.write_text(yaml.safe_dump({
        "suite": "mini", "reference": "dpo", "target": "rlvr_step_1200",
        "models": {"smollm2": {"kind": "gguf", "path": str(gguf)},
                   "dpo": {"kind": "peft", "base": "smollm2", "path": str(DEMO_ADAPTERS / "dpo"),
                           "stop_tokens": DEMO_STOPS}},
        "problems": {"source": "file", "path": str(problems)},
        "grading": {"timeout_s": 5.0, "workers": 1},
        "filtering": {"n_samples": 1, "max_new_tokens": 24, "batch_size": 8,
                      "ref_max_pass": 1.0, "target_min_pass": 0.0},
        "rollouts": {"n_per_problem": 2, "max_new_tokens": 24, "batch_size": 8},
        "forcing": {"failure_types": ["boxed_wrong", "empty_box", "no_box", "truncated"],
                    "max_rollouts": max_rollouts, "topk": 5, "pairs": []},
        "runtime": {"device": "cpu", "dtype": "float32"}}))
    return suite_file

"""End to end: a real TRL GRPO run (``byo_grpo``) -> discover -> the book's chapters 01-05
on the new suite, shrunk as the small book is (``session_book.small_demo_params``' sizes),
each writing non-empty tables; 02 reads the run's own samples, dumped as verl writes them
and imported (``rollouts.source: imported``), and 03 forces them.

It costs about 80 s on one core (make test gives each worker one), so it runs in its own
file, which pytest-xdist schedules beside the small book's readers.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed"),
]


def shrink(suite_file: Path) -> None:
    cfg = yaml.safe_load(suite_file.read_text())
    cfg["problems"].update(n=8)
    cfg["filtering"].update(n_samples=1, max_new_tokens=40, ref_max_pass=1.0, target_min_pass=0.0)
    cfg["rollouts"].update(n_per_problem=2, max_new_tokens=40, temperatures=[0.7, 1.0])
    cfg["forcing"].update(failure_types=["boxed_wrong", "empty_box", "no_box", "truncated"],
                          group_max_rollouts={}, max_rollouts=12)
    suite_file.write_text(yaml.safe_dump(cfg))


def test_discover_then_chapters_01_to_05(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "RLPROBE_PARAMS": str(tmp_path / "params"), "RLPROBE_CACHE": str(tmp_path / "cache"),
           "RLPROBE_OUT": str(tmp_path / "out"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "params" / "demo").mkdir(parents=True)
    shutil.copy2(REPO / "params" / "demo" / "suite.yaml", tmp_path / "params" / "demo")

    def run(*args):
        done = subprocess.run([sys.executable, *args], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        return done.stdout

    run(str(REPO / "tests" / "byo_grpo.py"), str(tmp_path))
    run("-m", "rlprobe_nb.suite.discover", str(tmp_path / "full"), "--name", "byo",
        "--reference", str(tmp_path / "init"), "--like", "demo")
    suite_file = tmp_path / "params" / "byo" / "suite.yaml"
    shrink(suite_file)
    run("-m", "rlprobe_nb.book", "--suite", "byo", "--only", "01")
    data = tmp_path / "out" / "data" / "byo"
    # the run's own samples, as verl dumps them (text only), become 02's rollouts
    dump = verl_dump(data, tmp_path)
    run("-m", "rlprobe_nb.import_rollouts", str(dump), "--suite", "byo",
        "--problems", str(tmp_path / "problems.jsonl"))
    cfg = yaml.safe_load(suite_file.read_text())
    cfg["rollouts"].update(source="imported",
                           prior_path=str(data / "imported" / f"rollouts_{dump.stem}.parquet"))
    # a dump does not say its sampling temperature: 04's T = 1 check has no rollouts
    cfg["forcing"]["groups"] = [g for g in cfg["forcing"]["groups"] if g != "t1_unselected"]
    cfg["forcing"]["failure_types"].append("imported")  # a wrong text-only import's type
    suite_file.write_text(yaml.safe_dump(cfg))
    run("-m", "rlprobe_nb.book", "--suite", "byo", "--only", "02", "03", "04", "05")
    for table in ("answers", "selection", "rollouts", "tokens/rlvr_step_1__vs__initial",
                  "tokens/rlvr_step_2__vs__initial", "divergence_when"):
        parts = list((data / table).rglob("*.parquet"))
        assert parts and sum(p.stat().st_size for p in parts) > 0, table
    assert list(data.glob("spikes*/**/*.parquet")), "chapter 05 wrote no spikes table"
    rollouts = pd.read_parquet(data / "rollouts")
    assert rollouts["flags"].str.contains("retokenized").all()  # text only: re-tokenized, flagged
    forced = pd.read_parquet(data / "tokens" / "rlvr_step_1__vs__initial", columns=["rollout_id"])
    assert set(forced.rollout_id) <= set(rollouts.rollout_id) and len(forced)


def verl_dump(data: Path, root: Path) -> Path:
    """The reference's sampled answers of chapter 01, written as verl's rollout JSONL
    (``input``: the prompt decoded without special tokens, ``output``, ``gts``), and the
    suite's problems as the run's problems file (MATH schema: its ids and answers)."""
    import json

    from transformers import AutoTokenizer

    from rlprobe_nb.suite import prompting

    tok = AutoTokenizer.from_pretrained(root / "init")
    answers = pd.read_parquet(data / "answers")
    problems = pd.read_parquet(data / "problems").set_index("problem_id")
    rows = answers[(answers.model == "initial") & (answers["sample"] > 0)]
    (root / "problems.jsonl").write_text("".join(json.dumps(
        {"unique_id": pid, "problem": r.problem, "answer": r.answer}) + "\n"
        for pid, r in problems.iterrows()))
    dump = root / "1.jsonl"
    dump.write_text("".join(json.dumps({
        "input": tok.decode(prompting.prompt_ids(tok, problems.problem[r.problem_id]),
                            skip_special_tokens=True),
        "output": r.response, "gts": problems.answer[r.problem_id]}) + "\n"
        for r in rows.itertuples()))
    return dump

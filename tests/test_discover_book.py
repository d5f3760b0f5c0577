"""End to end: a real TRL GRPO run (``byo_grpo``) -> discover -> the book's chapters 01-05
on the new suite, shrunk as the small book is (``session_book.small_demo_params``' sizes),
each writing non-empty tables.

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
    shrink(tmp_path / "params" / "byo" / "suite.yaml")
    run("-m", "rlprobe_nb.book", "--suite", "byo", "--only", "01", "02", "03", "04", "05")
    data = tmp_path / "out" / "data" / "byo"
    for table in ("answers", "selection", "rollouts", "tokens/rlvr_step_1__vs__initial",
                  "tokens/rlvr_step_2__vs__initial", "divergence_when"):
        parts = list((data / table).rglob("*.parquet"))
        assert parts and sum(p.stat().st_size for p in parts) > 0, table
    assert list(data.glob("spikes*/**/*.parquet")), "chapter 05 wrote no spikes table"

"""Shared fixtures. ``small_book``: the whole book, run once per test session exactly as
`make demo` runs it (python -m rlprobe_nb.book), on the demo suite shrunk to two
checkpoints and a handful of problems, into a temporary results folder; the end-to-end
tests read what a user reads from it (executed notebooks, HTML pages, tables)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_models import tiny_llama

from rlprobe_nb.suite import paths

# two RLVR checkpoints and the placebo at each of their steps (chapter 05's external null)
SMALL_CHECKPOINTS = ("rlvr_step_400", "rlvr_step_1200", "placebo_step_400", "placebo_step_1200")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``tiny_llama`` saved to a folder, so fresh processes can load it: (folder, model, tok)."""
    model, tok = tiny_llama()
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model, tok


def small_demo_params(root: Path) -> Path:
    """The demo suite with two checkpoints and their placebos, 8 problems, short texts, and a selection rule
    that keeps every problem (the point is the plumbing, not the science); one rollout per
    problem at T = 1 for chapter 04's check on unselected draws."""
    shutil.copytree(paths.params_dir() / "demo", root / "demo")
    for f in (root / "demo").glob("*_step_*.yaml"):
        if f.stem not in SMALL_CHECKPOINTS:
            f.unlink()
    suite_file = root / "demo" / "suite.yaml"
    cfg = yaml.safe_load(suite_file.read_text())
    cfg["problems"].update(n=8)
    cfg["filtering"].update(n_samples=1, max_new_tokens=40, ref_max_pass=1.0, target_min_pass=0.0)
    cfg["rollouts"].update(n_per_problem=2, max_new_tokens=40, temperatures=[0.7, 1.0])
    cfg["forcing"].update(failure_types=["boxed_wrong", "empty_box", "no_box", "truncated"],
                          max_rollouts=12)
    cfg["counterfactuals"].update(n=2, max_points=2, positive_points=2, grid_points=3,
                                  case_studies=1)
    suite_file.write_text(yaml.safe_dump(cfg))
    return root


@pytest.fixture(scope="session")
def small_book(tmp_path_factory):
    root = tmp_path_factory.mktemp("book")
    env = {**os.environ, "RLPROBE_OUT": str(root / "out"),
           "RLPROBE_PARAMS": str(small_demo_params(root / "params"))}
    done = subprocess.run([sys.executable, "-m", "rlprobe_nb.book"], env=env, cwd=paths.REPO_ROOT,
                          capture_output=True, text=True, timeout=3000)
    book = {"env": env, "out": root / "out", "data": root / "out" / "data" / "demo",
            "figures": root / "out" / "figures" / "demo", "log": done.stdout + done.stderr}
    assert done.returncode == 0, book["log"][-4000:]
    return book

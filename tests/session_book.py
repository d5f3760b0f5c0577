"""The small book (``python -m rlprobe_nb.book`` on the demo suite shrunk by
``small_demo_params``), built once per test session in the background, however many
pytest-xdist workers run the tests.

Its build takes minutes, so it starts when the session's first test is set up (if any
collected test reads it) and runs beside the other tests; conftest schedules the modules
that read it last, so they seldom wait. Under xdist every worker sees one folder of the
session (the session's base temporary folder: each worker's own is inside it); the first
worker to claim the build (an exclusive create of its claim file) starts it, and every
reader, in any worker, waits for its result file there. Readers get the book read-only:
its files are listed with their sizes and times once built, and a reader's session fails
at its end if any of them changed.

The build's processes get one thread each for torch's CPU kernels, in a serial run as in
a parallel one: the tables it writes do not depend on how many workers ran the tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from rlprobe_nb.suite import paths

# two RLVR checkpoints and the placebo at each of their steps (chapter 05's external null)
SMALL_CHECKPOINTS = ("rlvr_step_400", "rlvr_step_1200", "placebo_step_400", "placebo_step_1200")
BUILD_TIMEOUT_S = 3000
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
CLAIM, RESULT, LOG = "claimed", "result.json", "book.log"


def small_demo_params(root: Path) -> Path:
    """The demo suite with two checkpoints and their placebos, 8 problems, short texts, and a
    selection rule that keeps every problem (the point is the plumbing, not the science);
    one rollout per problem at T = 1 for chapter 04's check on unselected draws."""
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
                          group_max_rollouts={},
                          max_rollouts=12)
    cfg["counterfactuals"].update(n=2, max_points=2, positive_points=2, grid_points=3,
                                  case_studies=1)
    cfg["takeover"].update(checkpoints=None, n_problems=6, budgets=[0.05, 0.2],
                           max_new_tokens=40)
    suite_file.write_text(yaml.safe_dump(cfg))
    return root


def session_folder(tmp_path_factory) -> Path:
    """A folder every worker of this test session sees: the session's base temporary
    folder (an xdist worker's own is a subfolder of it), or this process's without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def layout(folder: Path) -> dict:
    """Where the book of a session's folder lives, and the environment that reads it."""
    root = folder / "small_book"
    env = {**os.environ, "RLPROBE_OUT": str(root / "out"), "RLPROBE_PARAMS": str(root / "params")}
    return {"root": root, "env": env, "out": root / "out", "data": root / "out" / "data" / "demo",
            "figures": root / "out" / "figures" / "demo"}


class Build:
    """The build this process started; a thread records its exit status for every reader."""

    def __init__(self, book: dict):
        small_demo_params(book["root"] / "params")
        self.book = book
        self.log = open(book["root"] / LOG, "w")
        self.process = subprocess.Popen([sys.executable, "-m", "rlprobe_nb.book"],
                                        env={**book["env"], **ONE_THREAD}, cwd=paths.REPO_ROOT,
                                        stdout=self.log, stderr=subprocess.STDOUT)
        self.thread = threading.Thread(target=self._record, daemon=True)
        self.thread.start()

    def _record(self) -> None:
        try:
            status = self.process.wait(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = f"still running after {BUILD_TIMEOUT_S} s (killed)"
        self.log.close()
        files = snapshot(self.book["out"]) if status == 0 else {}
        done = self.book["root"] / RESULT
        (done.with_suffix(".tmp")).write_text(json.dumps({"status": status, "files": files}))
        done.with_suffix(".tmp").replace(done)  # readers never see half a result

    def finish(self, interrupted: bool) -> None:
        """At the end of the session: stop a build no test will read, else wait for it."""
        if interrupted and self.process.poll() is None:
            self.process.kill()
        self.thread.join()


def start(book: dict) -> Build | None:
    """Start the build unless another worker of the session has claimed it."""
    book["root"].mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(book["root"] / CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None
    return Build(book)


def wait(book: dict) -> dict:
    """The finished build's result ({"status", "files"}), and its log in ``book["log"]``."""
    done, deadline = book["root"] / RESULT, time.monotonic() + BUILD_TIMEOUT_S
    while not done.exists():
        if not (book["root"] / CLAIM).exists():
            raise RuntimeError("the small book was never started (no test of the session "
                               "claimed it)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the small book did not finish in {BUILD_TIMEOUT_S} s")
        time.sleep(1.0)
    book["log"] = (book["root"] / LOG).read_text()
    return json.loads(done.read_text())


def private_copy(book: dict, root: Path) -> dict:
    """A copy of the book's tables and parameters that a test may write into (a notebook
    run on it writes its figures there too); the session's book stays as it was built."""
    shutil.copytree(book["out"] / "data", root / "out" / "data")
    shutil.copytree(book["env"]["RLPROBE_PARAMS"], root / "params")
    env = {**book["env"], "RLPROBE_OUT": str(root / "out"), "RLPROBE_PARAMS": str(root / "params")}
    return {"root": root, "env": env, "data": root / "out" / "data" / "demo"}


def snapshot(folder: Path) -> dict[str, list[int]]:
    """Every file under ``folder``: [size, modification time in ns]."""
    return {str(p.relative_to(folder)): [p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted(folder.rglob("*")) if p.is_file()}


def changed_files(book: dict, built: dict) -> list[str]:
    """Files of the book added, removed or rewritten since it was built."""
    now = snapshot(book["out"])
    return sorted(name for name in set(now) | set(built) if now.get(name) != built.get(name))

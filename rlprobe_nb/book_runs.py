"""How the book runs its notebooks: in waves, stopped together on Ctrl-C, executed in
temporary notebooks that an interrupted run's successor removes, and only when each
``.ipynb`` holds the cells of its jupytext twin (the ``.py`` one edits).

Ctrl-C stops every notebook of the running wave at once (their kernels get SIGINT, then
SIGKILL after ``INTERRUPT_GRACE_S``) and ends the book with status 130 and one line, no
traceback; the partial notebooks are kept as ``<stem>.FAILED.ipynb``. Tables are written
atomically (``tables.storage``), so none is left half-written and a rerun resumes.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Callable

class NotebookFailed(RuntimeError):
    """A notebook run raised; ``kept`` is its executed notebook (None if nothing ran)."""

    def __init__(self, notebook: Path, error: str, kept: Path | None):
        super().__init__(f"{notebook.name}: {error}")
        self.notebook, self.error, self.kept = notebook, error, kept


TEMPORARY = re.compile(r"\A\.(?P<stem>.+?)\.(?:book-(?P<pid>\d+)|[^.]+)\.tmp\.ipynb\Z")


def temporary_notebook(out_dir: Path, stem: str) -> Path:
    """Where a run's notebook is executed until it is complete: hidden, beside its page,
    named for this process (``remove_stale_temporaries`` knows it from its pid)."""
    return out_dir / f".{stem}.book-{os.getpid()}.tmp.ipynb"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(out_dir: Path) -> list[Path]:
    """Remove the temporary notebooks that interrupted or killed runs left in ``out_dir``
    (those of a book still running are kept; those of older versions, named without a
    pid, go too); returns what was removed."""
    removed = []
    for f in sorted(out_dir.glob(".*.tmp.ipynb")):
        m = TEMPORARY.match(f.name)
        if m and (m["pid"] is None or (int(m["pid"]) != os.getpid() and not _alive(int(m["pid"])))):
            f.unlink(missing_ok=True)
            removed.append(f)
    return removed


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def out_of_sync(notebooks_run: list[Path]) -> list[str]:
    """For each notebook whose jupytext twin (``notebooks/X.py``, the file one edits) holds
    other cells than it: what differs, in words. The book runs the ``.ipynb``; run after
    editing the ``.py`` without ``make sync``, it would run the old cells."""
    import jupytext
    import nbformat

    out = []
    for nb in dict.fromkeys(notebooks_run):
        twin = nb.with_suffix(".py")
        if not twin.is_file():
            continue
        a, b = _cells(jupytext.read(twin)), _cells(nbformat.read(nb, as_version=4))
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append(f"{nb.name} differs from {twin.name} (from cell {first + 1}; "
                       f"{len(b)} cells against {len(a)})")
    return out


# After Ctrl-C: how long the running notebooks get to stop their cell (SIGINT) and keep
# their partial notebook, before their kernels are killed.
INTERRUPT_GRACE_S = 20


def _wait_or_interrupt(done: list[cf.Future], running: Callable[[], list[str]]) -> bool:
    """Wait for a wave's lanes; on Ctrl-C stop them all at once (their kernels get SIGINT,
    then SIGKILL after ``INTERRUPT_GRACE_S``) rather than waiting for each to finish.
    Returns False when interrupted."""
    from rlprobe_nb import kernels

    try:
        cf.wait(done)
        return True
    except KeyboardInterrupt:
        print(f"\ninterrupted: stopping {', '.join(running()) or 'nothing'} ...", file=sys.stderr,
              flush=True)
        kernels.signal_kernels(signal.SIGINT)
        try:
            if cf.wait(done, timeout=INTERRUPT_GRACE_S).not_done:
                kernels.signal_kernels(signal.SIGKILL)
                cf.wait(done, timeout=INTERRUPT_GRACE_S)
        except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
            kernels.signal_kernels(signal.SIGKILL)
        return False


Wave = list[list[int]]  # lanes that run at once, each a list of plan indices run in order


def run_waves(plan: list[tuple[Path, dict, str]], waves: list[Wave],
              run: Callable[[Path, dict, str], tuple[float, list[str]]],
              finished: Callable[[int, tuple[float, list[str]]], None],
              failed: Callable[[int, BaseException], None], kept: Callable[[str], Path],
              lanes: Callable[[], "contextlib.AbstractContextManager"] | None = None) -> int:
    """Run the plan's ``waves``: the lanes of a wave at once, the runs of a lane in order
    (``run(notebook, parameters, stem)`` each; ``finished(i, result)`` as each ends). A
    lane stops at its first failed run, the other lanes of its wave go on to their end;
    then 1 (``failed(i, error)`` for the first failure in plan order). 130 after Ctrl-C
    (every running run stopped, no traceback; ``kept(stem)``: where a run keeps its partial
    notebook). 0 when every run succeeded. ``lanes()``: a ``cores.Lanes`` for a wave of
    several lanes (how many threads each running kernel may use)."""
    lock = threading.Lock()
    for wave in waves:
        current: dict[int, int] = {}
        share = lanes() if lanes is not None and len(wave) > 1 else None

        def lane_run(number: int, lane: list[int]) -> tuple[int, NotebookFailed] | None:
            try:
                for i in lane:
                    nb, parameters, _ = plan[i]
                    extra = (f" (checkpoint {parameters['checkpoint']})"
                             if "checkpoint" in parameters else "")
                    with lock:
                        current[number] = i
                        print(f"[{i + 1}/{len(plan)}] {nb.name}{extra} ...", flush=True)
                    try:
                        outcome = run(*plan[i])
                    except NotebookFailed as failure:
                        return i, failure
                    with lock:
                        current.pop(number, None)
                        finished(i, outcome)
                return None
            finally:
                if share is not None:
                    share.ended()

        with share or contextlib.nullcontext():
            pool = cf.ThreadPoolExecutor(len(wave))
            done = []
            for number, lane in enumerate(wave):
                if share is not None:
                    share.started()
                done.append(pool.submit(lane_run, number, lane))
            complete = _wait_or_interrupt(done, lambda: [plan[i][2] for i in current.values()])
            pool.shutdown(wait=False, cancel_futures=True)
        if not complete:
            partial = [str(kept(plan[i][2])) for lane in wave for i in lane
                       if kept(plan[i][2]).exists()]
            print("rlprobe_nb: interrupted; no table was left half-written (a rerun resumes)"
                  + (f"; partial notebooks: {', '.join(partial)}" if partial else ""),
                  file=sys.stderr)
            return 130
        failures = [r for r in (f.result() for f in done) if r is not None]
        if failures:
            failed(*min(failures, key=lambda r: r[0]))  # the first in plan order
            return 1
    return 0

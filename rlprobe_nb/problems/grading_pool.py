"""The parent side of grading: worker processes with a per-answer wall-clock limit.

Workers are ``python -c`` subprocesses running ``grading._worker_stdio`` (not
multiprocessing: no pickling, and no re-import of the caller's ``__main__``, so unguarded
scripts and notebooks work), one JSON request and reply per line. A worker that overruns
its answer's limit is killed and graded ``"timeout"``; a warm spare takes over at once and
the replacement starts in the background, so a hung answer costs its limit and no more.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

_STARTUP_TIMEOUT_S = 120.0


class _Worker:
    """A grading subprocess (``python -c``, not multiprocessing: no pickling, and no
    re-import of the caller's ``__main__``, so unguarded scripts and notebooks work)."""

    def __init__(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")] if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from rlprobe_nb.problems.grading import _worker_stdio; _worker_stdio()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, text=True, bufsize=1)
        self.started = time.monotonic()
        self.ready = False
        self.task: tuple[int, float] | None = None  # (task index, time sent)

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def send(self, obj) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def recv(self):
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError("grading worker exited")
        return json.loads(line)

    def kill(self, wait: bool = True) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        if wait:
            self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # EOF ends the worker loop
            self.proc.wait(2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class GraderPool:
    """``workers`` processes grading at once, plus one warm spare. A worker that overruns
    is killed, the spare takes its place at once, and a new spare starts in the background:
    one pathological answer costs ``timeout_s`` and no more. Workers start on first use."""

    def __init__(self, workers: int = 2):
        if workers < 1:
            raise ValueError(f"grading workers must be >= 1, got {workers}")
        self._size = workers
        self._workers: list[_Worker] = []
        self._dying: list[_Worker] = []  # killed, not yet reaped (the kernel frees them)
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the workers now and wait until every one is ready (else lazily, as needed)."""
        with self._lock:
            self._top_up()
            while starting := [w for w in self._workers if not w.ready]:
                if select.select(starting[:1], [], [], self._startup_left(starting[0]))[0]:
                    self._mark_ready(starting[0])
                else:
                    self._failed_start(starting[0])
                self._top_up()

    def map(self, tasks: list[tuple[str, str]], timeout_s: float) -> list[tuple[bool, str, float]]:
        """Run (pred, gold) comparisons; returns (correct, method, seconds) per task."""
        with self._lock:
            try:
                return self._map(tasks, timeout_s)
            except BaseException:  # e.g. an interrupt: no worker may keep a stale task
                self.close()
                raise

    def _map(self, tasks, timeout_s):
        results: list = [None] * len(tasks)
        pending = list(range(len(tasks)))[::-1]
        while pending or self._busy():
            self._top_up()
            self._dispatch(tasks, pending)
            busy, starting = self._busy(), [w for w in self._workers if not w.ready]
            deadlines = [w.task[1] + timeout_s for w in busy]
            deadlines += [w.started + _STARTUP_TIMEOUT_S for w in starting]
            ready, _, _ = select.select(busy + starting, [], [],
                                        max(0.0, min(deadlines) - time.monotonic()))
            for w in ready:
                if w.ready:
                    self._collect(w, results)
                else:
                    self._mark_ready(w)
            now = time.monotonic()
            for w in self._busy():
                k, sent = w.task
                if now - sent >= timeout_s:
                    results[k] = (False, "timeout", now - sent)
                    self._drop(w)
            for w in starting:
                if not w.ready and self._startup_left(w) <= 0:
                    self._failed_start(w)
        return results

    def _busy(self) -> list[_Worker]:
        return [w for w in self._workers if w.task is not None]

    def _top_up(self) -> None:
        # The spare starts once the others are up, so that it does not delay first answers.
        self._dying = [w for w in self._dying if w.proc.poll() is None]
        spare = all(w.ready for w in self._workers)
        while len(self._workers) < self._size + spare:
            self._workers.append(_Worker())

    def _dispatch(self, tasks, pending) -> None:
        idle = [w for w in self._workers if w.ready and w.task is None]
        while pending and idle and len(self._busy()) < self._size:
            w, k = idle.pop(), pending.pop()
            try:
                w.send([k, tasks[k][0], tasks[k][1]])
            except OSError:  # it died while idle (e.g. killed from outside): retry elsewhere
                pending.append(k)
                self._drop(w)
                continue
            w.task = (k, time.monotonic())

    def _collect(self, w: _Worker, results) -> None:
        k, sent = w.task
        try:
            task_id, correct, method = w.recv()
            if task_id != k:
                raise EOFError("grading worker answered out of order")
        except (EOFError, OSError, ValueError):  # the worker died (e.g. out of memory)
            correct, method = False, "error:worker_died"
            self._drop(w)
        results[k] = (bool(correct), method, time.monotonic() - sent)
        w.task = None

    def _startup_left(self, w: _Worker) -> float:
        return max(0.0, w.started + _STARTUP_TIMEOUT_S - time.monotonic())

    def _mark_ready(self, w: _Worker) -> None:  # w's first line has arrived
        try:
            ok = w.recv() == "ready"
        except (EOFError, OSError, ValueError):
            ok = False
        if not ok:
            self._failed_start(w)
        w.ready = True

    def _failed_start(self, w: _Worker) -> None:
        w.kill()
        self._workers.remove(w)
        raise RuntimeError(
            f"a grading worker failed to start (or took over {_STARTUP_TIMEOUT_S:.0f}s); "
            "check that math-verify imports: python -c 'import math_verify'")

    def _drop(self, w: _Worker) -> None:
        """Kill a worker and start its replacement, without waiting for it to be ready."""
        # SIGKILL: a worker stuck in a C-level integer power ignores anything else. Reaped
        # later: freeing its memory took ~70 ms, which the answer's caller need not wait.
        w.kill(wait=False)
        self._workers.remove(w)
        self._dying.append(w)
        self._top_up()

    def close(self) -> None:
        for w in self._workers:
            if w.ready and w.task is None:
                w.close()
            else:  # starting (not reading its stdin yet) or busy: nothing to wait for
                w.kill()
        for w in self._dying:
            w.kill()
        self._workers, self._dying = [], []


_POOLS: dict[int, GraderPool] = {}
# A forked child (a worker process of ``distributed``) starts its own graders: the
# inherited ones belong to the parent, which alone talks to them and stops them.
os.register_at_fork(after_in_child=_POOLS.clear)


def _pool(workers: int) -> GraderPool:
    if workers not in _POOLS:
        _POOLS[workers] = GraderPool(workers)
    return _POOLS[workers]


@atexit.register
def shutdown() -> None:
    """Stop the cached worker processes (also runs at interpreter exit)."""
    for p in _POOLS.values():
        p.close()
    _POOLS.clear()

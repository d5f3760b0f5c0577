"""Sharing the CPU's cores between notebooks that run at once.

On a CPU the book runs two *lanes* side by side after the forcing run of chapter 03 (the
chapters that read only its tables beside those that read each other's, ``book.waves``).
Two kernels that each use every core would fight over them, and one that keeps a single
core while the other lane has ended wastes the other. So the book writes, in a small file
named by ``RLPROBE_CORES_FILE`` (set for its kernels), how many threads each running
notebook may use: every core divided by the lanes still running. A kernel reads it
(``adopt``) between shards of its long stages (``distributed.run_shards``) and before
them, and sets torch's thread count to it.

Outside the book (JupyterLab, a test, a script) nothing is set and nothing changes.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

CORES_FILE_ENV = "RLPROBE_CORES_FILE"


def available() -> int:
    """Threads the book's kernels may use in all: the cores this process may run on, or
    fewer where ``OMP_NUM_THREADS`` says so (a test session that runs the book beside its
    other tests keeps it at one: more would only spin)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = os.environ.get("OMP_NUM_THREADS", "").strip()
    return max(1, min(cores, int(limit))) if limit.isdigit() and int(limit) > 0 else cores


def adopt() -> int | None:
    """Set torch's thread count to what the book allows now; returns it, or None outside
    the book (no file named, or none readable: nothing changes)."""
    where = os.environ.get(CORES_FILE_ENV)
    if not where:
        return None
    try:
        threads = int(Path(where).read_text().strip())
    except (OSError, ValueError):
        return None
    import torch

    threads = max(1, threads)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


class Lanes:
    """The book's side: how many lanes run now, and the file its kernels read. Use as a
    context manager around a wave; ``started()``/``ended()`` per lane."""

    def __init__(self, folder: Path, cores: int | None = None):
        self.cores = cores or available()
        self.path = Path(folder) / f".cores-{os.getpid()}"
        self.running = 0
        self.lock = threading.Lock()
        self.previous = os.environ.get(CORES_FILE_ENV)

    def __enter__(self) -> "Lanes":
        self._write()
        os.environ[CORES_FILE_ENV] = str(self.path)  # kernels started from now on read it
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is None:
            os.environ.pop(CORES_FILE_ENV, None)
        else:
            os.environ[CORES_FILE_ENV] = self.previous
        self.path.unlink(missing_ok=True)

    def started(self) -> None:
        with self.lock:
            self.running += 1
            self._write()

    def ended(self) -> None:
        with self.lock:
            self.running = max(0, self.running - 1)
            self._write()

    def share(self) -> int:
        return max(1, self.cores // max(1, self.running))

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(str(self.share()))
        os.replace(tmp, self.path)  # a kernel never reads half a number

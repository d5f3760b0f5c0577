"""One writer at a time per folder: an advisory lock on ``_lock`` held by the writing
process, released when that process ends however it ends; a second process is refused
with the holder named, the same process may re-enter (a notebook cell rerun after an
error)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from rlprobe_nb.tables.atomic import FILE_MODE

LOCK_FILE = "_lock"


class TableBusyError(RuntimeError):
    """Another process is writing the table."""


_HELD: dict[str, list] = {}  # folder -> [fd, depth]: this process's locks (re-entrant)


@contextlib.contextmanager
def writer_lock(folder: str | os.PathLike, what: str = "") -> Iterator[None]:
    """Hold the folder's writer lock for the block. Another process holding it is named in
    a TableBusyError; the same process may re-enter (a notebook cell rerun after an error)."""
    release = acquire_lock(folder, what)
    try:
        yield
    finally:
        release()


def acquire_lock(folder: str | os.PathLike, what: str = ""):
    """Take the folder's writer lock; returns the function that releases it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = str(folder.resolve())
    if name in _HELD:
        _HELD[name][1] += 1
    else:
        path = folder / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise TableBusyError(f"{folder} is being written by {holder}; wait for that run "
                                 "to end (or stop it), then rerun") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')} {what}".strip().encode())
        _HELD[name] = [fd, 1]

    def release() -> None:
        entry = _HELD.get(name)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _HELD[name]
            os.close(entry[0])  # closing the descriptor drops the flock

    return release

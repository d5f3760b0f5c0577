"""Files written atomically (a private temporary file renamed into place, fsync'd, with
the mode the umask gives a new file: ``tempfile`` alone would leave 0600), optionally
named by their own content hash, and small helpers every writer shares."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


class DamagedTableError(RuntimeError):
    """A table or data file does not match what it was written with (missing, extra or
    altered files)."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()
DIR_MODE = 0o777 & ~_umask()


class _TempPath(type(Path())):
    final: Path  # where the file went (set on success)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, content_named: bool = False) -> Iterator[Path]:
    """Yield a private temporary path beside ``path``; on success rename it over ``path``.

    With ``content_named``, the file goes to ``<stem>.<first 16 hex of its sha256><suffix>``
    instead (``tmp.final`` says where). On any error the temporary file is removed and the
    destination keeps its old content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Hidden, and ending in the target's suffix so writers that check it (papermill) agree.
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}",
                                dir=path.parent)
    os.close(fd)
    tmp = _TempPath(name)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        final = path
        if content_named:
            final = path.with_name(f"{path.stem}.{sha256_of(tmp)[:16]}{path.suffix}")
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, final)
        tmp.final = final
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike, keep_existing: bool = False) -> Iterator[Path]:
    """Yield a private temporary folder beside ``path``; on success rename it into place,
    replacing the old folder (or, with ``keep_existing``, leaving a folder already there:
    another process finished the same content first). On any error it is removed."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        for f in tmp.rglob("*"):
            os.chmod(f, DIR_MODE if f.is_dir() else FILE_MODE)
        os.chmod(tmp, DIR_MODE)
        if path.exists() and not keep_existing:
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, path)
        except OSError:
            if not (keep_existing and path.exists()):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


class DamagedFileError(ValueError):
    """A record file (JSON) cannot be read as what it should hold; the message names it."""


def read_json_object(path: str | os.PathLike, fix: str) -> dict:
    """A JSON file that holds a mapping, or DamagedFileError naming the file and ``fix``
    (what to do about it) instead of a bare decoding error."""
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise DamagedFileError(f"{path} is not valid JSON ({type(err).__name__}: "
                               f"{str(err)[:120]}): {fix}") from err
    if not isinstance(value, dict):
        raise DamagedFileError(f"{path} holds a JSON {type(value).__name__}, not the mapping "
                               f"expected: {fix}")
    return value


def sha256_of(path: str | os.PathLike, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(chunk):
            h.update(block)  # releases the GIL for large blocks
    return h.hexdigest()


def fingerprint(obj: Any) -> str:
    """A stable short hash of JSON-able inputs (parameters, ids)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]

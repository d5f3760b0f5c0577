"""A table's working folder and what ties a part to its table.

A table is written in a hidden folder beside its own (``.tokens.writing``) and renamed
into place when complete (``publish``): standard readers skip names starting with ``.``,
so a folder they can open only ever holds a complete table. Each part carries the key
hash of its table in its parquet metadata (``TABLE_KEY``), and the manifest a checksum of
its own part list (``parts_checksum``), so a part copied in from another table, or one
removed from the list with the totals fixed, is refused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe_nb.tables.atomic import DamagedTableError
from rlprobe_nb.tables.locks import LOCK_FILE

TABLE_KEY = b"rlprobe_nb.table_key"  # a part's parquet metadata: its table's key hash


def lock_dir(folder: str | os.PathLike) -> Path:
    """Where a table's writer lock lives: a hidden folder beside it, which outlives both
    the working folder and the table it replaces (a lock inside either would be renamed
    or deleted under the process holding it)."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}.lock"


def work_dir(folder: str | os.PathLike) -> Path:
    """Where a table is written until it is complete: a hidden folder beside it."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}.writing"


def publish(work: Path, folder: Path) -> None:
    """Rename a finished working folder into place (the table it replaces goes first)."""
    old = None
    if folder.exists():
        old = folder.parent / f".{folder.name}.replaced-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(folder, old)
    os.replace(work, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    fd = os.open(folder.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a crash
    finally:
        os.close(fd)


def part_table_key(path: Path) -> str | None:
    """The key hash of the table a part was written for (None: written without one)."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException) as err:
        raise DamagedTableError(f"{path} cannot be read as parquet ({err}): it is damaged "
                                "or truncated; delete the table and rerun") from err
    value = meta.get(TABLE_KEY)
    return value.decode() if value is not None else None


def check_parts_belong(folder: Path, paths: Iterable[Path], key_sha: str | None) -> None:
    """Refuse a part written for another table than the one with ``key_sha``."""
    if key_sha is None:
        return
    for path in paths:
        have = part_table_key(path)
        if have != key_sha:
            raise DamagedTableError(
                f"{path} belongs to another table (its key {have}, this table's {key_sha}): "
                "copied in from another table? delete it, or the whole folder, and rerun")


def clear_files(folder: Path) -> None:
    """Every file of a working folder but its lock."""
    if folder.exists():
        for f in folder.iterdir():
            if f.is_file() and f.name != LOCK_FILE:
                f.unlink()


def parts_checksum(parts: list[dict], rows: int, key_sha: str | None) -> str:
    """The checksum of a manifest's part list (with its row total and key): a part
    removed from the list, however its totals were fixed, is noticed."""
    from rlprobe_nb.tables.keys import canonical

    blob = canonical({"parts": parts, "rows": rows, "key_sha": key_sha}).encode()
    return hashlib.sha256(blob).hexdigest()

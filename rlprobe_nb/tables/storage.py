"""Tables on disk: parquet with an explicit schema, written atomically, verified on read.

A table is a folder of parts plus ``_manifest.json``::

    data/demo/rollouts/
        part-00000.3f9a1c0b2e4d5f67.parquet     the rows (the name carries the first 16
        _manifest.json                           hex digits of the file's sha256)

Standard readers work on the folder as it is (``pd.read_parquet(folder)``,
``pyarrow.dataset.dataset(folder)``): they skip names that start with ``_`` or ``.``. A
table is written in a hidden working folder beside it (``.rollouts.writing/``) and
renamed into place once complete, so a folder a standard reader can open only ever holds
a complete table; an interrupted run leaves only the working folder, where a rerun
resumes.

The manifest is written last. It records the table's *key* (everything its content
depends on, see ``rlprobe_nb.tables.lineage``), the parts with their row counts and
checksums, a checksum of that list itself, and the columns that identify a row. Every
part carries the key hash of its table in its parquet metadata, so a part copied in from
another table is refused (on resume, on finish and on read). ``read_table`` verifies all
of it before returning a row: the parts on disk are exactly the listed ones, each has
its rows, its checksum and its table's key, and no row appears twice. A failed check
names the file and refuses (DamagedTableError).

Large tables are written in shards keyed by their unit of work (``ShardedTable``); a rerun
skips finished shards, so an interrupted run resumes without lost or duplicated rows. One
writer at a time: a writer holds an advisory lock on ``_lock`` (released when its process
ends, however it ends) and a second process is refused with the holder named.

Files are written through ``atomic`` (a private temporary file renamed into place, with
the mode the umask gives a new file); the writer lock is ``locks``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

# Atomic files, locks and tensor files are their own modules; tables use all three, and
# callers reach them through here too.
from rlprobe_nb.tables.atomic import (
    DIR_MODE,
    FILE_MODE,
    DamagedFileError,  # noqa: F401
    DamagedTableError,
    atomic_path,
    atomic_write_json,
    atomic_write_text,
    fingerprint,
    read_json,
    read_json_object,  # noqa: F401
    sha256_of,
)
from rlprobe_nb.tables.locks import LOCK_FILE, TableBusyError, acquire_lock, writer_lock  # noqa: F401
from rlprobe_nb.tables.parts import (  # noqa: F401
    TABLE_KEY,
    check_parts_belong,
    clear_files,
    lock_dir,
    part_table_key,
    parts_checksum,
    publish,
    work_dir,
)
from rlprobe_nb.tables.tensor_files import read_tensors, write_tensors  # noqa: F401

MANIFEST = "_manifest.json"
RUN_FILE = "_run.json"
_PART_RE = re.compile(r"part-(?P<key>.+)\.(?P<sha>[0-9a-f]{16})\.parquet\Z")
class StaleTableError(RuntimeError):
    """A table was computed from other inputs than the current ones."""


def to_arrow(df: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """Convert with the schema's exact columns and types; name what is missing or extra."""
    have, want = list(df.columns), schema.names
    missing = [c for c in want if c not in have]
    extra = [c for c in have if c not in want]
    if missing or extra:
        raise ValueError(f"table columns differ from schema: missing {missing}, unexpected {extra}")
    return pa.Table.from_pandas(df[want], schema=schema, preserve_index=False)


def write_parquet(path: str | os.PathLike, df: pd.DataFrame | pa.Table,
                  schema: pa.Schema) -> Path:
    """Write a DataFrame (converted with the schema) or an Arrow table of exactly the schema."""
    with atomic_path(path) as tmp:
        pq.write_table(_as_table(df, schema), tmp)
    return Path(path)


def _as_table(df: pd.DataFrame | pa.Table, schema: pa.Schema) -> pa.Table:
    if isinstance(df, pa.Table):
        if not df.schema.equals(schema):
            raise ValueError(f"table schema differs from the expected one:\n{df.schema}\nvs\n{schema}")
        return df
    return to_arrow(df, schema)


def _write_part(folder: Path, key: str, df: pd.DataFrame | pa.Table, schema: pa.Schema,
                table_key: str | None = None) -> Path:
    """One part, named by its key and the first 16 hex digits of its sha256, carrying the
    key hash of its table."""
    table = _as_table(df, schema)
    if table_key is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               TABLE_KEY: table_key.encode()})
    for old in folder.glob(f"part-{glob_escape(key)}.*.parquet"):
        old.unlink()
    with atomic_path(folder / f"part-{key}.parquet", content_named=True) as tmp:
        pq.write_table(table, tmp)
    return tmp.final


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def parts_on_disk(folder: str | os.PathLike) -> dict[str, Path]:
    """key -> part file, for every finished part in the folder."""
    out = {}
    for p in Path(folder).glob("part-*.parquet"):
        m = _PART_RE.match(p.name)
        if m:
            out[m["key"]] = p
    return out


def _part_entries(folder: Path, keys: Iterable[str], table_key: str | None) -> list[dict]:
    on_disk = parts_on_disk(folder)
    check_parts_belong(folder, [on_disk[k] for k in keys], table_key)
    entries = []
    for key in keys:
        path = on_disk[key]
        sha = sha256_of(path)
        if not sha.startswith(_PART_RE.match(path.name)["sha"]):
            raise DamagedTableError(f"{path} changed after it was written (its checksum no "
                                    "longer matches its name): delete it and rerun")
        entries.append({"file": path.name, "rows": pq.ParquetFile(path).metadata.num_rows,
                        "sha256": sha})
    return entries


def write_table(folder: str | os.PathLike, df: pd.DataFrame, schema: pa.Schema,
                manifest: dict, key: dict | None = None,
                unique: list[str] | None = None) -> Path:
    """Write a one-part table and its manifest in the working folder, under the writer
    lock, then rename it into place."""
    folder = Path(folder)
    work = work_dir(folder)
    with writer_lock(lock_dir(folder)):
        clear_files(work)
        _check_unique(df.to_pandas() if isinstance(df, pa.Table) else df, unique, folder)
        _write_part(work, "00000", df, schema, key_sha_of(key))
        _write_manifest(work, manifest, key, unique, ["00000"])
        publish(work, folder)
    return folder


def key_sha_of(key: dict | None) -> str | None:
    from rlprobe_nb.tables.keys import key_sha

    return key_sha(key) if key is not None else None


def _write_manifest(folder: Path, manifest: dict, key: dict | None,
                    unique: list[str] | None, part_keys: list[str]) -> None:
    sha = key_sha_of(key)
    parts = _part_entries(folder, part_keys, sha)
    rows = int(sum(p["rows"] for p in parts))
    atomic_write_json(folder / MANIFEST, {
        **manifest, "key": key, "key_sha": sha, "unique": unique, "parts": parts,
        "shards": len(parts), "rows": rows, "parts_sha256": parts_checksum(parts, rows, sha),
        "complete": True})


def is_complete(folder: str | os.PathLike) -> bool:
    path = Path(folder) / MANIFEST
    return path.exists() and bool(read_json(path).get("complete"))


def read_manifest(folder: str | os.PathLike) -> dict:
    folder = Path(folder)
    if not is_complete(folder):
        raise FileNotFoundError(
            f"{folder} has no complete manifest: the notebook that writes it has not "
            "finished (run it first, or rerun it to resume)"
        )
    return read_json(folder / MANIFEST)


_VERIFIED: dict[tuple, bool] = {}  # (file, size, mtime_ns, sha, table key) checked here


def verify(folder: str | os.PathLike) -> dict:
    """Check a complete table against its manifest; returns the manifest.

    The manifest's part list must match its own checksum; the parts on disk must be
    exactly the listed ones, each with its row count, its sha256 and its table's key. A
    file checked once in this process is not hashed again while its size and mtime hold.
    """
    folder = Path(folder)
    man = read_manifest(folder)
    listed = {p["file"]: p for p in man.get("parts") or []}
    if not listed and man.get("rows"):
        raise DamagedTableError(f"{folder}: the manifest lists no parts (written by an older "
                                "version of the book?): rerun the notebook that writes it")
    if man.get("parts_sha256") != parts_checksum(man.get("parts") or [], man.get("rows"),
                                                 man.get("key_sha")):
        raise DamagedTableError(
            f"{folder / MANIFEST}: its part list does not match its checksum (edited, or "
            "written by an older version of the book): delete the table and rerun the "
            "notebook that writes it")
    _check_key_rows(folder, man)
    on_disk = {p.name for p in folder.glob("part-*.parquet")}
    extra, missing = sorted(on_disk - set(listed)), sorted(set(listed) - on_disk)
    if extra or missing:
        raise DamagedTableError(
            f"{folder} does not match its manifest: "
            + (f"parts not in the manifest (copied in?): {extra[:3]} " if extra else "")
            + (f"listed parts missing: {missing[:3]} " if missing else "")
            + "; delete the table and rerun the notebook that writes it")
    for name, entry in listed.items():
        _verify_part(folder / name, entry, man.get("key_sha"))
    total = sum(p["rows"] for p in listed.values())
    if total != man.get("rows"):
        raise DamagedTableError(f"{folder}: the manifest says {man.get('rows')} rows, its "
                                f"parts hold {total}")
    return man


def _check_key_rows(folder: Path, man: dict) -> None:
    """The manifest's key hashes to its key_sha (which every part carries), and where the
    key says how many rows the table has (``settings.rows``), the manifest has them: a
    part removed, with the part list, totals and checksum redone, is refused."""
    key = man.get("key")
    if key is None:
        return
    if man.get("key_sha") != key_sha_of(key):
        raise DamagedTableError(f"{folder / MANIFEST}: its key does not hash to its key_sha "
                                "(edited by hand?): delete the table and rerun the notebook "
                                "that writes it")
    want = (key.get("settings") or {}).get("rows") if isinstance(key, dict) else None
    if want is not None and man.get("rows") != want:
        raise DamagedTableError(
            f"{folder}: the manifest lists {man.get('rows')} rows, but the table was computed "
            f"to hold {want} (its key): a part was removed? delete the table and rerun the "
            "notebook that writes it")


def _verify_part(path: Path, entry: dict, table_key: str | None) -> None:
    st = path.stat()
    memo = (str(path), st.st_size, st.st_mtime_ns, entry["sha256"], table_key)
    if memo in _VERIFIED:
        return
    if sha256_of(path) != entry["sha256"]:
        raise DamagedTableError(f"{path} does not match its checksum in the manifest "
                                "(altered since it was written): delete the table and "
                                "rerun the notebook that writes it")
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except (OSError, pa.ArrowException) as err:
        raise DamagedTableError(f"{path} cannot be read as parquet ({err}): delete the "
                                "table and rerun the notebook that writes it") from err
    if rows != entry["rows"]:
        raise DamagedTableError(f"{path} has {rows} rows, its manifest says {entry['rows']}")
    check_parts_belong(path.parent, [path], table_key)
    _VERIFIED[memo] = True


def _check_unique(df: pd.DataFrame, unique: list[str] | None, folder: Path) -> None:
    if not unique or df.empty:
        return
    dup = df.duplicated(unique, keep=False)
    if dup.any():
        example = df.loc[dup, unique].head(3).to_dict("records")
        raise DamagedTableError(f"{folder}: {int(dup.sum())} rows share their key {unique}, "
                                f"e.g. {example}")


def read_table(folder: str | os.PathLike, schema: pa.Schema | None = None,
               columns: list[str] | None = None, filters=None,
               expect_key: dict | None = None) -> pd.DataFrame:
    """Every row of a complete, verified table (see ``verify``); with ``expect_key``, refuse
    a table computed from other inputs (StaleTableError naming the differences)."""
    folder = Path(folder)
    man = verify(folder)
    if expect_key is not None:
        check_key(folder, man, expect_key)
    parts = [folder / p["file"] for p in man["parts"]]
    if not parts:
        return (schema or pa.schema([])).empty_table().to_pandas()
    unique = man.get("unique") or []
    cols = None if columns is None else list(dict.fromkeys(list(columns) + unique))
    df = pq.read_table(parts, columns=cols, filters=filters, schema=schema).to_pandas()
    if filters is None:
        _check_unique(df, unique, folder)
    return df[list(columns)] if columns is not None else df


def check_key(folder: Path, man: dict, expect_key: dict) -> None:
    from rlprobe_nb.tables.keys import describe_difference, key_sha

    if man.get("key_sha") != key_sha(expect_key):
        producer = man.get("producer") or "the notebook that writes it"
        raise StaleTableError(
            f"{folder} was computed from other inputs than the current ones "
            f"({describe_difference(man.get('key'), expect_key)}); rerun {producer} "
            "(with overwrite=True where it refuses to replace the table)")


def plan_reuse(folder: str | os.PathLike, key: dict, overwrite: bool = False) -> bool:
    """Before any expensive work: True when the table is complete with this key (reuse
    it); False when it must be computed (missing, unfinished with this key, or
    ``overwrite``); StaleTableError naming the differences when it holds another key."""
    from rlprobe_nb.tables.keys import describe_difference, key_sha

    folder = Path(folder)
    for path in (folder / MANIFEST, work_dir(folder) / RUN_FILE):
        if path.exists():
            old = read_json(path).get("key")
            if key_sha(old) != key_sha(key):
                if overwrite:
                    return False
                raise StaleTableError(
                    f"{folder} holds {'a table' if path.name == MANIFEST else 'an unfinished run'} "
                    f"computed from other inputs ({describe_difference(old, key)}); rerun with "
                    "overwrite=True (notebook parameter `-p overwrite True`) to recompute it, "
                    "or restore the inputs")
    if is_complete(folder):
        verify(folder)
        return True
    return False


class ShardedTable:
    """A table written shard by shard, each shard atomic and named by its unit of work.

    Shards go to the hidden working folder (``work``); ``finish`` renames it into place.
    ``begin(key)`` takes the writer lock and records the key of the inputs: a table or an
    unfinished run with another key is refused, naming the differences (``overwrite=True``
    discards the run and, at finish, replaces the table), so shards of two different runs
    never mix; a shard written for another table (copied in) is refused. It returns True
    when the table is already complete with this key: nothing to do. ``done()`` lists
    finished shard keys; ``finish(manifest, expected)`` writes the manifest once every
    expected shard exists, renames the table into place and releases the lock.
    """

    def __init__(self, folder: str | os.PathLike, schema: pa.Schema,
                 unique: list[str] | None = None):
        self.folder = Path(folder)
        self.work = work_dir(self.folder)
        self.schema = schema
        self.unique = unique
        self.key: dict | None = None
        self._release = None

    def begin(self, key: dict | str, overwrite: bool = False, what: str = "") -> bool:
        from rlprobe_nb.tables.keys import describe_difference, key_sha

        key = key if isinstance(key, dict) else {"fingerprint": key}
        self.key = key
        self._lock(what)
        try:
            if is_complete(self.folder):
                old = read_json(self.folder / MANIFEST).get("key")
                if key_sha(old) == key_sha(key):
                    return True
                if not overwrite:
                    raise StaleTableError(
                        f"{self.folder} holds a table computed from other inputs or parameters "
                        f"({describe_difference(old, key)}); pass overwrite=True to "
                        "recompute it, or restore the inputs")
            self._resume_or_start(key, overwrite, describe_difference, key_sha)
            return False
        except BaseException:
            self.release()
            raise

    def _resume_or_start(self, key: dict, overwrite: bool, describe_difference, key_sha) -> None:
        run = self.work / RUN_FILE
        old = read_json(run).get("key") if run.exists() else None
        if run.exists() and key_sha(old) != key_sha(key):
            if not overwrite:
                raise StaleTableError(
                    f"{self.folder} holds an unfinished run with other inputs or parameters "
                    f"({describe_difference(old, key)}); pass overwrite=True to discard it "
                    "and recompute, or write to another folder")
            self.clear()
        elif not run.exists():
            self.clear()
        if not run.exists():
            atomic_write_json(run, {"key": key, "key_sha": key_sha(key)})
        for tmp in self.work.glob(".*.tmp*"):  # litter of a killed writer (we hold the lock)
            tmp.unlink()
        check_parts_belong(self.work, parts_on_disk(self.work).values(), key_sha(key))

    def _lock(self, what: str) -> None:
        if self._release is None:
            self._release = acquire_lock(lock_dir(self.folder), what)

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None

    def clear(self) -> None:
        clear_files(self.work)

    def key_sha(self) -> str | None:
        """This run's key hash: the one begun here, or (in a worker process of a run that
        another process began) the one its working folder records."""
        if self.key is not None:
            return key_sha_of(self.key)
        run = self.work / RUN_FILE
        return read_json(run).get("key_sha") if run.exists() else None

    def _complete(self) -> bool:
        """The table is in place, complete, with this run's key, and no run is open."""
        return not self.work.exists() and is_complete(self.folder) \
            and read_json(self.folder / MANIFEST).get("key_sha") == self.key_sha()

    def parts(self) -> dict[str, Path]:
        """shard key -> part file of every finished shard (in the table or its run)."""
        return parts_on_disk(self.folder if self._complete() else self.work)

    def done(self) -> set[str]:
        return set(self.parts())

    def write_shard(self, key: str, df: pd.DataFrame | pa.Table) -> Path:
        return _write_part(self.work, key, df, self.schema, self.key_sha())

    def finish(self, manifest: dict, expected: list[str]) -> Path:
        try:
            if self._complete() and self.done() == set(expected):
                return self.folder  # finished before: nothing was written this time
            missing = sorted(set(expected) - self.done())
            if missing:
                raise RuntimeError(f"{self.folder}: {len(missing)} shards missing, e.g. {missing[:3]}")
            extra = sorted(self.done() - set(expected))
            if extra:
                raise DamagedTableError(f"{self.folder}: shards {extra[:3]} belong to no part "
                                        "of this run; delete the folder and rerun")
            _write_manifest(self.work, manifest, self.key, self.unique, list(expected))
            if self.unique:
                read_table(self.work)  # the unique key holds over all shards
            publish(self.work, self.folder)
        finally:
            self.release()
        return self.folder


def run_shards(table: ShardedTable, jobs: list[tuple[str, Any]], manifest, progress: bool = True
               ) -> list[str]:
    """The generic resumable loop: run ``jobs`` ([(shard key, fn -> DataFrame)]) of a begun
    table, skipping finished shards, then write the manifest (``manifest``: a dict, or a
    function returning one once the shards exist). Returns the keys computed this time."""
    from rlprobe_nb.progress import tqdm

    try:
        done = table.done()
        todo = [(k, fn) for k, fn in jobs if k not in done]
        for key, fn in tqdm(todo, desc=f"{table.folder.name} shards", disable=not progress):
            table.write_shard(key, fn())
        table.finish(manifest() if callable(manifest) else manifest, [k for k, _ in jobs])
    finally:
        table.release()
    return [k for k, _ in todo]


def write_derived(folder: str | os.PathLike, df: pd.DataFrame, schema: pa.Schema,
                  manifest: dict, key: dict, unique: list[str] | None = None) -> bool:
    """A small table computed cheaply from its inputs (problems, selection, imported
    rollouts): kept as it is when a complete, intact copy has the same key, rewritten
    otherwise. Returns True when it wrote (downstream tables keyed on it then go stale)."""
    from rlprobe_nb.tables.keys import key_sha

    folder = Path(folder)
    if is_complete(folder) and read_json(folder / MANIFEST).get("key_sha") == key_sha(key):
        try:
            verify(folder)
            return False
        except DamagedTableError:
            pass
    write_table(folder, df, schema, manifest, key=key, unique=unique)
    return True

"""Tables on disk: parquet with an explicit schema, written atomically, with a manifest.

A table is a folder: ``part-*.parquet`` files plus ``manifest.json``. The manifest is
written last, so a folder without one is unfinished and is never read as a result.
Large tables are written in shards keyed by the unit of work; a rerun skips shards that
are complete, so an interrupted run resumes without lost or duplicated rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST = "manifest.json"
RUN_FILE = "_run.json"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``.

    On any error the temporary file is removed and ``path`` keeps its old content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Hidden, and ending in the target's suffix so writers that check it (papermill) agree.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}",
                               dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


# safetensors dtype names of the tensors the engine caches
_TENSOR_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64"}


def write_tensors(path: str | os.PathLike, tensors: dict, metadata: dict | None = None,
                  host_slices=None) -> Path:
    """Tensors as one safetensors file (readable by safetensors.safe_open), atomically.

    Written with plain file I/O from the tensors' own memory: no copy, and the GIL is
    released while the bytes go out, so a background writer does not stall the thread
    that keeps the GPU busy (safetensors' save_file copies the data and holds the GIL).
    Device tensors need ``host_slices(tensor)``: an iterator of CPU tensors that together
    are the tensor's bytes in order (the engine streams a GPU LM head through a small
    pinned buffer this way).
    """
    import torch
    header, sources, offset = {}, [], 0
    for name, tensor in tensors.items():
        dtype = str(tensor.dtype).replace("torch.", "")
        if dtype not in _TENSOR_DTYPES or (tensor.device.type != "cpu" and host_slices is None):
            raise TypeError(f"write_tensors takes CPU tensors of {sorted(_TENSOR_DTYPES)}, "
                            f"got {name!r}: {tensor.dtype} on {tensor.device}")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _TENSOR_DTYPES[dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        sources.append(host_slices(tensor) if tensor.device.type != "cpu" else [tensor])
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format's 8-byte alignment of the data
    with atomic_path(path) as tmp:
        with open(tmp, "wb", buffering=0) as f:
            f.write(len(blob).to_bytes(8, "little") + blob)
            for source in sources:
                for part in source:
                    view = memoryview(part.contiguous().reshape(-1).view(torch.uint8).numpy())
                    while view.nbytes:
                        view = view[f.write(view):]
        if os.path.getsize(tmp) != 8 + len(blob) + offset:
            raise RuntimeError(f"internal: {path} would have {os.path.getsize(tmp)} bytes, "
                               f"the header says {8 + len(blob) + offset}")
    return Path(path)


def read_tensors(path: str | os.PathLike, names: list[str] | None = None,
                 pin_memory: bool = False) -> tuple[dict, dict]:
    """(tensors, metadata) of a safetensors file, each tensor read straight into a fresh
    (optionally pinned) CPU tensor with the GIL released during the read."""
    import torch
    dtypes = {v: k for k, v in _TENSOR_DTYPES.items()}
    out = {}
    with open(path, "rb", buffering=0) as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        meta = header.pop("__metadata__", {}) or {}
        for name in names if names is not None else list(header):
            if name not in header:
                raise KeyError(f"{path} holds no tensor {name!r} (has {sorted(header)})")
            entry = header[name]
            if entry["dtype"] not in dtypes:
                raise TypeError(f"{path}: tensor dtype {entry['dtype']} not supported here")
            t = torch.empty(entry["shape"], dtype=getattr(torch, dtypes[entry["dtype"]]),
                            pin_memory=pin_memory)
            start, end = entry["data_offsets"]
            buf = memoryview(t.reshape(-1).view(torch.uint8).numpy())
            if buf.nbytes != end - start:
                raise ValueError(f"{path}: {name} has {end - start} bytes in the header, "
                                 f"{buf.nbytes} by its shape")
            f.seek(8 + size + start)
            while buf.nbytes:
                got = f.readinto(buf)
                if not got:
                    raise EOFError(f"{path} is truncated")
                buf = buf[got:]
            out[name] = t
    return out, meta


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
    if isinstance(df, pa.Table):
        if not df.schema.equals(schema):
            raise ValueError(f"table schema differs from the expected one:\n{df.schema}\nvs\n{schema}")
        table = df
    else:
        table = to_arrow(df, schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return Path(path)


def fingerprint(obj: Any) -> str:
    """A stable hash of JSON-able inputs (parameters, ids), to detect a changed rerun."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def write_table(folder: str | os.PathLike, df: pd.DataFrame, schema: pa.Schema,
                manifest: dict) -> Path:
    """Write a one-part table and its manifest (manifest last)."""
    folder = Path(folder)
    for old in folder.glob("part-*.parquet"):
        old.unlink()
    if (folder / MANIFEST).exists():
        (folder / MANIFEST).unlink()
    write_parquet(folder / "part-00000.parquet", df, schema)
    atomic_write_json(folder / MANIFEST, {**manifest, "rows": int(len(df)), "complete": True})
    return folder


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


def read_table(folder: str | os.PathLike, schema: pa.Schema | None = None,
               columns: list[str] | None = None, filters=None) -> pd.DataFrame:
    """Read every part of a complete table; refuse an unfinished one."""
    folder = Path(folder)
    read_manifest(folder)
    parts = sorted(folder.glob("part-*.parquet"))
    if not parts:
        return (schema or pa.schema([])).empty_table().to_pandas()
    table = pq.read_table(parts, columns=columns, filters=filters, schema=schema)
    return table.to_pandas()


class ShardedTable:
    """A table written shard by shard, each shard atomic and named by its unit of work.

    ``begin(fp)`` records the fingerprint of the inputs; a rerun with another fingerprint
    is refused (pass ``overwrite=True`` to start over), so shards of two different runs
    never mix. ``done()`` lists finished shard keys; ``finish(manifest)`` writes the
    manifest once every expected shard exists.
    """

    def __init__(self, folder: str | os.PathLike, schema: pa.Schema):
        self.folder = Path(folder)
        self.schema = schema

    def begin(self, fp: str, overwrite: bool = False) -> None:
        run = self.folder / RUN_FILE
        if run.exists() and read_json(run).get("fingerprint") != fp:
            if not overwrite:
                raise RuntimeError(
                    f"{self.folder} holds a run with other inputs or parameters "
                    f"(fingerprint {read_json(run).get('fingerprint')} != {fp}); "
                    "pass overwrite=True to discard it, or write to another folder"
                )
            self.clear()
        elif not run.exists():
            self.clear()
        if not run.exists():
            atomic_write_json(run, {"fingerprint": fp})

    def clear(self) -> None:
        if self.folder.exists():
            for f in self.folder.iterdir():
                if f.is_file():
                    f.unlink()

    def shard_path(self, key: str) -> Path:
        return self.folder / f"part-{key}.parquet"

    def done(self) -> set[str]:
        return {p.name[len("part-"):-len(".parquet")] for p in self.folder.glob("part-*.parquet")}

    def write_shard(self, key: str, df: pd.DataFrame | pa.Table) -> Path:
        return write_parquet(self.shard_path(key), df, self.schema)

    def finish(self, manifest: dict, expected: list[str]) -> Path:
        missing = sorted(set(expected) - self.done())
        if missing:
            raise RuntimeError(f"{self.folder}: {len(missing)} shards missing, e.g. {missing[:3]}")
        rows = sum(pq.ParquetFile(self.shard_path(k)).metadata.num_rows for k in expected)
        atomic_write_json(self.folder / MANIFEST,
                          {**manifest, "rows": int(rows), "shards": len(expected), "complete": True})
        return self.folder

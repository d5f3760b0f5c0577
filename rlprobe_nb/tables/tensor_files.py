"""Tensor files in the safetensors format, written and read with plain file I/O (the GIL
released while bytes move), optionally named by their content hash and verified on read."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

from rlprobe_nb.tables.atomic import FILE_MODE, DamagedTableError, _TempPath

# safetensors dtype names of the tensors the engine caches
_TENSOR_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64"}


def write_tensors(path: str | os.PathLike, tensors: dict, metadata: dict | None = None,
                  host_slices=None, content_named: bool = False) -> Path:
    """Tensors as one safetensors file (readable by safetensors.safe_open), atomically;
    returns where it went. ``content_named``: the file goes to
    ``<stem>.<first 16 hex of its sha256>.safetensors`` instead, the digest taken from the
    bytes as they go out (no second read).

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
    digest = hashlib.sha256()
    with _atomic_tensor_path(path, digest, content_named) as tmp:
        with open(tmp, "wb", buffering=0) as f:
            head = len(blob).to_bytes(8, "little") + blob
            digest.update(head)
            f.write(head)
            for source in sources:
                for part in source:
                    view = memoryview(part.contiguous().reshape(-1).view(torch.uint8).numpy())
                    digest.update(view)
                    while view.nbytes:
                        view = view[f.write(view):]
            os.fsync(f.fileno())
        if os.path.getsize(tmp) != 8 + len(blob) + offset:
            raise RuntimeError(f"internal: {path} would have {os.path.getsize(tmp)} bytes, "
                               f"the header says {8 + len(blob) + offset}")
    return tmp.final


@contextlib.contextmanager
def _atomic_tensor_path(path, digest, content_named: bool) -> Iterator[Path]:
    """atomic_path whose content name comes from the running digest (no second read)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp.safetensors",
                                dir=path.parent)
    os.close(fd)
    tmp = _TempPath(name)
    try:
        yield tmp
        final = (path.with_name(f"{path.stem}.{digest.hexdigest()[:16]}{path.suffix}")
                 if content_named else path)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, final)
        tmp.final = final
    finally:
        if tmp.exists():
            tmp.unlink()


def read_tensors(path: str | os.PathLike, names: list[str] | None = None,
                 pin_memory: bool = False, sha256: str | None = None) -> tuple[dict, dict]:
    """(tensors, metadata) of a safetensors file, each tensor read straight into a fresh
    (optionally pinned) CPU tensor with the GIL released during the read.

    With ``sha256`` (a full digest or a prefix of it) the whole file is read and checked:
    a file altered after it was written raises DamagedTableError.
    """
    import torch
    dtypes = {v: k for k, v in _TENSOR_DTYPES.items()}
    out = {}
    digest = hashlib.sha256() if sha256 else None
    with open(path, "rb", buffering=0) as f:
        raw = f.read(8)
        size = int.from_bytes(raw, "little")
        head = f.read(size)
        if len(raw) < 8 or len(head) < size:
            raise DamagedTableError(f"{path} is truncated (its header is cut short): delete "
                                    "it and rerun to recompute it")
        try:
            header = json.loads(head)
            meta = header.pop("__metadata__", {}) or {}
            if not all(isinstance(e, dict) and "data_offsets" in e for e in header.values()):
                raise ValueError("a tensor entry without data_offsets")
        except (ValueError, AttributeError, TypeError) as err:
            raise DamagedTableError(f"{path}: its header is not a safetensors header "
                                    f"({type(err).__name__}: {str(err)[:80]}): the file is "
                                    "damaged; delete it and rerun to recompute it") from err
        entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
        wanted = names if names is not None else [n for n, _ in entries]
        for name in wanted:
            if name not in header:
                raise KeyError(f"{path} holds no tensor {name!r} (has {sorted(header)})")
        if digest is not None:  # verify: read every tensor, in file order
            digest.update(raw + head)
            wanted_set, wanted = set(wanted), [n for n, _ in entries]
        for name in wanted:
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
            view = buf
            while view.nbytes:
                got = f.readinto(view)
                if not got:
                    raise EOFError(f"{path} is truncated")
                view = view[got:]
            if digest is not None:
                digest.update(buf)
                if name not in wanted_set:
                    continue
            out[name] = t
        if digest is not None and (f.read(1) or not digest.hexdigest().startswith(sha256)):
            raise DamagedTableError(f"{path} does not match the checksum it was written with "
                                    "(altered or damaged since): delete it and rerun to "
                                    "recompute it")
    return out, meta

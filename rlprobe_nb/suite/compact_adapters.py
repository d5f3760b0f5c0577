"""LoRA adapters in 8 bits: 56% of the bytes of bf16, decoded once into a cache for PEFT.

A LoRA adapter holds, per adapted linear layer, A (rank × in) and B (out × rank); the
update is B @ A. Each matrix is stored as int8 with one scale per row (absmax / 127):
value = round(weight / scale). The row's absmax is kept in float16 (float32 for a matrix
whose absmaxes fall outside float16's normal range). A scale per column of B (one per
rank component) would save another tenth of the bytes, but it moved the demo's forced
log-probs four times as much (up to 0.017 nats against 0.004). The demo suite's eleven
adapters are shipped this way, so that the repository stays small enough to clone
quickly and to carry to a GPU whole.

A compact adapter folder holds ``adapter_config.json`` and ``adapter_int8.safetensors``
(its metadata names the encoding and the sha256 of the original weights file). PEFT
cannot read it, so ``loadable`` decodes it to float32 ``adapter_model.safetensors`` in a
cache folder named after the compact file's hash (written atomically, reused after, and
verified against the sha256 of what it wrote each time it is used), and returns that folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rlprobe_nb.tables.atomic import atomic_folder

ENCODED_FILE = "adapter_int8.safetensors"
PEFT_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
ENCODING = "int8 per row, scale = absmax / 127 (absmax in float16)"
ABSMAX_SUFFIX = ".absmax"
FLOAT16_NORMAL = (2.0 ** -14, 65504.0)


class CompactAdapterError(ValueError):
    """A compact adapter folder is incomplete or not what it says."""


def _row_absmax(weight):
    """Each row's absmax, in float16 where every one is a normal float16 number."""
    import torch

    absmax = weight.abs().amax(dim=1, keepdim=True)
    low, high = FLOAT16_NORMAL
    nonzero = absmax[absmax > 0]
    if nonzero.numel() and nonzero.min() >= low and nonzero.max() <= high:
        return absmax.to(torch.float16)
    return absmax


def encode_tensors(state: dict) -> dict:
    """int8 values and per-row absmaxes for every (2-D) tensor of a LoRA state dict."""
    import torch

    out = {}
    for key, weight in state.items():
        if weight.dim() != 2:
            raise CompactAdapterError(f"{key!r} has shape {tuple(weight.shape)}: only "
                                      "matrices (LoRA's A and B) are encoded")
        w = weight.detach().to(torch.float32)
        absmax = _row_absmax(w)
        scale = absmax.to(torch.float32) / 127.0  # what decoding will multiply by
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row
        out[key] = torch.round(w / scale).clamp(-127, 127).to(torch.int8).contiguous()
        out[key + ABSMAX_SUFFIX] = absmax.contiguous()
    return out


def decode_tensors(encoded: dict) -> dict:
    """float32 weights from ``encode_tensors``' output."""
    import torch

    return {key: (value.to(torch.float32) * (encoded[key + ABSMAX_SUFFIX].to(torch.float32)
                                             / 127.0)).contiguous()
            for key, value in encoded.items() if not key.endswith(ABSMAX_SUFFIX)}


def encode_folder(source: str | os.PathLike, dest: str | os.PathLike,
                  texts: dict[str, str] | None = None) -> Path:
    """Write the compact form of the PEFT adapter in ``source`` to ``dest`` (atomically):
    its config, the int8 weights, and ``texts`` (file name -> content) beside them."""
    from safetensors.torch import load_file, save_file

    from rlprobe_nb.tables.provenance import sha256_file

    source, dest = Path(source), Path(dest)
    weights = source / PEFT_FILE
    if not weights.is_file() or not (source / CONFIG_FILE).is_file():
        raise CompactAdapterError(f"{source} is not a PEFT adapter folder "
                                  f"({CONFIG_FILE} and {PEFT_FILE} expected)")
    with atomic_folder(dest) as tmp:
        shutil.copyfile(source / CONFIG_FILE, tmp / CONFIG_FILE)
        for name, text in (texts or {}).items():
            (tmp / name).write_text(text)
        meta = {"encoding": ENCODING, "source_sha256": sha256_file(weights),
                "source_file": PEFT_FILE}
        save_file(encode_tensors(load_file(str(weights))), str(tmp / ENCODED_FILE), metadata=meta)
    return dest


def is_compact(folder: str | os.PathLike) -> bool:
    return (Path(folder) / ENCODED_FILE).is_file()


def metadata(folder: str | os.PathLike) -> dict:
    """The encoding and the original weights' sha256 recorded in a compact adapter."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / ENCODED_FILE), framework="pt") as f:
        return dict(f.metadata() or {})


DECODED_RECORD = "decoded_from.json"


def _decoded_state(target: Path, digest: str) -> str | None:
    """"older" for a decoded cache folder without a verifiable record (an older version
    of the book wrote none: decoded again), None when intact, else what is wrong. Its
    record names the compact file it was decoded from and the sha256 of each file it
    wrote; a byte changed in either file is found here."""
    from rlprobe_nb.tables.provenance import sha256_file

    try:
        record = json.loads((target / DECODED_RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "older"
    except (OSError, ValueError) as err:
        return f"its {DECODED_RECORD} cannot be read ({type(err).__name__})"
    if not isinstance(record, dict):
        return f"its {DECODED_RECORD} is not a mapping"
    if "written" not in record:
        return "older"
    written = record["written"]
    if not isinstance(written, dict) or record.get(ENCODED_FILE) != digest:
        return f"its {DECODED_RECORD} does not record the files decoded from {digest[:16]}"
    for name in (PEFT_FILE, CONFIG_FILE):
        if not (target / name).is_file() or sha256_file(target / name) != written.get(name):
            return f"{target / name} does not match the sha256 recorded when it was decoded"
    return None


def loadable(folder: str | os.PathLike, cache_root: str | os.PathLike) -> Path:
    """A folder PEFT can load: ``folder`` itself, or for a compact adapter its decoded
    copy under ``cache_root`` (made once, keyed by the compact file's sha256, and checked
    against the sha256 of each file it wrote every time it is used: a damaged copy is
    refused by name, never loaded)."""
    from safetensors.torch import load_file, save_file

    from rlprobe_nb.tables.provenance import sha256_file

    folder = Path(folder)
    if not is_compact(folder):
        return folder
    if not (folder / CONFIG_FILE).is_file():
        raise CompactAdapterError(f"{folder} holds {ENCODED_FILE} but no {CONFIG_FILE}")
    digest = sha256_file(folder / ENCODED_FILE)
    target = Path(cache_root) / digest[:16]
    state = _decoded_state(target, digest) if target.exists() else "absent"
    if state is None:
        return target
    if state not in ("absent", "older"):
        raise CompactAdapterError(
            f"the decoded copy of {folder / ENCODED_FILE} in {target} is damaged ({state}): "
            f"delete {target}; it is decoded again from {folder} on next use")
    # a folder of an older version is replaced; a new one is left to whoever wrote it first
    with atomic_folder(target, keep_existing=state == "absent") as tmp:
        shutil.copyfile(folder / CONFIG_FILE, tmp / CONFIG_FILE)
        save_file(decode_tensors(load_file(str(folder / ENCODED_FILE))), str(tmp / PEFT_FILE),
                  metadata={"format": "pt", "decoded_from_sha256": digest})
        written = {name: sha256_file(tmp / name) for name in (PEFT_FILE, CONFIG_FILE)}
        (tmp / DECODED_RECORD).write_text(json.dumps(
            {"folder": folder.name, ENCODED_FILE: digest, "written": written,
             **metadata(folder)}, indent=2) + "\n")
    return target

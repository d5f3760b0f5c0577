"""verl's FSDP shards (``model_world_size_W_rank_R.pt``, one ``torch.save`` of the sharded
state dict per rank, each value a DTensor sharded on dim 0) merged into safetensors, tensor
by tensor, without verl.

Every rank file is opened with ``torch.load(weights_only=True, mmap=True)`` (DTensors
unpickle safely once ``torch.distributed.tensor`` is imported), so at most one merged
tensor (plus one output shard of ``SHARD_BYTES``) is in memory. The values are written as
saved (verl's own merger casts everything to bf16). A LoRA run's shards (PEFT keys
``….lora_A.default.weight``) become a PEFT adapter folder; its alpha comes only from
``lora_train_meta.json`` (verl's merger writes 0 without it, which merges nothing), so
without that file and without ``--lora-alpha`` the checkpoint is refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator, Optional

from rlprobe_nb.suite.run_layouts import DiscoverError

SHARD_BYTES = 2 << 30
LORA_RE = re.compile(r"^(?P<module>.+)\.(?P<part>lora_[AB])(?:\.[^.]+)?\.weight$")
VERL_MERGER = "python -m verl.model_merger merge --backend fsdp --local_dir {actor} --target_dir OUT"


def open_shards(shards: list[Path]) -> list[dict]:
    import torch
    import torch.distributed.tensor  # noqa: F401 (registers DTensor for weights_only loads)

    states = []
    for p in shards:
        try:
            states.append(torch.load(p, map_location="cpu", weights_only=True, mmap=True))
        except Exception as exc:  # an unpicklable object, a truncated file
            raise DiscoverError(
                f"{p}: cannot be read as a sharded state dict with weights_only=True "
                f"({type(exc).__name__}: {str(exc)[:200]}). Merge it with verl's own tool in "
                f"your training environment: {VERL_MERGER.format(actor=p.parent)}") from exc
    keys = list(states[0])
    for p, s in zip(shards[1:], states[1:]):
        if list(s) != keys:
            raise DiscoverError(f"{p}: its keys differ from {shards[0].name}'s; the shards are "
                                "not of one save. Re-save or leave this step out with --steps")
    return states


def _local(value, key: str, path: Path):
    """(local tensor, shard dim or None, global shape) of one rank's value."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        if value.device_mesh.ndim != 1:
            raise DiscoverError(
                f"{path}: {key} is sharded over a {value.device_mesh.ndim}-D mesh "
                f"({value.device_mesh.mesh_dim_names}); only 1-D FSDP meshes are merged here. "
                f"Use verl's merger: {VERL_MERGER.format(actor=path.parent)}")
        placement = value.placements[0]
        if placement.is_shard():
            return value._local_tensor, placement.dim, tuple(value.shape)
        if placement.is_replicate():
            return value._local_tensor, None, tuple(value.shape)
        raise DiscoverError(f"{path}: {key} has placement {placement} (a partial sum); use "
                            f"verl's merger: {VERL_MERGER.format(actor=path.parent)}")
    if isinstance(value, torch.Tensor):
        return value, None, tuple(value.shape)
    raise DiscoverError(f"{path}: {key} is a {type(value).__name__}, not a tensor")


def merged(shards: list[Path], keep=lambda key: True) -> Iterator[tuple[str, object]]:
    """(key, full tensor) for every key ``keep`` accepts, in the shards' order."""
    import torch

    states = open_shards(shards)
    for key in states[0]:
        if not keep(key):
            continue
        parts = [_local(s[key], key, p) for s, p in zip(states, shards)]
        dim, shape = parts[0][1], parts[0][2]
        tensor = parts[0][0].clone() if dim is None else torch.cat([t for t, _, _ in parts], dim)
        if tuple(tensor.shape) != shape:
            raise DiscoverError(f"{shards[0].parent}: {key} merges to {tuple(tensor.shape)}, "
                                f"but the shards say {shape}; use verl's merger: "
                                f"{VERL_MERGER.format(actor=shards[0].parent)}")
        yield key, tensor.contiguous()


def write_safetensors(items, out: Path, prefix: str = "model",
                      dtype: Optional[str] = None) -> list[Path]:
    """Tensors into ``out``/<prefix>.safetensors (or numbered shards of at most
    SHARD_BYTES with an index), cast to ``dtype`` when given; returns the files written."""
    import torch
    from safetensors.torch import save_file

    cast = {"bfloat16": torch.bfloat16, "float32": torch.float32,
            "float16": torch.float16}.get(dtype or "")
    groups, group, size = [], {}, 0
    written: list[Path] = []

    def flush():
        nonlocal group, size
        if group:
            name = out / f".{prefix}-part{len(groups)}.safetensors"
            save_file(group, str(name), metadata={"format": "pt"})
            groups.append((name, list(group)))
        group, size = {}, 0

    seen: set[int] = set()
    for key, tensor in items:
        tensor = tensor.to(cast) if cast is not None else tensor
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:  # tied weights (embedding = head): safetensors refuses shared memory
            tensor = tensor.clone()
        seen.add(ptr)
        nbytes = tensor.numel() * tensor.element_size()
        if group and size + nbytes > SHARD_BYTES:
            flush()
        group[key], size = tensor, size + nbytes
    flush()
    if len(groups) == 1:
        final = out / f"{prefix}.safetensors"
        groups[0][0].rename(final)
        return [final]
    index = {"metadata": {}, "weight_map": {}}
    for i, (tmp, keys) in enumerate(groups, 1):
        final = out / f"{prefix}-{i:05d}-of-{len(groups):05d}.safetensors"
        tmp.rename(final)
        written.append(final)
        index["weight_map"].update({k: final.name for k in keys})
    idx = out / f"{prefix}.safetensors.index.json"
    idx.write_text(json.dumps(index, indent=2))
    return written + [idx]


def has_lora(shards: list[Path]) -> bool:
    """Whether the shards hold PEFT LoRA keys (reads rank 0's key names only)."""
    return any(LORA_RE.match(k) for k in open_shards(shards[:1])[0])


def lora_alpha(actor: Path, meta: Optional[Path], given: Optional[float]) -> tuple[int, float]:
    """(r, alpha) from lora_train_meta.json, or --lora-alpha; refused when neither says."""
    if meta is not None:
        info = json.loads(meta.read_text())
        if "lora_alpha" in info and "r" in info:
            return int(info["r"]), float(info["lora_alpha"])
    if given is None:
        raise DiscoverError(
            f"{actor}: LoRA shards but no lora_train_meta.json with r and lora_alpha: the "
            "adapter's scale alpha/r is unknown (verl's merger would write alpha 0, which "
            "merges nothing). Pass the run's actor_rollout_ref.model.lora_alpha: "
            "--lora-alpha ALPHA")
    return -1, float(given)


def write_fsdp_full(shards: list[Path], out: Path, dtype: Optional[str]) -> list[Path]:
    return write_safetensors(merged(shards), out, dtype=dtype)


def write_fsdp_lora(shards: list[Path], out: Path, r: int, alpha: float,
                    dtype: Optional[str]) -> list[Path]:
    """The LoRA keys of the shards as a PEFT adapter folder (the base weights in the shards
    are the reference's and are not written)."""
    found: dict[str, tuple] = {}

    def renamed():
        for key, tensor in merged(shards, keep=lambda k: bool(LORA_RE.match(k))):
            m = LORA_RE.match(key)
            found.setdefault(m["module"], {})[m["part"]] = tuple(tensor.shape)
            yield f"{m['module']}.{m['part']}.weight", tensor

    files = write_safetensors(renamed(), out, prefix="adapter_model", dtype=dtype)
    ranks = {shape[0] for parts in found.values() for part, shape in parts.items() if part == "lora_A"}
    if len(ranks) != 1 or (r > 0 and ranks != {r}):
        raise DiscoverError(f"{shards[0].parent}: LoRA ranks {sorted(ranks)} in the shards, "
                            f"lora_train_meta.json says r={r}; per-module ranks are not supported")
    rank = ranks.pop()
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
              "target_modules": sorted({m.rsplit(".", 1)[-1] for m in found}),
              "lora_dropout": 0.0, "bias": "none", "use_dora": False, "use_rslora": False,
              "fan_in_fan_out": False, "inference_mode": True, "base_model_name_or_path": None}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return files + [out / "adapter_config.json"]

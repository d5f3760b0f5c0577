"""Whole-state-dict conversions, without the trainers: DeepSpeed ZeRO-1/2 model states
(``mp_rank_00_model_states.pt``: its ``module`` is the full state dict in training
precision), torch distributed checkpoints (accelerate's ``pytorch_model_fsdp_0/``, NeMo-RL's
``policy/weights``) through torch's own ``dcp_to_torch_save``, and PEFT ``adapter_model.bin``
rewritten as safetensors. Every load is ``weights_only=True``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from rlprobe_nb.suite.convert_fsdp import write_safetensors
from rlprobe_nb.suite.run_layouts import DiscoverError

ZERO_TO_FP32 = ("python {ds_dir}/zero_to_fp32.py {ds_dir} OUT --tag {tag} --safe_serialization")


def _load(path: Path, fix: str):
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise DiscoverError(f"{path}: cannot be read with torch.load(weights_only=True) "
                            f"({type(exc).__name__}: {str(exc)[:200]}). {fix}") from exc


def unprefixed(state: dict, reference_keys: Optional[set]) -> dict:
    """The state dict with a wrapper's prefix removed ("module.", OpenRLHF's Actor "model.")
    where that makes its keys the reference's."""
    if reference_keys is None or set(state) == reference_keys:
        return state
    for prefix in ("module.", "model.", "module.model."):
        if all(k.startswith(prefix) for k in state):
            stripped = {k[len(prefix):]: v for k, v in state.items()}
            if set(stripped) <= reference_keys:
                return stripped
    return state


def write_zero12(states: Path, out: Path, dtype: Optional[str],
                 reference_keys: Optional[set]) -> list[Path]:
    ds_dir, tag = states.parent.parent, states.parent.name
    fix = ("Recover the weights with DeepSpeed in your training environment: "
           + ZERO_TO_FP32.format(ds_dir=ds_dir, tag=tag))
    blob = _load(states, fix)
    module = blob.get("module") if isinstance(blob, dict) else None
    if not isinstance(module, dict) or not module:
        raise DiscoverError(f"{states}: no 'module' state dict in the DeepSpeed model states. {fix}")
    module = unprefixed(module, reference_keys)
    return write_safetensors(((k, v.contiguous()) for k, v in module.items()), out, dtype=dtype)


def write_dcp(dcp_dir: Path, out: Path, unwrap: Optional[str], dtype: Optional[str],
              reference_keys: Optional[set]) -> list[Path]:
    """A torch distributed checkpoint -> safetensors (the whole state dict passes through
    memory once: torch's converter has no streaming form)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    tmp = out / ".dcp_state.pt"
    try:
        dcp_to_torch_save(str(dcp_dir), str(tmp))
    except Exception as exc:
        raise DiscoverError(f"{dcp_dir}: torch could not read the distributed checkpoint "
                            f"({type(exc).__name__}: {str(exc)[:200]}); is the save complete "
                            "(.metadata and every __R_0.distcp)?") from exc
    state = _load(tmp, "The checkpoint holds objects other than tensors.")
    if isinstance(state, dict) and set(state) == {unwrap or "model"} and isinstance(
            state[unwrap or "model"], dict):
        state = state[unwrap or "model"]
    if not isinstance(state, dict) or not state:
        raise DiscoverError(f"{dcp_dir}: the distributed checkpoint holds no model state dict")
    state = unprefixed(state, reference_keys)
    files = write_safetensors(((k, v.contiguous()) for k, v in state.items()), out, dtype=dtype)
    tmp.unlink()
    return files


def write_peft_bin(folder: Path, out: Path) -> list[Path]:
    """adapter_model.bin (OpenRLHF and open-instruct under ZeRO-3) -> adapter_model.safetensors,
    beside a copy of its adapter_config.json."""
    from safetensors.torch import save_file

    state = _load(folder / "adapter_model.bin", "Re-save the adapter with PEFT's "
                  "save_pretrained(safe_serialization=True).")
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    shutil.copy2(folder / "adapter_config.json", out / "adapter_config.json")
    return [out / "adapter_model.safetensors", out / "adapter_config.json"]

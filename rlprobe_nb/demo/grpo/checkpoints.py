"""What a run writes and reads back: LoRA adapters (bf16 safetensors + PEFT config) and
the resumable training state (LoRA weights, AdamW moments, RNG states, step), each
written atomically and without pickle."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch

from rlprobe_nb.demo.grpo.config import BASE_MODEL_ID, GRPOConfig


def lora_state(model) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}


class NonFiniteStateError(RuntimeError):
    """A state or adapter about to be saved holds a weight that is not finite."""


def check_finite(tensors: dict[str, torch.Tensor], what: str) -> None:
    """Refuse to save ``tensors`` when any holds NaN or inf, naming them: a state saved
    after a bad step could not resume (every later step NaN)."""
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise NonFiniteStateError(
            f"{what}: {len(bad)} tensors hold NaN or inf (e.g. {bad[:3]}); not saved. The "
            "training diverged: resume from the last saved state with a smaller learning "
            "rate, or look at the log's steps before this one")


def save_adapter(model, folder: Path, meta: dict, base_model: str = BASE_MODEL_ID) -> Path:
    """adapter_config.json + adapter_model.safetensors (bf16), written atomically.
    ``base_model`` names what the adapter sits on (recorded, never resolved)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    state = {k: v.to(torch.bfloat16) for k, v in lora_state(model).items()}
    check_finite(state, f"adapter {folder}")
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = dataclasses.replace(model.peft_config["default"], base_model_name_or_path=base_model)
    config.save_pretrained(str(tmp))
    save_file(state, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    (tmp / "rlprobe_training.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    _replace_dir(tmp, folder)
    return folder


def _replace_dir(tmp: Path, folder: Path) -> None:
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def save_state(out: Path, model, optimizer, step: int, rnd: int, cfg: GRPOConfig) -> None:
    from safetensors.torch import save_file

    state_dir = out / "state"
    weights = lora_state(model)
    check_finite(weights, f"training state at step {step} ({state_dir})")
    tmp = out / ".state.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(weights, str(tmp / "lora.safetensors"))
    opt = {}
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    for name, p in zip(names, params):
        st = optimizer.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq", "step"):
            if key in st:
                opt[f"{key}::{name}"] = torch.as_tensor(st[key]).detach().cpu().clone()
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["torch_cuda"] = torch.cuda.get_rng_state()
    check_finite(opt, f"optimizer state at step {step} ({state_dir})")
    save_file(opt, str(tmp / "optimizer.safetensors"))
    save_file(rng, str(tmp / "rng.safetensors"))
    (tmp / "progress.json").write_text(json.dumps(
        {"step": step, "round": rnd, "config": cfg.as_dict()}, indent=2) + "\n")
    _replace_dir(tmp, state_dir)


def load_state(out: Path, model, optimizer, cfg: GRPOConfig) -> tuple[int, int]:
    """Restore a saved state into model and optimizer; return (step, round) or (0, 0)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state_dir = out / "state"
    if not (state_dir / "progress.json").is_file():
        return 0, 0
    progress = json.loads((state_dir / "progress.json").read_text())
    if progress["config"] != cfg.as_dict():
        diff = {k: (progress["config"].get(k), v) for k, v in cfg.as_dict().items()
                if progress["config"].get(k) != v}
        raise RuntimeError(f"{state_dir} was written with another configuration "
                           f"(saved, now): {diff}; use another output folder or delete it")
    set_peft_model_state_dict(model, load_file(str(state_dir / "lora.safetensors")))
    opt = load_file(str(state_dir / "optimizer.safetensors"))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    for name, p in zip(names, params):
        st = {key: opt[f"{key}::{name}"].to(p.device) if key != "step" else opt[f"{key}::{name}"]
              for key in ("exp_avg", "exp_avg_sq", "step") if f"{key}::{name}" in opt}
        if st:
            optimizer.state[p] = st
    rng = load_file(str(state_dir / "rng.safetensors"))
    torch.set_rng_state(rng["torch_cpu"])
    if "torch_cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["torch_cuda"])
    return int(progress["step"]), int(progress["round"])


def load_adapter_weights(policy, adapter_dir: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    set_peft_model_state_dict(policy, {k: v.float() for k, v in state.items()})

"""A plain LoRA adapter merged into its base model's weights, without PEFT's wrappers.

PEFT loads an adapter by wrapping every targeted layer and then merges and unwraps them
(``merge_and_unload``): about 1.5 s for the demo's 210 adapted layers, plus 1.3 s to
import PEFT, each time a notebook loads a checkpoint. A plain LoRA adapter's merge is
W += (alpha / r) * B @ A per targeted linear layer, which is done here directly from the
adapter's safetensors, in the same order of operations as PEFT (the product in float32,
scaled, cast to the weight's dtype, added). Anything else (DoRA, rsLoRA, per-module
ranks or alphas, fan-in-fan-out layers, trained biases or embeddings, modules to save)
is left to PEFT: ``merge`` returns False and changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

PLAIN = {"peft_type": "LORA", "use_dora": False, "use_rslora": False, "fan_in_fan_out": False,
         "bias": "none"}
EMPTY = ("rank_pattern", "alpha_pattern", "modules_to_save", "trainable_token_indices",
         "layers_to_transform", "target_parameters")
PREFIX = "base_model.model."


def is_plain(config: dict) -> bool:
    """Whether an adapter config describes a LoRA that ``merge`` can merge exactly."""
    return (all(config.get(k, v) == v for k, v in PLAIN.items())
            and not any(config.get(k) for k in EMPTY))


def _pairs(state: dict) -> dict[str, tuple] | None:
    """Module name -> (A, B) for every LoRA pair of the state dict; None if it holds
    anything else."""
    pairs: dict[str, dict] = {}
    for key, tensor in state.items():
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if key.startswith(PREFIX) and key.endswith(suffix):
                pairs.setdefault(key[len(PREFIX):-len(suffix)], {})[part] = tensor
                break
        else:
            return None
    if any(len(p) != 2 for p in pairs.values()):
        return None
    return {name: (p["lora_A"], p["lora_B"]) for name, p in pairs.items()}


def merge(model, folder: str | Path) -> bool:
    """Merge the adapter in ``folder`` (PEFT's files) into ``model`` in place; False,
    with the model untouched, where the adapter is not a plain LoRA of linear layers."""
    import torch
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    if not is_plain(config):
        return False
    pairs = _pairs(load_file(str(folder / "adapter_model.safetensors")))
    if not pairs:
        return False
    layers = {}
    for name, (a, b) in pairs.items():
        try:
            layer = model.get_submodule(name)
        except AttributeError:
            return False
        if not isinstance(layer, torch.nn.Linear) or tuple(layer.weight.shape) != (b.shape[0], a.shape[1]):
            return False
        layers[name] = layer
    scaling = float(config["lora_alpha"]) / int(config["r"])
    with torch.no_grad():
        for name, (a, b) in pairs.items():
            weight = layers[name].weight
            delta = (b.to(weight.device, torch.float32) @ a.to(weight.device, torch.float32)) * scaling
            weight += delta.to(weight.dtype)
    return True

"""The trained policy: the base model with a fresh LoRA adapter, and the Sampler, a
plain copy of the base that generates with the adapter's update merged into its weights."""

from __future__ import annotations

import torch

from rlprobe_nb.demo.grpo.config import GRPOConfig


def load_policy(cfg: GRPOConfig, device: str, model=None, tokenizer=None):
    """The start model (fp32 weights: the base, with ``cfg.start_adapter`` merged in when
    set) with a fresh LoRA adapter, its tokenizer, and a Sampler."""
    from peft import LoraConfig, get_peft_model

    from rlprobe_nb.demo import end_of_turn

    if model is None:
        model, tokenizer = end_of_turn.training_model(dtype=torch.float32, device=device)
    if cfg.start_adapter:
        model = merge_adapter(model, cfg.start_adapter)
    sampler = Sampler(model, device)
    torch.manual_seed(cfg.seed)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                      target_modules=list(cfg.lora_target), bias="none", task_type="CAUSAL_LM")
    policy = get_peft_model(model, lora)
    return policy, tokenizer, sampler


def merge_adapter(model, adapter_dir):
    """The model with a saved LoRA adapter merged into its weights (a plain model again)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()


class Sampler:
    """A plain copy of the base model that generates with the LoRA update merged in.

    Generation is the cost of this loop, and it is bound by kernel launches: an unmerged
    LoRA layer adds three launches to each of the 210 adapted linears, and autocast adds a
    weight cast to each. So samples come from a bf16 (on GPU) copy whose adapted weights
    are set to W + scale * B @ A before each round. Log-probs for the loss are computed by
    the LoRA model itself, so the sampling copy only has to be close, not exact: the
    clipped ratio absorbs the bf16 rounding, as it does for vLLM samplers in TRL.
    """

    def __init__(self, base_model, device: str):
        import copy

        self.dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.model = copy.deepcopy(base_model).to(device=device, dtype=self.dtype).eval()
        self.model.generation_config = copy.deepcopy(base_model.generation_config)
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def sync(self, policy, use_adapter: bool = True) -> None:
        from peft.tuners.lora import LoraLayer

        for name, module in policy.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            target = self.model.get_submodule(name.removeprefix("base_model.model."))
            w = module.base_layer.weight.float()
            if use_adapter:
                a = module.lora_A["default"].weight.float()
                b = module.lora_B["default"].weight.float()
                w = w + module.scaling["default"] * (b @ a)
            target.weight.copy_(w.to(self.dtype))

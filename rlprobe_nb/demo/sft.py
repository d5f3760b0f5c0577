"""The demo suite's supervised stage: SmolLM2-135M-Instruct learns to write the problem
generator's step-by-step solutions (LoRA), and becomes the suite's reference model.

Why a supervised stage: the book compares RLVR checkpoints with the model RL started
from, on that model's wrong answers. Like Tulu 3 (SFT -> DPO -> RLVR), the start must
already write well-formed, boxed solutions, so that its wrong answers are wrong
*arithmetic* and the RL run has to change arithmetic, not format. The base model almost
never writes a box; after this stage it nearly always does, and it is still often wrong.

* data: training-split problems (``problems.arithmetic``), prompted exactly as the book
  prompts (``suite.prompting``); the target is the solution followed by EOS, and the
  loss counts target tokens only;
* LoRA on every linear layer of the base, AdamW, linear warm-up then a constant rate,
  bf16 autocast on a GPU;
* at ``eval_steps`` the adapter is saved and evaluated greedily on held-out
  training-split problems (the *dev* set: never the test problems the book studies):
  the share of boxed answers and the accuracy (the demo's verdict);
* the reference is the checkpoint chosen by ``select_checkpoint`` from those numbers
  alone: nearly always boxed, and right on a fraction of problems inside
  ``accuracy_range`` (so RL has room to improve it). The choice and every evaluated
  step are written to ``sft/selection.json``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rlprobe_nb.demo.grpo.checkpoints import save_adapter
from rlprobe_nb.demo.grpo.generation import generate
from rlprobe_nb.demo.grpo.logprobs import autocast
from rlprobe_nb.problems import arithmetic
from rlprobe_nb.suite import prompting

LOG_COLUMNS = ["step", "loss", "target_tokens", "lr", "seconds"]


@dataclass
class SFTConfig:
    seed: int = 0
    steps: int = 400
    batch_size: int = 32
    learning_rate: float = 2e-4
    warmup_steps: int = 20
    lora_r: int = 8
    lora_alpha: int = 16
    lora_target: tuple = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                          "down_proj")
    train_problems: int = 8000
    dev_problems: int = 300
    eval_steps: tuple = (10, 20, 30, 40, 60, 80, 100, 150, 200, 300, 400)
    eval_max_new_tokens: int = 160
    min_boxed: float = 0.97
    accuracy_range: tuple = (0.25, 0.45)

    def validate(self) -> None:
        for name in ("steps", "batch_size", "lora_r", "train_problems", "dev_problems"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SFTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.eval_steps or any(s < 1 or s > self.steps for s in self.eval_steps):
            raise ValueError(f"SFTConfig.eval_steps {self.eval_steps} must lie in 1..{self.steps}")
        lo, hi = self.accuracy_range
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"SFTConfig.accuracy_range {self.accuracy_range} is not a range in [0, 1]")

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()}


def split_data(cfg: SFTConfig) -> tuple[list[dict], list[dict]]:
    """Training examples and the dev set: both from the training split, disjoint by
    canonical arithmetic (the test split is never touched)."""
    pool = arithmetic.generate_problems("train", cfg.train_problems + cfg.dev_problems, cfg.seed)
    rng = random.Random(f"sft-dev:{cfg.seed}")
    dev_keys = {p["canonical"] for p in rng.sample(pool, cfg.dev_problems)}
    train = [p for p in pool if p["canonical"] not in dev_keys]
    dev = [p for p in pool if p["canonical"] in dev_keys]
    return train, dev


def encode(tokenizer, problem: dict) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids): the book's chat prompt, then the solution and EOS."""
    prompt = prompting.prompt_ids(tokenizer, problem["problem"])
    target = tokenizer(problem["solution"], add_special_tokens=False)["input_ids"]
    return prompt, [int(t) for t in target] + [tokenizer.eos_token_id]


def batch(examples: list[tuple[list[int], list[int]]], pad_id: int, device):
    """Right-padded inputs with labels -100 on prompt and padding tokens."""
    width = max(len(p) + len(t) for p, t in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (p, t) in enumerate(examples):
        seq = p + t
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, len(p):len(seq)] = torch.tensor(t)
        mask[i, :len(seq)] = 1
    return ids.to(device), mask.to(device), labels.to(device)


def select_checkpoint(evals: list[dict], min_boxed: float, accuracy_range) -> dict:
    """The evaluated step the reference is taken from.

    Among steps whose boxed share is at least ``min_boxed``: the latest whose accuracy
    lies in ``accuracy_range``; if every such step is more accurate than the range, the
    earliest of them; if every one is less accurate, the latest. With no step boxed
    often enough, the step with the highest boxed share. ``why`` says which case held.
    """
    lo, hi = accuracy_range
    boxed = [e for e in evals if e["boxed"] >= min_boxed]
    if not boxed:
        best = max(evals, key=lambda e: (e["boxed"], e["step"]))
        return {**best, "why": f"no step boxed >= {min_boxed}: the most boxed"}
    inside = [e for e in boxed if lo <= e["accuracy"] <= hi]
    if inside:
        return {**max(inside, key=lambda e: e["step"]), "why": "latest in range"}
    if all(e["accuracy"] > hi for e in boxed):
        return {**min(boxed, key=lambda e: e["step"]), "why": "all above range: earliest"}
    return {**max(boxed, key=lambda e: e["step"]), "why": "all below range: latest"}


def evaluate_dev(sampler, policy, tokenizer, dev: list[dict], device: str, max_new_tokens: int,
                 workers: int, use_adapter: bool = True) -> dict:
    """Greedy answers on the dev set (of the base with the adapter merged in, or of the
    base alone): boxed share, accuracy, accuracy by problem kind."""
    from rlprobe_nb.demo.grpo.advantages import is_correct
    from rlprobe_nb.problems import grading

    sampler.sync(policy, use_adapter=use_adapter)
    prompts = [prompting.prompt_ids(tokenizer, p["problem"]) for p in dev]
    completions, stopped = generate(sampler.model, tokenizer, prompts, max_new_tokens, None, device)
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    grades = grading.grade_many(texts, [p["answer"] for p in dev], timeout_s=5.0, workers=workers)
    correct = [is_correct(g) for g in grades]
    by_kind: dict[str, list[bool]] = {}
    for p, c in zip(dev, correct):
        by_kind.setdefault(p["kind"], []).append(c)
    return {"boxed": sum(g.n_boxes >= 1 for g in grades) / len(dev),
            "accuracy": sum(correct) / len(dev),
            "stopped": sum(stopped) / len(dev),
            "by_kind": {k: sum(v) / len(v) for k, v in sorted(by_kind.items())},
            "example": texts[0]}


def train(cfg: SFTConfig, out: str | Path, device: str = "cuda", workers: int = 8,
          model=None, tokenizer=None, progress: bool = True) -> dict:
    """Run the supervised stage into ``out``; returns the selection (see module doc).

    Writes ``log.csv``, ``checkpoints/sft_step_N/`` (one adapter per evaluated step),
    ``selection.json`` and the chosen adapter as ``adapters/dpo/`` (``out`` is the
    training run's own folder, e.g. ``<run>/sft``)."""
    from peft import LoraConfig, get_peft_model

    from rlprobe_nb.demo import end_of_turn
    from rlprobe_nb.demo.grpo.policy import Sampler
    from rlprobe_nb.progress import tqdm

    cfg.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if model is None:
        model, tokenizer = end_of_turn.training_model(dtype=torch.float32, device=device)
    train_set, dev = split_data(cfg)
    examples = [encode(tokenizer, p) for p in train_set]
    sampler = Sampler(model, device)
    torch.manual_seed(cfg.seed)
    policy = get_peft_model(model, LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
        target_modules=list(cfg.lora_target), bias="none", task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad],
                                  lr=cfg.learning_rate, weight_decay=0.0)
    evals = [{"step": 0, **_eval(sampler, policy, tokenizer, dev, device, cfg, workers, base=True)}]
    rng = random.Random(f"sft:{cfg.seed}")
    order: list[int] = []
    log = out / "log.csv"
    with open(log, "w", newline="") as f:
        csv.DictWriter(f, LOG_COLUMNS).writeheader()
    t0 = time.time()
    for step in tqdm(range(1, cfg.steps + 1), disable=not progress, desc="SFT steps"):
        if len(order) < cfg.batch_size:  # epochs in a seeded order
            more = list(range(len(examples)))
            rng.shuffle(more)
            order += more
        idx, order = order[:cfg.batch_size], order[cfg.batch_size:]
        row = _sft_step(policy, optimizer, [examples[i] for i in idx], cfg, step,
                        tokenizer.pad_token_id, device)
        with open(log, "a", newline="") as f:
            csv.DictWriter(f, LOG_COLUMNS).writerow({**row, "seconds": round(time.time() - t0, 2)})
        if step in cfg.eval_steps:
            save_adapter(policy, out / "checkpoints" / f"sft_step_{step}",
                         {"stage": "sft", "step": step, "config": cfg.as_dict(),
                          "stop_tokens": [tokenizer.eos_token]})
            evals.append({"step": step, **_eval(sampler, policy, tokenizer, dev, device, cfg, workers)})
            print(f"SFT step {step}: boxed {evals[-1]['boxed']:.3f} "
                  f"accuracy {evals[-1]['accuracy']:.3f}", flush=True)
    chosen = select_checkpoint([e for e in evals if e["step"] > 0], cfg.min_boxed,
                               cfg.accuracy_range)
    target = out / "adapters" / "dpo"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(out / "checkpoints" / f"sft_step_{chosen['step']}", target)
    selection = {"chosen_step": chosen["step"], "why": chosen["why"], "evals": evals,
                 "config": cfg.as_dict(), "dev_problems": [p["unique_id"] for p in dev],
                 "seconds": round(time.time() - t0, 1)}
    (out / "selection.json").write_text(json.dumps(selection, indent=2) + "\n")
    return selection


def _eval(sampler, policy, tokenizer, dev, device, cfg, workers, base: bool = False) -> dict:
    policy.eval()
    res = evaluate_dev(sampler, policy, tokenizer, dev, device, cfg.eval_max_new_tokens, workers,
                       use_adapter=not base)
    policy.train()
    return res


def _sft_step(policy, optimizer, examples, cfg: SFTConfig, step: int, pad_id: int,
              device: str) -> dict:
    ids, mask, labels = batch(examples, pad_id, device)
    lr = cfg.learning_rate * min(1.0, step / max(1, cfg.warmup_steps))
    for g in optimizer.param_groups:
        g["lr"] = lr
    with autocast(device):
        logits = policy(input_ids=ids, attention_mask=mask).logits[:, :-1]
    target = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             target.reshape(-1), ignore_index=-100)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    return {"step": step, "loss": float(loss), "target_tokens": int((target != -100).sum()),
            "lr": lr}

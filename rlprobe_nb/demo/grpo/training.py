"""The GRPO loop: rounds of sampling, rewarding and scoring, then clipped-ratio optimizer
steps with a KL penalty to the start model; logs each step to a CSV and resumes from the
last saved state. A step whose loss or gradient norm is not finite is skipped (the
weights stay as they were; the log's ``skipped`` column marks it), and no state or
adapter with a non-finite weight is ever saved (``checkpoints``)."""

from __future__ import annotations

import csv
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

from rlprobe_nb.demo.grpo.advantages import group_advantages, permuted_rewards
from rlprobe_nb.demo.grpo.checkpoints import load_state, save_adapter, save_state
from rlprobe_nb.demo.grpo.config import BASE_MODEL_ID, GRPOConfig
from rlprobe_nb.demo.grpo.generation import generate
from rlprobe_nb.demo.grpo.logprobs import (
    batch_tensors,
    chunked_logprobs,
    completion_logprobs,
)
from rlprobe_nb.demo.grpo.policy import load_policy
from rlprobe_nb.problems import arithmetic
from rlprobe_nb.suite import prompting

LOG_COLUMNS = [
    "step", "round", "reward_mean", "accuracy", "format_rate", "kl_to_start", "loss",
    "clip_frac", "completion_len_mean", "completion_len_max", "truncated_frac",
    "grad_norm", "lr", "skipped", "seconds",
]


def train(cfg: GRPOConfig, out: str | os.PathLike, device: str = "cuda", workers: int = 8,
          model=None, tokenizer=None, progress: bool = True):
    """Run (or resume) GRPO; writes ``out/train_log.csv``, ``out/adapters/<prefix>_step_N``."""
    from rlprobe_nb.progress import tqdm

    cfg.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    policy, tokenizer, sampler = load_policy(cfg, device, model, tokenizer)
    policy.train()
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, betas=(0.9, 0.99),
                                  weight_decay=0.0)
    step, rnd = load_state(out, policy, optimizer, cfg)
    if step == 0:
        torch.manual_seed(cfg.seed)
    log_path = _restart_log(out / "train_log.csv", step)
    pool = arithmetic.generate_problems("train", cfg.train_pool_size, cfg.seed)
    prompt_cache: dict[str, list[int]] = {}
    bar = tqdm(total=cfg.total_steps, initial=step, disable=not progress, desc="GRPO steps")
    last_ckpt, t0, skipped = step, time.time(), 0
    while step < cfg.total_steps:
        batch = _sample_round(policy, sampler, tokenizer, cfg, pool, prompt_cache, rnd, device,
                              workers)
        for idx in _minibatches(cfg, rnd, len(batch["prompts"])):
            if step >= cfg.total_steps:
                break
            stats = _train_step(policy, optimizer, cfg, device, tokenizer.pad_token_id, batch,
                                idx, step)
            step += 1
            if stats["skipped"]:
                skipped += 1
                print(f"step {step}: loss {stats['loss']}, gradient norm {stats['grad_norm']}: "
                      f"not finite, step skipped (weights unchanged; {skipped} skipped so far "
                      "in this process)", flush=True)
            row = _log_row(step, rnd, batch, idx, stats, optimizer, t0)
            with open(log_path, "a", newline="") as f:
                csv.DictWriter(f, LOG_COLUMNS).writerow(row)
            bar.update(1)
            bar.set_postfix(acc=f"{row['accuracy']:.2f}", kl=f"{row['kl_to_start']:.3f}")
            if step in cfg.save_steps or step == cfg.total_steps:
                save_adapter(policy, out / "adapters" / f"{cfg.adapter_prefix}_step_{step}",
                             {"step": step, "config": cfg.as_dict(),
                              "stop_tokens": [tokenizer.eos_token]}, base_model=_base_name(cfg))
        rnd += 1
        if step - last_ckpt >= cfg.checkpoint_every or step >= cfg.total_steps:
            save_state(out, policy, optimizer, step, rnd, cfg)
            last_ckpt = step
    bar.close()
    return policy, tokenizer, sampler


def _base_name(cfg: GRPOConfig) -> str:
    if not cfg.start_adapter:
        return BASE_MODEL_ID
    return f"{BASE_MODEL_ID} + adapter {Path(cfg.start_adapter).name} (merged)"


def _restart_log(log_path: Path, step: int) -> Path:
    """The log with the rows of steps up to ``step`` (those a resumed run keeps)."""
    old_rows = []
    if log_path.exists():
        with open(log_path) as f:
            old_rows = [r for r in csv.DictReader(f) if int(r["step"]) <= step]
    with open(log_path, "w", newline="") as f:
        w = csv.DictWriter(f, LOG_COLUMNS)
        w.writeheader()
        w.writerows(old_rows)
    return log_path


def _sample_round(policy, sampler, tokenizer, cfg, pool, prompt_cache, rnd, device, workers):
    """A round's problems, completions from the current policy, rewards, advantages and
    the log-probs the loss compares with (policy at sampling time, and the start model)."""
    from rlprobe_nb.demo import grpo  # the package: the tests replace grpo.rewards

    # Problems of a round depend only on (seed, round): a resumed run sees the same.
    per_round = cfg.prompts_per_step * cfg.steps_per_generation
    picks = random.Random(f"{cfg.seed}:round:{rnd}").choices(pool, k=per_round)
    prompts = []
    for p in picks:
        if p["unique_id"] not in prompt_cache:
            prompt_cache[p["unique_id"]] = prompting.prompt_ids(tokenizer, p["problem"])
        prompts.extend([prompt_cache[p["unique_id"]]] * cfg.group_size)
    golds = [p["answer"] for p in picks for _ in range(cfg.group_size)]
    policy.eval()
    sampler.sync(policy)
    completions, stopped = generate(sampler.model, tokenizer, prompts, cfg.max_new_tokens,
                                    cfg.temperature, device)
    r, correct, well_formed, _ = grpo.rewards(tokenizer, completions, stopped, golds,
                                              cfg.format_weight, workers,
                                              cfg.answer_must_be_number)
    if cfg.reward == "permuted":
        r = permuted_rewards(r, cfg.seed, rnd)
    old_lp = chunked_logprobs(policy, prompts, completions, tokenizer.pad_token_id, device,
                              cfg.logprob_chunk)
    with policy.disable_adapter():
        ref_lp = chunked_logprobs(policy, prompts, completions, tokenizer.pad_token_id, device,
                                  cfg.logprob_chunk)
    policy.train()
    return {"prompts": prompts, "completions": completions, "stopped": stopped, "reward": r,
            "correct": correct, "well_formed": well_formed,
            "advantage": group_advantages(r, cfg.group_size), "old_lp": old_lp, "ref_lp": ref_lp}


def _minibatches(cfg, rnd: int, n: int) -> list[list[int]]:
    """The round's completions in ``steps_per_generation`` minibatches of whole groups
    (each step sees complete comparisons), in a seeded order."""
    order = np.arange(n).reshape(-1, cfg.group_size)
    order = order[np.random.default_rng([cfg.seed, rnd]).permutation(len(order))]
    return [mb.ravel().tolist() for mb in np.array_split(order, cfg.steps_per_generation)]


def _train_step(policy, optimizer, cfg, device, pad_id, batch, idx, step) -> dict:
    from rlprobe_nb.demo import grpo  # the package: the tests replace grpo._optimizer_step

    # Linear warm-up, then constant; a function of the step, so resuming needs no
    # scheduler state.
    for g in optimizer.param_groups:
        g["lr"] = cfg.learning_rate * min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    pick = lambda key: [batch[key][i] for i in idx]  # noqa: E731
    return grpo._optimizer_step(policy, optimizer, cfg, device, pad_id, pick("prompts"),
                                pick("completions"),
                                torch.tensor(batch["advantage"][idx], dtype=torch.float32),
                                pick("old_lp"), pick("ref_lp"))


def _log_row(step, rnd, batch, idx, stats, optimizer, t0) -> dict:
    lens = [len(batch["completions"][i]) for i in idx]
    return {
        "step": step, "round": rnd,
        "reward_mean": float(batch["reward"][idx].mean()),
        "accuracy": float(batch["correct"][idx].mean()),
        "format_rate": float(batch["well_formed"][idx].mean()),
        "kl_to_start": stats["kl"], "loss": stats["loss"], "clip_frac": stats["clip_frac"],
        "completion_len_mean": float(np.mean(lens)), "completion_len_max": int(np.max(lens)),
        "truncated_frac": float(np.mean([not batch["stopped"][i] for i in idx])),
        "grad_norm": stats["grad_norm"], "lr": optimizer.param_groups[0]["lr"],
        "skipped": int(stats["skipped"]), "seconds": round(time.time() - t0, 2),
    }


def _optimizer_step(policy, optimizer, cfg, device, pad_id, prompts, completions, adv,
                    old_lp, ref_lp) -> dict:
    ids, mask, pos, c_ids, c_mask = batch_tensors(prompts, completions, pad_id, device)
    width = c_ids.shape[1]

    def padded(rows):
        t = torch.zeros((len(rows), width), dtype=torch.float32)
        for i, row in enumerate(rows):
            t[i, :len(row)] = row
        return t.to(device)

    old, ref = padded(old_lp), padded(ref_lp)
    m = c_mask.float()
    logp = completion_logprobs(policy, ids, mask, pos, c_ids, device)
    # Log-ratios are clamped before exp, and k3 after, as verl does: a token the bf16
    # sampler drew that the policy all but rules out (log-prob ~ -100) made exp overflow
    # to inf and the loss NaN (the demo's placebo run diverged so at step ~970).
    ratio = torch.exp((logp - old).clamp(-20.0, 20.0))
    a = adv.to(device).unsqueeze(1)
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * a)
    delta = (ref - logp).clamp(-20.0, 20.0)
    k3 = (torch.exp(delta) - delta - 1).clamp(max=10.0)
    per_token = -surrogate + cfg.beta * k3
    loss = (per_token * m).sum() / m.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(
        [p for p in policy.parameters() if p.requires_grad], cfg.grad_clip)
    # A step whose loss or gradient norm is not finite is skipped: stepped anyway, it made
    # every weight NaN (the demo's second placebo run, step 1013) and the run was lost.
    skipped = not (torch.isfinite(loss) and torch.isfinite(grad_norm))
    if skipped:
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > cfg.clip_eps).float()
        return {"loss": float(loss), "kl": float((k3 * m).sum() / m.sum()),
                "clip_frac": float((clipped * m).sum() / m.sum()),
                "grad_norm": float(grad_norm), "skipped": bool(skipped)}

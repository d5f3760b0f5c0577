"""Train the demo suite's models and evaluate them: a miniature of SFT -> DPO -> RLVR.

    python scripts/train_demo_suite.py --out runs/demo all        # on a GPU: every stage

Stages (each can be run alone; ``all`` runs them in order, the two GRPO runs at once):

  sft      supervised LoRA on the generator's step-by-step solutions; the checkpoint the
           selection rule picks becomes the reference ``dpo``   -> <out>/sft/
  rlvr     GRPO from the reference with the verifiable reward   -> <out>/rlvr/
  placebo  the same GRPO, same seeds and steps, rewards permuted within each round
                                                                 -> <out>/placebo/
  eval     the reference and every saved adapter on held-out test problems, greedy and
           sampled, graded                                       -> <out>/eval_rows.jsonl

A CPU dry run of every stage in a minute (tiny settings):

    python scripts/train_demo_suite.py --out /tmp/dbg --device cpu --tiny all

<out>/run.json records the command, configurations, seeds, versions, timings and the stop
token every model was trained to end with: the GGUF metadata's EOS. A tokenizer whose EOS
disagrees with the metadata (a transformers version that converts it otherwise) is
refused before any stage starts. A rerun with the same --out resumes GRPO from its saved
state and redoes the evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from rlprobe_nb.demo import end_of_turn, grpo, sft  # noqa: E402
from rlprobe_nb.problems import arithmetic  # noqa: E402
from rlprobe_nb.tables import provenance  # noqa: E402

STAGES = ("sft", "rlvr", "placebo", "eval", "all")
SAVE_STEPS = (50, 100, 200, 400, 800, 1200)


def parse_args(argv=None):
    d = grpo.GRPOConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=STAGES)
    ap.add_argument("--out", required=True, help="run folder (resumed if it exists)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a CPU dry run: a few steps of each")
    ap.add_argument("--sft-steps", type=int, default=sft.SFTConfig.steps)
    ap.add_argument("--steps", type=int, default=d.total_steps, help="GRPO optimizer steps")
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=d.group_size)
    ap.add_argument("--steps-per-generation", type=int, default=16)
    ap.add_argument("--lr", type=float, default=d.learning_rate)
    ap.add_argument("--beta", type=float, default=d.beta)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--save-steps", default=",".join(map(str, SAVE_STEPS)))
    ap.add_argument("--workers", type=int, default=6, help="grading worker processes per stage")
    ap.add_argument("--eval-problems", type=int, default=300)
    ap.add_argument("--eval-samples", type=int, default=4)
    ap.add_argument("--eval-temperature", type=float, default=0.7)
    ap.add_argument("--eval-max-new-tokens", type=int, default=192)
    ap.add_argument("--eval-seed", type=int, default=1234)
    return ap.parse_args(argv)


def sft_config(args) -> sft.SFTConfig:
    if args.tiny:
        return sft.SFTConfig(seed=args.seed, steps=4, batch_size=4, train_problems=40,
                             dev_problems=6, eval_steps=(2, 4), eval_max_new_tokens=12)
    return sft.SFTConfig(seed=args.seed, steps=args.sft_steps)


def grpo_config(args, reward: str) -> grpo.GRPOConfig:
    common = dict(seed=args.seed, reward=reward, format_weight=0.1,
                  adapter_prefix="rlvr" if reward == "verifiable" else "placebo",
                  start_adapter=str(Path(args.out) / "sft" / "adapters" / "dpo"))
    if args.tiny:
        return grpo.GRPOConfig(**common, total_steps=4, prompts_per_step=2, group_size=2,
                               steps_per_generation=2, max_new_tokens=8, save_steps=(2, 4),
                               checkpoint_every=2, train_pool_size=20, warmup_steps=1)
    return grpo.GRPOConfig(
        **common, total_steps=args.steps, prompts_per_step=args.prompts_per_step,
        group_size=args.group_size, steps_per_generation=args.steps_per_generation,
        learning_rate=args.lr, beta=args.beta, max_new_tokens=args.max_new_tokens,
        save_steps=tuple(int(s) for s in args.save_steps.split(",") if s))


def run_sft(args) -> dict:
    selection = sft.train(sft_config(args), Path(args.out) / "sft", device=args.device,
                          workers=args.workers)
    print(f"reference = SFT step {selection['chosen_step']} ({selection['why']})", flush=True)
    return {"chosen_step": selection["chosen_step"], "why": selection["why"]}


def run_grpo(args, reward: str) -> dict:
    cfg = grpo_config(args, reward)
    t0 = time.time()
    grpo.train(cfg, Path(args.out) / cfg.adapter_prefix, device=args.device,
               workers=args.workers)
    return {"config": cfg.as_dict(), "seconds": round(time.time() - t0, 1)}


def run_both_grpo(args) -> dict:
    """The verifiable and the placebo run as two processes at once: each is bound by
    kernel launches, so on one GPU they share it at little cost to each other."""
    base = [sys.executable, __file__, "--out", args.out, "--device", args.device,
            "--seed", str(args.seed), *(["--tiny"] if args.tiny else []),
            "--steps", str(args.steps), "--prompts-per-step", str(args.prompts_per_step),
            "--group-size", str(args.group_size),
            "--steps-per-generation", str(args.steps_per_generation), "--lr", str(args.lr),
            "--beta", str(args.beta), "--max-new-tokens", str(args.max_new_tokens),
            "--save-steps", args.save_steps, "--workers", str(args.workers)]
    procs = {}
    for stage in ("rlvr", "placebo"):
        log = open(Path(args.out) / f"{stage}.log", "w")
        procs[stage] = (subprocess.Popen([*base[:2], stage, *base[2:]], stdout=log,
                                         stderr=subprocess.STDOUT), log)
    failed = []
    for stage, (proc, log) in procs.items():
        if proc.wait() != 0:
            failed.append(stage)
        log.close()
    if failed:
        raise SystemExit(f"GRPO stage(s) {failed} failed; see {args.out}/<stage>.log")
    return {s: json.loads((Path(args.out) / f"{s}.json").read_text()) for s in procs}


def run_eval(args) -> dict:
    out = Path(args.out)
    cfg = grpo_config(args, "verifiable")
    policy, tok, sampler = grpo.load_policy(cfg, args.device)
    problems = arithmetic.generate_problems("test", 6 if args.tiny else args.eval_problems,
                                            args.seed)
    models = grpo.evaluation_models(out / "rlvr" / "adapters", out / "placebo" / "adapters")
    t0 = time.time()
    rows = grpo.evaluate(policy, sampler, tok, problems, models, args.device,
                         n_samples=2 if args.tiny else args.eval_samples,
                         temperature=args.eval_temperature,
                         max_new_tokens=12 if args.tiny else args.eval_max_new_tokens,
                         seed=args.eval_seed, workers=args.workers)
    grpo.write_jsonl(out / "eval_rows.jsonl", rows)
    for name in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == name]
        g = [r["correct"] for r in rs if r["sample"] == 0]
        s = [r["correct"] for r in rs if r["sample"] > 0]
        print(f"{name:>18}: greedy {sum(g)}/{len(g)}  sampled {sum(s)}/{len(s)}", flush=True)
    return {"models": list(models), "problems": len(problems), "seconds": round(time.time() - t0, 1),
            "samples": args.eval_samples, "temperature": args.eval_temperature,
            "max_new_tokens": args.eval_max_new_tokens, "seed": args.eval_seed,
            "split": "test", "problem_seed": args.seed}


def checked_stop() -> dict:
    """The stop token record, refusing a tokenizer whose EOS is not the GGUF metadata's."""
    from transformers import AutoTokenizer

    from rlprobe_nb.suite import gguf_cache, paths

    converted = gguf_cache.convert_gguf(gguf_cache.demo_gguf_path(), paths.cache_dir() / "models")
    return end_of_turn.check_tokenizer(AutoTokenizer.from_pretrained(str(converted)))


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    stop = checked_stop()
    print(f"stop tokens {stop['stop_tokens']} (ids {stop['stop_token_ids']}, "
          f"from the {stop['stop_source']})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    stages = ["sft", "grpo", "eval"] if args.stage == "all" else [args.stage]
    for stage in stages:
        t0 = time.time()
        if stage == "sft":
            result = run_sft(args)
        elif stage == "grpo":
            result = run_both_grpo(args)
        elif stage in ("rlvr", "placebo"):
            result = run_grpo(args, "verifiable" if stage == "rlvr" else "permuted")
        else:
            result = run_eval(args)
        result["wall_seconds"] = round(time.time() - t0, 1)
        (out / f"{stage}.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    if args.stage in ("all", "eval"):
        write_run_record(args, out, stop)
    return 0


def write_run_record(args, out: Path, stop: dict) -> None:
    record = {
        **stop,
        "command": " ".join(["python", "scripts/train_demo_suite.py", *sys.argv[1:]]),
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device.startswith("cuda")
        else platform.processor() or platform.machine(),
        "packages": provenance.package_versions(), "python": platform.python_version(),
        "generator_version": arithmetic.GENERATOR_VERSION,
        "stages": {s: json.loads((out / f"{s}.json").read_text())
                   for s in ("sft", "rlvr", "placebo", "grpo", "eval")
                   if (out / f"{s}.json").exists()},
        "sft_selection": json.loads((out / "sft" / "selection.json").read_text()),
        "environment": {k: v for k, v in os.environ.items() if k.startswith("RLPROBE_")},
    }
    (out / "run.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())

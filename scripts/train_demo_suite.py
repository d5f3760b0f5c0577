"""Train the demo suite's RLVR checkpoints (GRPO + LoRA) and evaluate them.

    python scripts/train_demo_suite.py --out runs/demo_grpo            # on a GPU
    python scripts/train_demo_suite.py --out /tmp/dbg --device cpu --steps 2 \\
        --prompts-per-step 2 --group-size 2 --steps-per-generation 2 \\
        --save-steps 1,2 --eval-problems 4 --eval-samples 2 --eval-max-new-tokens 16

Writes into --out: train_log.csv, adapters/rlvr_step_N/, eval_rows.jsonl (every graded
response of every model), run.json (command, configuration, seeds, versions, timings).
Rerunning with the same --out resumes training and redoes only the evaluation.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from rlprobe_nb.demo import grpo
from rlprobe_nb.problems import arithmetic
from rlprobe_nb.tables import provenance  # noqa: E402


def parse_args(argv=None):
    d = grpo.GRPOConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="run folder (resumed if it exists)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--steps", type=int, default=d.total_steps)
    ap.add_argument("--prompts-per-step", type=int, default=d.prompts_per_step)
    ap.add_argument("--group-size", type=int, default=d.group_size)
    ap.add_argument("--steps-per-generation", type=int, default=d.steps_per_generation)
    ap.add_argument("--lr", type=float, default=d.learning_rate)
    ap.add_argument("--beta", type=float, default=d.beta)
    ap.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    ap.add_argument("--lora-r", type=int, default=d.lora_r)
    ap.add_argument("--format-weight", type=float, default=d.format_weight)
    ap.add_argument("--save-steps", default=",".join(map(str, d.save_steps)))
    ap.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    ap.add_argument("--workers", type=int, default=8, help="grading worker processes")
    ap.add_argument("--eval-problems", type=int, default=300)
    ap.add_argument("--eval-samples", type=int, default=4)
    ap.add_argument("--eval-temperature", type=float, default=0.7)
    ap.add_argument("--eval-max-new-tokens", type=int, default=256)
    ap.add_argument("--eval-seed", type=int, default=1234)
    ap.add_argument("--skip-train", action="store_true", help="only evaluate saved adapters")
    ap.add_argument("--skip-eval", action="store_true")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = grpo.GRPOConfig(
        seed=args.seed, total_steps=args.steps, prompts_per_step=args.prompts_per_step,
        group_size=args.group_size, steps_per_generation=args.steps_per_generation,
        learning_rate=args.lr, beta=args.beta, max_new_tokens=args.max_new_tokens,
        lora_r=args.lora_r, lora_alpha=2 * args.lora_r, format_weight=args.format_weight,
        save_steps=tuple(int(s) for s in args.save_steps.split(",") if s),
        checkpoint_every=args.checkpoint_every)
    cfg.validate()
    record = {
        "command": " ".join(["python", *sys.argv]) if argv is None else " ".join(argv),
        "config": cfg.as_dict(), "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else
        platform.processor() or platform.machine(),
        "eval": {"problems": args.eval_problems, "samples": args.eval_samples,
                 "temperature": args.eval_temperature,
                 "max_new_tokens": args.eval_max_new_tokens, "seed": args.eval_seed,
                 "split": "test", "problem_seed": args.seed},
        "packages": provenance.package_versions(),
        "python": platform.python_version(),
    }
    t0 = time.time()
    policy = sampler = tok = None
    if not args.skip_train:
        policy, tok, sampler = grpo.train(cfg, out, device=args.device, workers=args.workers)
    record["train_seconds"] = round(time.time() - t0, 1)
    if not args.skip_eval:
        if policy is None:
            policy, tok, sampler = grpo.load_policy(cfg, args.device)
        t1 = time.time()
        problems = arithmetic.generate_problems("test", args.eval_problems, args.seed)
        rows = grpo.evaluate(policy, sampler, tok, problems, grpo.evaluation_models(out),
                             args.device, n_samples=args.eval_samples,
                             temperature=args.eval_temperature,
                             max_new_tokens=args.eval_max_new_tokens, seed=args.eval_seed,
                             workers=args.workers)
        grpo.write_jsonl(out / "eval_rows.jsonl", rows)
        record["eval_seconds"] = round(time.time() - t1, 1)
        for name in dict.fromkeys(r["model"] for r in rows):
            rs = [r for r in rows if r["model"] == name]
            g = [r["correct"] for r in rs if r["sample"] == 0]
            s = [r["correct"] for r in rs if r["sample"] > 0]
            print(f"{name:>16}: greedy {sum(g)}/{len(g)}  sampled {sum(s)}/{len(s)}", flush=True)
    (out / "run.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where the book's decode step spends its time (random-weight Llama-3.1-8B shape, bf16,
one GPU): torch.profiler over one ``decoding.generate`` call after a warm-up, the kernels
ranked by device time. Prints per-step milliseconds by kernel family.

    python benchmarks/profile_generate.py --batch 64 --share 8 --new 64
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_generate import run_book  # noqa: E402
from random_models import build_model, llama_8b_config  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--share", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rows", type=int, default=30)
    args = ap.parse_args(argv)
    cfg = llama_8b_config()
    model = build_model(cfg, 0, "cuda", torch.bfloat16, attention="sdpa")
    g = torch.Generator().manual_seed(0)
    distinct = torch.randint(2, cfg.vocab_size, (-(-args.batch // args.share), args.prompt),
                             generator=g).tolist()
    prompts = [distinct[i // args.share] for i in range(args.batch)]
    run_book(model, prompts, args.new, 7)  # warm-up: compiles the sampler
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run_book(model, prompts, args.new, 8)
    torch.cuda.synchronize()
    print(f"unprofiled call: {time.perf_counter() - t0:.2f} s for {args.new} steps")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_book(model, prompts, args.new, 9)
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = sorted((e for e in events if e.device_time_total > 0),
                     key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in kernels if e.device_type.name == "CUDA")
    print(f"device time in kernels: {total / 1e3:.1f} ms over the call "
          f"({total / 1e3 / args.new:.2f} ms per step, prefill and capture included)")
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=args.rows,
                                    max_name_column_width=70))


if __name__ == "__main__":
    main()

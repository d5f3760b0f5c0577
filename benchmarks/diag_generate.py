"""Where a call of the book's generator spends its wall-clock time (random-weight
Llama-3.1-8B shape, bf16, one GPU): the whole call, building the slot engine (buffers and
CUDA-graph capture), a decode step replayed alone (with and without the host reading its
tokens), and the kernels of one replayed step by family.

    python benchmarks/diag_generate.py --batches 16 64 128
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_generate import run_book  # noqa: E402
from random_models import build_model, llama_8b_config  # noqa: E402

from rlprobe_nb.generation import decoding  # noqa: E402


def family(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("nvjet", "gemm", "cutlass", "splitk", "sm90_xmma", "cublas")):
        return "gemm"
    if any(k in n for k in ("sdpa", "flash", "fmha", "attention")):
        return "attention"
    if "triton" in n:
        return "triton"
    return "other"


def seconds(fn, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


TIMERS: dict = defaultdict(float)


def time_method(name: str) -> None:
    """Accumulate the wall-clock seconds of ``decoding._Slots.<name>`` (synchronised)."""
    original = getattr(decoding._Slots, name)

    def wrapper(self, *args, **kwargs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = original(self, *args, **kwargs)
        torch.cuda.synchronize()
        TIMERS[name] += time.perf_counter() - t0
        return out
    setattr(decoding._Slots, name, wrapper)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--share", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--variants", nargs="+", default=["eager", "compiled"])
    args = ap.parse_args(argv)
    from transformers import AttentionInterface
    cfg = llama_8b_config()
    model = build_model(cfg, 0, "cuda", torch.bfloat16, attention="sdpa")
    for name in ("_prefill", "_run_step", "_fill"):
        time_method(name)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    g = torch.Generator().manual_seed(0)
    for batch in args.batches:
        distinct = torch.randint(2, cfg.vocab_size, (-(-batch // args.share), args.prompt),
                                 generator=g).tolist()
        prompts = [distinct[i // args.share] for i in range(batch)]
        tokens = {}
        for variant in args.variants:
            compiled = variant == "compiled"
            decoding.release()
            cold = seconds(lambda: run_book(model, prompts, args.new, 7, compiled), 1)
            TIMERS.clear()
            warm = seconds(lambda: tokens.__setitem__(variant, run_book(model, prompts, args.new, 8, compiled)), 1)
            parts = ", ".join(f"{k} {v:.2f} s" for k, v in TIMERS.items())
            slots = decoding._HELD["engine"][1]
            AttentionInterface.register(decoding.SLOT_ATTENTION, decoding.slot_attention)
            previous = model.config._attn_implementation
            model.config._attn_implementation = decoding.SLOT_ATTENTION
            try:
                with torch.inference_mode():
                    span = max(slots.spans)
                    graph, out = slots.graphs[span]
                    synced = seconds(lambda: (graph.replay(), out.tolist()), 30)
                    from torch.profiler import ProfilerActivity, profile
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(10):
                            graph.replay()
                        torch.cuda.synchronize()
                    per = defaultdict(float)
                    count = 0
                    for e in prof.key_averages():
                        if e.device_time_total > 0 and e.device_type.name == "CUDA":
                            per[family(e.key)] += e.device_time_total / 10 / 1e3
                            count += e.count
                    del slots
            finally:
                model.config._attn_implementation = previous
            decoding.release()
            kernels = " ".join(f"{k} {v:.2f}" for k, v in sorted(per.items()))
            print(f"batch {batch:4d} {variant:8s}: cold call {cold:.2f} s, warm call {warm:.2f} s "
                  f"({warm / args.new * 1e3:.1f} ms/step, {batch * args.new / warm:,.0f} tok/s; {parts}); "
                  f"step at span {span}: {synced * 1e3:.2f} ms; kernels/step {count / 10:.0f}, "
                  f"ms/step by family: {kernels} (sum {sum(per.values()):.2f})", flush=True)
        if len(tokens) == 2:
            a, b = tokens.values()
            same = sum(x == y for x, y in zip(a, b))
            print(f"batch {batch}: sequences identical between variants: {same}/{len(a)}")
    import torch._inductor.config as ic
    print("inductor deterministic flag:", getattr(ic, "deterministic", "absent"))


if __name__ == "__main__":
    main()

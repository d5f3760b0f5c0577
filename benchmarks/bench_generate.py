"""GPU benchmark of the book's generator (issue 14, acceptance 3).

A random-weight Llama-3.1-8B-shaped model (bf16, built on the GPU, no downloads) decodes
the same random prompts at the same batch and lengths, side by side in one run:

  book           ``decoding.generate`` as the book runs it: slot loop, CUDA graphs for the
                 decode step and the prompt prefill, seeded Gumbel-max sampler
                 (temperature 1); each call is timed whole (prefills, host loop)
  book_compiled  the same with ``compiled=True`` (the suite setting
                 ``runtime.compile_decode``: the step's model call through torch.compile
                 in inductor's deterministic mode)
  hf             plain ``model.generate(do_sample=True, temperature=1, top_k=0)``, default
                 dynamic cache, SDPA attention
  bound          batch x HBM bandwidth / weight bytes read per decode step: the decode rate
                 a step that only reads the weights once would reach (KV-cache reads, the
                 prefill and the sampler ignored). Bandwidth: a measured device-to-device
                 copy (bytes read + written); weight bytes: every parameter but the input
                 embeddings (one row per token is read), bf16.

Every sequence produces exactly ``--new`` tokens in all (no EOS for the book, HF's
``min_new_tokens``), so tokens/s = batch x new / seconds. Each row and way: a first
full-length call (the book builds its engine there: buffers, graph capture, compilation;
its time is printed as "first call"), then ``--repeats`` timed calls, the median reported.
The book keeps its engine between calls, as it does between a table's shards.

Two prompt layouts (``--shares``): 1, every sequence its own prompt (the book prefills
each prompt alone, so its keys and values depend on no other prompt: the worst case for
it); 8, groups of 8 sequences sharing a prompt (how the book samples: a problem's samples
share its prompt, prefilled once). HF gets the very same prompts.

    python benchmarks/bench_generate.py --json $OUT/bench_generate.json
    python benchmarks/bench_generate.py --tiny       # CPU dry run, seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from random_models import build_model, llama_8b_config, tiny_config  # noqa: E402

from rlprobe_nb.generation import decoding  # noqa: E402


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device, gib: float = 2.0) -> float:
    """Bytes read + written per second of a large device-to-device copy (median of 20)."""
    if device.type != "cuda":
        return float("nan")
    n = int(gib * 2 ** 30)
    a = torch.empty(n, dtype=torch.uint8, device=device).random_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2 * n / statistics.median(times)


def run_book(model, prompts, new: int, seed: int, compiled: bool = False) -> list[list[int]]:
    reqs = [decoding.Request(tuple(p), 1.0, seed + i, new) for i, p in enumerate(prompts)]
    out = decoding.generate(model, reqs, [], slots=len(reqs), compiled=compiled)
    assert all(len(t) == new for t, _ in out), "the book's generator stopped early"
    return [t for t, _ in out]


@torch.inference_mode()
def run_hf(model, prompts, new: int, seed: int):
    device = next(model.parameters()).device
    ids = torch.tensor(prompts, device=device)
    torch.manual_seed(seed)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                         temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                         min_new_tokens=new, pad_token_id=0, eos_token_id=1)
    assert out.shape[1] - ids.shape[1] == new
    return out


def timed(fn, device, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny shape (a dry run)")
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shares", type=int, nargs="+", default=[1, 8],
                    help="sequences per distinct prompt (one scenario each)")
    ap.add_argument("--variants", nargs="+", default=["book", "book_compiled", "hf"],
                    choices=["book", "book_compiled", "hf"])
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args(argv)

    if args.tiny:
        device, dtype = torch.device("cpu"), torch.float32
        cfg = tiny_config()
        args.batches, args.prompt, args.new, args.repeats = [4], 16, 8, 1
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --tiny for a CPU dry run")
        device, dtype = torch.device("cuda"), torch.bfloat16
        cfg = llama_8b_config()
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    t0 = time.perf_counter()
    model = build_model(cfg, 0, device, dtype, attention="sdpa")
    init_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    step_bytes = (params - embed) * torch.finfo(dtype).bits // 8
    bw = copy_bandwidth(device)
    print(f"device {card}; torch {torch.__version__}; {params / 1e9:.2f}B parameters built "
          f"in {init_s:.1f}s; weight bytes per decode step {step_bytes / 1e9:.2f} GB; "
          f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    g = torch.Generator().manual_seed(0)
    rows = []
    for share, batch in [(s, b) for s in args.shares for b in args.batches]:
        distinct = torch.randint(2, cfg.vocab_size, (-(-batch // share), args.prompt),
                                 generator=g).tolist()
        prompts = [distinct[i // share] for i in range(batch)]
        tokens = batch * args.new
        res = {"batch": batch, "share": share, "prompt": args.prompt, "new": args.new}
        for name in args.variants:
            if name == "hf":
                fn = lambda: run_hf(model, prompts, args.new, 1000)  # noqa: E731
                warm_up = lambda: run_hf(model, prompts, args.new, 7)  # noqa: E731
            else:
                compiled = name == "book_compiled"
                decoding.release()  # the warm-up call builds (and compiles) the engine
                fn = lambda: run_book(model, prompts, args.new, 1000, compiled)  # noqa: E731
                warm_up = lambda: run_book(model, prompts, args.new, 7, compiled)  # noqa: E731
            w0 = time.perf_counter()
            warm_up()
            sync(device)
            warm = time.perf_counter() - w0
            times = timed(fn, device, args.repeats)
            med = statistics.median(times)
            res[name] = {"seconds": times, "first_call_seconds": warm, "tokens_per_s": tokens / med}
            print(f"share {share} batch {batch:4d} {name:13s} {tokens / med:10,.0f} tok/s  "
                  f"(runs {', '.join(f'{t:.2f}' for t in times)} s; first call {warm:.1f} s)",
                  flush=True)
        decoding.release()
        res["bound_tokens_per_s"] = batch * bw / step_bytes
        for name in args.variants:
            res[name]["fraction_of_bound"] = res[name]["tokens_per_s"] / res["bound_tokens_per_s"]
            if name != "hf" and "hf" in res:
                res[name]["over_hf"] = res[name]["tokens_per_s"] / res["hf"]["tokens_per_s"]
        rows.append(res)
    out = {"device": card, "torch": torch.__version__, "args": vars(args),
           "parameters": params, "weight_bytes_per_step": step_bytes,
           "copy_bandwidth_bytes_per_s": bw, "init_seconds": init_s, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"\ngeneration, random-weight Llama-3.1-8B shape, bf16, prompt {args.prompt}, "
          f"{args.new} new tokens, temperature 1 [{card}]")
    books = [v for v in args.variants if v != "hf"]
    print(f"{'share':>5} {'batch':>5} {'HF tok/s':>9} " + " ".join(
        f"{v + ' tok/s':>19} {'/HF':>5} {'/bound':>6}" for v in books) + f" {'HF/bound':>8}")
    for r in rows:
        print(f"{r['share']:5d} {r['batch']:5d} {r['hf']['tokens_per_s']:9,.0f} " + " ".join(
            f"{r[v]['tokens_per_s']:19,.0f} {r[v].get('over_hf', float('nan')):5.2f} "
            f"{r[v]['fraction_of_bound']:6.2f}" for v in books)
            + f" {r['hf']['fraction_of_bound']:8.2f}")

if __name__ == "__main__":
    main()

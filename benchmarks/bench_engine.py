"""GPU benchmark of the teacher-forcing engine (issue acceptance 3).

Two random-weight Llama-3.1-8B-shaped models P and Q (bf16, built on the GPU, no
downloads), the same forced sequences for every method, measured side by side:

  (a) forward-only     plain HF forward of one model (bf16 logits of every position)
  (b) one more ckpt    the engine with the reference's hidden states cached in pinned host
                       memory: P's body forward + every metric vs Q + P's hidden states
                       and the metrics copied to the host (what run_checkpoint does on
                       the device; disk I/O runs in a background thread)
      pair, scratch    both bodies forwarded + every metric
      engine e2e       forcing.run_checkpoint end to end (cache + parquet on disk), once
  (c) naive            one sequence at a time, fp32 logits of both models
                       (model(ids).logits.float()), softmax, then KL

Throughput is response tokens (table rows) per second over identical sequences. Memory is
the peak allocated over what was allocated before the phase (the weights). Errors: the
largest relative error vs float64 math from the same hidden states on a sample of positions,
for the engine and for bf16 logits (the naive path's precision).

    python benchmarks/bench_engine.py            # GPU, 8B shape (~3-5 min on one H100)
                                                 # (with (a') and (b'): compiled layers)
    python benchmarks/bench_engine.py --tiny     # CPU, tiny shape, seconds (a dry run)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from random_models import build_model, llama_8b_config, make_sequences, tiny_config  # noqa: E402

from rlprobe_nb import forcing  # noqa: E402
from rlprobe_nb.forcing import metrics


class Timer:
    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def __call__(self, fn, repeats: int) -> tuple[float, list[float]]:
        fn()  # warm-up (compilation, cuBLAS heuristics, allocator)
        self.sync()
        times = []
        for _ in range(repeats):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000)
            else:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return statistics.median(times), times

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def peak_over(device, fn) -> float:
    """Peak allocated bytes during fn() above what was allocated before, in GiB."""
    if torch.device(device).type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 30


def run_scenario(name, P, Q, seqs, args, device, timer, row_fn, torch_fn):
    batches = forcing.plan_batches(seqs, args.batch_tokens)
    members = [[seqs.sequences[i] for i in b.members] for b in batches]
    inputs = [forcing.batch_inputs(m, b.width, device) for m, b in zip(members, batches)]
    V = seqs.tokenizer["size"]
    head_p, head_q = forcing.lm_head_of(P, V), forcing.lm_head_of(Q, V)
    rows = seqs.n_rows()
    in_tokens = sum(b.width * len(b.members) for b in batches)
    with torch.inference_mode():
        cached_q = []  # Q's hidden states as the cache would hand them over: pinned host
        for ids, mask, idx, _ in inputs:
            h = forcing.forward_hidden(Q, ids, mask, idx).cpu()
            cached_q.append(h.pin_memory() if device.type == "cuda" else h)

    def forward_only():
        with torch.inference_mode():
            for ids, mask, _, _ in inputs:
                P(input_ids=ids, attention_mask=mask, use_cache=False).logits

    def one_more_checkpoint(chunk=args.chunk, fn=row_fn):
        copies = []
        for (ids, mask, idx, tgt), hq_host in zip(inputs, cached_q):
            h_q = forcing.DeviceCopy(hq_host, device)  # on the copy stream
            h_p = forcing.forward_hidden(P, ids, mask, idx)
            packed = forcing.pair_metrics(h_p, h_q.get(), head_p, head_q, tgt, chunk,
                                          args.topk, fn)
            copies += [forcing.HostCopy(h_p), forcing.HostCopy(packed)]
        for c in copies:
            c.get()

    def one_more_checkpoint_half_chunk():
        one_more_checkpoint(max(1, args.chunk // 2))

    def one_more_checkpoint_torch_math():
        one_more_checkpoint(fn=torch_fn)

    # where the time of (b) goes: P's body alone, the two fp32 heads alone, the math alone
    def body_only():
        for ids, mask, idx, _ in inputs:
            forcing.forward_hidden(P, ids, mask, idx)

    def heads_only():
        for (ids, mask, idx, tgt), hq_host in zip(inputs, cached_q):
            h = hq_host.to(device)
            for s in range(0, h.shape[0], args.chunk):
                forcing.head_logits(h[s:s + args.chunk], head_p)
                forcing.head_logits(h[s:s + args.chunk], head_q)

    lp_chunk = forcing.head_logits(cached_q[0][:args.chunk].to(device), head_p)
    lq_chunk = forcing.head_logits(cached_q[0][:args.chunk].to(device), head_q)
    tgt_chunk = inputs[0][3][:args.chunk]
    n_chunks = sum((len(t) + args.chunk - 1) // args.chunk for *_, t in inputs)

    def math_only(fn=row_fn):
        for _ in range(n_chunks):
            metrics.token_metrics(lp_chunk, lq_chunk, tgt_chunk, args.topk, row_fn=fn)

    def math_only_torch():
        math_only(torch_fn)

    def pair_from_scratch():
        copies = []
        for ids, mask, idx, tgt in inputs:
            h_q = forcing.forward_hidden(Q, ids, mask, idx)
            h_p = forcing.forward_hidden(P, ids, mask, idx)
            packed = forcing.pair_metrics(h_p, h_q, head_p, head_q, tgt, args.chunk,
                                          args.topk, row_fn)
            copies += [forcing.HostCopy(h_p), forcing.HostCopy(h_q), forcing.HostCopy(packed)]
        for c in copies:
            c.get()

    def naive():
        kls = []
        with torch.inference_mode():
            for s in seqs.sequences:
                ids = torch.tensor([s.input_ids[:-1]], device=device)
                lp = torch.log_softmax(P(input_ids=ids, use_cache=False).logits.float()[0], -1)
                lq = torch.log_softmax(Q(input_ids=ids, use_cache=False).logits.float()[0], -1)
                lp, lq = lp[s.prompt_len - 1:], lq[s.prompt_len - 1:]
                kls.append((lp.exp() * (lp - lq)).sum(-1).cpu())  # one sync per sequence, as it was
        return kls

    results = {}

    def measure(label, fn):
        med, times = timer(fn, args.repeats)
        mem = peak_over(device, fn)
        results[label] = {"seconds": med, "times": times, "rows_per_s": rows / med,
                          "input_tokens_per_s": in_tokens / med, "mem_over_gib": mem}
        print(f"  {name} {label}: {rows / med:,.0f} rows/s  (median {med:.3f}s of "
              f"{[round(t, 3) for t in times]}), peak over weights {mem:.2f} GiB", flush=True)

    if row_fn is metrics.fused_row_fn:  # kernel shape: a few (block, warps) side by side
        from rlprobe_nb.forcing import fused_metrics
        tuning = {}
        for block, warps in ((1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16)):
            med, _ = timer(lambda: fused_metrics.row_reductions(lp_chunk, lq_chunk, tgt_chunk,
                                                                block, warps), args.repeats)
            tuning[f"{block}/{warps}"] = med * 1e3
        results["fused kernel ms per chunk by block/warps"] = tuning
        print(f"  {name} fused kernel, ms per {args.chunk}-position chunk by BLOCK/num_warps: "
              + ", ".join(f"{k}: {v:.2f}" for k, v in tuning.items()), flush=True)
    for label, fn in (("(a) forward-only", forward_only),
                      ("(b) one more checkpoint", one_more_checkpoint),
                      ("(b) one more ckpt, chunk/2", one_more_checkpoint_half_chunk),
                      ("(b) one more ckpt, torch math", one_more_checkpoint_torch_math),
                      ("(b) pair from scratch", pair_from_scratch),
                      ("(c) naive per-sequence fp32", naive),
                      ("part: P body only", body_only),
                      ("part: both fp32 heads only", heads_only),
                      ("part: metric math only", math_only),
                      ("part: metric math, torch", math_only_torch)):
        measure(label, fn)

    if args.compile_layers:  # the same (a) and (b) with both bodies' layers compiled
        forcing.compile_layers(P)
        forcing.compile_layers(Q)
        try:
            for label, fn in (("(a') forward-only, compiled layers", forward_only),
                              ("(b') one more ckpt, compiled layers", one_more_checkpoint),
                              ("(b') pair from scratch, compiled", pair_from_scratch)):
                measure(label, fn)
        finally:
            forcing.compile_layers(P, enable=False)
            forcing.compile_layers(Q, enable=False)

    # engine end to end, as notebook 03 runs it: reference into its cache, then one more
    # checkpoint (hidden cache + parquet shards on disk). A warm-up pass over one sequence
    # first, so compilation and first-call set-up stay out of the timed pass; the timed
    # pass runs over ``--e2e-copies`` copies of the sequences (steady state over more batches).
    big = forcing.SequenceSet(
        [forcing.make_sequence(f"{s.rollout_id}~{c}", s.problem_id, s.input_ids[:s.prompt_len],
                               s.response_ids, s.token_method, None)
         for c in range(args.e2e_copies) for s in seqs.sequences],
        [], seqs.tokenizer, seqs.max_context, seqs.context_policy)
    big_rows = sum(s.n_rows for s in big.sequences)
    with tempfile.TemporaryDirectory() as tmp:
        kw = dict(suite="bench", batch_tokens=args.batch_tokens, chunk_positions=args.chunk,
                  topk=args.topk, device=device, progress=False)
        warm = forcing.SequenceSet(seqs.sequences[:1], [], seqs.tokenizer, seqs.max_context,
                                   seqs.context_policy)
        t = time.perf_counter()
        forcing.forward_to_cache(warm, forcing.Side("Q", Q, None, f"{tmp}/wQ"), **kw)
        forcing.run_checkpoint(warm, forcing.Side("P", P, None, f"{tmp}/wP"),
                               forcing.Side("Q", cache_dir=f"{tmp}/wQ"), f"{tmp}/wtok", **kw)
        timer.sync()
        warm_s = time.perf_counter() - t  # first calls: layer compilation, head caches
        t = time.perf_counter()
        forcing.forward_to_cache(big, forcing.Side("Q", Q, None, f"{tmp}/hQ"), **kw)
        timer.sync()
        ref_s = time.perf_counter() - t
        t = time.perf_counter()
        out = forcing.run_checkpoint(big, forcing.Side("P", P, None, f"{tmp}/hP"),
                                     forcing.Side("Q", cache_dir=f"{tmp}/hQ"), f"{tmp}/tok", **kw)
        timer.sync()
        e2e_s = time.perf_counter() - t
        from rlprobe_nb.tables import storage
        manifest = storage.read_manifest(out)
        assert manifest["rows"] == big_rows, (manifest["rows"], big_rows)
        eng = manifest["engine"]
        waits = {k: eng[k] for k in ("seconds_this_run", "seconds_waiting_for_reads",
                                     "seconds_waiting_for_writes", "compiled_layers_used",
                                     "metric_kernel", "seconds_before_loop",
                                     "seconds_waiting_for_head_saves")}
        # the call's time outside its batch loop: before it (checks, LM heads to the
        # device, the table's key), the LM head's save after it, and the rest (the caches'
        # index, the table's manifest: every part's checksum, the unique-key check)
        waits["seconds_after_loop_rest"] = round(
            e2e_s - waits["seconds_this_run"] - waits["seconds_before_loop"]
            - waits["seconds_waiting_for_head_saves"], 3)
        print(f"  {name} engine e2e one more checkpoint: {waits}; warm-up (compile, heads) "
              f"{warm_s:.1f}s", flush=True)
        # the same without saving P's hidden states (only progression pairs need them)
        t = time.perf_counter()
        forcing.run_checkpoint(big, forcing.Side("P", P, None, None),
                               forcing.Side("Q", cache_dir=f"{tmp}/hQ"), f"{tmp}/tok2", **kw)
        timer.sync()
        nosave_s = time.perf_counter() - t
        eng2 = storage.read_manifest(f"{tmp}/tok2")["engine"]
        nosave_loop = eng2["seconds_this_run"]
    results["engine e2e: waits"] = waits
    results["engine e2e: warm-up seconds (two runs over one sequence)"] = warm_s
    # the batch loop alone (the manifest's own clock): what a long run converges to, once
    # the one-time set-up (LM heads to and from the cache: 1 GB each at 8B) is amortized
    results["engine e2e: batch loop only"] = {"seconds": waits["seconds_this_run"],
                                              "rows_per_s": big_rows / waits["seconds_this_run"]}
    results["engine e2e: reference to cache"] = {"seconds": ref_s, "rows_per_s": big_rows / ref_s}
    results["engine e2e: one more checkpoint"] = {"seconds": e2e_s, "rows_per_s": big_rows / e2e_s}
    results["engine e2e: one more ckpt, no h save"] = {"seconds": nosave_s,
                                                       "rows_per_s": big_rows / nosave_s}
    results["engine e2e: no h save, batch loop only"] = {"seconds": nosave_loop,
                                                         "rows_per_s": big_rows / nosave_loop}
    # acceptance: end to end over the call's own batch loop, set-up included
    results["e2e over loop"] = e2e_s and waits["seconds_this_run"] / e2e_s
    results["e2e over loop, no h save"] = nosave_loop / nosave_s
    print(f"  {name} end to end / batch loop: {results['e2e over loop']:.3f} (one more checkpoint, "
          f"its hidden states saved), {results['e2e over loop, no h save']:.3f} (not saved); "
          f"outside the loop: before {waits['seconds_before_loop']:.2f}s, head save "
          f"{waits['seconds_waiting_for_head_saves']:.2f}s, after "
          f"{waits['seconds_after_loop_rest']:.2f}s", flush=True)
    print(f"  {name} engine e2e (disk, {big_rows} rows after a warm-up): reference "
          f"{big_rows / ref_s:,.0f} rows/s, one more checkpoint {big_rows / e2e_s:,.0f} rows/s, "
          f"without saving its hidden states {big_rows / nosave_s:,.0f} rows/s",
          flush=True)

    # precision on a sample of positions of the first batch, vs float64 from the same h
    ids, mask, idx, tgt = inputs[0]
    with torch.inference_mode():
        h_p = forcing.forward_hidden(P, ids, mask, idx)
        h_q = forcing.forward_hidden(Q, ids, mask, idx)
        pick = torch.linspace(0, h_p.shape[0] - 1, args.sample, device=device).long()
        packed = forcing.pair_metrics(h_p[pick], h_q[pick], head_p, head_q, tgt[pick],
                                      args.chunk, args.topk, row_fn).cpu()

        def f64_logits(h, head):
            out = torch.empty(h.shape[0], head.vocab_size, dtype=torch.float64, device=device)
            for s in range(0, head.vocab_size, 16384):
                out[:, s:s + 16384] = h.double() @ head.weight[s:s + 16384].double().t()
            return out.cpu()

        lp64, lq64 = f64_logits(h_p[pick], head_p), f64_logits(h_q[pick], head_q)
        bf_p = (h_p[pick] @ head_p.weight.t()).float().cpu()  # bf16 logits, as HF returns them
        bf_q = (h_q[pick] @ head_q.weight.t()).float().cpu()
    t_cpu = tgt[pick].cpu()
    want = metrics.reference_metrics_f64(torch.log_softmax(lp64, -1), torch.log_softmax(lq64, -1),
                                            t_cpu, lp64, lq64)
    errors = {}
    for j, metric in enumerate(forcing.METRIC_COLUMNS):
        if metric in metrics.INT_METRICS:
            errors[metric] = float((packed[:, j].double() - want[metric].double()).abs().max())
        else:
            errors[metric] = float(metrics.relative_error(packed[:, j], want[metric], 1e-3).max())
    naive_out = metrics.token_metrics(bf_p, bf_q, t_cpu, topk=0)
    naive_err = {m: float(metrics.relative_error(naive_out[m], want[m], 1e-3).max())
                 for m in ("kl_ckpt_ref", "kl_ref_ckpt", "js", "logp_ckpt")}
    results["max_rel_error_engine"] = errors
    results["max_rel_error_bf16_logits"] = naive_err
    results["kl_median_f64"] = float(want["kl_ckpt_ref"].median())
    results["rows"], results["input_tokens"], results["batches"] = rows, in_tokens, len(batches)
    print(f"  {name} max relative error vs float64 (floor 1e-3) engine: "
          f"{max(v for k, v in errors.items() if k not in metrics.INT_METRICS):.2e} "
          f"(ranks off by {max(errors[k] for k in metrics.INT_METRICS):.0f}); "
          f"bf16 logits: {max(naive_err.values()):.2e}", flush=True)
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU dry run with a tiny config")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=1024, help="chunk_positions")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument("--sample", type=int, default=64, help="positions checked vs float64")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--no-compile", action="store_true", help="eager divergence math")
    ap.add_argument("--json", type=str, default=None, help="also write the results here")
    ap.add_argument("--compile-layers", dest="compile_layers", action="store_true", default=True,
                    help="(the default) also measure (a') and (b')")
    ap.add_argument("--no-compile-layers", dest="compile_layers", action="store_false",
                    help="leave out (a') and (b'): (a) and (b) with torch.compile'd decoder "
                         "layers, as the engine runs on CUDA by default")
    ap.add_argument("--e2e-copies", type=int, default=4,
                    help="copies of the sequences in the timed end-to-end pass")
    ap.add_argument("--scenario", choices=["8x1024", "384-token"], default=None,
                    help="one scenario only (default: both)")
    args = ap.parse_args(argv)

    if args.tiny:
        device, dtype = torch.device("cpu"), torch.bfloat16
        cfg = tiny_config(initializer_range=0.1)
        args.batch_tokens, args.chunk, args.sample = 256, 64, 16
        scenarios = [("8x128", 4, 128), ("48-token", 12, 48)]  # (name, sequences, length)
        args.repeats = min(args.repeats, 2)
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --tiny for a CPU dry run")
        device, dtype = torch.device("cuda"), torch.bfloat16
        cfg = llama_8b_config()
        # 16 x 1024 = two batches of 8 x 1024; 384-token responses: two batches of ~18
        scenarios = [("8x1024", 16, 1024), ("384-token", 36, 384 + args.prompt_len)]
    if args.scenario is not None:
        scenarios = [sc for sc in scenarios if sc[0] == args.scenario] or scenarios[-1:]
    t0 = time.perf_counter()
    P = build_model(cfg, 0, device, dtype)
    Q = build_model(cfg, 1, device, dtype)
    init_s = time.perf_counter() - t0
    weights_gib = (torch.cuda.memory_allocated() / 2 ** 30) if device.type == "cuda" else float("nan")
    row_fn = None if args.no_compile else metrics.compiled_row_fn(device)
    torch_fn = metrics.torch_compiled_row_fn(device)  # the previous CUDA path, for comparison
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {card}; torch {torch.__version__}; models built in {init_s:.1f}s; "
          f"weights {weights_gib:.1f} GiB; metric math: {metrics.row_fn_kind(row_fn)}", flush=True)
    timer = Timer(device)
    all_results = {"device": card, "torch": torch.__version__, "args": vars(args),
                   "init_seconds": init_s}
    for name, n, length in scenarios:
        prompt = min(args.prompt_len, length // 4) if args.tiny else args.prompt_len
        if name == "8x1024":  # 8 x 1024 total tokens: the input is 1023 (last token predicts nothing)
            seqs = make_sequences(n, prompt, length - prompt + 1, cfg.vocab_size, seed=7)
        else:
            seqs = make_sequences(n, prompt, length - prompt, cfg.vocab_size, seed=8)
        all_results[name] = run_scenario(name, P, Q, seqs, args, device, timer, row_fn, torch_fn)
    if args.json:
        Path(args.json).write_text(json.dumps(all_results, indent=2, default=str))

    print("\nscenario     method                         rows/s   vs (a)  vs (c)  mem>w GiB")
    for name, _, _ in scenarios:
        r = all_results[name]
        a = r["(a) forward-only"]["rows_per_s"]
        c = r["(c) naive per-sequence fp32"]["rows_per_s"]
        for label in ("(a) forward-only", "(b) one more checkpoint", "(b) one more ckpt, chunk/2",
                      "(b) one more ckpt, torch math", "(b) pair from scratch",
                      "(c) naive per-sequence fp32", "(a') forward-only, compiled layers",
                      "(b') one more ckpt, compiled layers", "(b') pair from scratch, compiled",
                      "engine e2e: one more checkpoint",
                      "engine e2e: one more ckpt, no h save", "engine e2e: batch loop only",
                      "engine e2e: no h save, batch loop only",
                      "part: P body only",
                      "part: both fp32 heads only", "part: metric math only",
                      "part: metric math, torch"):
            if label not in r:
                continue
            x = r[label]
            mem = x.get("mem_over_gib", float("nan"))
            print(f"{name:<12} {label:<30} {x['rows_per_s']:>8,.0f}  {x['rows_per_s'] / a:>6.3f}"
                  f"  {x['rows_per_s'] / c:>6.2f}  {mem:>9.2f}")
        e = r["max_rel_error_engine"]
        exact = max(e[k] for k in ("logp_ckpt", "logp_ref", "entropy_ckpt", "entropy_ref",
                                   "kl_ckpt_ref", "kl_ref_ckpt", "js"))
        print(f"{name:<12} max rel. error vs float64: engine logp/entropy/KL/JS {exact:.1e}, "
              f"k1-k3 {max(e['k1'], e['k2'], e['k3']):.1e} (log r cancels), ranks off by "
              f"{max(e['rank_ckpt'], e['rank_ref']):.0f}; bf16 logits "
              f"{max(r['max_rel_error_bf16_logits'].values()):.1e} (median KL {r['kl_median_f64']:.3g})")
    print("\nwhere the time goes (ms per batch):")
    for name, _, _ in scenarios:
        r = all_results[name]
        nb = r["batches"]
        ms = {k: r[k]["seconds"] * 1e3 / nb for k in r if isinstance(r[k], dict) and "seconds" in r[k]
              and not k.startswith("engine")}
        print(f"{name:<12} " + ", ".join(f"{k} {v:.1f}" for k, v in ms.items()))
    print(f"targets: one more checkpoint >= 0.85x (a); >= 3x (c) at 384-token; mem < 2 GiB at 8x1024 "
          f"[{card}]")
    for name, _, _ in scenarios:
        r = all_results[name]
        ratio = (r["(b') one more ckpt, compiled layers"]["rows_per_s"]
                 / r["(a') forward-only, compiled layers"]["rows_per_s"]) if args.compile_layers else None
        print(f"{name:<12} (b')/(a') {ratio if ratio is None else round(ratio, 3)} (target 0.85); "
              f"end to end / batch loop {r['e2e over loop']:.3f}, without saving its hidden "
              f"states {r['e2e over loop, no h save']:.3f} (target 0.8) [{card}]")


if __name__ == "__main__":
    main()

"""Teacher forcing on every GPU of a host (issue 14, acceptance 2).

Two random-weight Llama-3.1-8B-shaped models P and Q (bf16, each worker builds them on its
own GPU from the same seeds, so every GPU holds the same weights), the same forced
sequences, forced pair-from-scratch (both bodies forwarded, every metric, the table written
to disk) through ``forcing.sharded.run_pair``: first with one worker per GPU, then with one
worker, in one run. Reported:

  engine   rows / seconds of the engines' batch loops (the slowest worker's): the
           forcing's throughput
  wall     rows / seconds of the whole call (worker start, model build, compilation and
           the coordinator's manifest included)

and the equality of the two tables: token ids and every non-metric column identical,
metrics (logp, entropy, KL, JS, k1-k3, top-k p) within 1e-5.

    python benchmarks/bench_gpus.py --json $OUT/bench_gpus.json
    RLPROBE_PROCESSES=2 python benchmarks/bench_gpus.py --tiny     # CPU, gloo, a dry run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from random_models import build_model, llama_8b_config, make_sequences, tiny_config  # noqa: E402

from rlprobe_nb import distributed, forcing
from rlprobe_nb.forcing import sharded  # noqa: E402
from rlprobe_nb.tables import storage  # noqa: E402

METRICS = ["logp_ckpt", "logp_ref", "dlogp", "entropy_ckpt", "entropy_ref", "kl_ckpt_ref",
           "kl_ref_ckpt", "js", "k1", "k2", "k3"]


def compare(a, b) -> dict:
    a = a.sort_values(["rollout_id", "pos"]).reset_index(drop=True)
    b = b.sort_values(["rollout_id", "pos"]).reset_index(drop=True)
    exact = [c for c in a.columns if c not in METRICS and not c.startswith("topk_p")]
    out = {"rows": [len(a), len(b)],
           "exact_columns_equal": bool(len(a) == len(b) and a[exact].equals(b[exact])),
           "token_ids_equal": bool(len(a) == len(b) and (a["token_id"] == b["token_id"]).all())}
    if len(a) == len(b):
        out["max_abs_diff"] = {c: float((a[c] - b[c]).abs().max()) for c in METRICS}
        for c in ("topk_p_ckpt", "topk_p_ref"):
            out["max_abs_diff"][c] = max(abs(x - y) for u, v in zip(a[c], b[c])
                                         for x, y in zip(u, v))
        out["metrics_within_1e-5"] = all(v <= 1e-5 for v in out["max_abs_diff"].values())
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny shape (a dry run)")
    ap.add_argument("--sequences", type=int, default=384)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=960)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--json", type=str, default=None)
    ap.add_argument("--compile-body", action="store_true",
                    help="compiled decoder layers (run_pair's default is eager)")
    args = ap.parse_args(argv)

    if args.tiny:
        device, dtype = "cpu", torch.float32
        cfg = tiny_config()
        args.sequences, args.response_len, args.batch_tokens = 8, 64, 256
        gpus = int(os.environ.get(distributed.PROCESSES_ENV, "2"))
    else:
        device, dtype = "cuda", torch.bfloat16
        cfg = llama_8b_config()
        gpus = distributed.processes()  # NVML: the coordinator stays free of CUDA
    seqs = make_sequences(args.sequences, args.prompt_len, args.response_len, cfg.vocab_size, 0)
    rows_expected = sum(len(s.input_ids) - args.prompt_len for s in seqs.sequences)

    def load():
        if device == "cuda":
            print(f"worker on cuda:{torch.cuda.current_device()}, "
                  f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
                  f"torch threads {torch.get_num_threads()}", flush=True)
        return (forcing.Side("P", build_model(cfg, 0, device, dtype)),
                forcing.Side("Q", build_model(cfg, 1, device, dtype)))

    root = Path(tempfile.mkdtemp(prefix="bench_gpus_"))
    results, tables = {}, {}
    for workers in (gpus, 1):  # the sharded run first: the coordinator has no CUDA yet
        out = root / f"w{workers}"
        t0 = time.perf_counter()
        folder = sharded.run_pair(seqs, ("P", "Q"), out, load, forwarded={},
                                      workers=workers, batch_tokens=args.batch_tokens, topk=5,
                                      key={"bench": "gpus"}, provenance={"bench": "gpus"},
                                      suite="bench", device=device,
                                      compile_body=True if args.compile_body else None)
        wall = time.perf_counter() - t0
        man = storage.read_manifest(folder)
        eng = man["engine"]
        loop = max(w["seconds_this_run"] for w in eng["workers"]) if "workers" in eng \
            else eng["seconds_this_run"]
        rows = man["rows"]
        results[workers] = {"workers": workers, "rows": rows, "wall_seconds": wall,
                            "engine_seconds": loop, "engine_rows_per_s": rows / loop,
                            "wall_rows_per_s": rows / wall, "engine": eng}
        tables[workers] = storage.read_table(folder)
        print(f"{workers} worker(s): {rows} rows, engine {loop:.1f} s "
              f"({rows / loop:,.0f} rows/s), wall {wall:.1f} s ({rows / wall:,.0f} rows/s)",
              flush=True)
    assert results[1]["rows"] == rows_expected
    card = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    eq = compare(tables[gpus], tables[1])
    summary = {"device": card, "gpus": gpus, "torch": torch.__version__, "args": vars(args),
               "runs": results, "equality": eq,
               "engine_speedup": results[gpus]["engine_rows_per_s"] / results[1]["engine_rows_per_s"],
               "wall_speedup": results[gpus]["wall_rows_per_s"] / results[1]["wall_rows_per_s"]}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str))
    print(f"\nteacher forcing, pair from scratch, random-weight Llama-3.1-8B shape, bf16, "
          f"{args.sequences} x {args.prompt_len}+{args.response_len} tokens [{gpus} x {card}]")
    print(f"{'workers':>7} {'rows':>8} {'engine s':>9} {'engine rows/s':>14} {'wall s':>7} "
          f"{'wall rows/s':>12}")
    for w in (1, gpus):
        r = results[w]
        print(f"{w:7d} {r['rows']:8d} {r['engine_seconds']:9.1f} {r['engine_rows_per_s']:14,.0f} "
              f"{r['wall_seconds']:7.1f} {r['wall_rows_per_s']:12,.0f}")
    print(f"speed-up {gpus} vs 1: engine {summary['engine_speedup']:.2f}x, wall "
          f"{summary['wall_speedup']:.2f}x")
    print(f"tables equal: token ids {eq['token_ids_equal']}, other exact columns "
          f"{eq['exact_columns_equal']}, metrics within 1e-5 {eq.get('metrics_within_1e-5')} "
          f"(largest diff {max(eq.get('max_abs_diff', {0: float('nan')}).values()):.2e})")


if __name__ == "__main__":
    main()

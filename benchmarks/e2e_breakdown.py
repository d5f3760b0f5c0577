"""Where the end-to-end engine loses time against its device path (diagnostic).

Runs forcing.run_checkpoint over the 384-token scenario of bench_engine.py (random-weight
8B-shaped models, reference cached first) with parts of the host-side work switched off,
one at a time, so the cost of each shows as the difference:

  as notebook 03 runs it      hidden states of the checkpoint saved, parquet shards written
  LM head not saved           its 1 GB LM head not copied to its cache (a one-time cost)
  hidden states to host, no disk   copied to pinned host memory but not written
  no hidden-state save        the checkpoint's cache off (checkpoints in no configured pair)
  no table rows               + the per-token Arrow table is not built or written
  no reads                    + the reference's hidden states come from memory, not disk

    python benchmarks/e2e_breakdown.py [--copies 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_models import build_model, llama_8b_config, make_sequences, tiny_config  # noqa: E402

from rlprobe_nb import forcing
from rlprobe_nb.tables import storage  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--tiny", action="store_true", help="CPU dry run")
    args = ap.parse_args(argv)
    if args.tiny:
        device = torch.device("cpu")
        cfg = tiny_config()
        n, prompt, resp, kw = 12, 16, 32, dict(batch_tokens=256, chunk_positions=64)
    else:
        device = torch.device("cuda")
        cfg = llama_8b_config()
        n, prompt, resp, kw = 36 * args.copies, 64, 384, dict(batch_tokens=8192,
                                                              chunk_positions=1024)
    P = build_model(cfg, 0, device, torch.bfloat16)
    Q = build_model(cfg, 1, device, torch.bfloat16)
    seqs = make_sequences(n, prompt, resp, cfg.vocab_size, seed=8)
    rows = seqs.n_rows()
    kw.update(suite="bench", topk=5, device=device, progress=False)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        forcing.forward_to_cache(seqs, forcing.Side("Q", Q, None, f"{tmp}/hQ"), **kw)
        results["reference to cache (incl. compile)"] = time.perf_counter() - t
        print(f"reference to its cache, first call of the process (layer compilation "
              f"included): {rows / results['reference to cache (incl. compile)']:,.0f} rows/s, "
              f"{results['reference to cache (incl. compile)']:.1f}s for {rows} rows", flush=True)

        def run(label, save_hidden=True):
            out = f"{tmp}/t-{len(results)}"
            t = time.perf_counter()
            path = forcing.run_checkpoint(
                seqs, forcing.Side("P", P, None, f"{tmp}/hP-{len(results)}" if save_hidden else None),
                forcing.Side("Q", cache_dir=f"{tmp}/hQ"), out, **kw)
            total = time.perf_counter() - t
            eng = storage.read_manifest(path)["engine"]
            results[label] = total
            print(f"{label:<32} {rows / total:>9,.0f} rows/s end to end, "
                  f"{rows / eng['seconds_this_run']:>9,.0f} in the batch loop "
                  f"(waits: reads {eng['seconds_waiting_for_reads']:.2f}s, "
                  f"writes {eng['seconds_waiting_for_writes']:.2f}s)", flush=True)

        run("warm-up", save_hidden=False)
        run("as notebook 03 runs it")
        real_head = forcing.HiddenCache.save_head
        forcing.HiddenCache.save_head = lambda self, head: None
        try:
            run("the same, LM head not saved")
        finally:
            forcing.HiddenCache.save_head = real_head
        real_save = forcing.HiddenCache.save
        forcing.HiddenCache.save = lambda self, members, hidden, batch_tokens: None
        try:
            run("hidden states to host, no disk")
        finally:
            forcing.HiddenCache.save = real_save
        run("no hidden-state save", save_hidden=False)
        real_rows_table = forcing.engine.rows_table
        real_write, real_finish = storage.ShardedTable.write_shard, storage.ShardedTable.finish

        def finish_without_rows(self, manifest, expected):
            storage.atomic_write_json(self.folder / storage.MANIFEST, {**manifest, "rows": 0, "complete": True})
            self.release()
            return self.folder

        try:
            forcing.engine.rows_table = lambda members, host, *a, **k: pa.table({})  # no rows
            storage.ShardedTable.write_shard = lambda self, key, df: None
            storage.ShardedTable.finish = finish_without_rows
            run("no table rows", save_hidden=False)
            cache = forcing.HiddenCache(f"{tmp}/hQ")
            held = {forcing.HiddenCache.shard_stem([seqs.sequences[i] for i in b.members]):
                    cache.rows([seqs.sequences[i] for i in b.members], pin_memory=device.type == "cuda")
                    for b in forcing.plan_batches(seqs, kw["batch_tokens"])}
            real_rows = forcing.HiddenCache.rows
            forcing.HiddenCache.rows = lambda self, members, pin_memory=False: held[
                forcing.HiddenCache.shard_stem(members)]
            try:
                run("no reads", save_hidden=False)
            finally:
                forcing.HiddenCache.rows = real_rows
        finally:
            forcing.engine.rows_table = real_rows_table
            storage.ShardedTable.write_shard = real_write
            storage.ShardedTable.finish = real_finish


if __name__ == "__main__":
    main()

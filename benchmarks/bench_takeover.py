"""Chapter 09's lock-step decoder on a suite's own models and token tables: what it costs
on this device, and how many of its texts equal those of the suite's ``takeover`` table
(written by the book, e.g. on the CPU) for the same checkpoint, problems and rules.

The thresholds come from the suite's token tables exactly as chapter 09 derives them
(``sweep.all_thresholds``, the calibrated criterion's null from the placebo at the
checkpoint's step); the tables are read as data (``storage.read_table``), so tables made
on another machine can be carried here. Printed and written (``--json``): seconds to load
the two models, seconds to write and grade, requests, rule texts, distinct node-steps
(rows forwarded through both models), prompts taken from the cache; with the table, the
share of (problem, sample, rule) texts equal token for token and each criterion's
accuracy on both sides. A second, larger call (``--problems 300 --samples 4`` with demo_scaled's six
budgets) gives the per-request rate that prices a full sweep; ``--leave-gib`` runs it as
on a device with that much memory free (the decoder sizes its slots by it).

    python benchmarks/bench_takeover.py --suite demo --device cuda --checkpoint rlvr_step_1200 \\
        --problems 100 --json $OUT/bench_takeover.json
"""

from __future__ import annotations

import argparse
import json
import time

import pandas as pd

from rlprobe_nb.problems import sources as problem_sources
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import storage
from rlprobe_nb.takeover import calibrated, sweep, table


def _tokens(P, checkpoints: list[str]) -> pd.DataFrame:
    frames = [storage.read_table(paths.table_dir(P.suite, paths.token_table_name(c, P.reference)))
              .assign(checkpoint=c) for c in dict.fromkeys(checkpoints)]
    return pd.concat(frames, ignore_index=True)


def _agreement(ours: pd.DataFrame, P, checkpoint: str) -> dict:
    """Texts and accuracies beside the suite's takeover table, where it has these rows."""
    folder = paths.table_dir(P.suite, "takeover")
    if not storage.is_complete(folder):
        return {"table": "absent"}
    book = storage.read_table(folder)
    keys = ["problem_id", "sample", "criterion", "budget"]
    both = ours.merge(book[book.checkpoint == checkpoint][keys + ["response_ids", "correct"]],
                      on=keys, suffixes=("", "_table"), how="inner")
    if both.empty:
        return {"table": "no shared rows"}
    same = [list(a) == list(b) for a, b in zip(both.response_ids, both.response_ids_table)]
    acc = both.groupby("criterion")[["correct", "correct_table"]].mean().round(4)
    return {"rows": len(both), "texts_equal": float(pd.Series(same).mean()),
            "accuracy_here_vs_table": acc.to_dict(orient="index")}


def _hold_all_but(gib: float):
    """A tensor taking the device's free memory but ``gib``."""
    import torch
    free, _ = torch.cuda.mem_get_info()
    return torch.empty(max(0, int(free - gib * 2**30)), dtype=torch.uint8, device="cuda")


def _allocated_after_reset(device: str) -> int:
    """Bytes allocated now (models, held memory); the peak counter starts from here."""
    import torch
    if device == "cpu" or not torch.cuda.is_available():
        return 0
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="demo")
    ap.add_argument("--device", default="cpu",
                    help="cpu, cuda or auto (the suite's runtime.device)")
    ap.add_argument("--checkpoint", default=None, help="default: the suite's target")
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--samples", type=int, default=None, help="default: takeover.samples")
    ap.add_argument("--budgets", type=float, nargs="*", default=None,
                    help="default: takeover.budgets")
    ap.add_argument("--batch-rows", type=int, default=None, help="default: takeover.batch_rows")
    ap.add_argument("--leave-gib", type=float, default=None,
                    help="CUDA: hold all but this much free memory before decoding (the "
                         "decoder's memory cap as on a smaller or fuller device)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    P = params.load(a.suite, overrides={"runtime.device": a.device})
    T, ck = P.takeover, a.checkpoint or P.target
    samples, budgets = a.samples or T.samples, a.budgets or T.budgets
    nulls = [calibrated.null_for(P, ck)] if "calibrated" in T.criteria else []
    tokens = _tokens(P, [ck] + nulls)
    scorers = calibrated.scorers(P, tokens, [ck])[0] if nulls else {}
    rules = table.rules_of(sweep.all_thresholds(tokens, [ck], T.criteria, budgets, scorers), ck)
    problems = problem_sources.suite_problems(P, n=a.problems, limit=a.problems)
    start = time.perf_counter()
    ref, ckpt = models.load_model(P.reference, P), models.load_model(ck, P)
    loaded = time.perf_counter() - start
    held = _hold_all_but(a.leave_gib) if a.leave_gib is not None else None
    base = _allocated_after_reset(a.device)
    stats: dict = {}
    start = time.perf_counter()
    ours = table.write_rules(
        ref.model, ckpt.model, ref.tokenizer, problems, rules, P=P, checkpoint=ck,
        samples=samples, temperature=T.temperature,
        max_new_tokens=T.max_new_tokens or P.filtering.max_new_tokens,
        stop_at_box=T.stop_at_box, seed=T.seed, batch_rows=a.batch_rows or T.batch_rows,
        scorer=scorers.get(ck), stats=stats)
    seconds = time.perf_counter() - start
    import torch
    cuda = a.device != "cpu" and torch.cuda.is_available()
    del held
    out = {"suite": P.suite, "checkpoint": ck, "device": a.device,
           "device_name": torch.cuda.get_device_name() if cuda else "cpu",
           "peak_gib_over_models": round((torch.cuda.max_memory_allocated() - base) / 2**30, 2)
           if cuda else None,
           "torch_threads": torch.get_num_threads(), "leave_gib": a.leave_gib,
           "problems": len(problems),
           "samples": samples, "rules": len(rules), "requests": len(problems) * samples,
           "texts": len(ours), "seconds_load": round(loaded, 1),
           "seconds_write_and_grade": round(seconds, 1),
           "seconds_per_request": round(seconds / (len(problems) * samples), 4), **stats,
           "accuracy": ours.groupby("criterion").correct.mean().round(4).to_dict(),
           "against_the_table": _agreement(ours, P, ck)}
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

"""Two runs of the book on the same suite (e.g. one GPU and two) compared table by table:
the sampled tables (answers, rollouts: 01, 02) token for token, every token table (03)
with its ids and ranks exactly and its metrics within the stated tolerance, and the
counterfactual branches (08) pass for pass.

    python benchmarks/compare_runs.py RUN_A/out RUN_B/out --suite demo_scaled --json out.json

Prints one line per table and exits 1 if any differs beyond what is stated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlprobe_nb.forcing.precision import BATCH_TOLERANCE  # noqa: E402
from rlprobe_nb.tables import storage  # noqa: E402

EXACT_TOKENS = ["suite", "checkpoint", "reference", "problem_id", "rollout_id", "pos", "token_id",
                "rank_ckpt", "rank_ref", "topk_ids_ckpt", "topk_ids_ref"]
METRICS = ["logp_ckpt", "logp_ref", "entropy_ckpt", "entropy_ref", "kl_ckpt_ref", "kl_ref_ckpt",
           "js", "k1", "k2", "k3"]


def _read(root: Path, suite: str, name: str) -> pd.DataFrame | None:
    folder = root / "data" / suite / name
    return storage.read_table(folder) if storage.is_complete(folder) else None


def _same(a: pd.Series, b: pd.Series) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


def compare_sampled(a: pd.DataFrame, b: pd.DataFrame, key: list[str]) -> dict:
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    ids = "response_ids" if "response_ids" in a else "response"
    return {"rows": [len(a), len(b)], "keys_equal": a[key].equals(b[key]),
            "tokens_equal": len(a) == len(b) and _same(a[ids], b[ids]),
            "differing_rows": int(sum(not np.array_equal(np.asarray(x), np.asarray(y))
                                      for x, y in zip(a[ids], b[ids]))) if len(a) == len(b) else None}


def compare_tokens(a: pd.DataFrame, b: pd.DataFrame) -> dict:
    key = ["rollout_id", "pos"]
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    out = {"rows": [len(a), len(b)]}
    if len(a) != len(b):
        return {**out, "ok": False}
    out["exact_columns_equal"] = {c: _same(a[c], b[c]) if a[c].dtype == object else bool(a[c].equals(b[c]))
                                  for c in EXACT_TOKENS if c in a}
    scaled = {m: float(((a[m] - b[m]).abs() / a[m].abs().clip(lower=1)).max()) for m in METRICS}
    out["largest_scaled_change"] = scaled
    out["ok"] = all(out["exact_columns_equal"].values()) and max(scaled.values()) <= BATCH_TOLERANCE
    return out


def compare_branches(a: pd.DataFrame, b: pd.DataFrame) -> dict:
    key = ["model", "kind", "rollout_id", "pos", "arm"]
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    same = len(a) == len(b) and a[key].equals(b[key])
    return {"rows": [len(a), len(b)], "contexts_equal": same,
            "passes_equal": same and bool((a.passes == b.passes).all()),
            "contexts_with_other_passes": int((a.passes != b.passes).sum()) if same else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--suite", required=True)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    report, ok = {}, True
    for name, key in (("answers", ["model", "problem_id", "sample"]),
                      ("rollouts", ["model", "problem_id", "sample"])):
        a, b = _read(args.a, args.suite, name), _read(args.b, args.suite, name)
        if a is not None and b is not None:
            report[name] = compare_sampled(a, b, key)
            ok &= report[name]["tokens_equal"]
    for folder in sorted((args.a / "data" / args.suite / "tokens").glob("*__vs__*")):
        name = f"tokens/{folder.name}"
        a, b = _read(args.a, args.suite, name), _read(args.b, args.suite, name)
        if a is not None and b is not None:
            report[name] = compare_tokens(a, b)
            ok &= report[name]["ok"]
    a, b = _read(args.a, args.suite, "branches"), _read(args.b, args.suite, "branches")
    if a is not None and b is not None:
        report["branches"] = compare_branches(a, b)
        ok &= report["branches"]["passes_equal"]
    for name, result in report.items():
        print(f"{name}: {json.dumps(result)}")
    print("ALL EQUAL (within the stated tolerance)" if ok else "DIFFERENCES ABOVE")
    if args.json:
        args.json.write_text(json.dumps({"equal": ok, "tables": report}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

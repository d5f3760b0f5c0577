"""From a plan of contexts to graded pass counts: the one place continuations are sampled
and graded, shared by takeover curves, branches and the positive control.

A *plan* has one row per context to test, cut from a rollout at response token ``pos``:

    arm "prefix"      prompt + response[:pos]                  (a point of a takeover curve)
    arm "keep"        prompt + response[:pos + 1]              (the written token kept)
    arm "top1"        prompt + response[:pos] + [substituted]  (the checkpoint's alternative)
    arm "correct"     prompt + response[:pos] + [substituted]  (the correct digit)

so ``prefix_len`` (rollout tokens kept: pos, pos + 1, pos, pos) is the takeover curve's x.
Rows that describe the same context (a grid point at k and the "keep" arm at k − 1) get
the same seeds and are sampled once: seeds follow the context, not the row's role.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb.counterfactuals.continuations import (
    Context,
    branch_response,
    continuation_seed,
    continue_contexts,
)
from rlprobe_nb.problems import grading
from rlprobe_nb.statistics import wilson_ci

ARMS = ("prefix", "keep", "top1", "correct")
SUBSTITUTES = ("top1", "correct")  # arms that swap a token in
PLAN_COLUMNS = ["rollout_id", "problem_id", "kind", "pos", "arm", "substituted_id"]


def prefix_len(pos: int, arm: str) -> int:
    """How many tokens of the rollout a context keeps."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    return int(pos) + 1 if arm == "keep" else int(pos)


def with_prefix_len(plan: pd.DataFrame) -> pd.DataFrame:
    """The plan with ``prefix_len`` and the substituted token as an int or None; checks
    that substitute rows name a token and the others do not."""
    missing = [c for c in PLAN_COLUMNS if c not in plan.columns]
    if missing:
        raise ValueError(f"the plan lacks columns {missing}")
    sub = [None if pd.isna(s) else int(s) for s in plan["substituted_id"]]
    bad = [(a, s) for a, s in zip(plan["arm"], sub) if (a in SUBSTITUTES) != (s is not None)]
    if bad:
        raise ValueError(f"rows of arms top1 and correct need a substituted_id and other rows none, got {bad[:3]}")
    return plan.assign(substituted_id=pd.array(sub, dtype="Int64"),
                       prefix_len=[prefix_len(p, a) for p, a in zip(plan["pos"], plan["arm"])])


def _context_key(row) -> tuple:
    s = row.substituted_id
    return row.rollout_id, int(row.prefix_len), None if pd.isna(s) else int(s)


def pass_counts(model, tokenizer, plan: pd.DataFrame, rollouts: pd.DataFrame,
                gold: dict[str, str], *, model_name: str, n: int, temperature: float,
                max_new_tokens: int, seed: int, batch_rows: int = 32,
                continuation_tokens: int | None = None, stop_at_box: bool = False,
                timeout_s: float = 5.0, workers: int = 2,
                progress: bool | str = False) -> pd.DataFrame:
    """Sample ``n`` continuations of every context of ``plan`` from ``model`` and grade each
    whole response (context response part + continuation) against the problem's gold
    answer. A continuation writes at most ``continuation_tokens`` new tokens (None: up to
    the response limit) and, with ``stop_at_box``, stops once it has closed a box.
    Returns the plan with ``prefix_len``, ``n``, ``passes``, ``pass_rate``, its Wilson 95%
    interval, ``n_stopped`` (continuations that ended with EOS or a closed box), the mean
    number of new tokens and the per-sample ``seeds``."""
    plan = with_prefix_len(plan)
    by_id = rollouts.set_index("rollout_id")
    keys = list(dict.fromkeys(_context_key(r) for r in plan.itertuples()))
    contexts, seeds = [], []
    for rid, k, sub in keys:
        response = list(by_id.at[rid, "response_ids"])
        if k > len(response) or (k == len(response) and sub is not None):
            raise ValueError(f"{rid}: a context at token {k} lies beyond its {len(response)} tokens")
        contexts.append(Context(tuple(int(t) for t in by_id.at[rid, "prompt_ids"]),
                                branch_response(response, k, sub), int(max_new_tokens),
                                continuation_tokens))
        seeds.append([continuation_seed(seed, rid, k, sub, s) for s in range(n)])
    outs = continue_contexts(model, tokenizer, contexts, seeds, temperature, batch_rows,
                             progress, stop_at_box=stop_at_box)
    texts, golds = [], []
    for (rid, _, _), ctx, samples in zip(keys, contexts, outs):
        for new, _ in samples:
            texts.append(tokenizer.decode(list(ctx.response_ids) + new, skip_special_tokens=True))
            golds.append(gold[by_id.at[rid, "problem_id"]])
    grades = grading.grade_many(texts, golds, timeout_s, workers)
    stats = {}
    for i, key in enumerate(keys):
        right = [g.correct for g in grades[i * n:(i + 1) * n]]
        passes = int(sum(right))
        low, high = wilson_ci(passes, n)
        stats[key] = {"n": n, "passes": passes, "pass_rate": passes / n if n else np.nan,
                      "wilson_low": low, "wilson_high": high,
                      "n_stopped": sum(r in ("stop", "box") for _, r in outs[i]),
                      "mean_new_tokens": float(np.mean([len(t) for t, _ in outs[i]])) if n else np.nan,
                      "seeds": seeds[i]}
    rows = [stats[_context_key(r)] for r in plan.itertuples()]
    return pd.concat([plan.reset_index(drop=True), pd.DataFrame(rows)], axis=1)

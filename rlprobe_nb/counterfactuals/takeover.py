"""Takeover curves: how often a model reaches a right answer when it takes over a response
after its first k tokens, and where that stops being possible.

The curve of a rollout under a model M is the pass rate of M's continuations of
``prompt + response[:k]`` as a function of k (each point with a Wilson interval). At k = 0
it is M's own pass rate on the problem; as k grows, M inherits more of the response.

A *drop* is where inheriting one more stretch of text makes M fail where it had been
succeeding. Point j of a curve is a drop when

1. the pooled pass rate of points j, j+1 (``after`` points: the fall must last) is below
   the pooled rate of the ``before`` points preceding j by at least ``min_drop``, with
   Newcombe's interval for the difference below zero at level ``alpha / m`` (m: the
   positions scanned, a Bonferroni correction: the scan looks for the fall at every
   position, and on a flat curve of 20 points at n = 8 the uncorrected scan finds a
   "drop" in about one curve in five), and
2. each ``after`` point alone is below the ``before`` level by at least ``min_drop``,
   with its interval at level ``alpha`` below zero (this places the drop at its first
   low point rather than one point early, where the pool straddles the edge, and keeps a
   single low point followed by a high one from passing as a fall).

The first such j is the drop; it lies between the points j − 1 and j, so with points one
token apart the token at ``drop_at − 1`` is the one whose inclusion broke the response.
The ``before`` level is the curve just before j, not its start: a curve often starts low
(M alone rarely solves the problem) and rises as M inherits good reasoning before it
falls, and the rise must not hide the fall. Simulated on curves of 20 points at n = 8
(tests): false drops on flat curves at rates 0.3-0.9 ≤ 3%; a fall from 0.9 to 0.05 found
within one point ≥ 97% of the time.

``locate_drop`` finds the drop without sampling every k: a coarse grid, a closer look
around low grid points, then bisection between the last high point and the first low
one, assuming the curve is a step there.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from rlprobe_nb.counterfactuals.intervals import newcombe_ci


def grid(n_tokens: int, step: int) -> list[int]:
    """Prefix lengths 0, step, 2·step, … and ``n_tokens`` itself."""
    if n_tokens < 0 or step < 1:
        raise ValueError(f"need n_tokens >= 0 and step >= 1, got {n_tokens}, {step}")
    return sorted(set(range(0, n_tokens, step)) | {n_tokens})


def even_grid(n_tokens: int, points: int) -> list[int]:
    """``points`` prefix lengths spread evenly over 0..n_tokens (both ends included)."""
    if points < 2:
        return [0]
    return sorted(set(np.linspace(0, n_tokens, points).round().astype(int).tolist()))


def body_length(response_ids, eos: set[int]) -> int:
    """Tokens a context may keep: the response without its final EOS (nothing is written
    after EOS, so a prefix that includes it has nothing to continue)."""
    ids = list(response_ids)
    return len(ids) - 1 if ids and int(ids[-1]) in eos else len(ids)


def _pooled(c: pd.DataFrame, rows: slice) -> tuple[int, int]:
    part = c.iloc[rows]
    return int(part["passes"].sum()), int(part["n"].sum())


def _falls(before: tuple[int, int], after: tuple[int, int], alpha: float, min_drop: float) -> bool:
    """``after`` is below ``before`` by at least ``min_drop``, its interval below zero."""
    diff, _, high = newcombe_ci(after[0], after[1], before[0], before[1], alpha)
    return high < 0 and -diff >= min_drop


def find_drop(curve: pd.DataFrame, alpha: float = 0.05, min_drop: float = 0.3,
              before: int = 3, after: int = 2) -> dict:
    """The first drop of a curve (columns ``prefix_len``, ``passes``, ``n``; one row per
    prefix length; see the module doc). Returns {drop: bool, drop_after, drop_at (prefix
    lengths: the drop lies between them), level (pooled rate before), rate_at (pooled
    rate after)}; without a drop, drop_after and drop_at are None."""
    c = curve.sort_values("prefix_len").reset_index(drop=True)
    if c["prefix_len"].duplicated().any():
        raise ValueError("a takeover curve has one point per prefix length")
    scanned = max(1, len(c) - 1)
    for j in range(1, len(c)):
        level = _pooled(c, slice(max(0, j - before), j))
        each = [(int(c.passes[i]), int(c.n[i])) for i in range(j, min(j + after, len(c)))]
        if _falls(level, _pooled(c, slice(j, j + after)), alpha / scanned, min_drop) \
                and all(_falls(level, point, alpha, min_drop) for point in each):
            low = _pooled(c, slice(j, j + after))
            return {"drop": True, "drop_after": int(c.prefix_len[j - 1]),
                    "drop_at": int(c.prefix_len[j]), "level": level[0] / level[1],
                    "rate_at": low[0] / low[1]}
    return {"drop": False, "drop_after": None, "drop_at": None, "level": float("nan"),
            "rate_at": float("nan")}


def _lone_fall(c: pd.DataFrame, alpha: float, min_drop: float, before: int,
               skip: set[int]) -> int | None:
    """The first point (index into the sorted curve) that falls below the level of the
    points before it, leaving out prefix lengths in ``skip``; None if none does."""
    for j in range(1, len(c)):
        if int(c.prefix_len[j]) in skip:
            continue
        level = _pooled(c, slice(max(0, j - before), j))
        if _falls(level, (int(c.passes[j]), int(c.n[j])), alpha, min_drop):
            return j
    return None


def locate_drop(evaluate: Callable[[list[int]], pd.DataFrame], n_tokens: int, step: int,
                alpha: float = 0.05, min_drop: float = 0.3, before: int = 3,
                after: int = 2) -> tuple[dict, pd.DataFrame]:
    """Find a curve's first drop to one token without sampling every k.

    1. Evaluate a grid of ``step`` tokens.
    2. While no drop is found, a low grid point may be noise or a short low stretch that
       the grid crosses once (text that breaks the answer and, a few tokens on, text that
       repairs it): sample the midpoints on both sides of the first low point not yet
       looked at, and judge again.
    3. Bisect between the two points around the drop (a probe is low when it alone falls
       below the level of the points before it), and judge the drop again on every point.

    ``evaluate(prefix_lengths)`` returns curve rows for those prefix lengths. Returns
    (find_drop's result on all points, all points)."""
    curve = evaluate(grid(n_tokens, step))

    def sorted_curve():
        return curve.sort_values("prefix_len").reset_index(drop=True)

    looked: set[int] = set()
    found = find_drop(curve, alpha, min_drop, before, after)
    while not found["drop"]:
        c = sorted_curve()
        j = _lone_fall(c, alpha, min_drop, before, looked)
        if j is None:
            break
        looked.add(int(c.prefix_len[j]))
        k = int(c.prefix_len[j])
        neighbours = [int(c.prefix_len[i]) for i in (j - 1, j + 1) if 0 <= i < len(c)]
        new = sorted({(a + k) // 2 for a in neighbours} - set(c.prefix_len))
        if new:
            curve = pd.concat([curve, evaluate(new)], ignore_index=True)
            found = find_drop(curve, alpha, min_drop, before, after)
    if found["drop"]:
        lo, hi = found["drop_after"], found["drop_at"]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if mid not in set(curve.prefix_len):
                curve = pd.concat([curve, evaluate([mid])], ignore_index=True)
            c = curve[curve.prefix_len <= mid].sort_values("prefix_len").reset_index(drop=True)
            level = _pooled(c, slice(max(0, len(c) - 1 - before), len(c) - 1))
            if _falls(level, (int(c.passes.iloc[-1]), int(c.n.iloc[-1])), alpha, min_drop):
                hi = mid
            else:
                lo = mid
        found = find_drop(curve, alpha, min_drop, before, after)
    return found, sorted_curve()


def curve_points(branches: pd.DataFrame) -> pd.DataFrame:
    """Takeover-curve points of each (model, rollout) in a ``branches`` table: the
    unbranched contexts, i.e. arms "prefix" and "keep" (a kept token extends the prefix by
    one), one per prefix length."""
    pts = branches[branches["arm"].isin(["prefix", "keep"])]
    cols = ["model", "rollout_id", "prefix_len", "n", "passes", "pass_rate", "wilson_low",
            "wilson_high"]
    return pts[cols].drop_duplicates(["model", "rollout_id", "prefix_len"]).sort_values(
        ["model", "rollout_id", "prefix_len"]).reset_index(drop=True)


def curve_drops(branches: pd.DataFrame, rollout_ids: list[str], alpha: float = 0.05,
                min_drop: float = 0.3) -> pd.DataFrame:
    """``find_drop`` on the curve of each (model, rollout) of ``rollout_ids``, and the
    branch points whose token enters the prefix inside the drop (k = pos + 1 in
    (drop_after, drop_at]). One row per curve: model, rollout_id, points, start (pass
    rate at k = 0), drop, drop_after, drop_at, level, rate_at, points_inside."""
    pts = curve_points(branches[branches["rollout_id"].isin(list(rollout_ids))])
    marks = branches[(branches["arm"] == "keep") & (branches["kind"] != "grid")]
    rows = []
    for (model, rid), curve in pts.groupby(["model", "rollout_id"], sort=True):
        found = find_drop(curve, alpha, min_drop)
        inside = []
        if found["drop"]:
            mine = marks[(marks["model"] == model) & (marks["rollout_id"] == rid)]
            inside = [f"{k} @ {p}" for k, p in zip(mine["kind"], mine["pos"])
                      if found["drop_after"] < p + 1 <= found["drop_at"]]
        first = curve.sort_values("prefix_len").iloc[0]
        rows.append({"model": model, "rollout_id": rid, "points": len(curve),
                     "start": float(first["pass_rate"]), **found,
                     "points_inside": ", ".join(inside)})
    return pd.DataFrame(rows, columns=["model", "rollout_id", "points", "start", "drop",
                                       "drop_after", "drop_at", "level", "rate_at",
                                       "points_inside"])

"""Takeover curves: how often a model reaches a right answer when it takes over a response
after its first k tokens, and where that stops being possible.

The curve of a rollout under a model M is the pass rate of M's continuations of
``prompt + response[:k]`` as a function of k (each point with a Wilson interval). At k = 0
it is M's own pass rate on the problem; as k grows, M inherits more of the response.
A *drop* is where inheriting one more stretch of text makes M fail where it had been
succeeding: the first point whose pass rate falls significantly below the best level
reached before it — Newcombe's interval for the difference lies below zero — by at least
``min_drop``, and stays there at the next point (a single low point between two high
ones is noise or a local detour, not text that can no longer be recovered from).
The drop lies between the previous point and that one: with points one token apart, the
token at ``drop_at - 1`` is the one whose inclusion broke the response.

Comparing with the best level so far rather than with the curve's start matters: a
curve often starts low (M alone rarely solves the problem) and rises as M inherits good
reasoning before it falls, and the rise must not hide the fall.

``locate_drop`` finds the drop without sampling every k: a coarse grid, then bisection
between the last high point and the first low one, assuming the curve is a step there.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from .intervals import newcombe_ci


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


def _is_low(best: tuple[int, int], point: tuple[int, int], alpha: float, min_drop: float) -> bool:
    (kb, nb), (kp, np_) = best, point
    diff, _, high = newcombe_ci(kp, np_, kb, nb, alpha)
    return high < 0 and -diff >= min_drop


def find_drop(curve: pd.DataFrame, alpha: float = 0.05, min_drop: float = 0.3) -> dict:
    """The first drop of a curve (columns ``prefix_len``, ``passes``, ``n``; one row per
    prefix length). Returns {drop: bool, drop_after, drop_at (prefix lengths: the drop
    lies between them), best_at, best_rate, rate_at}; with no drop, drop_after and
    drop_at are None."""
    c = curve.sort_values("prefix_len").reset_index(drop=True)
    if c["prefix_len"].duplicated().any():
        raise ValueError("a takeover curve has one point per prefix length")
    k, n = c["passes"].to_numpy(int), c["n"].to_numpy(int)
    rate = np.where(n > 0, k / np.maximum(n, 1), np.nan)
    best = 0
    for j in range(1, len(c)):
        if rate[j - 1] > rate[best]:
            best = j - 1
        low_here = _is_low((k[best], n[best]), (k[j], n[j]), alpha, min_drop)
        stays = j + 1 >= len(c) or _is_low((k[best], n[best]), (k[j + 1], n[j + 1]),
                                           alpha, min_drop)
        if low_here and stays:
            return {"drop": True, "drop_after": int(c.prefix_len[j - 1]),
                    "drop_at": int(c.prefix_len[j]), "best_at": int(c.prefix_len[best]),
                    "best_rate": float(rate[best]), "rate_at": float(rate[j])}
    top = int(np.nanargmax(rate)) if len(c) else 0
    return {"drop": False, "drop_after": None, "drop_at": None,
            "best_at": int(c.prefix_len[top]) if len(c) else None,
            "best_rate": float(rate[top]) if len(c) else float("nan"), "rate_at": float("nan")}


def locate_drop(evaluate: Callable[[list[int]], pd.DataFrame], n_tokens: int, step: int,
                alpha: float = 0.05, min_drop: float = 0.3) -> tuple[dict, pd.DataFrame]:
    """Find a curve's first drop to one token: evaluate a grid of ``step`` tokens, then
    bisect between the two grid points around the first drop, and judge the drop again on
    every point. ``evaluate(prefix_lengths)`` returns curve rows for those prefix lengths.
    Returns (find_drop's result on all points, all points)."""
    curve = evaluate(grid(n_tokens, step))
    found = find_drop(curve, alpha, min_drop)
    if found["drop"]:
        lo, hi = found["drop_after"], found["drop_at"]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            curve = pd.concat([curve, evaluate([mid])], ignore_index=True)
            # the level to beat is the best one before ``mid``, as in find_drop
            before = curve[curve.prefix_len < mid]
            b = before.loc[(before.passes / before.n).idxmax()]
            point = curve[curve.prefix_len == mid].iloc[0]
            if _is_low((int(b.passes), int(b.n)), (int(point.passes), int(point.n)), alpha, min_drop):
                hi = mid
            else:
                lo = mid
        found = find_drop(curve, alpha, min_drop)
    return found, curve.sort_values("prefix_len").reset_index(drop=True)

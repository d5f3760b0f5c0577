"""Intervals for pass rates of continuations: one difference of two proportions, and a
mean effect (or a difference of two mean effects) over problems.

``newcombe_ci`` is Newcombe's hybrid score interval for p1 − p2 with independent samples
(method 10 of Newcombe 1998, "Interval estimation for the difference between independent
proportions: comparison of eleven methods", Statistics in Medicine 17:873-890): it
combines the two Wilson score intervals, so it stays inside [−1, 1], behaves at 0 and n
successes (where the Wald interval collapses to a point) and keeps close to its nominal
coverage at the small n a branch affords.

Effects of branches in one problem share the problem (its difficulty, its rollouts), so
means over branches get a bootstrap that resamples whole problems
(``statistics.cluster_bootstrap_ci``); a contrast of two kinds of branch (spikes vs
controls) resamples problems once for both, keeping each problem's pairing.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from rlprobe_nb.statistics import wilson_ci


@functools.lru_cache(maxsize=65536)  # curves and simulations ask for the same counts often
def newcombe_ci(k1: int, n1: int, k2: int, n2: int, alpha: float = 0.05
                ) -> tuple[float, float, float]:
    """(p1 − p2, low, high): Newcombe's hybrid score interval for the difference of two
    independent proportions k1/n1 and k2/n2. With n = 0 on a side the difference is
    unknown: (nan, −1, 1)."""
    if n1 == 0 or n2 == 0:
        return float("nan"), -1.0, 1.0
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_ci(k1, n1, alpha)
    l2, u2 = wilson_ci(k2, n2, alpha)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return d, max(-1.0, low), min(1.0, high)


def _problem_sums(values, clusters, codes_of: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per-problem sums and counts of ``values`` on the shared problem index."""
    idx = np.array([codes_of[c] for c in clusters], dtype=np.int64)
    vals = np.asarray(values, dtype=np.float64)
    sums = np.bincount(idx, weights=vals, minlength=len(codes_of))
    counts = np.bincount(idx, minlength=len(codes_of)).astype(np.float64)
    return sums, counts


def cluster_bootstrap_difference(values_a, clusters_a, values_b, clusters_b,
                                 n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
                                 ) -> tuple[float, float, float]:
    """(mean(a) − mean(b), low, high) with a percentile interval from resampling problems.

    Each draw takes problems with replacement from the union of both groups' problems and
    keeps all their values of either group, so a problem that holds both spikes and
    controls moves both together (the pairing by problem is kept). A draw in which a
    group has no value is redrawn. NaN when either group is empty."""
    va, vb = np.asarray(values_a, dtype=np.float64), np.asarray(values_b, dtype=np.float64)
    if len(va) == 0 or len(vb) == 0:
        return float("nan"), float("nan"), float("nan")
    problems = pd.unique(np.concatenate([np.asarray(clusters_a, dtype=object),
                                         np.asarray(clusters_b, dtype=object)]))
    codes_of = {c: i for i, c in enumerate(problems)}
    sa, ca = _problem_sums(va, clusters_a, codes_of)
    sb, cb = _problem_sums(vb, clusters_b, codes_of)
    rng = np.random.default_rng(seed)
    boot = np.empty(0)
    while len(boot) < n_boot:  # redraw the (rare) draws that leave a group empty
        draws = rng.integers(0, len(problems), size=(n_boot, len(problems)))
        na, nb = ca[draws].sum(axis=1), cb[draws].sum(axis=1)
        ok = (na > 0) & (nb > 0)
        diff = sa[draws].sum(axis=1)[ok] / na[ok] - sb[draws].sum(axis=1)[ok] / nb[ok]
        boot = np.concatenate([boot, diff])[:n_boot]
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(va.mean() - vb.mean()), float(low), float(high)

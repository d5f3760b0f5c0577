"""One test per distinct context, Benjamini–Hochberg per checkpoint, and a minimum effect.

Rollouts of a problem share their first tokens, and every position of that shared prefix
is the same predictive context in each of them: one distribution pair, one test. The
per-token table says so with ``context_id``; ``distinct_contexts`` keeps one row per
(checkpoint, context) and counts the rollouts that share it. Testing the copies
separately would count one observation several times and let BH reward repetition.

BH controls the expected share of false discoveries among the discoveries at ``q`` when
the p-values of true nulls are independent or positively dependent (tokens of one problem
are, if anything, positively dependent). A discovery whose divergence is below
``min_effect`` nats is not called a spike: with enough tokens a change too small to
matter can still be significant.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def bh_qvalues(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values: the smallest q at which each test would be
    rejected (reject all tests with q-value <= q)."""
    p = np.asarray(p, dtype=np.float64)
    m = len(p)
    if m == 0:
        return p.copy()
    order = np.argsort(p)
    ranked = p[order] * m / np.arange(1, m + 1)
    q = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(q, 1.0)
    return out


def distinct_contexts(tokens: pd.DataFrame) -> pd.DataFrame:
    """One row per (checkpoint, context_id): the first row in (rollout_id, pos) order,
    with ``n_rollouts``, the number of rollouts sharing the context. The tested
    quantities (divergence, reference covariates) are the context's, so any copy will do;
    what depends on the written token (sign, dlogp) is attached per row later."""
    ordered = tokens.sort_values(["checkpoint", "context_id", "rollout_id", "pos"], kind="stable")
    counts = ordered.groupby(["checkpoint", "context_id"], sort=False).rollout_id.transform("nunique")
    first = ~ordered.duplicated(["checkpoint", "context_id"])
    return ordered[first.to_numpy()].assign(n_rollouts=counts[first.to_numpy()].to_numpy())


def significant(qvalues: np.ndarray, effect: np.ndarray, q: float = 0.05,
                min_effect: float = 0.0) -> np.ndarray:
    """Discovered by BH at ``q`` and at least ``min_effect`` large."""
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if min_effect < 0:
        raise ValueError(f"min_effect must be >= 0 nats, got {min_effect}")
    return (np.asarray(qvalues) <= q) & (np.asarray(effect) >= min_effect)

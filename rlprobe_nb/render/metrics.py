"""The per-token values a response can be coloured by, each named in words.

Every metric is read from the per-token table (P = checkpoint, Q = reference, nats):

- ``dlogp``: log P(x) − log Q(x) of the written token x, signed. Negative: the checkpoint
  gives what the reference wrote less probability (it rejects it); positive: more.
- ``kl_ref_ckpt``: KL(ref‖ckpt), expected under the reference's distribution: how
  surprised the checkpoint is by what the reference would write.
- ``kl_ckpt_ref``: KL(ckpt‖ref), expected under the checkpoint's distribution: how
  surprised the reference is by what the checkpoint would write.
- ``js``: Jensen–Shannon divergence, symmetric, at most log 2.
- ``dentropy``: H(ckpt) − H(ref), signed: the checkpoint is more (positive) or less
  (negative) certain of the next token than the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Metric:
    name: str
    label: str  # for legends and axes: the direction in words
    short: str  # for tooltips and table headers
    signed: bool  # signed metrics get a diverging palette centred on 0


METRICS: dict[str, Metric] = {m.name: m for m in [
    Metric("dlogp", "Δlogp = log p_ckpt − log p_ref of the written token (nats); "
           "red: the checkpoint rejects it, blue: endorses it", "Δlogp", True),
    Metric("kl_ref_ckpt", "KL(ref‖ckpt), nats: how surprised the checkpoint is by what "
           "the reference would write", "KL(ref‖ckpt)", False),
    Metric("kl_ckpt_ref", "KL(ckpt‖ref), nats: how surprised the reference is by what "
           "the checkpoint would write", "KL(ckpt‖ref)", False),
    Metric("js", "Jensen–Shannon divergence of the two next-token distributions, nats",
           "JS", False),
    Metric("dentropy", "entropy change H(ckpt) − H(ref), nats; blue: the checkpoint is "
           "less certain, red: more certain", "ΔH", True),
]}
DEFAULT_METRIC = "dlogp"


def metric(name: str) -> Metric:
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; valid: {list(METRICS)}")
    return METRICS[name]


def metric_values(rows: pd.DataFrame, name: str) -> np.ndarray:
    """``name`` for each row as float64; derived metrics are computed when the table
    lacks their column (``dlogp`` from the two log-probs, ``dentropy`` from the entropies)."""
    metric(name)
    if name in rows.columns:
        return rows[name].to_numpy(dtype=np.float64)
    if name == "dlogp":
        return rows.logp_ckpt.to_numpy(np.float64) - rows.logp_ref.to_numpy(np.float64)
    if name == "dentropy":
        return rows.entropy_ckpt.to_numpy(np.float64) - rows.entropy_ref.to_numpy(np.float64)
    raise KeyError(f"the table has no column {name!r}")

"""The null distribution of a standardised score, read from out-of-fold training values:
empirical in the bulk, an exponential tail beyond it (see the ``null`` module docstring,
assumption 3)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class TailModel:
    """A null distribution F of a standardised statistic, as survival function: the
    training values' empirical survival up to the ``anchor`` quantile, an exponential
    tail beyond it (see assumption 3 of the module docstring).

    The tail's rate is fitted to the training values between the ``lower`` and
    ``anchor`` quantiles, those above the anchor counted as censored there (so spikes
    beyond the anchor carry no weight), and the rate used is the lower ``confidence``
    bound of its estimate: with few training values the far tail is read from few
    points, and a rate overstated by chance would make p-values far too small. With
    thousands of values the bound is within a few percent of the estimate."""

    sorted_values: np.ndarray
    anchor_value: float
    anchor: float
    rate: float

    @classmethod
    def from_training(cls, values: np.ndarray, lower: float = 0.8, anchor: float = 0.95,
                      confidence: float = 0.95) -> "TailModel":
        v = np.sort(values[np.isfinite(values)])
        v_lower, v_anchor = np.quantile(v, [lower, anchor])
        band = v[(v > v_lower) & (v <= v_anchor)] - v_lower
        above = np.sum(v > v_anchor)
        exposure = band.sum() + above * (v_anchor - v_lower)
        events = max(len(band), 1)
        rate = stats.gamma.ppf(1 - confidence, events) / max(exposure, 1e-12)
        return cls(v, float(v_anchor), anchor, float(rate))

    def sf(self, values: np.ndarray) -> np.ndarray:
        """P(V >= v) under the null; +inf gets 0 and -inf or NaN gets 1."""
        v = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=-np.inf)
        n = len(self.sorted_values)
        empirical = (n - np.searchsorted(self.sorted_values, v, side="left") + 1) / (n + 1)
        with np.errstate(over="ignore", invalid="ignore"):
            tail = (1 - self.anchor) * np.exp(-self.rate * (v - self.anchor_value))
        return np.where(v <= self.anchor_value, np.maximum(empirical, 1 - self.anchor),
                        np.nan_to_num(tail, nan=0.0))

"""The null distribution of a standardised score, read from null values: empirical in
the bulk, a parametric tail beyond it (see the ``null`` module docstring, assumption 3,
and the ``external`` module docstring, "The tail").

Beyond the ``anchor`` quantile a, the survival function is continued as a generalized
Pareto tail, P(V >= v) = (1 - anchor) (1 + shape (v - a) / scale)^(-1 / shape), which is
the exponential tail exp(-(v - a) / scale) at shape 0. Two fits:

* ``from_training`` (the internal null: the training values are a checkpoint's own
  departures, spikes among them): shape 0, the rate 1 / scale fitted between the
  ``lower`` and ``anchor`` quantiles with the values above the anchor censored there, so
  spikes carry no weight;
* ``from_null`` (the external null: the values are a placebo's departures, no spikes by
  assumption): shape and scale fitted by maximum likelihood to every exceedance over the
  ``lower`` quantile, the far tail included, the shape kept at 0 or above (never lighter
  than exponential)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class TailModel:
    """A null distribution F of a standardised statistic, as survival function: the
    null values' empirical survival up to the ``anchor`` quantile, a generalized Pareto
    tail of ``shape`` and ``scale`` beyond it (see the module docstring).

    Both fits take the conservative end of the ``confidence`` interval of what sets the
    far tail: the lower bound of the exponential rate, the upper bound of the Pareto
    shape. With few null values the far tail is read from few points, and a tail
    understated by chance would make p-values far too small."""

    sorted_values: np.ndarray
    anchor_value: float
    anchor: float
    scale: float
    shape: float = 0.0

    @property
    def rate(self) -> float:
        """The tail's hazard at the anchor, 1 / scale."""
        return 1.0 / self.scale

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
        return cls(v, float(v_anchor), anchor, 1.0 / max(float(rate), 1e-300))

    @classmethod
    def from_null(cls, values: np.ndarray, lower: float = 0.8, anchor: float = 0.95,
                  confidence: float = 0.95) -> "TailModel":
        v = np.sort(values[np.isfinite(values)])
        v_lower, v_anchor = np.quantile(v, [lower, anchor])
        excess = v[v > v_lower] - v_lower
        if len(excess) < 10 or np.ptp(excess) <= 0:
            return cls.from_training(values, lower, anchor, confidence)
        shape, _, _ = stats.genpareto.fit(excess, floc=0)
        # the shape's standard error at the maximum, (1 + shape) / sqrt(n) (shape > -1/2)
        z = stats.norm.ppf(confidence)
        shape = max(float(shape), 0.0) + z * (1 + max(float(shape), 0.0)) / np.sqrt(len(excess))
        _, _, scale = stats.genpareto.fit(excess, fc=shape, floc=0)
        # a Pareto tail over v_lower is one over the anchor with the scale grown by shape·(a − l)
        return cls(v, float(v_anchor), anchor, float(scale + shape * (v_anchor - v_lower)),
                   float(shape))

    def sf(self, values: np.ndarray) -> np.ndarray:
        """P(V >= v) under the null; +inf gets 0 and -inf or NaN gets 1."""
        v = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=-np.inf)
        n = len(self.sorted_values)
        empirical = (n - np.searchsorted(self.sorted_values, v, side="left") + 1) / (n + 1)
        beyond = np.maximum(v - self.anchor_value, 0.0)
        with np.errstate(over="ignore", invalid="ignore"):
            if self.shape > 0:
                tail = (1 - self.anchor) * (1 + self.shape * beyond / self.scale) ** (-1 / self.shape)
            else:
                tail = (1 - self.anchor) * np.exp(-beyond / self.scale)
        tail = np.where(np.isposinf(v), 0.0, tail)
        return np.where(v <= self.anchor_value, np.maximum(empirical, 1 - self.anchor),
                        np.nan_to_num(tail, nan=0.0))

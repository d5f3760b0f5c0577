"""The null model: how far does a checkpoint move at a token for no RL-specific reason?

A checkpoint differs from the reference at every token; how much depends on things that
have nothing to do with a targeted change: how uncertain the reference was at that
position (a flat distribution moves more under the same perturbation than a peaked one;
a token the reference was sure of cannot lose much log-probability) and how far this
checkpoint drifted overall. The null describes a context's departure *given* those
things, and a spike is a context far in the upper tail of that description.

Two components are tested at every context and combined into one test:

- the divergence D (see ``statistic.divergence``), transformed to log D, upper tail;
- the change on each written token, dlogp = logp_ckpt - logp_ref, both tails (a
  rejection or an endorsement moves it far more than the divergence alone shows when the
  reference was unsure).

Each component gets a calibrated p-value; the context's statistic is the larger
surprise, -log of the smaller component p-value, and that maximum is calibrated in turn
(its null distribution is estimated like the components', so the combined p-value is
uniform under the null rather than merely conservative).

Assumptions (each one is a claim about the data; the calibration plot checks them):

1. **Covariates.** What makes a departure large for no RL reason is captured by the
   reference's own uncertainty at the position (log entropy, log gap between its top two
   probabilities, log collision probability of its top-k; for dlogp also the written
   token's reference log-probability) and by the checkpoint (each checkpoint is fitted
   separately, which absorbs its overall drift). Nothing computed from the checkpoint is
   a covariate: conditioning on it would explain the effect away.
2. **Shape.** Each transformed component s has a conditional location m(x) and scale
   σ(x) that are additive, smooth functions of the covariates (linear splines), and
   z = (s - m(x)) / σ(x) has one distribution F for all contexts of a checkpoint.
3. **Tail.** F is read empirically up to its 95th percentile and continued beyond by an
   exponential tail whose rate is F's average hazard between its 80th and 95th
   percentiles. On log D an exponential tail is what a power-law tail of D looks like;
   for normal or chi-square-like components the hazard keeps rising, so the continued
   tail over-states the far tail (conservative). A null whose far tail is heavier than
   its upper bulk predicts (a hazard that falls beyond the 95th percentile) breaks this.
4. **Sparsity.** Spikes are rare (a few percent of contexts) and lie in the tails:
   location and scale are fitted with a redescending (Tukey bisquare) loss that gives
   them zero weight, and F is read below its 95th percentile, so spikes neither widen the
   null they are tested against nor set its tail (a per-sequence z-score fails exactly
   here: an outlier inflates the scale it is divided by). Spikes in the fitting data can
   only raise the quantiles the tail is read from: that costs power, never false
   positives.
5. **Independence of calibration.** Every model is fitted on other problems' contexts
   (cross-fitting over folds of problems): a token never calibrates itself, and rollouts
   of one problem, which share contexts and style, never calibrate each other.

What it is not: a model of the logits. With logits at hand, a null could apply logit
changes drawn from other problems' positions to this position's reference logits and
read the p-value from how often the null divergence reaches the observed one. Any object
with ``fit(contexts, written) -> fitted``, where ``fitted.test(contexts, written)``
returns per-context (statistic, p) and per-written-row z_written, can replace ``SpikeNull``
in ``cross_fit``: that is the seam for a logit-based null.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pandas as pd
from scipy import stats

from ..statistics import seed_from

_HUBER, _BISQUARE = 1.345, 4.685  # 95%-efficient tuning constants under a normal


@dataclass(frozen=True)
class Basis:
    """Additive linear splines in the covariates (hinges at training quantiles): smooth,
    cheap, fitted by least squares. No interaction terms: products of covariates
    extrapolate into corners of the covariate space where there is no training data (a
    peaked position whose written token was unlikely) and invent a null there.

    Covariates enter standardised (median, IQR) and clipped to the training range, or,
    with ``ranks``, as their rank among the training values (0..1): then a sparse tail of
    a covariate weighs only its share of the data and the function is nearly flat there
    instead of carrying the bulk's slope out to values seen a handful of times."""

    sorted_x: tuple[np.ndarray, ...] | None
    centre: np.ndarray
    spread: np.ndarray
    low: np.ndarray
    high: np.ndarray
    knots: tuple[np.ndarray, ...]

    @classmethod
    def from_training(cls, x: np.ndarray, n_knots: int = 4, ranks: bool = False) -> "Basis":
        sorted_x = tuple(np.sort(x[:, j]) for j in range(x.shape[1])) if ranks else None
        centre = np.zeros(x.shape[1]) if ranks else np.median(x, axis=0)
        spread = np.ones(x.shape[1]) if ranks else np.maximum(np.subtract(*np.percentile(x, [75, 25], axis=0)), 1e-9)
        proto = cls(sorted_x, centre, spread, np.full(x.shape[1], -np.inf),
                    np.full(x.shape[1], np.inf), ())
        u = proto._standardise(x)
        qs = np.linspace(0, 1, n_knots + 2)[1:-1]
        knots = tuple(np.unique(np.quantile(u[:, j], qs)) for j in range(x.shape[1]))
        return cls(sorted_x, centre, spread, u.min(0), u.max(0), knots)

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        if self.sorted_x is None:
            u = (x - self.centre) / self.spread
        else:
            u = np.column_stack([np.searchsorted(col, x[:, j]) / len(col)
                                 for j, col in enumerate(self.sorted_x)])
        return np.clip(u, self.low, self.high)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        u = self._standardise(x)
        cols = [np.ones(len(u))]
        for j, knots in enumerate(self.knots):
            cols.append(u[:, j])
            cols += [np.maximum(u[:, j] - k, 0.0) for k in knots]
        return np.column_stack(cols)


_GRAM_ROWS = 512  # rows per product: small enough that OpenBLAS runs it on one thread


class _WeightedLeastSquares:
    """Weighted least squares with one weight vector and several right-hand sides, by
    the normal equations. The Gram matrix is summed over blocks of rows: a product of
    ~20 columns by a few thousand rows is too small for threads, and threaded BLAS on
    busy shared cores is slower by an order of magnitude. The tiny ridge only guards a
    rank-deficient basis."""

    def __init__(self, b: np.ndarray, w: np.ndarray):
        self.bw = b * w[:, None]
        self.gram = sum(self.bw[i:i + _GRAM_ROWS].T @ b[i:i + _GRAM_ROWS]
                        for i in range(0, len(b), _GRAM_ROWS))
        self.gram[np.diag_indices_from(self.gram)] += 1e-10 * np.trace(self.gram) / len(self.gram) + 1e-300

    def solve(self, y: np.ndarray) -> np.ndarray:
        return np.linalg.solve(self.gram, np.einsum("ni,n->i", self.bw, y))


def _predict(b: np.ndarray, coef: np.ndarray) -> np.ndarray:
    return np.einsum("ni,i->n", b, coef)


def _weighted_median(x: np.ndarray, w: np.ndarray) -> float:
    order = np.argsort(x)
    cum = np.cumsum(w[order])
    return float(x[order][np.searchsorted(cum, 0.5 * cum[-1])])


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


@dataclass(frozen=True)
class FittedComponent:
    """m(x) and log σ(x) as coefficients on the basis, and the range each took on the
    training rows: a prediction is clipped to that range, so a combination of covariates
    never seen in training cannot produce a location or a scale never fitted."""

    basis: Basis
    scale_basis: Basis
    location: np.ndarray
    log_scale: np.ndarray
    location_range: tuple[float, float]
    log_scale_range: tuple[float, float]
    transform: str
    two_sided: bool

    def z(self, values: np.ndarray, covariates: np.ndarray) -> np.ndarray:
        """(s - m(x)) / σ(x): how many null scales the transformed value lies from the
        typical one (signed)."""
        s = _transform(values, self.transform)
        m = np.clip(_predict(self.basis(covariates), self.location), *self.location_range)
        log_sigma = np.clip(_predict(self.scale_basis(covariates), self.log_scale),
                            *self.log_scale_range)
        return (s - m) / np.exp(log_sigma)

    def tail_score(self, z: np.ndarray) -> np.ndarray:
        """What the tail model reads: z, or |z| when both tails count."""
        return np.abs(z) if self.two_sided else z


def _transform(values: np.ndarray, kind: str) -> np.ndarray:
    """log: log(D + 1e-12), the constant only so that an exact 0 (identical
    distributions) has a logarithm; identity: as is."""
    v = np.asarray(values, dtype=np.float64)
    if kind == "log":
        return np.log(np.maximum(v, 0.0) + 1e-12)
    if kind == "identity":
        return v
    raise ValueError(f"transform must be 'log' or 'identity', got {kind!r}")


@dataclass(frozen=True)
class ConditionalNull:
    """Robust conditional location and scale of one transformed component given the
    covariates, by iteratively reweighted least squares: Huber steps to get close, then
    Tukey bisquare steps (until the weights settle), which give far outliers zero weight.
    Fitted on at most ``max_fit_rows`` training rows drawn at random (two smooth functions
    of a few covariates need no more)."""

    transform: str = "log"
    two_sided: bool = False
    n_knots: int = 4
    n_scale_knots: int = 3
    huber_steps: int = 3
    bisquare_steps: int = 12
    max_fit_rows: int = 20_000

    def fit(self, values: np.ndarray, covariates: np.ndarray) -> FittedComponent:
        fit_rows = _subsample(len(values), self.max_fit_rows)
        # Fewer rows, stiffer functions: a hinge per ~400 rows for the location and per
        # ~800 for the (noisier) scale, up to the configured numbers.
        n = len(fit_rows)
        basis = Basis.from_training(covariates[fit_rows], min(self.n_knots, max(1, n // 400)))
        scale_basis = Basis.from_training(covariates[fit_rows],
                                          min(self.n_scale_knots, n // 800), ranks=True)
        b, sb = basis(covariates[fit_rows]), scale_basis(covariates[fit_rows])
        s = _transform(values[fit_rows], self.transform)
        # Huber steps, then Tukey bisquare steps, re-estimating location and scale
        # together at each step until the location stops moving (by 1% of the scale).
        # Outliers keep a token weight of 1e-3, so every row's log |r| stays defined;
        # it moves no fit.
        w = np.ones(len(s))
        scale = np.ones(len(s))
        fitted = np.zeros(len(s))
        for step in range(self.huber_steps + self.bisquare_steps):
            location, log_scale, scale_new, u = self._step(b, sb, s, w, scale)
            moved = np.max(np.abs(_predict(b, location) - fitted) / scale_new)
            fitted, scale = _predict(b, location), scale_new
            if step < self.huber_steps:
                w = np.minimum(1.0, _HUBER / np.maximum(np.abs(u), 1e-12))
                continue
            if step > self.huber_steps and moved < 0.01:
                break
            w = np.where(np.abs(u) < _BISQUARE, (1 - (u / _BISQUARE) ** 2) ** 2, 0.0)
        m, log_sigma = _predict(b, location), _predict(sb, log_scale)
        return FittedComponent(basis, scale_basis, location, log_scale, (m.min(), m.max()),
                               (log_sigma.min(), log_sigma.max()), self.transform,
                               self.two_sided)

    @staticmethod
    def _step(b, sb, s, w, scale):
        """One location fit (weighted by robustness and precision), then the scale on its
        own, stiffer basis: log |r| is too noisy (sd 1.1 a row) for the location's
        splines, whose hinges near the edge of the data would fit a few rows' noise."""
        location = _WeightedLeastSquares(b, _location_weights(w, scale)).solve(s)
        r = s - _predict(b, location)
        log_scale = _scale_fit(_WeightedLeastSquares(sb, np.maximum(w, 1e-3)), sb, r, w)
        scale = np.exp(_predict(sb, log_scale))
        return location, log_scale, scale, r / scale


def _location_weights(w: np.ndarray, scale: np.ndarray, cap: float = 10.0) -> np.ndarray:
    """Robustness weight times precision 1/σ(x)^2, capped at ``cap`` times its median:
    where the null is narrow its location must be right to a fraction of that narrow
    scale, but an uncapped precision lets a few rows that the location happens to fit
    closely claim ever more weight, their scale collapsing with each step."""
    precision = 1.0 / (scale * scale)
    precision = np.minimum(precision / np.median(precision), cap)
    return np.maximum(w, 1e-3) * precision


def _subsample(n: int, cap: int) -> np.ndarray:
    """Rows used to fit location and scale: all, or ``cap`` of them at random (seeded by
    n, so a refit on the same data picks the same rows)."""
    if n <= cap:
        return np.arange(n)
    return np.sort(np.random.default_rng(n).choice(n, cap, replace=False))


def _scale_fit(wls: _WeightedLeastSquares, b: np.ndarray, r: np.ndarray,
               w: np.ndarray) -> np.ndarray:
    """log σ(x): a weighted regression of log |r| on the basis, then one constant so that
    the weighted median of |r| / σ is the normal's 0.6745. A floor keeps a degenerate
    training set (all residuals 0, e.g. a checkpoint compared with itself) finite."""
    floor = 1e-6 * np.median(r * r) + 1e-24
    gamma = wls.solve(0.5 * np.log(r * r + floor))
    ratio = np.abs(r) / np.exp(_predict(b, gamma))
    gamma[0] += np.log(max(_weighted_median(ratio, np.maximum(w, 1e-3)), 1e-12) / 0.6745)
    return gamma


CONTEXT_COVARIATES = ("log_entropy_ref", "log_top_gap", "log_collision")
WRITTEN_COVARIATES = ("log_entropy_ref", "logp_ref")


Columns = Mapping[str, np.ndarray]  # column name -> 1-d array (a DataFrame will do)


def _matrix(frame: Columns, names: tuple[str, ...]) -> np.ndarray:
    return np.column_stack([np.asarray(frame[c], dtype=np.float64) for c in names])


@dataclass(frozen=True)
class FittedSpikeNull:
    divergence: FittedComponent
    written: FittedComponent

    def scores(self, contexts: Columns, written: Columns):
        """(z of the divergence per context, z of the log-odds change per written row)."""
        z_div = self.divergence.z(contexts["divergence"], _matrix(contexts, CONTEXT_COVARIATES))
        z_written = self.written.z(written["logodds_change"], _matrix(written, WRITTEN_COVARIATES))
        return z_div, z_written


@dataclass(frozen=True)
class SpikeNull:
    """Location and scale of the two components (the calibration of their tails and of
    their combination happens in ``cross_fit``, out of fold)."""

    divergence: ConditionalNull = field(default_factory=ConditionalNull)
    written: ConditionalNull = field(
        default_factory=lambda: ConditionalNull(transform="identity", two_sided=True))

    def fit(self, contexts: Columns, written: Columns) -> FittedSpikeNull:
        return FittedSpikeNull(
            self.divergence.fit(np.asarray(contexts["divergence"], dtype=np.float64),
                                _matrix(contexts, CONTEXT_COVARIATES)),
            self.written.fit(np.asarray(written["logodds_change"], dtype=np.float64),
                             _matrix(written, WRITTEN_COVARIATES)))


def problem_folds(problem_id: np.ndarray, folds: int = 5, seed: int = 0) -> np.ndarray:
    """Fold of each row: whole problems are assigned (by a hash of id and seed, dealt
    round-robin so folds have equal numbers of problems)."""
    uniq, codes = np.unique(np.asarray(problem_id).astype(str), return_inverse=True)
    if len(uniq) < 2:
        raise ValueError("cross-fitting needs at least two problems: with one, a problem "
                         "would calibrate itself")
    k = min(folds, len(uniq))
    order = np.argsort([seed_from("fold", seed, u) for u in uniq])
    fold_of_problem = np.empty(len(uniq), dtype=np.int64)
    fold_of_problem[order] = np.arange(len(uniq)) % k
    return fold_of_problem[codes]


def cross_fit(contexts: pd.DataFrame, written: pd.DataFrame, null=None, folds: int = 5,
              seed: int = 0, tail_from: tuple[float, float] = (0.8, 0.95)
              ) -> tuple[pd.DataFrame, np.ndarray]:
    """Test every context against a null that never saw its problem.

    contexts: one row per distinct context: problem_id, divergence, CONTEXT_COVARIATES.
    written: one row per (context, written token): ctx (the context's position in
    ``contexts``), logodds_change, WRITTEN_COVARIATES. Returns a frame aligned with
    ``contexts`` (statistic, p, z_divergence) and z_written aligned with ``written``.

    1. Each fold's z-scores come from location/scale models fitted on the other folds.
    2. Each fold's component p-values come from TailModels of the *other folds'*
       out-of-fold z-scores, so the values a token is compared with were produced the
       same way as its own (in-sample residuals are slightly too small, out-of-fold ones
       are not); the statistic is the larger surprise, -log of the smaller p-value.
    3. Each fold's p-value comes from a TailModel of the other folds' statistics.
    """
    null = null or SpikeNull()
    index = contexts.index
    contexts = {c: contexts[c].to_numpy() for c in contexts.columns}
    written = {c: written[c].to_numpy() for c in written.columns}
    fold = problem_folds(contexts["problem_id"], folds, seed)
    w_fold = fold[written["ctx"]]
    n = len(fold)
    z_div, z_written = np.empty(n), np.empty(len(w_fold))
    two_sided = (False, True)
    for k in np.unique(fold):
        fitted = null.fit(*_subset(contexts, written, fold != k, w_fold != k))
        z_div[fold == k], z_written[w_fold == k] = fitted.scores(
            *_subset(contexts, written, fold == k, w_fold == k))
        two_sided = (fitted.divergence.two_sided, fitted.written.two_sided)
    score_div = np.abs(z_div) if two_sided[0] else z_div
    score_written = np.abs(z_written) if two_sided[1] else z_written
    surprise = np.empty(n)
    for k in np.unique(fold):
        p_div = TailModel.from_training(score_div[fold != k], *tail_from).sf(score_div)
        p_written = TailModel.from_training(score_written[w_fold != k], *tail_from).sf(score_written)
        with np.errstate(divide="ignore"):  # a p-value of 0 is an infinite surprise
            worst = np.zeros(n)
            np.maximum.at(worst, written["ctx"], -np.log(p_written))
            surprise[fold == k] = np.maximum(-np.log(p_div), worst)[fold == k]
    p = np.empty(n)
    for k in np.unique(fold):
        p[fold == k] = TailModel.from_training(surprise[fold != k], *tail_from).sf(
            surprise[fold == k])
    return pd.DataFrame({"statistic": surprise, "p": p, "z_divergence": z_div},
                        index=index), z_written


def _subset(contexts: Columns, written: Columns, keep: np.ndarray,
            keep_written: np.ndarray) -> tuple[Columns, Columns]:
    """Contexts and written rows of some folds, with ``ctx`` renumbered to match."""
    renumber = np.cumsum(keep) - 1
    sub_w = {c: v[keep_written] for c, v in written.items()}
    sub_w["ctx"] = renumber[sub_w["ctx"]]
    return {c: v[keep] for c, v in contexts.items()}, sub_w

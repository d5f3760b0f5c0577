"""Robust conditional location and scale of one score given covariates: the regression
the null model (``null``) fits for each of its components.

Location: additive linear splines in the covariates, fitted by iteratively reweighted
least squares (Huber steps, then Tukey bisquare steps that give far outliers zero weight),
weighted by the precision 1/σ(x)^2. Scale: log-linear splines in the covariates' ranks,
fitted to log |residual|, re-estimated at each step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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

    def z(self, values: np.ndarray, covariates: np.ndarray) -> np.ndarray:
        """(s - m(x)) / σ(x): how many null scales the transformed value lies from the
        typical one (signed)."""
        s = _transform(values, self.transform)
        m = np.clip(_predict(self.basis(covariates), self.location), *self.location_range)
        log_sigma = np.clip(_predict(self.scale_basis(covariates), self.log_scale),
                            *self.log_scale_range)
        return (s - m) / np.exp(log_sigma)


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
                               (log_sigma.min(), log_sigma.max()), self.transform)

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

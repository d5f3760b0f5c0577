"""Small, exact statistics for pass rates and paired comparisons.

Confidence intervals are reported everywhere a rate is: Wilson and Clopper-Pearson
intervals for a single binomial rate (scipy.stats.binomtest), a cluster bootstrap over
problems when samples of one problem are correlated (several samples per problem) and the
bootstrap can say something, and McNemar's exact test for paired verdicts (target vs
reference on the same problems).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
from scipy import stats


def _binomial_ci(k: int, n: int, alpha: float, method: str) -> tuple[float, float]:
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"a binomial interval needs 0 <= k <= n, got k={k}, n={n}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n == 0:
        return 0.0, 1.0  # no data, no information
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=1 - alpha, method=method)
    return float(ci.low), float(ci.high)


def wilson_ci(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (no continuity correction)."""
    return _binomial_ci(k, n, alpha, "wilson")


def clopper_pearson_ci(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Clopper-Pearson ("exact") interval: never below its nominal coverage."""
    return _binomial_ci(k, n, alpha, "exact")


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for the discordant counts b and c: under H0 the
    b + c discordant pairs split Binomial(b + c, 1/2)."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    if b + c == 0:
        return 1.0
    return float(stats.binomtest(int(b), int(b + c), 0.5).pvalue)


def seed_from(*parts) -> int:
    """A 63-bit seed from any printable parts, stable across processes (sha256, not hash())."""
    blob = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big") >> 1


def cluster_bootstrap_ci(values, clusters, n_boot: int = 2000, alpha: float = 0.05,
                         seed: int = 0) -> tuple[float, float, float]:
    """Mean of per-sample values with a percentile CI that resamples whole clusters.

    Samples of one problem are correlated, so the bootstrap draws problems with
    replacement and keeps all their samples. Returns (mean, low, high).
    """
    values = np.asarray(values, dtype=np.float64)
    clusters = np.asarray(clusters)
    if values.shape != clusters.shape or values.ndim != 1:
        raise ValueError("values and clusters must be 1-d and the same length")
    if len(values) == 0:
        return float("nan"), float("nan"), float("nan")
    codes, uniq = pd.factorize(clusters)
    sums = np.bincount(codes, weights=values, minlength=len(uniq))
    counts = np.bincount(codes, minlength=len(uniq)).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(uniq), size=(n_boot, len(uniq)))
    boot = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(values.mean()), float(low), float(high)


def rate_table(df: pd.DataFrame, by: list[str], correct: str = "correct",
               cluster: str | None = "problem_id", alpha: float = 0.05,
               seed: int = 0) -> pd.DataFrame:
    """Pass rate per group with a Wilson and a Clopper-Pearson interval (answers treated as
    independent) and, if ``cluster`` is given, a bootstrap over clusters (answers to one
    problem are correlated). The cluster bootstrap is reported only where it can say
    something: with every answer right or every answer wrong it collapses to a point
    (``boot_low``/``boot_high`` NaN, ``boot_note`` says why), and with fewer than 10
    problems its percentiles are unreliable (noted)."""
    rows = []
    for key, g in df.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        k, n = int(g[correct].sum()), int(len(g))
        lo, hi = wilson_ci(k, n, alpha)
        clo, chi = clopper_pearson_ci(k, n, alpha)
        row = dict(zip(by, key), n=n, correct=k, rate=k / n if n else float("nan"),
                   wilson_low=lo, wilson_high=hi, cp_low=clo, cp_high=chi)
        if cluster is not None:
            problems = int(g[cluster].nunique())
            row.update(problems=problems, boot_low=float("nan"), boot_high=float("nan"))
            if k in (0, n):
                row["boot_note"] = "all answers alike: the bootstrap collapses to a point"
            else:
                _, blo, bhi = cluster_bootstrap_ci(g[correct].astype(float), g[cluster],
                                                   alpha=alpha, seed=seed_from(seed, *key))
                row.update(boot_low=blo, boot_high=bhi,
                           boot_note="" if problems >= 10 else f"only {problems} problems")
        rows.append(row)
    return pd.DataFrame(rows)

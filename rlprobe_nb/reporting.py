"""How a number is shown to a reader: estimates with their intervals, or with the reason
there is none, at a readable precision. Every chapter prints through these functions, so
one rule holds everywhere:

* an interval needs at least ``MIN_CLUSTERS`` independent clusters (problems: tokens and
  rollouts of one problem are not independent draws); with fewer, the estimate is shown
  with "too few problems for an interval" instead;
* no NaN, no inf, no interval that excludes its own estimate, no "[0.0, 0.0]": a bound
  that is missing or not finite, or an interval that does not contain the estimate, is
  not printed and the text says why;
* numbers carry the digits their size needs (``fmt``), not six decimals.
"""

from __future__ import annotations

import math

import pandas as pd

MIN_CLUSTERS = 5


def _finite(x) -> bool:
    try:
        return x is not None and not pd.isna(x) and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def fmt(x, digits: int = 3, signed: bool = False) -> str:
    """``x`` with ``digits`` significant digits (at most 4 decimals for numbers below 1 in
    size, none lost for large ones); a sign on request; "n/a" for a missing or infinite
    value."""
    if not _finite(x):
        return "n/a"
    x = float(x)
    if x == 0:
        text = "0"
    else:
        magnitude = math.floor(math.log10(abs(x)))
        decimals = max(0, min(digits - 1 - magnitude, 4 if abs(x) < 1 else digits))
        text = f"{x:.{decimals}f}"
        if float(text) == 0:  # smaller than the shown precision: say so, not "0.0000"
            text = f"{x:.1e}"
    if signed and not text.startswith("-"):
        text = "+" + text
    return text


def interval_ok(estimate, low, high, n_clusters: int, min_clusters: int = MIN_CLUSTERS) -> bool:
    """Whether an interval may be shown: enough clusters, finite bounds that contain the
    estimate and are not both equal to it (a degenerate interval says nothing)."""
    if n_clusters < min_clusters or not all(_finite(v) for v in (estimate, low, high)):
        return False
    low, high, estimate = float(low), float(high), float(estimate)
    tol = 1e-12 * max(1.0, abs(estimate))
    return low - tol <= estimate <= high + tol and high > low


def why_no_interval(estimate, low, high, n_clusters: int, min_clusters: int = MIN_CLUSTERS,
                    cluster_name: str = "problems") -> str:
    if n_clusters < min_clusters:
        return f"{n_clusters} {cluster_name}: too few for an interval (needs {min_clusters})"
    if not (_finite(low) and _finite(high)):
        return "no interval: the resampled estimates were not finite"
    if float(high) <= float(low):
        return "no interval: every resample gave the same value"
    return "no interval: the resampling interval does not contain the estimate"


def interval_text(estimate, low, high, n_clusters: int, *, digits: int = 3,
                  signed: bool = False, min_clusters: int = MIN_CLUSTERS,
                  cluster_name: str = "problems") -> str:
    """"0.342 [0.301, 0.388]", or "0.342 (3 problems: too few for an interval (needs 5))",
    or "no data" when the estimate itself is missing."""
    if not _finite(estimate):
        return "no data"
    est = fmt(estimate, digits, signed)
    if interval_ok(estimate, low, high, n_clusters, min_clusters):
        return f"{est} [{fmt(low, digits, signed)}, {fmt(high, digits, signed)}]"
    return f"{est} ({why_no_interval(estimate, low, high, n_clusters, min_clusters, cluster_name)})"


def excludes_zero(estimate, low, high, n_clusters: int, min_clusters: int = MIN_CLUSTERS) -> bool:
    """Whether a shown interval excludes 0 (False whenever no interval may be shown)."""
    return interval_ok(estimate, low, high, n_clusters, min_clusters) and (
        float(low) > 0 or float(high) < 0)


def with_interval_text(table: pd.DataFrame, estimate: str, low: str, high: str,
                       clusters: str, column: str = "interval", **kw) -> pd.DataFrame:
    """``table`` with a text column per row and the bounds blanked (NA) where no interval
    may be shown, so a displayed table never shows a bound the text would not."""
    out = table.copy()
    ok = [interval_ok(e, lo, hi, int(n), kw.get("min_clusters", MIN_CLUSTERS))
          for e, lo, hi, n in zip(out[estimate], out[low], out[high], out[clusters])]
    out[column] = [interval_text(e, lo, hi, int(n), **kw)
                   for e, lo, hi, n in zip(out[estimate], out[low], out[high], out[clusters])]
    out[low] = out[low].where(ok)
    out[high] = out[high].where(ok)
    return out

"""How a number is shown to a reader: estimates with their intervals, or with the reason
there is none, at a readable precision. Every chapter prints through these functions, so
one rule holds everywhere:

* an interval needs at least ``MIN_CLUSTERS`` independent clusters (problems: tokens and
  rollouts of one problem are not independent draws); with fewer, the estimate is shown
  with "too few problems for an interval" instead;
* no NaN, no inf, no interval that excludes its own estimate, no "[0.0, 0.0]": a bound
  that is missing or not finite, or an interval that does not contain the estimate, is
  not printed and the text says why;
* numbers carry the digits their size needs (``fmt``), not six decimals;
* a claim that reads an interval ("excludes 0", "meets the exact value", "X most") is
  made only where the interval may be shown (``excludes_zero``, ``sign_of``,
  ``contains``): with too few clusters the answer is "cannot tell", never yes or no;
* a table shown to a reader (``display_table``) has its intervals as text and every
  other missing value as "–", so no "NaN" reaches a page.
"""

from __future__ import annotations

import math

import pandas as pd

MIN_CLUSTERS = 5  # a chapter may change it through ``use_min_clusters`` (a notebook parameter)


def use_min_clusters(n: int) -> int:
    """Set the fewest clusters an interval needs, for every function here that is not
    given its own ``min_clusters`` (a chapter's parameter, e.g. ``min_problems``)."""
    global MIN_CLUSTERS
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ValueError(f"the fewest problems for an interval must be an integer >= 2, got {n!r}: "
                         "one problem says nothing about the spread between problems")
    MIN_CLUSTERS = n
    return n


def fewest(min_clusters: int | None = None) -> int:
    """The fewest clusters an interval needs: ``min_clusters`` if given, else the chapter's
    setting (``MIN_CLUSTERS``)."""
    return MIN_CLUSTERS if min_clusters is None else min_clusters


def is_finite(x) -> bool:
    """Whether ``x`` is a number that is neither missing nor infinite."""
    try:
        return x is not None and not pd.isna(x) and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def fmt(x, digits: int = 3, signed: bool = False) -> str:
    """``x`` with ``digits`` significant digits (at most 4 decimals for numbers below 1 in
    size, none lost for large ones); a sign on request; "n/a" for a missing or infinite
    value. Zero is "0" even with a sign asked for."""
    if not is_finite(x):
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
    if signed and not text.startswith("-") and text != "0":  # zero has no sign: "0", not "+0"
        text = "+" + text
    return text


def interval_ok(estimate, low, high, n_clusters: int, min_clusters: int | None = None) -> bool:
    """Whether an interval may be shown: enough clusters, finite bounds that contain the
    estimate and are not both equal to it (a degenerate interval says nothing)."""
    if n_clusters < fewest(min_clusters) or not all(is_finite(v) for v in (estimate, low, high)):
        return False
    low, high, estimate = float(low), float(high), float(estimate)
    tol = 1e-12 * max(1.0, abs(estimate))
    return low - tol <= estimate <= high + tol and high > low


def why_no_interval(estimate, low, high, n_clusters: int, min_clusters: int | None = None,
                    cluster_name: str = "problems") -> str:
    if n_clusters < fewest(min_clusters):
        return (f"{_counted(n_clusters, cluster_name)}: too few for an interval "
                f"(needs {fewest(min_clusters)})")
    if not (is_finite(low) and is_finite(high)):
        return "no interval: the resampled estimates were not finite"
    if float(high) <= float(low):
        return "no interval: every resample gave the same value"
    return "no interval: the resampling interval does not contain the estimate"


def _counted(n: int, name: str) -> str:
    return f"{n} {name[:-1] if n == 1 and name.endswith('s') else name}"


def interval_text(estimate, low, high, n_clusters: int, *, digits: int = 3,
                  signed: bool = False, min_clusters: int | None = None,
                  cluster_name: str = "problems", scale: float = 1.0, unit: str = "") -> str:
    """"0.342 [0.301, 0.388]", or "0.342 (3 problems: too few for an interval (needs 5))",
    or "no data" when the estimate itself is missing. ``scale`` multiplies the estimate
    and its bounds (100 for a share printed in percent); ``unit`` follows the numbers
    ("%", " nats")."""
    if not is_finite(estimate):
        return "no data"
    est = fmt(scale * float(estimate), digits, signed)
    if interval_ok(estimate, low, high, n_clusters, min_clusters):
        return (f"{est} [{fmt(scale * float(low), digits, signed)}, "
                f"{fmt(scale * float(high), digits, signed)}]{unit}")
    why = why_no_interval(estimate, low, high, n_clusters, min_clusters, cluster_name)
    return f"{est}{unit} ({why})"


def row_text(row, *, estimate: str = "estimate", low: str = "low", high: str = "high",
             clusters: str = "problems", **kw) -> str:
    """``interval_text`` of a table row (a Series or a namedtuple from ``itertuples``)."""
    get = row.get if hasattr(row, "get") else (lambda name: getattr(row, name))
    n = get(clusters)
    return interval_text(get(estimate), get(low), get(high), int(n) if is_finite(n) else 0, **kw)


def excludes_zero(estimate, low, high, n_clusters: int, min_clusters: int | None = None) -> bool:
    """Whether a shown interval excludes 0 (False whenever no interval may be shown)."""
    return interval_ok(estimate, low, high, n_clusters, min_clusters) and (
        float(low) > 0 or float(high) < 0)


def sign_of(estimate, low, high, n_clusters: int, min_clusters: int | None = None) -> int:
    """+1 or -1 where a shown interval lies above or below 0, else 0 (it includes 0, or
    no interval may be shown)."""
    if not excludes_zero(estimate, low, high, n_clusters, min_clusters):
        return 0
    return 1 if float(low) > 0 else -1


def contains(value, estimate, low, high, n_clusters: int,
             min_clusters: int | None = None) -> bool | None:
    """Whether a shown interval contains ``value``; None where no interval may be shown
    (the question cannot be answered from these data)."""
    if not interval_ok(estimate, low, high, n_clusters, min_clusters):
        return None
    return float(low) <= float(value) <= float(high)


def verdict_text(answer: bool | None, n_clusters: int, min_clusters: int | None = None,
                 cluster_name: str = "problems") -> str:
    """"yes", "no", or why the question has no answer (too few clusters, no interval)."""
    if answer is None:
        least = fewest(min_clusters)
        return (f"cannot tell ({_counted(n_clusters, cluster_name)}; an interval needs {least})"
                if n_clusters < least else "cannot tell (no interval)")
    return "yes" if answer else "no"


def with_interval_text(table: pd.DataFrame, estimate: str, low: str, high: str,
                       clusters: str, column: str = "interval", **kw) -> pd.DataFrame:
    """``table`` with a text column per row and the bounds blanked (NA) where no interval
    may be shown, so a displayed table never shows a bound the text would not."""
    out = table.copy()
    ok = [interval_ok(e, lo, hi, int(n), kw.get("min_clusters"))
          for e, lo, hi, n in zip(out[estimate], out[low], out[high], out[clusters])]
    out[column] = [interval_text(e, lo, hi, int(n), **kw)
                   for e, lo, hi, n in zip(out[estimate], out[low], out[high], out[clusters])]
    out[low] = out[low].where(ok)
    out[high] = out[high].where(ok)
    return out


def display_table(table: pd.DataFrame, intervals: dict | None = None, digits: int = 3,
                  keep=()) -> pd.DataFrame:
    """A table for a reader: each interval as one text column, every other float as
    ``fmt`` text, and "–" wherever a value is missing, so a page never shows "NaN".

    ``intervals`` maps a new column name to (estimate, low, high, clusters) column names,
    optionally with a dict of ``interval_text`` options as a fifth item; the estimate,
    low and high columns are dropped unless listed in ``keep``."""
    out = table.copy()
    used = set()
    for name, spec in (intervals or {}).items():
        est, lo, hi, n = spec[:4]
        kw = spec[4] if len(spec) > 4 else {}
        out[name] = [interval_text(e, a, b, int(c) if is_finite(c) else 0, digits=digits, **kw)
                     for e, a, b, c in zip(out[est], out[lo], out[hi], out[n])]
        used |= {est, lo, hi}
    out = out.drop(columns=[c for c in used if c not in keep])
    for column in out.columns:
        values = out[column]
        if pd.api.types.is_float_dtype(values):
            out[column] = [fmt(v, digits) if is_finite(v) else "–" for v in values]
        elif values.dtype == object or pd.api.types.is_extension_array_dtype(values):
            out[column] = values.astype(object).where(values.notna(), "–")
    return out

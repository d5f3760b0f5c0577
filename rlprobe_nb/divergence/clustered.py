"""Intervals for per-token statistics when tokens are clustered in problems.

Every forced token belongs to a rollout, and the rollouts of one problem share its prompt,
its difficulty and often long prefixes, so tokens of one problem are correlated: a
token-level interval pretends there are as many independent draws as tokens where there
are only as many as problems (on simulated data with an intra-class correlation of 0.3 a
token bootstrap covers the true mean about half the time). Everything here resamples or
weights whole problems.

Most statistics of the chapter are ratios of per-problem totals, R = sum_g num_g /
sum_g den_g: a mean over tokens (num = the metric's sum, den = the token count), a share
of the total KL (num = the category's KL, den = all KL), a share of tokens above a
threshold. For those:

- ``ratio_interval``: the cluster-robust standard error CR2 (Bell and McCaffrey 2002) in
  closed form: with residual totals e_g = num_g - R den_g and each problem's share p_g of
  the denominator, Var(R) = sum_g e_g^2 / (1 - p_g) / (sum_g den_g)^2; and a t interval
  with the Bell–McCaffrey degrees of freedom tr(M)^2 / tr(M^2), M = diag(p / (1 - p)) -
  u u', u_g = p_g / sqrt(1 - p_g) (G - 1 when problems are equally large).
- ``bootstrap_t_interval``: the headline interval, a *paired cluster bootstrap-t*. Problems
  are resampled with replacement (``bootstrap_counts``: one count matrix per table, shared
  by every step, so a replicate is the same problems at every checkpoint and a change
  between steps is resampled as a pair); each replicate's deviation R* - R is divided by
  its own cluster-robust standard error (sqrt(sum_g e_g^2) / sum_g den_g, computed for all
  replicates at once by matrix products) and the interval is R - q_{97.5%} SE ..
  R - q_{2.5%} SE. A replicate whose drawn problems all share one ratio has no spread
  of its own (its SE is rounding, ``NO_SPREAD``) and is scaled by the observed SE.
  On simulated tokens with a problem effect (ICC 0.3) it covers 94-96% with 9, 20 and 100
  problems, where the percentile bootstrap covers ~89% with 9. Studentizing also corrects
  part of the skew of heavy-tailed values such as KL: on log-normal tokens with 9
  problems it covers ~92.5% (the symmetric t interval ~90%), from 20 problems on 93-95%
  (tests/test_clustered.py simulates all of them).

For statistics that are not ratios of totals (quantiles, rank correlations),
``replicate_interval`` turns paired replicates into estimate +- t_{G-1} x sd x
sqrt(G / (G - 1)) (the bootstrap variance of a mean is (G - 1)/G of its unbiased estimate;
for a mean this is the CR1 t interval). It is approximate and says so.

A bootstrap-t interval of a ratio with non-negative denominators is cut to the range of
the problems' own ratios (``within_problems``): no replicate, a mean over resampled
problems, can leave it, while the bootstrap-t's endpoints can (one heavy-tailed problem
makes a replicate's standard error near zero). The CR2 interval of few problems is not
cut: with three problems the mean may well lie beyond the largest of them.

No interval comes from fewer than two problems (NaN): one problem says nothing about the
spread between problems. A statistic with no spread at all (every problem the same, e.g.
a checkpoint identical to the reference) gets its point as the interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from rlprobe_nb.statistics import seed_from

N_BOOT = 999
# Below this many problems the bootstrap-t is unstable (a replicate that draws one problem
# again and again has a near-zero spread, so t* explodes): the CR2 t interval, exact for
# normal data and merely conservative otherwise, is used instead.
MIN_PROBLEMS_BOOTSTRAP_T = 8
# A replicate's standard error below this share of the observed one is rounding, not spread.
NO_SPREAD = 1e-6


def problem_codes(problems) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes 0..G-1 for the problem of each row, and the sorted problem names."""
    codes, names = pd.factorize(np.asarray(problems), sort=True)
    return codes.astype(np.int64), np.asarray(names)


def problem_totals(values, codes: np.ndarray, n_problems: int,
                   weights=None) -> tuple[np.ndarray, np.ndarray]:
    """Per problem: the sum of ``values`` x ``weights`` and the sum of ``weights`` (the
    token count when no weights are given), in float64."""
    values = np.asarray(values, dtype=np.float64)
    w = np.ones_like(values) if weights is None else np.asarray(weights, dtype=np.float64)
    num = np.bincount(codes, weights=values * w, minlength=n_problems)
    den = np.bincount(codes, weights=w, minlength=n_problems)
    return num, den


def _cr2(num: np.ndarray, den: np.ndarray):
    """Ratio, CR2 standard error and Bell–McCaffrey df over the last axis."""
    total = den.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = num.sum(-1) / total
        p = den / total[..., None]
        present = den != 0
        d = np.where(present, p / (1 - p), 0.0)
        resid = num - ratio[..., None] * den
        var = np.where(present, resid * resid / (1 - p), 0.0).sum(-1) / (total * total)
        u2 = p * d
        trace = d.sum(-1) - u2.sum(-1)
        frob2 = (d * d).sum(-1) - 2 * (d * u2).sum(-1) + u2.sum(-1) ** 2
        df = trace * trace / frob2
    ok = (present.sum(-1) >= 2) & (total != 0) & ~np.any(present & (p >= 1), axis=-1)
    return ratio, np.where(ok, np.sqrt(np.abs(var)), np.nan), np.where(ok, df, np.nan)


def ratio_interval(num, den, alpha: float = 0.05) -> dict:
    """R = sum(num) / sum(den) with its CR2 / Bell–McCaffrey t interval.

    ``num``, ``den``: per-problem totals [G] (floats out) or [..., G] (one interval per
    leading index; a problem with den = 0 is absent from that row). Returns estimate, se,
    df, low, high and problems (how many carry weight)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    ratio, se, df = _cr2(num, den)
    spread = se > 0
    with np.errstate(invalid="ignore"):
        q = stats.t.ppf(1 - alpha / 2, np.where(spread, df, 1.0))
    half = np.where(spread, q * se, np.where(se == 0, 0.0, np.nan))
    out = {"estimate": ratio, "se": se, "df": df, "low": ratio - half, "high": ratio + half,
           "problems": (den != 0).sum(-1)}
    return _scalars(out) if num.ndim == 1 else out


def bootstrap_counts(n_problems: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """[n_boot, n_problems] float counts: how often each problem is drawn in each
    replicate (rows sum to n_problems). Reuse one matrix for every step of a table to
    pair the replicates across steps."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, max(n_problems, 1), size=(n_boot, n_problems))
    flat = draws + n_problems * np.arange(n_boot)[:, None]
    counts = np.bincount(flat.ravel(), minlength=n_boot * n_problems)
    return counts.reshape(n_boot, n_problems).astype(np.float64)


def bootstrap_ratios(num: np.ndarray, den: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Replicates of sum(num) / sum(den) for totals [G] or [G, K] (K steps or groups,
    paired through the shared ``counts`` [B, G]): [B] or [B, K]. A replicate that drew
    only problems with an empty denominator is NaN."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (counts @ num) / (counts @ den)


def bootstrap_t_interval(num, den, counts: np.ndarray, alpha: float = 0.05) -> dict:
    """The paired cluster bootstrap-t interval of R = sum(num) / sum(den).

    ``num``, ``den``: per-problem totals [G] or [K, G] (K statistics over the same
    problems, e.g. one per step or per step-to-step change); ``counts``: [B, G] from
    ``bootstrap_counts``, shared by all K. Each replicate's t* = (R* - R) / SE*, with the
    cluster-robust standard error SE = sqrt(sum_g e_g^2) / sum_g den_g of its drawn
    problems (a problem drawn twice counts twice); the interval is R - q_97.5% SE ..
    R - q_2.5% SE. A replicate with no spread (its drawn problems all have the same ratio)
    is scaled by the observed SE instead; no spread at all gives the point. With fewer than
    ``MIN_PROBLEMS_BOOTSTRAP_T`` problems the CR2 t interval is returned instead. Returns
    estimate, se, low, high, problems (floats for [G]).
    """
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    one = num.ndim == 1
    num, den = np.atleast_2d(num), np.atleast_2d(den)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = num.sum(1) / den.sum(1)
        centred = num - ratio[:, None] * den  # residual totals e_g at R
        se = np.sqrt((centred * centred).sum(1)) / np.abs(den.sum(1))
        # Replicates by matrix products: R* - R = sum c e / sum c den, and the residuals
        # at R* are e_g - (R* - R) den_g.
        drawn_den = counts @ den.T
        shift = (counts @ centred.T) / drawn_den
        squares = (counts @ (centred * centred).T - 2 * shift * (counts @ (centred * den).T)
                   + shift * shift * (counts @ (den * den).T))
        rep_se = np.sqrt(np.maximum(squares, 0.0)) / np.abs(drawn_den)
        # A replicate whose drawn problems all have the same ratio has no spread; rounding
        # leaves it ~1e-18 instead of 0, which would make t* explode: below a millionth of
        # the observed SE it counts as none.
        t_star = shift / np.where(rep_se > NO_SPREAD * se, rep_se, se)
    t_star[~np.isfinite(t_star)] = np.nan
    q_low, q_high = _nanquantiles(t_star, alpha)
    low, high = within_problems(num, den, ratio - q_high * se, ratio - q_low * se)
    point = se == 0
    low[point], high[point] = ratio[point], ratio[point]
    problems = (den != 0).sum(-1)
    small = problems < MIN_PROBLEMS_BOOTSTRAP_T
    if small.any():
        cr2 = ratio_interval(num, den, alpha)
        low, high = np.where(small, cr2["low"], low), np.where(small, cr2["high"], high)
    few = problems < 2  # one problem says nothing about the spread between problems
    se, low, high = (np.where(few, np.nan, x) for x in (se, low, high))
    out = {"estimate": ratio, "se": se, "low": low, "high": high, "problems": problems}
    return _scalars(out) if one else out


def within_problems(num, den, low, high) -> tuple[np.ndarray, np.ndarray]:
    """``low``, ``high`` [K] cut to the range of the problems' own ratios num_g / den_g
    (problems with den_g > 0), where every den_g >= 0: R, and R* of any resample of the
    problems, is a weighted mean of those ratios and cannot leave their range. The
    bootstrap-t divides by each replicate's standard error, and where one problem carries
    a value far above the rest (a heavy-tailed cell: KL in one entropy decile), a replicate
    that draws the others has a standard error near zero and a huge t*: uncut, such an
    interval reached 1,197 nats around a mean of 0.072."""
    num, den = np.atleast_2d(num), np.atleast_2d(den)
    with np.errstate(invalid="ignore", divide="ignore"):
        own = np.where(den > 0, num / den, np.nan)
    signed = (den >= 0).all(axis=1) & np.isfinite(own).any(axis=1)
    least = np.where(signed, np.nanmin(np.where(np.isnan(own), np.inf, own), axis=1), -np.inf)
    most = np.where(signed, np.nanmax(np.where(np.isnan(own), -np.inf, own), axis=1), np.inf)
    return np.clip(low, least, most), np.clip(high, least, most)


def replicate_interval(estimate, replicates, n_problems: int,
                       alpha: float = 0.05) -> tuple:
    """estimate +- t_{G-1} x sd(replicates) x sqrt(G / (G - 1)), for statistics that are
    not ratios of totals. ``replicates`` [B] or [B, K] (``estimate`` then [K]); NaN
    replicates are ignored; fewer than two problems give NaN."""
    reps = np.asarray(replicates, dtype=np.float64)
    estimate = np.asarray(estimate, dtype=np.float64)
    if n_problems < 2:
        nan = np.full(estimate.shape, np.nan)
        return (float(nan), float(nan)) if nan.ndim == 0 else (nan, nan)
    g = n_problems
    with np.errstate(invalid="ignore"):
        sd = np.nanstd(reps, axis=0, ddof=1) if len(reps) > 1 else np.nan
    half = stats.t.ppf(1 - alpha / 2, g - 1) * sd * np.sqrt(g / (g - 1))
    low, high = estimate - half, estimate + half
    return (float(low), float(high)) if np.ndim(low) == 0 else (low, high)


def _nanquantiles(t_star: np.ndarray, alpha: float):
    """Lower and upper alpha/2 quantiles over axis 0 ignoring NaN (numpy's linear rule),
    NaN where a column is all NaN; vectorised (np.nanquantile loops over columns)."""
    ordered = np.sort(t_star, axis=0)  # NaN last
    valid = (~np.isnan(t_star)).sum(0)
    out = []
    for q in (alpha / 2, 1 - alpha / 2):
        pos = q * np.maximum(valid - 1, 0)
        below = np.floor(pos).astype(int)
        above = np.minimum(below + 1, np.maximum(valid - 1, 0))
        lo = np.take_along_axis(ordered, below[None], 0)[0]
        hi = np.take_along_axis(ordered, above[None], 0)[0]
        out.append(np.where(valid > 0, lo + (pos - below) * (hi - lo), np.nan))
    return out[0], out[1]


def _scalars(out: dict) -> dict:
    """One statistic's results as plain floats (``problems`` as int)."""
    return {k: (int if k == "problems" else float)(np.asarray(v).reshape(-1)[0])
            for k, v in out.items()}


def mean_interval(values, problems, alpha: float = 0.05, seed: int | None = None) -> dict:
    """The mean over tokens of ``values`` with its interval: the cluster bootstrap-t
    (``N_BOOT`` replicates) when a ``seed`` is given, else the CR2 t interval. NaN values
    are left out."""
    values = np.asarray(values, dtype=np.float64)
    problems = np.asarray(problems)
    ok = ~np.isnan(values)
    codes, names = problem_codes(problems[ok])
    num, den = problem_totals(values[ok], codes, len(names))
    if seed is None:
        return ratio_interval(num, den, alpha)
    return bootstrap_t_interval(num, den, bootstrap_counts(len(names), N_BOOT, seed), alpha)


def ratio_table(frame: pd.DataFrame, keys: list[str], num, den: str | None = None,
                den_keys: list[str] | None = None, paired_by: tuple[str, ...] = ("group",),
                seed: int = 0, n_boot: int = N_BOOT, problem: str = "problem_id",
                alpha: float = 0.05, bounds=(-np.inf, np.inf)) -> pd.DataFrame:
    """Per value of ``paired_by`` + ``keys``: sum(num) / sum(den) over the rows, with the
    paired cluster bootstrap-t interval (``bootstrap_t_interval``).

    ``num``: a column, or a list of columns sharing the denominator (then a ``metric``
    column names each). ``den`` None counts rows (a mean per row). ``den_keys`` (a subset
    of ``keys``) sums the denominator over those keys only, for shares of a total: with
    keys [step, category] and den_keys [step], a category's share of all KL of its step.
    The problems of one ``paired_by`` stratum share one count matrix (seeded from ``seed``
    and the stratum), so every key of a stratum is resampled with the same problems: the
    pairing that gives differences between steps their own intervals. ``bounds``: the
    range the statistic can take (e.g. (0, 1) for a share), or a dict of them per column;
    the interval is cut to it, which keeps its coverage. Returns the ``paired_by`` and key
    columns (and ``metric``), estimate, low, high, se, problems and rows.
    """
    nums = [num] if isinstance(num, str) else list(num)
    columns = (list(paired_by) + list(keys) + ([] if isinstance(num, str) else ["metric"])
               + ["estimate", "low", "high", "se", "problems", "rows"])
    out = []
    strata = (frame.groupby(list(paired_by), sort=True, observed=True) if paired_by
              else [((), frame)])
    for stratum, part in strata:
        stratum = stratum if isinstance(stratum, tuple) else (stratum,)
        codes, names = problem_codes(part[problem])
        work = pd.DataFrame({k: part[k].to_numpy() for k in keys})
        work["_g"] = codes
        for i, column in enumerate(nums):
            work[f"_num{i}"] = part[column].to_numpy(np.float64)
        work["_den"] = 1.0 if den is None else part[den].to_numpy(np.float64)
        sums = work.groupby(keys + ["_g"], sort=True, observed=True).sum()
        den_m = _by_problem(sums["_den"], len(names))
        if den_keys is not None:
            totals = _by_problem(
                work.groupby(den_keys + ["_g"], sort=True, observed=True)["_den"].sum(), len(names))
            extra = [k for k in keys if k not in den_keys]
            at = den_m.index.droplevel(extra) if extra else den_m.index
            den_m = totals.reindex(at).set_axis(den_m.index)
        counts = bootstrap_counts(len(names), n_boot, seed_from(seed, *stratum))
        rows = work.groupby(keys, sort=True, observed=True).size().reindex(den_m.index)
        for i, column in enumerate(nums):
            num_m = _by_problem(sums[f"_num{i}"], len(names))
            res = bootstrap_t_interval(num_m.to_numpy(), den_m.to_numpy(), counts, alpha)
            limits = bounds.get(column, (-np.inf, np.inf)) if isinstance(bounds, dict) else bounds
            table = num_m.index.to_frame(index=False).assign(
                metric=column, estimate=res["estimate"], low=np.clip(res["low"], *limits),
                high=np.clip(res["high"], *limits), se=res["se"], problems=res["problems"],
                rows=rows.to_numpy())
            for name, value in zip(paired_by, stratum):
                table[name] = value
            out.append(table)
    return pd.concat(out, ignore_index=True)[columns] if out else pd.DataFrame(columns=columns)


def _by_problem(series: pd.Series, n_problems: int) -> pd.DataFrame:
    """A (keys..., _g) Series as a [keys, problem] frame with every problem a column."""
    wide = series.unstack("_g", fill_value=0.0)
    return wide.reindex(columns=range(n_problems), fill_value=0.0).astype(np.float64)


def difference_interval(num_a, den_a, num_b, den_b, counts: np.ndarray,
                        alpha: float = 0.05) -> dict:
    """The paired interval of D = sum(num_a) / sum(den_a) − sum(num_b) / sum(den_b), two
    ratios over the *same* problems (per-problem totals [G]; a problem may carry only one
    side), e.g. the mean Δlogp of one token category minus another's at one step.

    Its linearised residual per problem is e_g = (num_a_g − R_a den_a_g) / sum(den_a) −
    (num_b_g − R_b den_b_g) / sum(den_b), so a problem that moves both sides together
    cancels out: the pairing. With ``MIN_PROBLEMS_BOOTSTRAP_T`` problems or more, a
    bootstrap-t over the shared ``counts`` (each replicate studentized by its own
    residuals); with fewer, the t interval with G − 1 degrees of freedom and the
    small-sample factor G / (G − 1). Fewer than two problems give NaN. Returns estimate,
    se, low, high, problems (problems carrying either side)."""
    x = np.stack([np.asarray(v, dtype=np.float64) for v in (num_a, den_a, num_b, den_b)])
    present = (x[1] != 0) | (x[3] != 0)
    g = int(present.sum())
    nan = {"estimate": np.nan, "se": np.nan, "low": np.nan, "high": np.nan, "problems": g}
    if x[1].sum() == 0 or x[3].sum() == 0:
        return nan
    estimate, resid = _difference_residuals(x)
    se = float(np.sqrt((resid * resid).sum() * g / max(g - 1, 1)))
    out = {"estimate": float(estimate), "se": se, "problems": g}
    if g < 2:
        return {**nan, "estimate": float(estimate)}
    if se == 0:
        return {**out, "low": float(estimate), "high": float(estimate)}
    if g < MIN_PROBLEMS_BOOTSTRAP_T:
        half = stats.t.ppf(1 - alpha / 2, g - 1) * se
        return {**out, "low": float(estimate - half), "high": float(estimate + half)}
    drawn = counts @ x.T  # [B, 4]: each replicate's totals
    with np.errstate(invalid="ignore", divide="ignore"):
        ra, rb = drawn[:, 0] / drawn[:, 1], drawn[:, 2] / drawn[:, 3]
        # e*_g = sum_i coef_i x_ig, coefficients per replicate: 1/Da, -Ra/Da, -1/Db, Rb/Db
        coef = np.stack([1 / drawn[:, 1], -ra / drawn[:, 1], -1 / drawn[:, 3], rb / drawn[:, 3]], 1)
        squares = np.einsum("bi,bj,bij->b", coef, coef,
                            np.einsum("bg,ig,jg->bij", counts, x, x))
        rep_se = np.sqrt(np.maximum(squares, 0.0) * g / max(g - 1, 1))
        t_star = (ra - rb - estimate) / np.where(rep_se > NO_SPREAD * se, rep_se, se)
    t_star = t_star[np.isfinite(t_star)]
    if len(t_star) < 10:
        return {**out, "low": np.nan, "high": np.nan}
    q_low, q_high = np.quantile(t_star, [alpha / 2, 1 - alpha / 2])
    return {**out, "low": float(estimate - q_high * se), "high": float(estimate - q_low * se)}


def _difference_residuals(x: np.ndarray):
    """D and its per-problem linearised residuals from totals x = [num_a, den_a, num_b,
    den_b] x G."""
    da, db = x[1].sum(), x[3].sum()
    ra, rb = x[0].sum() / da, x[2].sum() / db
    return ra - rb, (x[0] - ra * x[1]) / da - (x[2] - rb * x[3]) / db

"""From the ``takeover`` table to curves: accuracy and the share of the checkpoint's gain
recovered, against the share of positions taken over, with intervals over problems.

For checkpoint c, rule r and a set of problems, acc_r is the mean over problems of each
problem's mean correctness over its samples; acc_ref and acc_c are the two ends (the
reference alone, c alone, from the same seeds). The gain recovered is

    recovered_r = (acc_r - acc_ref) / (acc_c - acc_ref)

and, for any checkpoint, the same over the *target's* gain (``of_target``: how far the
placebo's takeovers carry the reference towards what RLVR reached). A checkpoint whose own
gain is not above zero has no gain to recover: ``recovered`` is left empty and said so.
The share of positions taken over is pooled over the texts (positions where the rule
passed / all positions written); ``changed`` counts those where the token changed.

Intervals resample problems (one draw of problems for every checkpoint and rule, so every
difference is paired) and take percentiles; ``crossing`` reads off the share at which a
criterion's curve first reaches a level of recovered gain, by linear interpolation
between its measured points and the two ends (share 0: nothing taken over, recovered 0;
share 1: everything, recovered 1), in each resample too.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

RULE = ["checkpoint", "criterion", "budget"]
N_BOOT = 1000  # resamples of problems behind every interval (09's default, and the index's)


def _rule_key(df: pd.DataFrame) -> pd.Series:
    return df.criterion + "@" + df.budget.map(lambda b: "" if pd.isna(b) else f"{b:g}")


def problem_matrix(take: pd.DataFrame) -> tuple[dict, list[str]]:
    """Per (checkpoint, rule key): arrays over problems of mean correctness, positions
    taken, positions changed and positions written (sums over samples)."""
    df = take.assign(rule=_rule_key(take), n_taken=take.taken.map(len),
                     n_changed=take.changed.map(len), correct=take.correct.astype(float))
    problems = sorted(df.problem_id.unique())
    agg = df.groupby(["checkpoint", "rule", "problem_id"]).agg(
        acc=("correct", "mean"), taken=("n_taken", "sum"), changed=("n_changed", "sum"),
        tokens=("n_tokens", "sum"))
    out = {}
    for (ckpt, rule), part in agg.groupby(level=[0, 1]):
        part = part.droplevel([0, 1]).reindex(problems)
        if part.acc.isna().any():
            raise ValueError(f"takeover table: {ckpt} rule {rule} lacks problems "
                             f"{list(part.index[part.acc.isna()])[:5]}")
        out[(ckpt, rule)] = {k: part[k].to_numpy(np.float64) for k in part.columns}
    return out, problems


def _stats(m: dict, ckpt: str, rule: str, target: str, idx: np.ndarray) -> dict:
    cell = m[(ckpt, rule)]
    acc = cell["acc"][idx].mean()
    ref = m[(ckpt, "never@")]["acc"][idx].mean()
    own = m[(ckpt, "always@")]["acc"][idx].mean()
    tgt = m[(target, "always@")]["acc"][idx].mean()
    tgt_ref = m[(target, "never@")]["acc"][idx].mean()
    tokens = cell["tokens"][idx].sum()
    return {"acc": acc, "gain": acc - ref, "own_gain": own - ref,
            "recovered": (acc - ref) / (own - ref) if own - ref > 0 else np.nan,
            "of_target": (acc - tgt_ref) / (tgt - tgt_ref) if tgt - tgt_ref > 0 else np.nan,
            "share_taken": cell["taken"][idx].sum() / tokens,
            "share_changed": cell["changed"][idx].sum() / tokens}


def curve_table(take: pd.DataFrame, target: str, n_boot: int = 2000, seed: int = 0,
                alpha: float = 0.05) -> pd.DataFrame:
    """One row per (checkpoint, criterion, budget), the ends included: each statistic of
    ``_stats`` with a percentile interval over problems (columns ``<name>_low/_high``)."""
    m, problems = problem_matrix(take)
    n = len(problems)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(n_boot, n))
    everyone = np.arange(n)
    rules = take.drop_duplicates(RULE + ["threshold"]).assign(rule=lambda d: _rule_key(d))
    rows = []
    for r in rules.itertuples():
        point = _stats(m, r.checkpoint, r.rule, target, everyone)
        boot = pd.DataFrame([_stats(m, r.checkpoint, r.rule, target, d) for d in draws])
        row = {"checkpoint": r.checkpoint, "run": r.run, "step": r.step,
               "criterion": r.criterion, "budget": r.budget, "threshold": r.threshold,
               "problems": n, **point}
        for k in point:
            lo, hi = np.nanquantile(boot[k], [alpha / 2, 1 - alpha / 2]) \
                if boot[k].notna().mean() > 0.5 else (np.nan, np.nan)
            row[f"{k}_low"], row[f"{k}_high"] = lo, hi
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["step", "run", "criterion", "share_taken"],
                                          ignore_index=True)


def _crossing(shares: np.ndarray, values: np.ndarray, level: float) -> float:
    """The smallest share at which the piecewise-linear curve through (0, 0), the points
    (sorted by share) and (1, 1) reaches ``level``."""
    order = np.argsort(shares, kind="stable")
    xs = np.concatenate([[0.0], shares[order], [1.0]])
    ys = np.concatenate([[0.0], values[order], [1.0]])
    for i in range(1, len(xs)):
        if ys[i] >= level:
            if ys[i - 1] >= level or ys[i] == ys[i - 1]:
                return float(xs[i - 1] if ys[i - 1] >= level else xs[i])
            return float(xs[i - 1] + (level - ys[i - 1]) * (xs[i] - xs[i - 1]) / (ys[i] - ys[i - 1]))
    return float("nan")


def _at_share(shares: np.ndarray, values: np.ndarray, share: float) -> float:
    """The curve through (0, 0), the points and (1, 1), read at ``share``."""
    order = np.argsort(shares, kind="stable")
    xs = np.concatenate([[0.0], shares[order], [1.0]])
    ys = np.concatenate([[0.0], values[order], [1.0]])
    return float(np.interp(share, xs, ys))


def headline(take: pd.DataFrame, target: str, placebo: str | None, levels=(0.5, 0.9),
             criterion: str = "delta_logp", n_boot: int = 2000, seed: int = 0,
             alpha: float = 0.05) -> pd.DataFrame:
    """Per level: the share of positions at which ``criterion``'s takeover by the target
    recovers that share of the target's gain, and at that same share: random's recovery
    (same checkpoint) and the placebo's (its ``criterion`` curve, over the target's
    gain), each with an interval over problems (paired resamples)."""
    m, problems = problem_matrix(take)
    n = len(problems)
    rng = np.random.default_rng(seed)
    draws = [np.arange(n)] + list(rng.integers(0, n, size=(n_boot, n)))

    def curve(ckpt: str, crit: str, idx, over_target: bool):
        keys = [k for (c, k) in m if c == ckpt and k.startswith(crit + "@")]
        stats = [_stats(m, ckpt, k, target, idx) for k in keys]
        field = "of_target" if over_target else "recovered"
        return (np.array([s["share_taken"] for s in stats]),
                np.array([s[field] for s in stats]))

    out = []
    for level in levels:
        vals = []
        for idx in draws:
            s, v = curve(target, criterion, idx, False)
            x = _crossing(s, v, level)
            rs, rv = curve(target, "random", idx, False) if any(
                k.startswith("random@") for (c, k) in m if c == target) else (None, None)
            ps, pv = curve(placebo, criterion, idx, True) if placebo else (None, None)
            vals.append((x, np.nan if rs is None or np.isnan(x) else _at_share(rs, rv, x),
                         np.nan if ps is None or np.isnan(x) else _at_share(ps, pv, x)))
        vals = np.array(vals)
        row = {"level": level, "checkpoint": target, "criterion": criterion,
               "placebo": placebo, "problems": n}
        for j, name in enumerate(("share", "random", "placebo_recovered")):
            boot = vals[1:, j]
            ok = np.isfinite(boot)
            row[name] = vals[0, j]
            row[f"{name}_low"], row[f"{name}_high"] = (
                np.quantile(boot[ok], [alpha / 2, 1 - alpha / 2]) if ok.mean() > 0.5
                else (np.nan, np.nan))
        out.append(row)
    return pd.DataFrame(out)

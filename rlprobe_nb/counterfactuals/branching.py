"""Branching at a token: does the token decide the answer?

At a point ``pos`` of a rollout (``points``: where and why), arms are continued by the
same policy, ``n`` times each:

    keep      prompt + response[:pos + 1]             the written token
    top1      prompt + response[:pos] + [alternative] the checkpoint's most probable real
                                                      alternative (``points.real_alternative``)
    correct   prompt + response[:pos] + [digit]       first wrong digits only: the digit the
                                                      labeller says is right there

The *effect* of an arm is pass rate(arm) − pass rate(keep), with Newcombe's interval for
a difference of two independent proportions; each arm's own pass rate has its Wilson
interval.

Two questions, two comparisons:

- **positive control**: at first wrong digits, ``correct`` − ``keep``. Where the answer
  is copied from a wrong result, writing the right digit there must lift the pass rate.
  If it does not, the method cannot see a decisive token, and a null main result says
  nothing.
- **main result**: at the points, ``top1`` − ``keep``, beside the same at *controls*:
  tokens of the same rollout, matched on the reference's entropy (of the point's
  category where one is near: chapter 04's classes), that carry no arithmetic and that
  no rule marks as decisive (not a point or spike nor within ``gap`` tokens of one, no
  digit, number, operand or operator, not a format token) and that have a real
  alternative too. A control says how much swapping in the checkpoint's preference
  changes the answer anyway, at a token as uncertain that decides nothing by
  construction: its effect should be near zero. (A digit is no control: on the demo
  suite, controls that were digits of correct results or operands lowered the pass
  rate by 0.3 where the kept text passed, since another digit there changes the
  calculation.)

Means over points are clustered by problem (a problem's points share its difficulty and
rollouts): a bootstrap that resamples problems, and for point − control one that
resamples them once for both. ``summary`` reports them; a reader sees them through
``narrative``, which shows no interval from fewer than ``reporting.MIN_CLUSTERS``
problems.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb.counterfactuals.intervals import cluster_bootstrap_difference, newcombe_ci
from rlprobe_nb.counterfactuals.points import CONTENT_LABELS, FIRST_WRONG, disagrees, eligible
from rlprobe_nb.statistics import cluster_bootstrap_ci, seed_from

ARMS = ("keep", "top1", "correct")
ARITHMETIC_CATEGORIES = ("number_result", "number_operand", "number_other", "operator")
MATCH_LEVELS = ("category", "entropy")  # same rollout always; same category, else any


def _near(keys: set, gap: int) -> set:
    return {(r, p + d) for r, p in keys for d in range(-gap, gap + 1)}


def control_pool(tokens: pd.DataFrame, avoid: set, gap: int = 2,
                 include_format: bool = False, disagree_only: bool = False) -> pd.DataFrame:
    """Tokens that may serve as controls: branchable (``points.eligible``), carrying no
    arithmetic (no ground-truth label of ``points.CONTENT_LABELS`` and no number or
    operator category: another number or operation there changes the problem or the
    calculation, so it decides the answer by construction), not within ``gap`` tokens
    of any (rollout_id, pos) in ``avoid``; with ``disagree_only``, only where the
    checkpoint's top-1 is another token than the written one (``points.disagrees``: a
    swap the checkpoint itself would make, as at disagreement points)."""
    near = _near(avoid, gap)
    ok = eligible(tokens, include_format) & ~tokens["ground_truth"].isin(CONTENT_LABELS)
    if disagree_only:
        ok &= disagrees(tokens)
    ok &= ~tokens["category"].astype(str).isin(ARITHMETIC_CATEGORIES)
    ok &= np.array([(r, int(p)) not in near for r, p in zip(tokens["rollout_id"], tokens["pos"])],
                   dtype=bool)
    return tokens[ok]


def _first_wrong_pos(tokens: pd.DataFrame) -> dict:
    first = tokens[tokens["ground_truth"] == FIRST_WRONG]
    return first.groupby("rollout_id")["pos"].min().to_dict()


def wrong_so_far(tokens: pd.DataFrame) -> pd.Series:
    """Whether a token's kept text (the rollout up to and with the token) already holds a
    wrong result: its position is at or after the rollout's first wrong digit. Continued
    from a text that has not gone wrong yet, a swap can only lose passes; from one that
    has, it can only win them: a control stands on its point's side."""
    return _at_or_after(tokens, _first_wrong_pos(tokens))


def _at_or_after(rows: pd.DataFrame, first_wrong: dict) -> pd.Series:
    first = rows["rollout_id"].map(first_wrong).astype(float).fillna(np.inf)
    return pd.Series(rows["pos"].to_numpy(float) >= first.to_numpy(), index=rows.index)


def match_controls(points: pd.DataFrame, tokens: pd.DataFrame, avoid: set,
                   caliper: float = 0.25, gap: int = 2, seed: int = 0,
                   include_format: bool = False, disagree_only: bool = False) -> pd.DataFrame:
    """One control per point, from the point's own rollout and on the same side of its
    first wrong result (``wrong_so_far``): the token of the same category whose
    reference entropy is nearest the point's (within ``caliper`` nats), else of any
    category (``match``: "category" or "entropy"); ties broken by a seeded draw; each
    control serves one point. ``avoid``: (rollout_id, pos) of every point and spike.
    Returns the controls' token rows with ``matched_pos`` (the point), ``match``,
    ``entropy_gap`` and the point's ``rule``; points without a match are left out.
    ``disagree_only``: see ``control_pool``."""
    pool = control_pool(tokens, avoid | set(zip(points["rollout_id"], points["pos"])), gap,
                        include_format, disagree_only)
    first_wrong = _first_wrong_pos(tokens)
    pool = pool.assign(tie=np.random.default_rng(seed_from("controls", seed)).random(len(pool)),
                       wrong=_at_or_after(pool, first_wrong))
    used: set = set()
    rows = []
    for p in points.itertuples():
        wrong = p.pos >= first_wrong.get(p.rollout_id, np.inf)
        mine = pool[(pool["rollout_id"] == p.rollout_id) & ~pool.index.isin(list(used))
                    & (pool["wrong"] == wrong)]
        mine = mine.assign(entropy_gap=(mine["entropy_ref"] - p.entropy_ref).abs())
        mine = mine[mine["entropy_gap"] <= caliper]
        for level, options in zip(MATCH_LEVELS, (mine[mine["category"] == p.category], mine)):
            if len(options):
                best = options.sort_values(["entropy_gap", "tie"]).iloc[0]
                used.add(best.name)
                rows.append({**best.drop(["tie", "wrong"]).to_dict(), "matched_pos": int(p.pos),
                             "match": level, "rule": p.rule})
                break
    columns = list(tokens.columns) + ["entropy_gap", "matched_pos", "match", "rule"]
    return pd.DataFrame(rows, columns=list(dict.fromkeys(columns)))


def effects(branches: pd.DataFrame, arm: str = "top1", alpha: float = 0.05) -> pd.DataFrame:
    """One row per branched token (model, kind, rollout_id, pos) that has both ``keep``
    and ``arm``: each arm's passes, n and Wilson interval, effect = pass rate(arm) −
    pass rate(keep) and Newcombe's interval."""
    ids = ["model", "kind", "rollout_id", "pos"]
    carry = [c for c in ("problem_id", "rule", "category", "ground_truth", "result_is_answer",
                         "match", "matched_pos", "entropy_ref", "written_token") if c in branches]
    keep = branches[branches["arm"] == "keep"].set_index(ids)
    other = branches[branches["arm"] == arm].set_index(ids)
    both = keep.index.intersection(other.index)
    out = keep.loc[both, carry].copy()
    out["arm"] = arm
    out["substituted_token"] = other.loc[both, "substituted_token"]
    for name, rows in (("keep", keep), ("arm", other)):
        out[f"passes_{name}"] = rows.loc[both, "passes"].astype(int)
        out[f"n_{name}"] = rows.loc[both, "n"].astype(int)
        out[f"{name}_low"] = rows.loc[both, "wilson_low"].astype(float)
        out[f"{name}_high"] = rows.loc[both, "wilson_high"].astype(float)
    ci = [newcombe_ci(ka, na, kk, nk, alpha) for ka, na, kk, nk in
          zip(out.passes_arm, out.n_arm, out.passes_keep, out.n_keep)]
    out["effect"], out["effect_low"], out["effect_high"] = (
        (list(x) for x in zip(*ci)) if ci else ([], [], []))
    return out.reset_index()


RESAMPLED, COUNTED_ONCE = "problems resampled", "each problem counted once"


def _mean(part: pd.DataFrame, n_boot: int, alpha: float, seed: int) -> dict:
    mean, low, high = cluster_bootstrap_ci(part["effect"].to_numpy(float),
                                           part["problem_id"].to_numpy(), n_boot, alpha, seed)
    interval = RESAMPLED
    if len(part) and not high > low:
        low, high = _problems_counted_once(part, alpha)
        interval = COUNTED_ONCE
    rate = {"rate_keep": float(part["passes_keep"].sum() / part["n_keep"].sum()),
            "rate_arm": float(part["passes_arm"].sum() / part["n_arm"].sum())} if len(part) \
        else {"rate_keep": np.nan, "rate_arm": np.nan}
    return {"branches": len(part), "problems": part["problem_id"].nunique(), "mean": mean,
            "low": low, "high": high, **rate, "interval": interval}


def _problems_counted_once(part: pd.DataFrame, alpha: float) -> tuple[float, float]:
    """Where every problem gave the same mean effect, resampling problems gives an
    interval of no width, though the problems are few and each effect was read from a few
    draws. Then: Newcombe's interval with each problem counted as one draw per arm, at
    its mean pass rate in each arm (m problems, not m·n continuations: conservative)."""
    rates = part.assign(keep=part["passes_keep"] / part["n_keep"],
                        arm=part["passes_arm"] / part["n_arm"]).groupby("problem_id")[
        ["keep", "arm"]].mean()
    m = len(rates)
    _, low, high = newcombe_ci(round(rates["arm"].sum()), m, round(rates["keep"].sum()), m, alpha)
    return low, high


SUMMARY_COLUMNS = ["model", "arm", "group", "estimate", "branches", "problems", "mean", "low",
                   "high", "rate_keep", "rate_arm", "interval"]


def summary(point_effects: pd.DataFrame, control_effects: pd.DataFrame | None = None,
            by: str = "rule", n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
            ) -> pd.DataFrame:
    """Mean effect by (model, ``by``) and over all ("all"): at the points ("point"), at
    their controls ("control") and the difference ("point - control", problems resampled
    once for both), each with a bootstrap interval over problems. Controls count in the
    group of their point. Without controls, the points' rows only."""
    controls = control_effects if control_effects is not None else point_effects.iloc[:0]
    arm = point_effects["arm"].iloc[0] if len(point_effects) else "top1"
    rows = []
    for model in sorted(set(point_effects["model"]) | set(controls["model"])):
        pts, ctl = point_effects[point_effects.model == model], controls[controls.model == model]
        groups = [("all", pts, ctl)] + [(g, pts[pts[by] == g], ctl[ctl[by] == g])
                                         for g in sorted(set(pts[by]) | set(ctl[by]))]
        for group, p, c in groups:
            key = (seed, model, arm, group)
            rows.append({"model": model, "arm": arm, "group": group, "estimate": "point",
                         **_mean(p, n_boot, alpha, seed_from(*key, "point"))})
            if control_effects is None:
                continue
            rows.append({"model": model, "arm": arm, "group": group, "estimate": "control",
                         **_mean(c, n_boot, alpha, seed_from(*key, "control"))})
            diff = cluster_bootstrap_difference(p["effect"], p["problem_id"], c["effect"],
                                                c["problem_id"], n_boot, alpha,
                                                seed_from(*key, "diff"))
            both = pd.concat([p["problem_id"], c["problem_id"]])
            rows.append({"model": model, "arm": arm, "group": group,
                         "estimate": "point - control", "branches": len(p) + len(c),
                         "problems": both.nunique(), "mean": diff[0], "low": diff[1],
                         "high": diff[2], "rate_keep": np.nan, "rate_arm": np.nan,
                         "interval": RESAMPLED})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


CONTRAST_COLUMNS = ["model", "other", "points", "problems", "mean", "low", "high",
                    "effect_model", "effect_other"]


def policy_contrast(point_effects: pd.DataFrame, model: str, other: str, n_boot: int = 2000,
                    alpha: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """How much more a branch matters to ``model`` than to ``other`` at the same points
    (both continued the same contexts with the same draws): the mean over points of
    effect(model) − effect(other), with a bootstrap interval that resamples problems.
    One row (``CONTRAST_COLUMNS``); no points in common gives a row of 0 points."""
    ids = ["kind", "rollout_id", "pos"]
    a = point_effects[point_effects["model"] == model].set_index(ids)
    b = point_effects[point_effects["model"] == other].set_index(ids)
    both = a.index.intersection(b.index)
    diff = (a.loc[both, "effect"] - b.loc[both, "effect"]).to_numpy(float)
    problems = a.loc[both, "problem_id"].to_numpy()
    mean, low, high = cluster_bootstrap_ci(diff, problems, n_boot, alpha,
                                           seed_from(seed, model, other, "contrast"))
    return pd.DataFrame([{"model": model, "other": other, "points": len(both),
                          "problems": len(set(problems)), "mean": mean, "low": low,
                          "high": high, "effect_model": float(a.loc[both, "effect"].mean())
                          if len(both) else np.nan,
                          "effect_other": float(b.loc[both, "effect"].mean())
                          if len(both) else np.nan}], columns=CONTRAST_COLUMNS)

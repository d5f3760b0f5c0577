"""What chapter 08 tells its reader, in sentences whose every number is read from the
``branches`` table (through ``branching.effects`` and ``branching.summary``) and printed
through ``reporting``: no interval from fewer than ``reporting.MIN_CLUSTERS`` problems
(the sentence says so instead), no NaN, effects signed.

    positive_line   the positive control: the lift from writing the correct digit at
                    first wrong digits, and whether the method can see a decisive token
    group_lines     the same by group (e.g. whether the wrong statement computes the
                    answer, or the rule that picked the points)
    main_lines      the main result: the effect of the checkpoint's top-1 alternative at
                    the points, at their controls and the difference, with a verdict
    contrast_line   two policies (the RLVR checkpoint and its placebo) at the same points
    point_table     one row per branched token: each arm's passes with its Wilson
                    interval and the effect with Newcombe's, as text
"""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.counterfactuals.branching import COUNTED_ONCE
from rlprobe_nb.readable import counted
from rlprobe_nb.reporting import MIN_CLUSTERS, excludes_zero, fmt, interval_text


def _row(summary: pd.DataFrame, model: str, estimate: str, group: str = "all"):
    rows = summary[(summary["model"] == model) & (summary["estimate"] == estimate)
                   & (summary["group"] == group)]
    return rows.iloc[0] if len(rows) else None


def _interval(row, min_clusters: int) -> str:
    text = interval_text(row["mean"], row["low"], row["high"], int(row["problems"]),
                         signed=True, min_clusters=min_clusters)
    if row.get("interval") == COUNTED_ONCE and "[" in text:
        text += (" (every problem gave the same effect, so resampling problems gives no "
                 "width: Newcombe's interval with each problem counted once)")
    return text


def _shown_excludes_zero(row, min_clusters: int) -> int:
    """+1 / -1 where the shown interval lies above / below 0, else 0."""
    if not excludes_zero(row["mean"], row["low"], row["high"], int(row["problems"]),
                         min_clusters):
        return 0
    return 1 if float(row["low"]) > 0 else -1


def positive_line(summary: pd.DataFrame, model: str,
                  min_clusters: int = MIN_CLUSTERS) -> str:
    """The positive control's result for ``model`` (``summary`` of the "correct" arm)."""
    row = _row(summary, model, "point")
    if row is None or not row["branches"]:
        return (f"positive control ({model}): no first wrong digit with a correct digit to "
                "write was branched at, so this run cannot show that the method sees a "
                "decisive token; read the main result below with that in mind")
    head = (f"positive control ({model}): writing the correct digit at "
            f"{counted(row['branches'], 'first wrong digit')} in {counted(row['problems'], 'problem')} "
            "moves the pass rate from "
            f"{fmt(row['rate_keep'])} (the written digit kept) to {fmt(row['rate_arm'])}; "
            f"mean lift {_interval(row, min_clusters)}")
    sign = _shown_excludes_zero(row, min_clusters)
    if sign > 0:
        return head + " -> the method detects a decisive token where there is one"
    return head + (" -> the method did not show here that it can detect a decisive token: a "
                   "main result without an effect below says little")


def group_lines(summary: pd.DataFrame, model: str, what: str = "points",
                min_clusters: int = MIN_CLUSTERS) -> list[str]:
    """One line per group of ``summary`` (its ``by`` column's values, "all" left out):
    how many ``what`` in how many problems, the pass rates and the mean effect."""
    rows = summary[(summary["model"] == model) & (summary["estimate"] == "point")
                   & (summary["group"] != "all")]
    return [f"  {row['group']}: {counted(row['branches'], what[:-1])} in "
            f"{counted(row['problems'], 'problem')}, pass rate {fmt(row['rate_keep'])} -> "
            f"{fmt(row['rate_arm'])}, mean effect {_interval(row, min_clusters)}"
            for _, row in rows.iterrows() if row["branches"]]


def main_lines(summary: pd.DataFrame, model: str, min_clusters: int = MIN_CLUSTERS,
               alternative_of: str = "the checkpoint") -> list[str]:
    """The main result for ``model`` (``summary`` of the "top1" arm, with controls);
    ``alternative_of`` names whose top-1 alternative was swapped in."""
    point, control = _row(summary, model, "point"), _row(summary, model, "control")
    diff = _row(summary, model, "point - control")
    if point is None or not point["branches"]:
        return [f"main result ({model}): no branch point had a real alternative to swap in"]
    lines = [f"main result ({model}): swapping in {alternative_of}'s top-1 alternative at "
             f"{counted(point['branches'], 'point')} in {counted(point['problems'], 'problem')} moves "
             f"the pass rate from {fmt(point['rate_keep'])} to {fmt(point['rate_arm'])}: mean "
             f"effect {_interval(point, min_clusters)}"]
    if control is None or not control["branches"]:
        return lines + ["  no control was matched: the effect has nothing to be compared with"]
    lines.append(f"  at their {int(control['branches'])} matched controls (same rollout, "
                 f"matched on entropy and, where one was near, category): "
                 f"{_interval(control, min_clusters)}")
    if int(control["problems"]) < min_clusters:
        return lines + [f"  point - control: not compared: too few problems for an interval "
                        f"(the controls come from "
                        f"{counted(control['problems'], 'problem')}; an interval needs "
                        f"{min_clusters})"]
    sign = _shown_excludes_zero(diff, min_clusters)
    verdict = {1: "larger at the points than at their controls",
               -1: "smaller at the points than at their controls",
               0: "not told apart from the controls'"}[sign]
    if int(diff["problems"]) < min_clusters:
        verdict = "not compared: too few problems for an interval"
    lines.append(f"  point - control: {_interval(diff, min_clusters)} -> the effect of "
                 f"{alternative_of}'s preferred token is {verdict} (95% interval, problems "
                 "resampled)")
    return lines


def _rate(k, n, low, high) -> str:
    return f"{int(k)}/{int(n)} [{fmt(low, 2)}, {fmt(high, 2)}]"


def point_table(effects: pd.DataFrame) -> pd.DataFrame:
    """One row per branched token, for reading: where, what picked it, the written and
    substituted tokens, each arm's passes with its Wilson 95% interval, and the effect
    with Newcombe's."""
    def show(t):
        return None if t is None or pd.isna(t) else repr(str(t))

    out = pd.DataFrame({
        "model": effects["model"], "kind": effects["kind"], "rule": effects["rule"],
        "rollout_id": effects["rollout_id"], "pos": effects["pos"],
        "written": effects["written_token"].map(show),
        effects["arm"].iloc[0] if len(effects) else "arm": effects["substituted_token"].map(show),
        "keep (Wilson)": [_rate(*v) for v in zip(effects.passes_keep, effects.n_keep,
                                                   effects.keep_low, effects.keep_high)],
        "arm (Wilson)": [_rate(*v) for v in zip(effects.passes_arm, effects.n_arm,
                                                  effects.arm_low, effects.arm_high)],
        "effect (Newcombe)": [f"{fmt(e, 2, signed=True)} [{fmt(lo, 2, signed=True)}, "
                              f"{fmt(hi, 2, signed=True)}]" for e, lo, hi in
                              zip(effects.effect, effects.effect_low, effects.effect_high)]})
    return out.sort_values(["model", "kind", "rollout_id", "pos"]).reset_index(drop=True)


def contrast_line(contrast: pd.DataFrame, min_clusters: int = MIN_CLUSTERS) -> str:
    """The comparison of two policies at the same points (``branching.policy_contrast``)."""
    row = contrast.iloc[0]
    model, other = row["model"], row["other"]
    if not row["points"]:
        return f"{model} against {other}: no point was continued by both"
    head = (f"{model} against {other} at the same {counted(row['points'], 'point')} in "
            f"{counted(row['problems'], 'problem')} (same contexts, same draws): mean effect "
            f"{fmt(row['effect_model'], signed=True)} against {fmt(row['effect_other'], signed=True)}, "
            f"difference {_interval(row, min_clusters)}")
    if int(row["problems"]) < min_clusters:
        return head + " -> not compared: too few problems for an interval"
    verdict = {1: f"the swap matters more to {model} than to {other}",
               -1: f"the swap matters less to {model} than to {other}",
               0: f"{model} and {other} are not told apart"}[_shown_excludes_zero(row, min_clusters)]
    return f"{head} -> {verdict} (95% interval, problems resampled)"

"""Chapter 08's answer by label: which disagreements decide the answer.

Three experiments, each summarised by the label stratum of its points
(``points.STRATA``: first wrong digits, operands, operators, other tokens) and over all,
through ``branching.summary`` (means over points clustered by problem, with matched
controls where there are any):

    checkpoint          the RLVR checkpoint at its own disagreement points: its top-1
                        swapped in, the checkpoint continuing
    placebo, same       the placebo continuing the same contexts with the same swap
    placebo, own        the placebo at its own disagreement points (its top-1 swapped in,
                        the placebo continuing; same rule and seeds)

``table`` puts them side by side, ``conclusion`` says the answer in sentences: every
number is read from the summaries and shown through ``reporting`` (no interval from
fewer than ``reporting.MIN_CLUSTERS`` problems).
"""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.counterfactuals import branching
from rlprobe_nb.counterfactuals.points import STRATA
from rlprobe_nb.readable import counted
from rlprobe_nb.reporting import MIN_CLUSTERS, fmt, interval_text, sign_of

NAMES = {"result_first_wrong": "first wrong digits", "operand": "operands",
         "operator": "operators", "other": "other tokens", "all": "all disagreements"}
GROUPS = ("all",) + STRATA
OWN_KINDS = {"point": "own_point", "control": "own_control"}


def experiments(branches: pd.DataFrame, checkpoint: str, placebo: str | None,
                n_boot: int = 2000, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Experiment name -> its ``branching.summary`` by ``rule`` (the stratum), read from
    the ``branches`` table: the checkpoint at its points, the placebo at the same contexts
    and (where it branched) at its own points."""
    def summarise(model, point_kind, control_kind):
        rows = branches[branches["model"] == model]
        pts = branching.effects(rows[rows["kind"] == point_kind], arm="top1")
        ctl = branching.effects(rows[rows["kind"] == control_kind], arm="top1")
        return branching.summary(pts, ctl, by="rule", n_boot=n_boot, seed=seed)

    out = {f"{checkpoint} at its points": summarise(checkpoint, "point", "control")}
    if placebo and (branches["model"] == placebo).any():
        out[f"{placebo} at the same contexts"] = summarise(placebo, "point", "control")
        if (branches["kind"] == OWN_KINDS["point"]).any():
            out[f"{placebo} at its own points"] = summarise(placebo, *OWN_KINDS.values())
    return out


def _get(summary: pd.DataFrame, group: str, estimate: str):
    rows = summary[(summary["group"] == group) & (summary["estimate"] == estimate)]
    return rows.iloc[0] if len(rows) and rows.iloc[0]["branches"] else None


def _text(row, min_clusters: int) -> str:
    if row is None:
        return "–"
    return interval_text(row["mean"], row["low"], row["high"], int(row["problems"]),
                         signed=True, min_clusters=min_clusters)


def table(summaries: dict[str, pd.DataFrame], min_clusters: int = MIN_CLUSTERS) -> pd.DataFrame:
    """One row per (experiment, label): points, problems, the pass rate kept and
    swapped, the mean effect with its interval, the controls' and point − control."""
    rows = []
    for name, summary in summaries.items():
        for group in GROUPS:
            point = _get(summary, group, "point")
            control, diff = _get(summary, group, "control"), _get(summary, group, "point - control")
            rows.append({
                "experiment": name, "label": NAMES[group],
                "points": 0 if point is None else int(point["branches"]),
                "problems": 0 if point is None else int(point["problems"]),
                "pass rate kept": "–" if point is None else fmt(point["rate_keep"]),
                "pass rate swapped": "–" if point is None else fmt(point["rate_arm"]),
                "mean effect": _text(point, min_clusters),
                "controls": "none matched" if control is None else
                f"{int(control['branches'])}: {_text(control, min_clusters)}",
                "point − control": _text(diff, min_clusters)
                if control is not None and int(control["problems"]) >= min_clusters else "–"})
    return pd.DataFrame(rows)


def _verdict(row, min_clusters: int) -> str:
    sign = sign_of(row["mean"], row["low"], row["high"], int(row["problems"]), min_clusters)
    if int(row["problems"]) < min_clusters:
        return "cannot tell (too few problems for an interval)"
    return {1: "decide the answer: the swap raises the pass rate",
            -1: "decide the answer: the swap lowers the pass rate",
            0: "are not shown to decide it (the interval holds 0)"}[sign]


def label_sentence(summaries: dict[str, pd.DataFrame], group: str,
                   min_clusters: int = MIN_CLUSTERS) -> str | None:
    """One sentence for one label: the checkpoint's verdict with its numbers, then the
    placebo's two experiments and the controls beside it; None where the checkpoint has
    no point of that label."""
    names = list(summaries)
    point = _get(summaries[names[0]], group, "point")
    if point is None:
        return None
    head = (f"{NAMES[group]} ({counted(point['branches'], 'point')}, "
            f"{counted(point['problems'], 'problem')}): the checkpoint's choices "
            f"{_verdict(point, min_clusters)}, from "
            f"{fmt(point['rate_keep'])} to {fmt(point['rate_arm'])}, mean effect "
            f"{_text(point, min_clusters)}")
    control = _get(summaries[names[0]], group, "control")
    head += ("; no matched control" if control is None else
             f"; at {int(control['branches'])} matched controls {_text(control, min_clusters)}")
    for name in names[1:]:
        other = _get(summaries[name], group, "point")
        head += (f"; {name}: " + ("no point" if other is None else
                                  f"{counted(other['branches'], 'point')}, {_text(other, min_clusters)}"))
    return head


def conclusion(summaries: dict[str, pd.DataFrame], min_clusters: int = MIN_CLUSTERS) -> list[str]:
    """The answer, label by label and over all (``label_sentence``)."""
    lines = [label_sentence(summaries, g, min_clusters) for g in GROUPS]
    return [line for line in lines if line]


def by_verdict(summary: pd.DataFrame, min_clusters: int = MIN_CLUSTERS) -> tuple[list, list]:
    """The labels (``STRATA``) with points, split into those whose swap decides the answer
    (the mean effect's interval lies above 0) and the others (it holds 0, lies below it,
    or comes from too few problems): two lists of (label, its summary row)."""
    decides, others = [], []
    for group in STRATA:
        row = _get(summary, group, "point")
        if row is not None:
            up = sign_of(row["mean"], row["low"], row["high"], int(row["problems"]), min_clusters) == 1
            (decides if up else others).append((group, row))
    return decides, others


def finding(summaries: dict[str, pd.DataFrame], checkpoint: str, contrast_line: str | None = None,
            min_clusters: int = MIN_CLUSTERS) -> str:
    """The chapter's finding in a few sentences (markdown): the labels where the
    checkpoint's choice decides the answer and those where it is not shown to, then the
    placebo at the same contexts (with the paired contrast, ``contrast_line``) and at its
    own points, every number read from the summaries."""
    def said(group, row):
        return (f"{NAMES[group]} ({_text(row, min_clusters)}, {counted(row['branches'], 'point')} "
                f"in {counted(row['problems'], 'problem')})")

    names = list(summaries)
    decides, others = by_verdict(summaries[names[0]], min_clusters)
    if not decides and not others:
        return f"**Finding.** {checkpoint} was branched at no disagreement point."
    text = (f"**Finding.** Where `{checkpoint}` would write another token than the one written, "
            "its choice swapped in "
            + ("decides the answer at " + "; ".join(said(g, r) for g, r in decides)
               if decides else "is not shown to decide the answer at any label")
            + ("; it is not shown to at " + "; ".join(said(g, r) for g, r in others)
               if others and decides else "") + ".")
    for name in names[1:]:
        row = _get(summaries[name], "all", "point")
        if row is not None:
            text += f" `{name}`: mean effect {_text(row, min_clusters)} over all its points."
    if contrast_line:
        text += f" {contrast_line}."
    return text

"""Charts of the disagreement map (``disagreement.map_table``): the share of positions where
each checkpoint would write another token, RLVR beside placebo at each RL step, one panel
per label; and where its choice ranks in the reference's top-k."""

from __future__ import annotations

import altair as alt
import pandas as pd

from rlprobe_nb.divergence.charts import FEW, STEP_AXIS, has_intervals, shown
from rlprobe_nb.divergence.disagreement import NAMES, RANKS

RUNS = alt.Scale(domain=["rlvr", "placebo", "reference"], range=["#d62728", "#7f7f7f", "#1f77b4"])


def share_chart(table: pd.DataFrame, width: int = 230, height: int = 160):
    """Share of positions where the checkpoint's top-1 is another token than the written
    one, against RL step, RLVR and placebo, one panel per label (95% intervals over
    problems; faded without one)."""
    data = shown(table.rename(columns={"share": "estimate"}))
    steps = sorted(int(v) for v in data["step"].unique())
    x = alt.X("step:Q", title=STEP_AXIS, axis=alt.Axis(values=steps, labelAngle=-45),
              scale=alt.Scale(domain=[0, max(steps + [1])], nice=False))
    panels = []
    for label in NAMES.values():
        part = data[data["label"] == label]
        if part.empty:
            continue
        base = alt.Chart(part).encode(x=x, color=alt.Color("run:N", scale=RUNS, title="run"))
        line = base.mark_line(point=True).encode(
            y=alt.Y("estimate:Q", title="share of positions", axis=alt.Axis(format="%")),
            opacity=alt.condition("datum.enough", alt.value(1.0), alt.value(0.3)),
            tooltip=["checkpoint", "label", "disagreements", "positions", "interval"])
        rules = [base.mark_rule().encode(y="low:Q", y2="high:Q")] if has_intervals(part) else []
        panels.append(alt.layer(*rules, line).properties(width=width, height=height, title=label))
    rows = [alt.hconcat(*panels[i:i + 3]) for i in range(0, len(panels), 3)]
    return alt.vconcat(*rows).properties(title=[
        "Where the checkpoint would write another token: share of positions, by label",
        f"(the reference at 0: where its own first choice was not the token drawn; 95% "
        f"intervals over problems; faded: {FEW})"])


def rank_chart(ranks: pd.DataFrame, label: str = NAMES["all"], width: int = 230,
               height: int = 160):
    """Among the disagreements (``disagreement.rank_table``), where the checkpoint's choice
    ranks in the reference's top-k, by step: RLVR and placebo side by side."""
    data = ranks[ranks["label"] == label]
    bars = alt.Chart(data).mark_bar().encode(
        x=alt.X("step:O", title="RL step"),
        y=alt.Y("share:Q", title="share of its disagreements", axis=alt.Axis(format="%"),
                stack="normalize"),
        color=alt.Color("rank:N", sort=list(RANKS), title="rank in the reference's top-k"),
        tooltip=["checkpoint", "rank", alt.Tooltip("share:Q", format=".0%"), "disagreements"])
    return alt.hconcat(*[bars.transform_filter(alt.datum.run == run).properties(
        width=width, height=height, title=run) for run in ("rlvr", "placebo")
        if (data["run"] == run).any()]).properties(
        title=f"The checkpoint's choice in the reference's top-k ({label})")

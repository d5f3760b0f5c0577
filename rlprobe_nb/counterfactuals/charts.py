"""Charts of chapter 08, aggregated in pandas first and rendered statically
(``views.show``): takeover curves with the branch points marked, the positive control
point by point, and a forest plot of branch effects by the rule that picked the points
against their controls."""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.counterfactuals.takeover import curve_points

KIND_COLOURS = {"point": "#c0392b", "control": "#7f8c8d"}
ESTIMATE_COLOURS = {"point": "#c0392b", "control": "#7f8c8d", "point - control": "#2c3e50"}
ARM_COLOURS = {"keep": "#7f8c8d", "correct": "#27ae60", "top1": "#c0392b"}


def _present(colours: dict, values) -> dict:
    """The entries of ``colours`` that occur in ``values`` (a legend shows only those)."""
    seen = set(values)
    return {k: v for k, v in colours.items() if k in seen}


def _one_curve(points: pd.DataFrame, marks: pd.DataFrame, title: str, width: int):
    import altair as alt

    kinds = _present(KIND_COLOURS, marks["kind"]) or KIND_COLOURS
    x = alt.X("prefix_len:Q", title="response tokens kept (k)")
    colour = alt.Color("model:N", title="policy")
    band = alt.Chart(points).mark_area(opacity=0.15).encode(
        x=x, y=alt.Y("wilson_low:Q", title="pass rate (Wilson 95%)", scale=alt.Scale(domain=[0, 1])),
        y2="wilson_high:Q", color=alt.Color("model:N", legend=None))
    line = alt.Chart(points).mark_line(point=True).encode(
        x=x, y="pass_rate:Q", color=colour,
        tooltip=["model", "prefix_len", "passes", "n", alt.Tooltip("pass_rate:Q", format=".2f")])
    layers = [band, line]
    if len(marks):
        layers.append(alt.Chart(marks).mark_rule(strokeDash=[3, 2]).encode(
            x="k:Q", color=alt.Color("kind:N", title="branch point",
                                     scale=alt.Scale(domain=list(kinds), range=list(kinds.values()))),
            tooltip=["kind", "rule", "pos", "token", "category"]))
    return alt.layer(*layers, title=title).resolve_scale(color="independent").properties(
        width=width, height=150)


def takeover_chart(branches: pd.DataFrame, rollout_ids: list[str], width: int = 560,
                   title: str | None = None):
    """Takeover curves of ``rollout_ids`` (one panel each, every policy), with dashed
    rules where the branch points (red) and controls (grey) sit: a rule at k = pos + 1 is
    where the point's token enters the prefix."""
    import altair as alt

    pts = curve_points(branches)
    marks = branches[branches["kind"].isin(list(KIND_COLOURS)) & (branches["arm"] == "keep")]
    marks = marks.drop_duplicates(["rollout_id", "pos", "kind"]).assign(
        k=lambda d: d["pos"] + 1, token=lambda d: d["written_token"].fillna("").str.replace("\n", "⏎"))
    panels = [_one_curve(pts[pts.rollout_id == rid],
                         marks.loc[marks.rollout_id == rid, ["k", "pos", "kind", "rule", "token", "category"]],
                         rid, width) for rid in rollout_ids]
    return alt.vconcat(*panels, title=title or "")


def positive_chart(effects: pd.DataFrame, width: int = 420, title: str | None = None):
    """The positive control point by point: the pass rate with the written (wrong) digit
    kept and with the correct digit, each with its Wilson 95% interval."""
    import altair as alt

    label = effects["rollout_id"] + " @ " + effects["pos"].astype(str) + ": " \
        + effects["written_token"].astype(str) + " -> " + effects["substituted_token"].astype(str)
    rows = pd.concat([pd.DataFrame({"point": label, "model": effects["model"], "arm": arm,
                                    "rate": effects[f"passes_{side}"] / effects[f"n_{side}"],
                                    "low": effects[f"{side}_low"], "high": effects[f"{side}_high"]})
                      for arm, side in (("keep", "keep"), ("correct", "arm"))], ignore_index=True)
    colour = alt.Color("arm:N", title="arm", scale=alt.Scale(
        domain=["keep", "correct"], range=[ARM_COLOURS["keep"], ARM_COLOURS["correct"]]))
    y = alt.Y("point:N", title=None)
    x = alt.X("low:Q", title="pass rate (Wilson 95%)", scale=alt.Scale(domain=[0, 1]))
    bars = alt.Chart(rows).mark_rule().encode(x=x, x2="high:Q", y=y, yOffset="arm:N", color=colour)
    dots = alt.Chart(rows).mark_point(filled=True).encode(
        x="rate:Q", y=y, yOffset="arm:N", color=colour,
        tooltip=["model", "point", "arm", alt.Tooltip("rate:Q", format=".2f")])
    return alt.layer(bars, dots, title=title or "").properties(width=width)


def forest_chart(summary: pd.DataFrame, width: int = 360, title: str | None = None):
    """Mean branch effect (pass rate with the checkpoint's top-1 alternative − with the
    written token) by the rule that picked the points (``branching.summary``'s groups),
    for the points, their controls and the difference, each with its bootstrap-over-
    problems interval; one panel per policy model. ``summary`` comes with the bounds
    blanked where no interval may be shown (``reporting.with_interval_text``): those
    estimates are left out of the plot."""
    import altair as alt

    df = summary.dropna(subset=["low", "high"])
    present = _present(ESTIMATE_COLOURS, df["estimate"]) or ESTIMATE_COLOURS
    y = alt.Y("group:N", title=None, sort=sorted(df["group"].unique(), key=lambda c: (c != "all", c)))
    colour = alt.Color("estimate:N", title=None, scale=alt.Scale(
        domain=list(present), range=list(present.values())))
    offset = alt.YOffset("estimate:N", sort=list(present))
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(color="black").encode(x="x:Q")
    panels = []
    for model in sorted(df["model"].unique()):
        part = df[df["model"] == model]
        bars = alt.Chart(part).mark_rule().encode(
            x=alt.X("low:Q", title="effect on pass rate (substitute − keep), 95% CI",
                    scale=alt.Scale(domain=[-1, 1])),
            x2="high:Q", y=y, yOffset=offset, color=colour)
        dots = alt.Chart(part).mark_point(filled=True).encode(
            x="mean:Q", y=y, yOffset=offset, color=colour,
            tooltip=["model", "group", "estimate", "branches", "problems",
                     alt.Tooltip("mean:Q", format=".3f"), alt.Tooltip("low:Q", format=".3f"),
                     alt.Tooltip("high:Q", format=".3f")])
        panels.append(alt.layer(bars, dots, zero, title=f"policy: {model}").properties(width=width))
    return alt.hconcat(*panels, title=title or "")

"""Charts of chapter 09: takeover curves (the share of positions taken over against the
accuracy reached, or the share of the gain recovered), one panel per checkpoint, one line
per criterion, intervals over problems."""

from __future__ import annotations

import pandas as pd

CRITERION_COLOURS = {"delta_logp": "#c0392b", "kl": "#2980b9", "entropy": "#8e44ad",
                     "calibrated": "#d35400", "random": "#7f8c8d"}
NAMES = {"delta_logp": "Δlogp (checkpoint rejects the draw)", "kl": "KL(ref‖ckpt)",
         "entropy": "reference entropy",
         "calibrated": "chapter 05's statistic (vs the placebo)", "random": "random (seeded coin)"}


def _with_ends(curves: pd.DataFrame, y: str) -> pd.DataFrame:
    """Each criterion's points plus the two ends of its checkpoint (drawn on every line)."""
    ends = curves[curves.criterion.isin(["never", "always"])]
    parts = []
    for crit in [c for c in CRITERION_COLOURS if c in set(curves.criterion)]:
        parts.append(pd.concat([curves[curves.criterion == crit], ends]).assign(
            line=NAMES[crit], rule=lambda d: d.criterion))
    out = pd.concat(parts, ignore_index=True)
    return out[out[y].notna()] if y in out else out


def curve_chart(curves: pd.DataFrame, y: str = "acc", title: str = "", width: int = 240):
    """``y`` (acc or recovered) against share_taken, a panel per checkpoint in step order."""
    import altair as alt

    data = _with_ends(curves, y)
    data = data.assign(panel=data.checkpoint)
    order = list(data.sort_values(["run", "step"], ascending=[False, True]).panel.unique())
    names = [NAMES[c] for c in CRITERION_COLOURS]
    colour = alt.Color("line:N", title="criterion", scale=alt.Scale(
        domain=names, range=list(CRITERION_COLOURS.values())),
        legend=alt.Legend(labelLimit=320))
    label = {"acc": "accuracy (95% interval over problems)",
             "recovered": "share of the checkpoint's gain recovered",
             "of_target": "share of the target's gain recovered"}[y]
    x = alt.X("share_taken:Q", title="share of positions taken over (log-like scale)",
              scale=alt.Scale(type="symlog", constant=0.01, domain=[0, 1]),
              axis=alt.Axis(values=[0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1], format=".0%"))
    tip = ["checkpoint", "criterion", "budget", "threshold", "share_taken", "share_changed",
           y, f"{y}_low", f"{y}_high", "problems"]
    # every layer reads the facet's one dataset (a layer with data of its own would not
    # be split by panel: each panel would draw every checkpoint)
    lines = alt.Chart().mark_line(point=True).encode(
        x=x, y=alt.Y(f"{y}:Q", title=label), color=colour, order="share_taken:Q", tooltip=tip)
    layers = [lines]
    if (data[f"{y}_low"].notna() & data[f"{y}_high"].notna()).any():
        # an interval only where it exists (an empty layer has no extent)
        layers.insert(0, alt.Chart().mark_errorbar().encode(
            x=x, y=alt.Y(f"{y}_low:Q", title=label), y2=f"{y}_high:Q", color=colour
        ).transform_filter(f"isValid(datum.{y}_low) && isValid(datum.{y}_high)"))
    return alt.layer(*layers, data=data).properties(width=width, height=200).facet(
        facet=alt.Facet("panel:N", title=None, sort=order), columns=4, title=title)


def label_chart(shares: pd.DataFrame, title: str = "", width: int = 240):
    """The labels of the changed positions, stacked shares per (checkpoint, criterion,
    budget)."""
    import altair as alt

    labels = [c for c in shares.columns if c not in
              {"checkpoint", "run", "step", "criterion", "budget", "changed", "problems"}]
    long = shares.melt(id_vars=["checkpoint", "criterion", "budget", "changed", "problems"],
                       value_vars=labels, var_name="label", value_name="share")
    long = long.assign(rule=long.criterion + long.budget.map(
        lambda b: "" if pd.isna(b) else f" @ {b:g}"))
    return alt.Chart(long).mark_bar().encode(
        y=alt.Y("rule:N", title=None), x=alt.X("share:Q", title="share of changed positions",
                                               scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("label:N", title="ground-truth label"),
        tooltip=["checkpoint", "criterion", "budget", "label", "share", "changed", "problems"]
    ).properties(width=width, height=160).facet(facet=alt.Facet("checkpoint:N", title=None),
                                                columns=2, title=title)

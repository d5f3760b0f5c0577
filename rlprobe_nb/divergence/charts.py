"""Charts of chapter 04's aggregates (``summary``, ``phases``, ``entropy_concentration``,
``estimator_lab``). Each takes an aggregated table (never token rows), draws RL step on x
with the reference at 0 on the left, and names every KL by its direction in words. An
interval is drawn only where ``reporting`` would print it (enough problems, finite, not
degenerate); a cell or point from too few problems is drawn faded. Render them with
``views.show(chart, save_as=...)`` (static SVG and PNG). The chapter's sentences are in
``narrative``.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from rlprobe_nb import reporting
from rlprobe_nb.divergence.ground_truth import LABELS as GROUND_TRUTH
from rlprobe_nb.divergence.token_categories import CATEGORIES

LABELS = {
    "kl_ref_ckpt": ["KL(ref‖ckpt), nats: how surprised the checkpoint",
                    "is by what the reference would write"],
    "kl_ckpt_ref": ["KL(ckpt‖ref), nats: how surprised the reference",
                    "is by what the checkpoint would write"],
    "js": ["Jensen–Shannon divergence, nats", "(symmetric)"],
    "dlogp": ["Δlogp, nats: log p(ckpt) − log p(ref)", "of the token the reference wrote"],
    "entropy_change": ["entropy change, nats", "(checkpoint − reference)"],
}
SHORT = {"kl_ref_ckpt": "KL(ref‖ckpt): checkpoint surprised by the reference's text",
         "kl_ckpt_ref": "KL(ckpt‖ref): reference surprised by the checkpoint's text",
         "js": "Jensen–Shannon", "dlogp": "Δlogp of the written token"}
WORDS = {"kl_ref_ckpt": "KL(ref‖ckpt) (how surprised the checkpoint is by what the reference "
                        "would write)",
         "kl_ckpt_ref": "KL(ckpt‖ref) (how surprised the reference is by what the checkpoint "
                        "would write)",
         "js": "Jensen–Shannon divergence", "dlogp": "Δlogp of the written token"}
STEP_AXIS = "RL step (the reference at 0)"
CATEGORY_STATISTIC_LABELS = {
    "token_share": "share of tokens",
    "kl_ref_ckpt_share": "share of all KL(ref‖ckpt)",
    "kl_ckpt_ref_share": "share of all KL(ckpt‖ref)",
}
WIDTH, HEIGHT = 260, 180
FEW = f"fewer than {reporting.MIN_CLUSTERS} problems"


def shown(table: pd.DataFrame, estimate: str = "estimate") -> pd.DataFrame:
    """``table`` with the bounds blanked where ``reporting`` would print no interval, and a
    column ``enough`` (enough problems for one)."""
    out = reporting.with_interval_text(table, estimate, "low", "high", "problems")
    return out.assign(enough=out.problems >= reporting.MIN_CLUSTERS)


def _steps_x(steps, title=STEP_AXIS):
    steps = pd.Series(steps).dropna()
    domain = [float(min(steps.min(), 0)), float(max(steps.max(), 1))]
    return alt.X("step:Q", title=title, scale=alt.Scale(domain=domain, nice=False))


def has_intervals(data: pd.DataFrame, low: str = "low", high: str = "high") -> bool:
    """Whether any row has an interval to draw (``shown`` blanks those from too few
    problems): a chart draws no rule from bounds that are all blank."""
    if not len(data):
        return False
    bounds = data[[low, high]].apply(pd.to_numeric, errors="coerce").to_numpy(np.float64)
    return bool(np.isfinite(bounds).all(axis=1).any())


def intervals_said(data: pd.DataFrame, drawn: str = "95% intervals over problems") -> str:
    """What a title says of the intervals: drawn, or why there are none."""
    return f"({drawn})" if has_intervals(data) else f"(no interval drawn: each estimate from {FEW})"


def _estimate_with_interval(data: pd.DataFrame, x, y_title, colour=None, y="estimate"):
    """Points, a line and the 95% interval as a vertical rule (no rule where no row has
    an interval)."""
    base = alt.Chart(data).encode(x=x)
    enc = {"color": colour} if colour is not None else {}
    line = base.mark_line(point=True).encode(y=alt.Y(f"{y}:Q", title=y_title), **enc)
    rules = [base.mark_rule().encode(y="low:Q", y2="high:Q", **enc)] if has_intervals(data) else []
    return alt.layer(*rules, line)


def when_chart(when: pd.DataFrame, per_problem: pd.DataFrame, group: str = "target",
               metrics=("kl_ref_ckpt", "kl_ckpt_ref", "js", "dlogp"),
               accuracy: pd.DataFrame | None = None,
               ground_truth: pd.DataFrame | None = None):
    """Each metric's mean per token against RL step with its 95% interval, a thin line per
    problem behind it; below, sharing the x axis, the mean Δlogp per ground-truth label
    (``ground_truth``: ``summary.category_table`` over ``ground_truth.label``) and the
    checkpoints' accuracy (``accuracy``: model, step, rate, low, high) when given."""
    x = _steps_x(pd.concat([when.step, accuracy.step if accuracy is not None else when.step]))
    panels = []
    for m in metrics:
        means = shown(when[(when.group == group) & (when.metric == m)])
        lines = per_problem[(per_problem.group == group) & (per_problem.metric == m)]
        behind = alt.Chart(lines).mark_line(strokeWidth=0.7, opacity=0.3, color="gray").encode(
            x=x, y=alt.Y("mean:Q"), detail="problem_id:N")
        front = _estimate_with_interval(means, x, LABELS[m])
        panels.append(alt.layer(behind, front).properties(
            width=WIDTH, height=HEIGHT, title=SHORT[m].split(":")[0]))
    # two panels a row: four in one row (1,338 px) were cut off in a 1280-px window
    rows = [alt.hconcat(*panels[i:i + 2]) for i in range(0, len(panels), 2)]
    if ground_truth is not None:
        rows.append(_labels_over_steps(ground_truth, group, x))
    if accuracy is not None:
        rows.append(accuracy_panel(accuracy, x))
    # the labels' colours and the runs' are two scales, each with its legend
    return alt.vconcat(*rows).resolve_scale(color="independent").properties(
        title=f"Mean per token, group {group!r} {intervals_said(shown(when[when.group == group]))}")


def accuracy_runs(accuracy: pd.DataFrame) -> pd.DataFrame:
    """``accuracy`` (``suite_tables.accuracy_table``) as one series per training run: the
    reference's row (step 0) starts each run's line; without a ``run`` column, one run."""
    if "run" not in accuracy:
        return accuracy.assign(run="checkpoints")
    start = accuracy[accuracy.run == "reference"]
    runs = [r for r in dict.fromkeys(accuracy.run) if r != "reference"]
    return pd.concat([start.assign(run=r) for r in runs] + [accuracy[accuracy.run != "reference"]],
                     ignore_index=True)


def accuracy_panel(accuracy: pd.DataFrame, x, width: int = 2 * WIDTH, height: int = 130):
    """Accuracy against step, one coloured line per run with its 95% (Wilson) interval."""
    data = accuracy_runs(accuracy).rename(columns={"rate": "estimate"})
    colour = alt.Color("run:N", title="run", sort=list(dict.fromkeys(data.run)))
    tooltip = [alt.Tooltip("run:N", title="run"), alt.Tooltip("model:N", title="model"),
               alt.Tooltip("step:Q", title="RL step"),
               alt.Tooltip("estimate:Q", title="accuracy", format=".3f"),
               alt.Tooltip("low:Q", title="Wilson low", format=".3f"),
               alt.Tooltip("high:Q", title="Wilson high", format=".3f")]
    return _estimate_with_interval(data, x, "accuracy", colour=colour).encode(
        tooltip=tooltip).properties(width=width, height=height, title="Accuracy")


def _labels_over_steps(ground_truth: pd.DataFrame, group: str, x,
                       statistic: str = "dlogp_mean"):
    """Mean Δlogp per ground-truth label against step (the reference at 0), one colour per
    label; labels from too few problems faded, without intervals."""
    data = ground_truth[(ground_truth.group == group) & (ground_truth.statistic == statistic)]
    start = data.drop_duplicates("category").assign(step=0, estimate=0.0, low=np.nan,
                                                     high=np.nan)
    data = shown(pd.concat([start, data], ignore_index=True))
    order = [c for c in reversed(GROUND_TRUTH) if c in set(data.category)]
    colour = alt.Color("category:N", title="ground-truth label", sort=order)
    base = alt.Chart(data).encode(x=x, color=colour)
    line = base.mark_line(point=True).encode(
        y=alt.Y("estimate:Q", title=LABELS["dlogp"]),
        opacity=alt.condition("datum.enough", alt.value(1.0), alt.value(0.3)),
        tooltip=["category", "step", "interval", "problems", "rows"])
    rules = [base.mark_rule().encode(y="low:Q", y2="high:Q")] if has_intervals(data) else []
    return alt.layer(*rules, line).properties(
        width=2 * WIDTH, height=HEIGHT,
        title=["Content apart from format: mean Δlogp by ground-truth label",
               f"(faded: {FEW}, no interval drawn)"])


def ecdf_chart(ecdf: pd.DataFrame, group: str = "target"):
    """The cumulative distribution of log10 of the per-token metric, one line per step."""
    data = ecdf[ecdf.group == group]
    metric = data.metric.iloc[0] if len(data) else "kl_ref_ckpt"
    return alt.Chart(data).mark_line().encode(
        x=alt.X("log10_value:Q", title=["log10 " + LABELS[metric][0], LABELS[metric][1]]),
        y=alt.Y("share:Q", title="share of tokens at or below"),
        color=alt.Color("step:O", title="RL step", scale=alt.Scale(scheme="viridis")),
        order="share:Q").properties(width=360, height=220,
                                    title=f"Distribution per token, group {group!r}")


def tails_chart(tails: pd.DataFrame, group: str = "target"):
    """Each tail statistic (quantiles, share above a threshold) against RL step."""
    data = shown(tails[tails.group == group])
    panels = []
    for name, part in data.groupby("statistic", sort=True):
        title = ([f"{name} of"] + LABELS[part.metric.iloc[0]]) if name.startswith("p") else \
            [name, "(" + SHORT[part.metric.iloc[0]] + ")"]
        panels.append(_estimate_with_interval(part, _steps_x(data.step), title).properties(
            width=WIDTH - 60, height=HEIGHT, title=name))
    return alt.hconcat(*panels).properties(title=f"Tails, group {group!r} {intervals_said(data, '95% intervals')}")


def position_chart(position: pd.DataFrame, group: str = "target", metric: str = "kl_ref_ckpt"):
    """The metric's mean by relative position (deciles), by absolute position (doubling
    bins) and for the first response token and EOS on their own, one colour per step."""
    data = shown(position[(position.group == group) & (position.metric == metric)])
    colour = alt.Color("step:O", title="RL step", scale=alt.Scale(scheme="viridis"))
    panels = []
    for scheme, title in (("relative", "relative position in the response"),
                          ("absolute", "response token (absolute position)"),
                          ("special", "")):
        part = data[data.scheme == scheme]
        order = part.drop_duplicates("bin").sort_values("bin_order").bin.tolist()
        x = alt.X("bin:N", sort=order, title=title or "on their own")
        base = alt.Chart(part).encode(x=x, color=colour, xOffset="step:O")
        rules = [base.mark_rule().encode(y="low:Q", y2="high:Q")] if has_intervals(part) else []
        panels.append(alt.layer(*rules, base.mark_point(filled=True).encode(
            y=alt.Y("estimate:Q", title=LABELS[metric])))
                      .properties(width=WIDTH if scheme != "special" else 90, height=HEIGHT))
    return alt.hconcat(*panels).properties(
        title=f"Where in the response, group {group!r} {intervals_said(data, '95% intervals')}")


def category_heatmap(categories: pd.DataFrame, group: str = "target",
                     statistic: str = "dlogp_mean", ground_truth: pd.DataFrame | None = None):
    """Token category x RL step, coloured by the mean Δlogp (diverging, centred at 0: red
    where the checkpoint gives the reference's tokens less probability); beside it the same
    for the ground-truth labels when given. Cells from too few problems are faded."""
    tables = [(categories, CATEGORIES, "token category")]
    if ground_truth is not None:
        tables.append((ground_truth, GROUND_TRUTH, "ground-truth label"))
    # one colour scale for both maps, ending at the larger |mean| of either
    means = pd.concat([t[(t.group == group) & (t.statistic == statistic)].estimate for t, _, _ in tables])
    reach = max(float(np.nanmax(np.abs(means))) if means.notna().any() else 0.0, 1e-9)
    maps = [_heatmap(table, group, statistic, names, title, reach) for table, names, title in tables]
    return alt.hconcat(*maps).resolve_scale(color="shared").properties(
        title=[f"Mean Δlogp by kind of token, group {group!r}",
               "Δlogp = log p(ckpt) − log p(ref) of the token the reference wrote;",
               f"red: the checkpoint gives it less probability; faded: {FEW}"])


def _heatmap(table: pd.DataFrame, group: str, statistic: str, names, title: str, reach: float):
    data = shown(table[(table.group == group) & (table.statistic == statistic)])
    order = [c for c in reversed(names) if c in set(data.category)]
    # the label in a cell answers a hover as the cell does (it covers the cell's centre)
    base = alt.Chart(data).encode(x=alt.X("step:O", title=STEP_AXIS),
                                  y=alt.Y("category:N", sort=order, title=title),
                                  tooltip=[alt.Tooltip("category:N", title=title),
                                           alt.Tooltip("step:O", title="RL step"),
                                           alt.Tooltip("interval:N", title="mean Δlogp [95% interval], nats"),
                                           "problems", "rows"])
    cells = base.mark_rect().encode(color=alt.Color(
        "estimate:Q", title="mean Δlogp, nats",
        scale=alt.Scale(scheme="redblue", domain=[-reach, reach], domainMid=0)),
        opacity=alt.condition("datum.enough", alt.value(1.0), alt.value(0.35)))
    text = base.mark_text(fontSize=9).encode(text=alt.Text("estimate:Q", format=".2f"))
    return alt.layer(cells, text).properties(
        width=70 * max(data.step.nunique(), 1), height=18 * max(len(order), 1))


def category_share_chart(categories: pd.DataFrame, group: str = "target",
                         step: int | None = None):
    """At one step (default: the last), each category's share of the tokens beside its
    share of all KL in each direction, with intervals."""
    data = categories[(categories.group == group)
                      & categories.statistic.isin(list(CATEGORY_STATISTIC_LABELS))]
    step = int(data.step.max()) if step is None else step
    data = shown(data[data.step == step]).assign(
        what=lambda d: d.statistic.map(CATEGORY_STATISTIC_LABELS))
    order = [c for c in reversed(CATEGORIES) if c in set(data.category)]
    base = alt.Chart(data).encode(y=alt.Y("category:N", sort=order, title="token category"),
                                  color=alt.Color("what:N", title=None),
                                  yOffset="what:N")
    rules = [base.mark_rule(color="black").encode(x="low:Q", x2="high:Q")] if has_intervals(data) else []
    return alt.layer(base.mark_bar().encode(x=alt.X("estimate:Q", title="share")), *rules).properties(
        width=320, height=22 * max(len(order), 1),
        title=f"Shares by token category at step {step}, group {group!r}")


def entropy_chart(deciles: pd.DataFrame, group: str = "target"):
    """KL in both directions and the change of entropy by decile of the reference's
    entropy, one line per step."""
    data = shown(deciles[deciles.group == group])
    colour = alt.Color("step:O", title="RL step", scale=alt.Scale(scheme="viridis"))
    x = alt.X("entropy_decile:O", title="decile of the reference's entropy (0 = most certain)")
    panels = [_estimate_with_interval(data[data.metric == m], x, LABELS[m], colour).properties(
        width=WIDTH, height=HEIGHT) for m in ("kl_ref_ckpt", "kl_ckpt_ref", "entropy_change")]
    rows = [alt.hconcat(*panels[i:i + 2]) for i in range(0, len(panels), 2)]  # fits a 1280-px window
    return alt.vconcat(*rows).properties(
        title=f"By the reference's entropy, group {group!r} {intervals_said(data, '95% intervals')}")


def concentration_chart(share: pd.DataFrame, group: str = "target",
                        metric: str = "kl_ref_ckpt"):
    """The share of all KL carried by the highest-entropy positions against RL step, the
    permutation null as a grey band and the mechanical share as an orange band."""
    data = shown(share[(share.group == group) & (share.metric == metric)])
    x = _steps_x(data.step)
    top = float(data.top.iloc[0]) if len(data) else 0.2
    null = alt.Chart(data).mark_area(opacity=0.3, color="gray").encode(
        x=x, y="null_low:Q", y2="null_high:Q")
    mech = alt.Chart(data).mark_area(opacity=0.3, color="orange").encode(
        x=x, y="mechanical_low:Q", y2="mechanical_high:Q")
    observed = _estimate_with_interval(
        data, x, [f"share of all {LABELS[metric][0].split(',')[0]}",
                  f"carried by the {100 * top:g}% highest-entropy positions"])
    return alt.layer(null, mech, observed).properties(
        width=360, height=220, title=[f"Concentration at uncertain positions, group {group!r}",
                                      "grey: shuffled within problems; orange: uniform nudges",
                                      f"observed {intervals_said(data, '95% intervals')}"])


def similarity_heatmap(similarity: pd.DataFrame, group: str = "target"):
    """Spearman's rank correlation of the per-token metric between every two steps."""
    data = similarity[similarity.group == group]
    steps = sorted(set(data.step_a) | set(data.step_b))
    mirrored = pd.concat([
        data[["step_a", "step_b", "spearman", "low", "high"]],
        data.rename(columns={"step_a": "step_b", "step_b": "step_a"})[
            ["step_a", "step_b", "spearman", "low", "high"]],
        pd.DataFrame({"step_a": steps, "step_b": steps, "spearman": 1.0, "low": 1.0,
                      "high": 1.0})], ignore_index=True)
    metric = data.metric.iloc[0] if len(data) else "kl_ref_ckpt"
    # the label in a cell answers a hover as the cell does (it covers the cell's centre)
    base = alt.Chart(mirrored).encode(x=alt.X("step_a:O", title="RL step"),
                                      y=alt.Y("step_b:O", title="RL step"),
                                      tooltip=[alt.Tooltip("step_a:O", title="RL step"),
                                               alt.Tooltip("step_b:O", title="and RL step"),
                                               alt.Tooltip("spearman:Q", title="Spearman"), "low", "high"])
    cells = base.mark_rect().encode(
        color=alt.Color("spearman:Q", scale=alt.Scale(domain=[-1, 1], scheme="redblue",
                                                      domainMid=0), title="Spearman"))
    text = base.mark_text(fontSize=10).encode(text=alt.Text("spearman:Q", format=".2f"))
    return alt.layer(cells, text).properties(
        width=40 * max(len(steps), 2), height=40 * max(len(steps), 2),
        title=[f"Rank correlation of per-token {SHORT[metric].split(':')[0]}",
               f"between steps, group {group!r}"])


def estimator_bias_chart(lab: pd.DataFrame, group: str = "target", level: str = "token"):
    """Each estimator's bias, mean(k − exact), by rollout temperature, against the exact
    KL in each direction; one colour per step, 95% intervals over problems."""
    data = shown(lab[(lab.group == group) & (lab.level == level)], "bias").assign(
        direction=lambda d: d.target.map({"kl_ref_ckpt": "vs KL(ref‖ckpt)",
                                          "kl_ckpt_ref": "vs KL(ckpt‖ref)"}))
    base = alt.Chart().encode(x=alt.X("temperature_label:N", title="rollout temperature"),
                              color=alt.Color("step:O", title="RL step",
                                              scale=alt.Scale(scheme="viridis")),
                              xOffset="step:O")
    rules = [base.mark_rule().encode(y="low:Q", y2="high:Q")] if has_intervals(data) else []
    layer = alt.layer(*rules, base.mark_point(filled=True).encode(
                          y=alt.Y("bias:Q", title=f"bias per {level}, nats")),
                      alt.Chart().mark_rule(strokeDash=[3, 3]).encode(y=alt.datum(0)),
                      data=data).properties(width=170, height=150)
    return layer.facet(row=alt.Row("direction:N", title=None),
                       column=alt.Column("estimator:N", title=None)).resolve_scale(
        y="independent").properties(title=[
            f"Sampled estimators against the exact KL, group {group!r} ({level} level), "
            + intervals_said(data, "95% intervals over problems"),
            "KL(ref‖ckpt): how surprised the checkpoint is by what the reference would write",
            "KL(ckpt‖ref): how surprised the reference is by what the checkpoint would write"])


def estimator_scatter_chart(scatter: pd.DataFrame, estimator: str = "k3",
                            target: str = "kl_ref_ckpt"):
    """Estimator against exact value per token (a sample), on symmetric-log axes, with
    the line estimator = exact."""
    data = scatter.assign(exact=scatter[target], value=scatter[estimator])
    top = float(np.nanmax(np.abs(data[["exact", "value"]].to_numpy()))) if len(data) else 1.0
    scale = alt.Scale(type="symlog", constant=0.01)
    points = alt.Chart(data).mark_circle(size=10, opacity=0.4).encode(
        x=alt.X("exact:Q", title=LABELS[target], scale=scale),
        y=alt.Y("value:Q", title=f"{estimator} of the written token, nats", scale=scale),
        color=alt.Color("temperature_label:N", title="rollout temperature"))
    diagonal = alt.Chart(pd.DataFrame({"exact": [0.0, top], "value": [0.0, top]})).mark_line(
        color="black", strokeDash=[3, 3]).encode(x="exact:Q", y="value:Q")
    return alt.layer(points, diagonal).properties(
        width=320, height=260, title=f"{estimator} against {SHORT[target].split(':')[0]}")


def changes_for_display(changes: pd.DataFrame, group: str = "target") -> pd.DataFrame:
    """The step-to-step change table for a reader: directions in words, each change with
    its interval as text (``reporting``: none from too few problems, never NaN)."""
    data = changes[changes.group == group].assign(metric=lambda d: d.metric.map(SHORT))
    data = data.rename(columns={"step_from": "from step", "step_to": "to step"})[
        ["metric", "from step", "to step", "change", "low", "high", "problems", "rows"]]
    return reporting.display_table(data.reset_index(drop=True), {
        "change of the mean [95% interval]": ("change", "low", "high", "problems",
                                              {"signed": True})})[
        ["metric", "from step", "to step", "change of the mean [95% interval]", "problems",
         "rows"]]


def group_contrast_chart(when: pd.DataFrame, metric: str = "kl_ref_ckpt"):
    """The mean per token against RL step for every group side by side: the target
    group's wrong reasoning against the reference's right rollouts of the same problems
    and the control problems' rollouts (each group drawn slightly apart so the intervals
    do not hide each other; the tooltip gives the step)."""
    data = shown(when[when.metric == metric])
    groups = sorted(data.group.unique())
    span = max(float(data.step.max() - data.step.min()), 1.0)
    offset = data.group.map(groups.index) - (len(groups) - 1) / 2
    data["drawn_at"] = data.step + offset * 0.01 * span
    x = alt.X("drawn_at:Q", title=STEP_AXIS, scale=alt.Scale(nice=False))
    colour = alt.Color("group:N", title="rollouts")
    return _estimate_with_interval(data, x, LABELS[metric], colour).encode(
        tooltip=["group", alt.Tooltip("step:Q", title="RL step"), alt.Tooltip("estimate:Q", title="mean"),
                 alt.Tooltip("interval:N", title="mean [95% interval]"), "problems"]).properties(
        width=360, height=220,
        title=f"{SHORT[metric].split(':')[0]} per group {intervals_said(data, '95% intervals')}")

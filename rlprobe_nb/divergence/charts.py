"""Charts of chapter 04's aggregates (``divergence_summary``, ``entropy_concentration``,
``estimator_lab``). Each takes an aggregated table (never token rows), draws RL step on x
with the reference at 0 on the left, and names every KL by its direction in words.
Render them with ``views.show(chart, save_as=...)`` (static SVG and PNG).
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

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


def _steps_x(steps, title=STEP_AXIS):
    steps = pd.Series(steps).dropna()
    domain = [float(min(steps.min(), 0)), float(max(steps.max(), 1))]
    return alt.X("step:Q", title=title, scale=alt.Scale(domain=domain, nice=False))


def _estimate_with_interval(data: pd.DataFrame, x, y_title, colour=None, y="estimate"):
    """Points, a line and the 95% interval as a vertical rule."""
    base = alt.Chart(data).encode(x=x)
    enc = {"color": colour} if colour is not None else {}
    line = base.mark_line(point=True).encode(y=alt.Y(f"{y}:Q", title=y_title), **enc)
    rule = base.mark_rule().encode(y="low:Q", y2="high:Q", **enc)
    return alt.layer(rule, line)


def when_chart(when: pd.DataFrame, per_problem: pd.DataFrame, group: str = "target",
               metrics=("kl_ref_ckpt", "kl_ckpt_ref", "js", "dlogp"),
               accuracy: pd.DataFrame | None = None):
    """Each metric's mean per token against RL step with its 95% interval, a thin line per
    problem behind it; below, sharing the x axis, the checkpoints' accuracy (``accuracy``:
    model, step, rate, low, high) when given."""
    x = _steps_x(pd.concat([when.step, accuracy.step if accuracy is not None else when.step]))
    panels = []
    for m in metrics:
        means = when[(when.group == group) & (when.metric == m)]
        lines = per_problem[(per_problem.group == group) & (per_problem.metric == m)]
        behind = alt.Chart(lines).mark_line(strokeWidth=0.7, opacity=0.3, color="gray").encode(
            x=x, y=alt.Y("mean:Q"), detail="problem_id:N")
        front = _estimate_with_interval(means, x, LABELS[m])
        panels.append(alt.layer(behind, front).properties(
            width=WIDTH, height=HEIGHT, title=SHORT[m].split(":")[0]))
    # two panels a row: four in one row (1,338 px) were cut off in a 1280-px window
    top = alt.vconcat(*[alt.hconcat(*panels[i:i + 2]) for i in range(0, len(panels), 2)])
    if accuracy is None:
        return top.properties(
            title=f"Mean per token, group {group!r} (95% intervals over problems)")
    acc = _estimate_with_interval(accuracy.rename(columns={"rate": "estimate"}), x,
                                  "accuracy").encode(tooltip=["model", "estimate", "low", "high"])
    return alt.vconcat(top, acc.properties(width=WIDTH, height=110, title="Accuracy")).properties(
        title=f"Mean per token, group {group!r} (95% intervals over problems)")


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
    data = tails[tails.group == group]
    panels = []
    for name, part in data.groupby("statistic", sort=True):
        title = ([f"{name} of"] + LABELS[part.metric.iloc[0]]) if name.startswith("p") else \
            [name, "(" + SHORT[part.metric.iloc[0]] + ")"]
        panels.append(_estimate_with_interval(part, _steps_x(data.step), title).properties(
            width=WIDTH - 60, height=HEIGHT, title=name))
    return alt.hconcat(*panels).properties(title=f"Tails, group {group!r} (95% intervals)")


def position_chart(position: pd.DataFrame, group: str = "target", metric: str = "kl_ref_ckpt"):
    """The metric's mean by relative position (deciles), by absolute position (doubling
    bins) and for the first response token and EOS on their own, one colour per step."""
    data = position[(position.group == group) & (position.metric == metric)]
    colour = alt.Color("step:O", title="RL step", scale=alt.Scale(scheme="viridis"))
    panels = []
    for scheme, title in (("relative", "relative position in the response"),
                          ("absolute", "response token (absolute position)"),
                          ("special", "")):
        part = data[data.scheme == scheme]
        order = part.drop_duplicates("bin").sort_values("bin_order").bin.tolist()
        x = alt.X("bin:N", sort=order, title=title or "on their own")
        base = alt.Chart(part).encode(x=x, color=colour, xOffset="step:O")
        panels.append(alt.layer(base.mark_rule().encode(y="low:Q", y2="high:Q"),
                                base.mark_point(filled=True).encode(
                                    y=alt.Y("estimate:Q", title=LABELS[metric])))
                      .properties(width=WIDTH if scheme != "special" else 90, height=HEIGHT))
    return alt.hconcat(*panels).properties(title=f"Where in the response, group {group!r}")


def category_heatmap(categories: pd.DataFrame, group: str = "target",
                     statistic: str = "dlogp_mean"):
    """Token category x RL step, coloured by the mean Δlogp (diverging, centred at 0: red
    where the checkpoint gives the reference's tokens less probability)."""
    data = categories[(categories.group == group) & (categories.statistic == statistic)]
    reach = float(np.nanmax(np.abs(data.estimate))) if data.estimate.notna().any() else 0.0
    reach = max(reach, 1e-9)
    order = [c for c in reversed(CATEGORIES) if c in set(data.category)]
    base = alt.Chart(data).encode(x=alt.X("step:O", title=STEP_AXIS),
                                  y=alt.Y("category:N", sort=order, title="token category"))
    cells = base.mark_rect().encode(color=alt.Color(
        "estimate:Q", title="mean Δlogp, nats",
        scale=alt.Scale(scheme="redblue", domain=[-reach, reach], domainMid=0)),
        tooltip=["category", "step", "estimate", "low", "high", "rows"])
    text = base.mark_text(fontSize=9).encode(text=alt.Text("estimate:Q", format=".2f"))
    return alt.layer(cells, text).properties(
        width=70 * max(data.step.nunique(), 1), height=18 * max(len(order), 1),
        title=[f"Mean Δlogp by token category, group {group!r}",
               "Δlogp = log p(ckpt) − log p(ref) of the token the reference wrote;",
               "red: the checkpoint gives it less probability"])


def category_share_chart(categories: pd.DataFrame, group: str = "target",
                         step: int | None = None):
    """At one step (default: the last), each category's share of the tokens beside its
    share of all KL in each direction, with intervals."""
    data = categories[(categories.group == group)
                      & categories.statistic.isin(list(CATEGORY_STATISTIC_LABELS))]
    step = int(data.step.max()) if step is None else step
    data = data[data.step == step].assign(
        what=lambda d: d.statistic.map(CATEGORY_STATISTIC_LABELS))
    order = [c for c in reversed(CATEGORIES) if c in set(data.category)]
    base = alt.Chart(data).encode(y=alt.Y("category:N", sort=order, title="token category"),
                                  color=alt.Color("what:N", title=None),
                                  yOffset="what:N")
    return alt.layer(base.mark_bar().encode(x=alt.X("estimate:Q", title="share")),
                     base.mark_rule(color="black").encode(x="low:Q", x2="high:Q")).properties(
        width=320, height=22 * max(len(order), 1),
        title=f"Shares by token category at step {step}, group {group!r}")


def entropy_chart(deciles: pd.DataFrame, group: str = "target"):
    """KL in both directions and the change of entropy by decile of the reference's
    entropy, one line per step."""
    data = deciles[deciles.group == group]
    colour = alt.Color("step:O", title="RL step", scale=alt.Scale(scheme="viridis"))
    x = alt.X("entropy_decile:O", title="decile of the reference's entropy (0 = most certain)")
    panels = [_estimate_with_interval(data[data.metric == m], x, LABELS[m], colour).properties(
        width=WIDTH, height=HEIGHT) for m in ("kl_ref_ckpt", "kl_ckpt_ref", "entropy_change")]
    rows = [alt.hconcat(*panels[i:i + 2]) for i in range(0, len(panels), 2)]  # fits a 1280-px window
    return alt.vconcat(*rows).properties(title=f"By the reference's entropy, group {group!r}")


def concentration_chart(share: pd.DataFrame, group: str = "target",
                        metric: str = "kl_ref_ckpt"):
    """The share of all KL carried by the highest-entropy positions against RL step, the
    permutation null as a grey band and the mechanical share as an orange band."""
    data = share[(share.group == group) & (share.metric == metric)]
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
                                      "grey: shuffled within problems; orange: uniform nudges"])


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
    base = alt.Chart(mirrored).encode(x=alt.X("step_a:O", title="RL step"),
                                      y=alt.Y("step_b:O", title="RL step"))
    cells = base.mark_rect().encode(
        color=alt.Color("spearman:Q", scale=alt.Scale(domain=[-1, 1], scheme="redblue",
                                                      domainMid=0), title="Spearman"),
        tooltip=["step_a", "step_b", "spearman", "low", "high"])
    text = base.mark_text(fontSize=10).encode(text=alt.Text("spearman:Q", format=".2f"))
    return alt.layer(cells, text).properties(
        width=40 * max(len(steps), 2), height=40 * max(len(steps), 2),
        title=[f"Rank correlation of per-token {SHORT[metric].split(':')[0]}",
               f"between steps, group {group!r}"])


def estimator_bias_chart(lab: pd.DataFrame, group: str = "target", level: str = "token"):
    """Each estimator's bias, mean(k − exact), by rollout temperature, against the exact
    KL in each direction; one colour per step, 95% intervals over problems."""
    data = lab[(lab.group == group) & (lab.level == level)].assign(
        direction=lambda d: d.target.map({"kl_ref_ckpt": "vs KL(ref‖ckpt)",
                                          "kl_ckpt_ref": "vs KL(ckpt‖ref)"}))
    base = alt.Chart().encode(x=alt.X("temperature_label:N", title="rollout temperature"),
                              color=alt.Color("step:O", title="RL step",
                                              scale=alt.Scale(scheme="viridis")),
                              xOffset="step:O")
    layer = alt.layer(base.mark_rule().encode(y="low:Q", y2="high:Q"),
                      base.mark_point(filled=True).encode(
                          y=alt.Y("bias:Q", title=f"bias per {level}, nats")),
                      alt.Chart().mark_rule(strokeDash=[3, 3]).encode(y=alt.datum(0)),
                      data=data).properties(width=170, height=150)
    return layer.facet(row=alt.Row("direction:N", title=None),
                       column=alt.Column("estimator:N", title=None)).resolve_scale(
        y="independent").properties(title=[
            f"Sampled estimators against the exact KL, group {group!r} ({level} level)",
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
    """The step-to-step change table with readable column names (directions in words)."""
    data = changes[changes.group == group].assign(metric=lambda d: d.metric.map(SHORT))
    return data.rename(columns={"step_from": "from step", "step_to": "to step",
                                "change": "change of the mean", "low": "95% low",
                                "high": "95% high"})[
        ["metric", "from step", "to step", "change of the mean", "95% low", "95% high",
         "problems", "rows"]].reset_index(drop=True)


def group_contrast_chart(when: pd.DataFrame, metric: str = "kl_ref_ckpt"):
    """The mean per token against RL step for every group side by side: the target
    group's wrong reasoning against the reference's right rollouts of the same problems
    and the control problems' rollouts (each group drawn slightly apart so the intervals
    do not hide each other; the tooltip gives the step)."""
    data = when[when.metric == metric].copy()
    groups = sorted(data.group.unique())
    span = max(float(data.step.max() - data.step.min()), 1.0)
    offset = data.group.map(groups.index) - (len(groups) - 1) / 2
    data["drawn_at"] = data.step + offset * 0.01 * span
    x = alt.X("drawn_at:Q", title=STEP_AXIS, scale=alt.Scale(nice=False))
    colour = alt.Color("group:N", title="rollouts")
    return _estimate_with_interval(data, x, LABELS[metric], colour).encode(
        tooltip=["group", "step", "estimate", "low", "high", "problems"]).properties(
        width=360, height=220, title=f"{SHORT[metric].split(':')[0]} per group (95% intervals)")


# Sentences for the narrative, built from the tables (so no number is ever typed).

def _interval(row, scale: float = 1.0, digits: int = 3) -> str:
    return (f"{scale * row.estimate:.{digits}g} [{scale * row.low:.{digits}g}, "
            f"{scale * row.high:.{digits}g}]")


def say_when(when: pd.DataFrame, changes: pd.DataFrame, group: str = "target",
             metric: str = "kl_ref_ckpt") -> str:
    """The last step's mean and the largest step-to-step change of ``metric``."""
    rows = when[(when.group == group) & (when.metric == metric) & (when.step > 0)]
    if rows.empty:
        return f"No checkpoint rows in group {group!r}."
    last = rows.loc[rows.step.idxmax()]
    steps = changes[(changes.group == group) & (changes.metric == metric)]
    big = steps.loc[steps.change.abs().idxmax()]
    return (f"At step {last.step} ({last.checkpoint}), the mean {WORDS[metric]} is "
            f"{_interval(last)} nats per token (95% interval over {last.problems} problems, "
            f"{last.rows} tokens; the reference is 0 by definition). The largest change "
            f"between consecutive steps is from step {big.step_from} to {big.step_to}: "
            f"{big.change:+.3g} [{big.low:+.3g}, {big.high:+.3g}] nats.")


def say_tails(tails: pd.DataFrame, group: str = "target") -> str:
    """The last step's high quantile and share of tokens above the threshold."""
    rows = tails[(tails.group == group)]
    if rows.empty:
        return f"No checkpoint rows in group {group!r}."
    last = rows[rows.step == rows.step.max()].set_index("statistic")
    share = last.loc[[s for s in last.index if s.startswith("share")][0]]
    quantile = last.loc[sorted(s for s in last.index if s.startswith("p"))[-1]]
    return (f"At step {share.step}, {_interval(share, 100)}% of tokens have "
            f"{SHORT[share.metric].split(':')[0]} {share.name.replace('share ', '')}, and its "
            f"{quantile.name} is {_interval(quantile)} nats.")


def say_categories(categories: pd.DataFrame, group: str = "target") -> str:
    """At the last step: the most rejected category, and the category whose share of all
    KL(ref‖ckpt) exceeds its share of the tokens by the most."""
    rows = categories[categories.group == group]
    last = rows[rows.step == rows.step.max()]
    dlogp = last[last.statistic == "dlogp_mean"].dropna(subset=["estimate"])
    if dlogp.empty:
        return f"No categorised rows in group {group!r}."
    worst = dlogp.loc[dlogp.estimate.idxmin()]
    kl = last[last.statistic == "kl_ref_ckpt_share"].set_index("category")
    tok = last[last.statistic == "token_share"].set_index("category")
    excess = (kl.estimate - tok.estimate).dropna()
    if worst.estimate < 0:
        text = (f"At step {worst.step}, the checkpoint lowers the probability of the "
                f"reference's '{worst.category}' tokens most: mean Δlogp {_interval(worst)} nats.")
    else:
        text = f"At step {worst.step}, no category's tokens lose probability on average."
    if not excess.empty:
        top = excess.idxmax()
        text += (f" '{top}' tokens carry {_interval(kl.loc[top], 100)}% of all KL(ref‖ckpt) "
                 f"while being {_interval(tok.loc[top], 100)}% of the tokens.")
    return text


def say_concentration(share: pd.DataFrame, group: str = "target",
                      metric: str = "kl_ref_ckpt") -> str:
    """The last step's concentration against both baselines."""
    rows = share[(share.group == group) & (share.metric == metric)].dropna(subset=["estimate"])
    if rows.empty:
        return f"No {metric} to share out in group {group!r} (the checkpoints equal the reference)."
    last = rows.loc[rows.step.idxmax()]
    return (f"At step {last.step}, the {100 * last.top:g}% highest-entropy positions carry "
            f"{_interval(last, 100)}% of all {SHORT[metric].split(':')[0]}. Shuffling the "
            f"values within problems gives {100 * last.null_mean:.3g}% "
            f"[{100 * last.null_low:.3g}, {100 * last.null_high:.3g}]; the same small nudge "
            f"to every logit everywhere would give {100 * last.mechanical_low:.3g}–"
            f"{100 * last.mechanical_high:.3g}%.")


def say_estimators(lab: pd.DataFrame, group: str = "target", estimator: str = "k3") -> str:
    """The mean of ``estimator`` against the exact KL(ref‖ckpt) per temperature at the last
    step, with the interval of its bias."""
    rows = lab[(lab.group == group) & (lab.level == "token") & (lab.estimator == estimator)
               & (lab.target == "kl_ref_ckpt")]
    if rows.empty:
        return f"No rows in group {group!r}."
    last = rows[rows.step == rows.step.max()]
    parts = [f"{r.temperature_label}: {r.mean_estimate:.3g} against {r.mean_exact:.3g} "
             f"(bias {r.bias:+.3g} [{r.low:+.3g}, {r.high:+.3g}])" for r in last.itertuples()]
    return (f"At step {last.step.iloc[0]}, the mean of {estimator} per token against the exact "
            f"KL(ref‖ckpt), by rollout temperature: " + "; ".join(parts) + ".")

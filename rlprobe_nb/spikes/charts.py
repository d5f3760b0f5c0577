"""Charts of chapter 05, each aggregated in pandas first and small enough to render as a
static SVG/PNG (``views.show``): calibration, a raster of spikes, the onset heatmap, and
the new persistent spikes per step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb.views import TOOLTIP_NUMBER as NUMBER

SIGN_COLOURS = {"rejects": "#c0392b", "endorses": "#2471a3", "redistributes": "#7d3c98"}


def _sign_scale():
    import altair as alt

    return alt.Scale(domain=list(SIGN_COLOURS), range=list(SIGN_COLOURS.values()))


def nothing_to_show(title: str, message: str = "no spike reached significance at any step"):
    """A chart that says, in words, that there is nothing to draw (rather than a blank)."""
    import altair as alt

    return alt.Chart(pd.DataFrame({"text": [message]}), title=title).mark_text(
        fontSize=13, color="#555").encode(text="text:N").properties(width=480, height=60)


def pvalues_by_label(**tests) -> pd.DataFrame:
    """One p-value per tested context (columns label, p) from ``detect`` outputs (or
    arrays of p-values) given as label=tests (labels with spaces: pass a dict with **)."""
    frames = []
    for label, t in tests.items():
        p = (t.drop_duplicates(["checkpoint", "context_id"]).p.to_numpy()
             if isinstance(t, pd.DataFrame) else np.asarray(t, dtype=np.float64))
        frames.append(pd.DataFrame({"p": p, "label": label}))
    return pd.concat(frames, ignore_index=True)


def calibration_table(pvalues: pd.DataFrame, levels=(0.001, 0.01, 0.05)) -> pd.DataFrame:
    """Per label: how many p-values, and the share at or below each level (a calibrated
    test of contexts without spikes puts the level's own share there)."""
    from rlprobe_nb import reporting

    rows = []
    for label, g in pvalues.groupby("label", sort=False):
        row = {"label": label, "p-values": len(g)}
        for level in levels:
            row[f"share ≤ {level:g}"] = reporting.fmt(float((g.p <= level).mean()), 2)
        rows.append(row)
    return pd.DataFrame(rows)


def calibration_frames(pvalues: pd.DataFrame, bins: int = 20,
                       qq_points: int = 400) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(histogram, qq) of p-values per ``label``: the density in ``bins`` equal bins
    (1 everywhere under the null), and observed vs expected -log10 p at up to
    ``qq_points`` order statistics spaced evenly on the log scale."""
    hist, qq = [], []
    for label, g in pvalues.groupby("label", sort=False):
        p = np.sort(g.p.to_numpy(np.float64))
        counts, edges = np.histogram(p, bins=bins, range=(0, 1))
        hist.append(pd.DataFrame({"label": label, "left": edges[:-1], "right": edges[1:],
                                  "density": counts / max(len(p), 1) * bins}))
        n = len(p)
        if n == 0:
            continue
        ranks = np.unique(np.geomspace(1, n, min(qq_points, n)).astype(int)) - 1
        qq.append(pd.DataFrame({
            "label": label, "expected": -np.log10((ranks + 1) / (n + 1)),
            "observed": -np.log10(np.maximum(p[ranks], 1e-300))}))
    return pd.concat(hist, ignore_index=True), pd.concat(qq, ignore_index=True)


def calibration_chart(pvalues: pd.DataFrame, bins: int = 20):
    """Histogram and QQ plot of p-values (columns label, p) against the uniform: a
    calibrated test is flat at 1 and on the diagonal except for real spikes in the
    lower-left of the histogram / upper-right of the QQ plot (observed -log10 p is shown
    up to twice the largest expected value; beyond that it is drawn at the cap)."""
    import altair as alt

    hist, qq = calibration_frames(pvalues, bins)
    cap = 2.0 * float(max(qq.expected.max(), 1.0))
    qq = qq.assign(observed=qq.observed.clip(upper=cap))
    colour = alt.Color("label:N", title=None)
    bars = alt.Chart(hist, title="p-values (density; 1 = uniform)").mark_bar(opacity=0.6).encode(
        x=alt.X("left:Q", bin="binned", title="p"), x2="right:Q",
        y=alt.Y("density:Q", stack=None, title="density"), color=colour)
    rule = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[4, 3]).encode(y="y:Q")
    top = float(max(qq.expected.max(), 1.0))
    diag = alt.Chart(pd.DataFrame({"x": [0.0, top], "y": [0.0, top]})).mark_line(
        color="grey", strokeDash=[4, 3]).encode(x="x:Q", y="y:Q")
    points = alt.Chart(qq, title="QQ against uniform").mark_line(point=True).encode(
        x=alt.X("expected:Q", title="expected −log10 p"),
        y=alt.Y("observed:Q", title=f"observed −log10 p (capped at {cap:.1f})"),
        color=colour)
    return alt.hconcat((bars + rule).properties(width=300, height=200),
                       (diag + points).properties(width=300, height=200))


def raster_chart(spikes: pd.DataFrame, max_rollouts: int = 30):
    """Spikes over response positions, one row per rollout (the ``max_rollouts`` with
    most spikes), one panel per step; size = divergence, colour = sign."""
    import altair as alt

    at = spikes[spikes.significant]
    if at.empty:
        return nothing_to_show("spikes by position and step")
    keep = at.groupby("rollout_id").size().nlargest(max_rollouts).index
    df = at[at.rollout_id.isin(keep)][["step", "rollout_id", "pos", "divergence", "sign",
                                       "token", "dlogp"]].assign(
        token=lambda d: d.token.astype(str).str.replace("\n", "⏎"))
    return alt.Chart(df, title="spikes by position and step").mark_circle(opacity=0.8).encode(
        x=alt.X("pos:Q", title="response token"),
        y=alt.Y("rollout_id:N", title=None, sort=sorted(keep)),
        size=alt.Size("divergence:Q", title="divergence, nats"),
        color=alt.Color("sign:N", scale=_sign_scale()),
        column=alt.Column("step:O", title="step"),
        tooltip=["step", "rollout_id", "pos", "token", "sign", "divergence", "dlogp"],
    ).properties(width=180, height=max(60, 12 * len(keep)))


def short_label(context: str, width: int = 18) -> str:
    """The bracketed token of a ``context`` string with ``width`` characters either side."""
    start = context.find("[")
    end = context.find("]", start + 1)
    if start < 0 or end < 0:
        return context[: 2 * width]
    return context[max(0, start - width): min(len(context), end + 1 + width)]


LABEL_CONTEXT = 10  # characters either side of a spike's token in a chart's row label
LABEL_LIMIT = 360  # px: a row label is cut (with "…") only beyond this, never before its token


def onset_frame(spikes: pd.DataFrame, n: int = 40) -> pd.DataFrame:
    """The ``n`` strongest persistent spikes (by their largest statistic) at every step,
    ordered by onset then strength, each labelled by its token in context."""
    pairs = ["context_id", "token_id"]
    persistent = spikes[spikes.persistence == "persistent"]
    if "first_token" in persistent:
        persistent = persistent[~persistent.first_token.astype(bool)]
    strength = persistent.groupby(pairs).statistic.max().nlargest(n)
    rows = persistent.set_index(pairs).loc[strength.index].reset_index()
    order = (rows.drop_duplicates(pairs).assign(strength=lambda d: d.set_index(pairs).index.map(strength))
             .sort_values(["onset_step", "strength"], ascending=[True, False]))
    # the token in [brackets] with a little context first, where it is read, then where it is
    labels = {tuple(k): f"{short_label(ctx, LABEL_CONTEXT)}  ({pid}:{pos})".replace("\n", "⏎")
              for k, pid, pos, ctx in zip(order[pairs].to_numpy(), order.problem_id, order.pos,
                                          order.context)}
    rows["label"] = [labels[(c, t)] for c, t in zip(rows.context_id, rows.token_id)]
    rows["rank"] = rows.label.map({lab: i for i, lab in enumerate(labels.values())})
    return rows[["label", "rank", "step", "dlogp", "significant", "sign", "divergence",
                 "onset_step"]]


def onset_heatmap(spikes: pd.DataFrame, n: int = 40):
    """Rows: the strongest persistent spikes ordered by onset; columns: steps; colour:
    dlogp (red = the checkpoint takes probability from the written token, blue = gives);
    a dot marks the steps where it is a spike."""
    import altair as alt

    df = onset_frame(spikes, n)
    if df.empty:
        return nothing_to_show("persistent spikes ordered by onset",
                               "no persistent spike: nothing to order by onset")
    order = df.drop_duplicates("label").sort_values("rank").label.tolist()
    lim = float(np.nanmax(np.abs(df.dlogp))) if len(df) else 1.0
    base = alt.Chart(df, title="persistent spikes ordered by onset").encode(
        x=alt.X("step:O", title="step"),
        y=alt.Y("label:N", sort=order, title=None, axis=alt.Axis(labelLimit=LABEL_LIMIT)))
    cells = base.mark_rect().encode(color=alt.Color(
        "dlogp:Q", title="dlogp = logp_ckpt − logp_ref",
        scale=alt.Scale(scheme="redblue", domain=[-lim, lim], domainMid=0)),
        tooltip=["label", "step", "dlogp", "sign", "divergence", "significant"])
    dots = base.transform_filter("datum.significant").mark_point(
        shape="circle", size=12, color="black", filled=True)
    return (cells + dots).properties(width=max(120, 40 * df.step.nunique()),
                                     height=max(120, 14 * len(order)))


def _step_axis(*frames: pd.DataFrame) -> list[int]:
    """Every step any of the frames holds (the reference's 0 included where given), for a
    shared ordinal axis: no chart gets a domain its data lie outside."""
    steps = set()
    for f in frames:
        if f is not None and "step" in f and len(f):
            steps |= {int(v) for v in pd.to_numeric(f.step, errors="coerce").dropna()}
    return sorted(steps)


def accuracy_line(accuracy: pd.DataFrame, steps: list[int], width: int = 480):
    """The accuracy curve (columns step, accuracy, optionally low and high) on an ordinal
    step axis shared with the chart below it."""
    import altair as alt

    x = alt.X("step:O", title="RL step", scale=alt.Scale(domain=steps))
    line = alt.Chart(accuracy, title="accuracy").mark_line(point=True, clip=True).encode(
        x=x, y=alt.Y("accuracy:Q", title="accuracy"),
        tooltip=[c for c in ("model", "step", "accuracy", "low", "high") if c in accuracy])
    if {"low", "high"} <= set(accuracy.columns):
        line = alt.Chart(accuracy).mark_area(opacity=0.2, clip=True).encode(
            x=x, y="low:Q", y2="high:Q") + line
    return line.properties(width=width, height=140)


def new_persistent_chart(per_step: pd.DataFrame, accuracy: pd.DataFrame | None = None,
                         by: str = "category"):
    """Bars: new persistent spikes per step (``across_steps.new_persistent_per_step``),
    stacked by ``by``; above them, when given, the accuracy curve (columns step,
    accuracy and optionally low, high) on the same step axis. With no persistent spike
    the bars are replaced by a sentence (never an empty or degenerate axis)."""
    import altair as alt

    steps = _step_axis(per_step, accuracy)
    width = max(240, 60 * len(steps))
    if per_step.empty:
        bars = nothing_to_show("new persistent spikes per step", "no persistent spike at any step")
    else:
        colour = alt.Color(f"{by}:N", title=by) if by in per_step else alt.value("#555")
        bars = alt.Chart(per_step, title="new persistent spikes per step").mark_bar().encode(
            x=alt.X("step:O", title="RL step", scale=alt.Scale(domain=steps)),
            y=alt.Y("new_persistent:Q", title="new persistent spikes (contexts)"),
            color=colour, tooltip=list(per_step.columns)).properties(width=width, height=180)
    if accuracy is None or accuracy.empty:
        return bars
    return alt.vconcat(accuracy_line(accuracy, steps, width), bars)


def onset_chart(table: pd.DataFrame, onsets: pd.DataFrame, accuracy: pd.DataFrame | None = None,
                min_clusters: int = 5):
    """Under the accuracy curve, one row per label of each scheme (``onsets.departure_table``
    and ``onsets.onsets``): the mean departure at each step (red: the checkpoint lowers the
    written tokens' probability, blue: raises it), a ring where its interval over problems
    excludes 0, a black triangle at the onset. Labels carried by fewer than
    ``min_clusters`` problems at every step are left out (the table lists them)."""
    import altair as alt

    kept = onsets[onsets.problems >= min_clusters]
    if table.empty or kept.empty:
        return nothing_to_show("mean departure by label and step",
                               f"no label is carried by {min_clusters} or more problems")
    scheme_name = {"ground_truth": "label", "token_category": "category"}
    df = table.merge(kept[["scheme", "category", "onset_step"]], on=["scheme", "category"])
    df = df.assign(row=df.scheme.map(scheme_name).fillna(df.scheme) + ": " + df.category,
                   apart=[(lo > 0 or hi < 0) and n >= min_clusters
                          for lo, hi, n in zip(df.low, df.high, df.problems)],
                   onset=df.step == df.onset_step)
    steps = _step_axis(df, accuracy)
    width = max(240, 60 * len(steps))
    order = df.sort_values(["scheme", "category"]).row.unique().tolist()
    lim = float(max(np.nanmax(np.abs(df.estimate)), 1e-3))
    base = alt.Chart(df).encode(x=alt.X("step:O", title="RL step", scale=alt.Scale(domain=steps)),
                                y=alt.Y("row:N", sort=order, title=None))
    cells = base.mark_rect().encode(
        color=alt.Color("estimate:Q", title="mean departure, nats",
                        scale=alt.Scale(scheme="redblue", domain=[-lim, lim], domainMid=0)),
        tooltip=["row", "step", "against", alt.Tooltip("estimate:Q", title="mean departure, nats", format=NUMBER),
                 alt.Tooltip("low:Q", title="95% interval, low", format=NUMBER),
                 alt.Tooltip("high:Q", title="95% interval, high", format=NUMBER), "problems", "rows"])
    rings = base.transform_filter("datum.apart").mark_point(shape="circle", size=60, color="black")
    marks = base.transform_filter("datum.onset").mark_point(shape="triangle-right", size=90,
                                                            filled=True, color="black")
    grid = (cells + rings + marks).properties(
        width=width, height=max(60, 16 * len(order)),
        title="mean departure of the written tokens by label (ring: interval excludes 0; "
              "triangle: onset)")
    if accuracy is None or accuracy.empty:
        return grid
    return alt.vconcat(accuracy_line(accuracy, steps, width), grid)

"""Charts of the recorded demo run: the supervised stage, both GRPO runs, held-out accuracy."""

from __future__ import annotations

import pandas as pd

SIGNALS = {"reward_mean": "reward", "accuracy": "train accuracy",
           "kl_to_start": "KL to start (k3, nats/token)"}


def smoothed_logs(logs: dict[str, pd.DataFrame], window: int = 25,
                  points: int = 150) -> pd.DataFrame:
    """Long-form moving averages of each run's per-step signals, for plotting: about
    ``points`` steps of each run (a chart of every optimizer step would carry thousands
    of rows into the page and show nothing more at this smoothing)."""
    frames = []
    for run, log in logs.items():
        smooth = log.set_index("step")[list(SIGNALS)].rolling(window, min_periods=1).mean()
        smooth = smooth.iloc[::max(1, len(smooth) // points)]
        frames.append(smooth.rename(columns=SIGNALS).reset_index()
                      .melt(id_vars="step", var_name="signal", value_name="value")
                      .assign(run=run))
    return pd.concat(frames, ignore_index=True)


def training_curves(logs: dict[str, pd.DataFrame], window: int = 25):
    """Train accuracy and KL to the start model, RLVR beside placebo, per optimizer step."""
    import altair as alt

    data = smoothed_logs(logs, window)
    base = alt.Chart(data).mark_line().encode(
        x=alt.X("step:Q", title="optimizer step"), y=alt.Y("value:Q", title=None),
        color=alt.Color("run:N", legend=alt.Legend(orient="bottom", title="run")),
        tooltip=["run", "step", "signal", alt.Tooltip("value:Q", format=".3f")])
    panels = [base.transform_filter(alt.datum.signal == label).properties(
        width=250, height=180, title=f"{label} ({window}-step mean)")
        for label in ("train accuracy", "reward", "KL to start (k3, nats/token)")]
    return alt.hconcat(*panels)


def sft_chart(evaluations: pd.DataFrame):
    """The supervised stage on the dev set: boxed share and accuracy, the chosen step ringed."""
    import altair as alt

    long = evaluations.melt(id_vars=["step", "chosen"], value_vars=["boxed", "accuracy"],
                            var_name="measure", value_name="share")
    lines = alt.Chart(long).mark_line(point=True).encode(
        x=alt.X("step:Q", title="supervised step"),
        y=alt.Y("share:Q", title="share of dev problems", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("measure:N", legend=alt.Legend(orient="bottom", title=None)),
        tooltip=["step", "measure", alt.Tooltip("share:Q", format=".3f")])
    chosen = alt.Chart(long[long["chosen"]]).mark_point(size=220, shape="circle",
                                                        color="black", filled=False).encode(
        x="step:Q", y="share:Q", tooltip=["step", "measure", alt.Tooltip("share:Q", format=".3f")])
    return (lines + chosen).properties(width=420, height=200,
                                       title="supervised stage: the chosen step ringed")


def accuracy_chart(table: pd.DataFrame):
    """Held-out accuracy by step, RLVR beside placebo, with 95% intervals."""
    import altair as alt

    rows = table[table["run"] != "dpo"]
    reference = table[table["run"] == "dpo"]
    long = pd.concat([
        pd.concat([rows, reference.assign(run=run)]).assign(
            measure=label, acc=lambda d, c=col: d[f"{c}_acc"], low=lambda d, c=col: d[f"{c}_low"],
            high=lambda d, c=col: d[f"{c}_high"])
        for run in ("rlvr", "placebo")
        for label, col in (("greedy", "greedy"), ("sampled (T = 0.7)", "sampled"))
    ]).drop_duplicates(["run", "step", "measure"])[["run", "model", "step", "measure", "acc",
                                                    "low", "high"]]
    x = alt.X("step:O", title="GRPO step (0 = the reference)")
    enc = dict(color=alt.Color("run:N", legend=alt.Legend(orient="bottom", title="run")),
               xOffset="run:N")
    tips = ["model", "measure", alt.Tooltip("acc:Q", format=".3f"),
            alt.Tooltip("low:Q", format=".3f"), alt.Tooltip("high:Q", format=".3f")]
    points = alt.Chart().mark_point(filled=True).encode(
        x=x, y=alt.Y("acc:Q", title="held-out accuracy", scale=alt.Scale(domain=[0, 1])),
        tooltip=tips, **enc)
    bars = alt.Chart().mark_rule().encode(x=x, y="low:Q", y2="high:Q", tooltip=tips, **enc)
    return alt.layer(bars, points, data=long).properties(width=300, height=220).facet(
        column=alt.Column("measure:N", title=None)).properties(
        title="held-out accuracy with 95% intervals")

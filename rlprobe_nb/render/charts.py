"""Small static charts for the case studies and the viewer, as inline SVG strings.

Each chart is aggregated in pandas, drawn with Altair and converted to SVG by vl-convert
in-process, so a page that embeds it needs no script and no network.
"""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.render.metrics import metric

KL_WORDS = {
    "kl_ref_ckpt": "KL(ref‖ckpt): checkpoint surprised by the reference's text",
    "kl_ckpt_ref": "KL(ckpt‖ref): reference surprised by the checkpoint's text",
    "entropy_ref": "entropy of the reference",
}


def svg(chart) -> str:
    """An Altair chart as an SVG string (no script, no network)."""
    import vl_convert as vlc

    return vlc.vegalite_to_svg(chart.to_json())


def kl_trace_chart(rows: pd.DataFrame, pos: int, title: str = "", width: int = 640):
    """Both KL directions and the reference's entropy along one response (one checkpoint),
    the case's position marked by a vertical rule."""
    import altair as alt

    rows = rows.sort_values("pos")
    long = rows.melt(id_vars=["pos"], value_vars=list(KL_WORDS), var_name="series", value_name="nats")
    long["series"] = long.series.map(KL_WORDS)
    lines = alt.Chart(long).mark_line(strokeWidth=1.2, interpolate="step-after").encode(
        x=alt.X("pos:Q", title="response token", scale=alt.Scale(domainMin=0, nice=False)),
        y=alt.Y("nats:Q", title="nats"),
        color=alt.Color("series:N", title=None, sort=list(KL_WORDS.values()),
                        scale=alt.Scale(range=["#6a51a3", "#e6550d", "#969696"]),
                        legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=420)))
    rule = alt.Chart(pd.DataFrame({"pos": [pos]})).mark_rule(color="#000", strokeDash=[4, 3]).encode(x="pos:Q")
    return (lines + rule).properties(width=width, height=150, title=title)


def series_chart(series: pd.DataFrame, metric_name: str, title: str = "", width: int = 300):
    """One token's ``metric_name`` over training steps (``series``: columns step, value)."""
    import altair as alt

    m = metric(metric_name)
    base = alt.Chart(series).encode(x=alt.X("step:Q", title="RL step"),
                                    y=alt.Y("value:Q", title=m.short + " (nats)"))
    zero = alt.Chart(pd.DataFrame({"value": [0.0]})).mark_rule(color="#bbb").encode(y="value:Q")
    return (zero + base.mark_line(color="#333") + base.mark_point(filled=True, color="#333")
            ).properties(width=width, height=120, title=title)

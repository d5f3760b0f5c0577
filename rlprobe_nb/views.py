"""Readable views of the per-token table: per-rollout summaries, the tokens with the
largest divergence in context, a trace chart, and a response coloured by a metric.

Everything renders in a static HTML export (no kernel, no CDN): charts go out as inline
SVG through vl-convert, coloured tokens as plain HTML spans with title tooltips.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

METRIC_LABELS = {
    "kl_ref_ckpt": "KL(ref‖ckpt), nats",
    "kl_ckpt_ref": "KL(ckpt‖ref), nats",
    "js": "Jensen–Shannon, nats",
    "k1": "k1 = log q(x) − log p(x)",
}


def rollout_summary(tokens: pd.DataFrame, metric: str = "kl_ref_ckpt") -> pd.DataFrame:
    """One row per forced rollout: length, mean/max/total of ``metric``, the argmax token."""
    g = tokens.groupby("rollout_id", sort=False)
    at_max = tokens.loc[g[metric].idxmax(), ["rollout_id", "pos", "token"]].set_index("rollout_id")
    out = g.agg(problem_id=("problem_id", "first"), tokens=("pos", "size"),
                mean=(metric, "mean"), max=(metric, "max"), total=(metric, "sum"))
    out = out.join(at_max.rename(columns={"pos": "argmax_pos", "token": "argmax_token"}))
    return out.sort_values("max", ascending=False)


def with_context(tokens: pd.DataFrame, rows: pd.DataFrame, width: int = 12) -> pd.Series:
    """The text around each row: ``width`` tokens either side, the row's token in [brackets]."""
    by_rollout = {rid: df.sort_values("pos").reset_index(drop=True)
                  for rid, df in tokens[tokens.rollout_id.isin(rows.rollout_id)].groupby("rollout_id")}
    out = []
    for rid, pos in zip(rows.rollout_id, rows.pos):
        seq = by_rollout[rid]
        before = "".join(seq.token.iloc[max(0, pos - width):pos])
        after = "".join(seq.token.iloc[pos + 1:pos + 1 + width])
        out.append(f"{before}[{seq.token.iloc[pos]}]{after}".replace("\n", "⏎"))
    return pd.Series(out, index=rows.index)


def top_tokens(tokens: pd.DataFrame, metric: str = "kl_ref_ckpt", n: int = 15,
               width: int = 12) -> pd.DataFrame:
    """The ``n`` rows with the largest ``metric``, with their context and both log-probs."""
    rows = tokens.nlargest(n, metric)
    cols = ["rollout_id", "pos", "token", metric, "logp_ref", "logp_ckpt", "rank_ref", "rank_ckpt"]
    return rows[cols].assign(context=with_context(tokens, rows, width)).reset_index(drop=True)


def trace_chart(tokens: pd.DataFrame, rollout_id: str, metric: str = "kl_ref_ckpt"):
    """``metric`` along one response, with the token in the tooltip."""
    import altair as alt

    df = tokens[tokens.rollout_id == rollout_id].sort_values("pos")
    df = df[["pos", "token", metric, "logp_ref", "logp_ckpt"]].assign(
        token=lambda d: d.token.str.replace("\n", "⏎"))
    return alt.Chart(df, title=f"{rollout_id}: {METRIC_LABELS.get(metric, metric)} per token").mark_bar(
        width=2).encode(x=alt.X("pos:Q", title="response token", scale=alt.Scale(domainMin=0, nice=False)),
                        y=alt.Y(f"{metric}:Q", title=METRIC_LABELS.get(metric, metric)),
                        tooltip=["pos", "token", metric, "logp_ref", "logp_ckpt"]
                        ).properties(width=640, height=180)


def show(chart, save_as: str | Path | None = None):
    """Display a chart as inline SVG (works in a static HTML export); optionally save
    ``save_as``.svg and .png beside it."""
    import vl_convert as vlc
    from IPython.display import SVG

    spec = chart.to_json()
    svg = vlc.vegalite_to_svg(spec)
    if save_as is not None:
        from .storage import atomic_path

        base = Path(save_as)
        base.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(base.with_suffix(".svg")) as tmp:
            tmp.write_text(svg, encoding="utf-8")
        with atomic_path(base.with_suffix(".png")) as tmp:
            tmp.write_bytes(vlc.vegalite_to_png(spec, scale=2))
    return SVG(svg)


def coloured_response(tokens: pd.DataFrame, rollout_id: str, metric: str = "kl_ref_ckpt",
                      vmax: float | None = None):
    """The response with each token shaded by ``metric``; hover shows the numbers."""
    from IPython.display import HTML

    df = tokens[tokens.rollout_id == rollout_id].sort_values("pos")
    top = vmax if vmax is not None else max(float(df[metric].quantile(0.99)), 1e-12)
    spans = []
    for row in df.itertuples():
        value = getattr(row, metric)
        alpha = min(1.0, max(0.0, value / top))
        tip = (f"pos {row.pos} {row.token!r}\n{metric} = {value:.4g}\n"
               f"logp ref {row.logp_ref:.3f}, ckpt {row.logp_ckpt:.3f}\n"
               f"rank ref {row.rank_ref}, ckpt {row.rank_ckpt}")
        text = html.escape(row.token if row.token else "∅").replace("\n", "⏎\n")
        spans.append(f'<span title="{html.escape(tip)}" style="background: rgba(220,50,32,{alpha:.3f});'
                     f'border-radius:2px">{text}</span>')
    body = "".join(spans)
    return HTML(f'<div style="font-family: monospace; white-space: pre-wrap; line-height: 1.6; '
                f'max-height: 24em; overflow-y: auto; border: 1px solid #ccc; padding: 6px">'
                f"{body}</div><div style='font-size: 80%'>shade: {metric}, full at {top:.3g}</div>")

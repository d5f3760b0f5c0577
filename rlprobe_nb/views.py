"""Readable views of the per-token table: per-rollout summaries, the tokens with the
largest divergence in context, and a trace chart (a response coloured token by token is
drawn by ``rlprobe_nb.render``).

Charts (``show``) are interactive in JupyterLab and in the exported pages, offline: each is
displayed as a Vega-Lite spec (JupyterLab draws it with its own built-in renderer, with
tooltips and, where both axes are continuous, zoom and pan) beside a static SVG; the book's
exporter embeds the spec in the page with the Vega scripts inlined once per page
(``pages.charts``), the SVG showing until they run. The SVG and a PNG are also saved for
papers.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

# Every KL named by its direction, in words.
METRIC_LABELS = {
    "kl_ref_ckpt": "KL(ref‖ckpt): checkpoint's surprise at what the reference would write, nats",
    "kl_ckpt_ref": "KL(ckpt‖ref): reference's surprise at what the checkpoint would write, nats",
    "js": "Jensen–Shannon divergence, nats",
    "dlogp": "Δlogp = log p_ckpt − log p_ref of the written token, nats",
    "k1": "k1 = log p_ref(x) − log p_ckpt(x), nats",
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
    """The ``n`` rows with the largest ``metric`` (first response tokens excluded: they
    depend on the prompt alone), with their context, both log-probs and Δlogp."""
    rows = tokens[~tokens.first_token].nlargest(n, metric)
    cols = ["rollout_id", "pos", "token", metric, "dlogp", "logp_ref", "logp_ckpt",
            "rank_ref", "rank_ckpt"]
    cols = list(dict.fromkeys(cols))
    return rows[cols].assign(context=with_context(tokens, rows, width)).reset_index(drop=True)


def signed_rankings(tokens: pd.DataFrame, n: int = 10, width: int = 12) -> dict[str, pd.DataFrame]:
    """Where the checkpoint *rejects* the written token most (most negative Δlogp) and
    where it *endorses* it most (most positive), each context counted once and the first
    response token kept out (see ``first_tokens``)."""
    body = tokens[~tokens.first_token].drop_duplicates("context_id")
    cols = ["group", "rollout_id", "pos", "token", "dlogp", "logp_ref", "logp_ckpt",
            "rank_ref", "rank_ckpt", "kl_ref_ckpt", "kl_ckpt_ref"]
    out = {}
    for name, rows in (("rejects", body.nsmallest(n, "dlogp")),
                       ("endorses", body.nlargest(n, "dlogp"))):
        out[name] = rows[cols].assign(context=with_context(tokens, rows, width)).reset_index(drop=True)
    return out


def first_tokens(tokens: pd.DataFrame) -> pd.DataFrame:
    """The first response token's prediction, once per problem (it depends on the prompt
    alone, so every rollout of a problem repeats it)."""
    first = tokens[tokens.first_token].drop_duplicates("context_id")
    return first[["group", "problem_id", "token", "dlogp", "kl_ref_ckpt", "kl_ckpt_ref",
                  "logp_ref", "logp_ckpt"]].sort_values("kl_ref_ckpt", ascending=False
                                                       ).reset_index(drop=True)


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


# JupyterLab's built-in renderer draws Vega-Lite 5 specs; altair 6 writes Vega-Lite 6, whose
# specs the book's charts use only the common subset of, so the Lab copy is labelled v5.
VEGALITE_MIMETYPE = "application/vnd.vegalite.v5+json"
LAB_SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"
CONTINUOUS = {"quantitative", "temporal"}
# Widest a chart may be: it fits a 1280-px window beside JupyterLab's collapsed side bar or a
# page's margins (a wider one is cut off in a page and scrolls in JupyterLab).
MAX_WIDTH = 1100


def _continuous_axes(spec: dict) -> bool:
    """True when every view of ``spec`` (a single or layered view) has continuous x and y."""
    views = spec.get("layer", [spec])
    if not views or any(k in spec for k in ("hconcat", "vconcat", "concat", "facet", "repeat")):
        return False
    for view in views:
        if "layer" in view or "params" in view:
            return False
        enc = view.get("encoding", spec.get("encoding", {}))
        if not all(enc.get(axis, {}).get("type") in CONTINUOUS for axis in ("x", "y")):
            return False
    return True


def zoomable(chart):
    """``chart`` with zoom and pan (altair's ``interactive()``) when its axes are continuous;
    otherwise unchanged (binning or categories cannot be zoomed)."""
    try:
        if _continuous_axes(chart.to_dict()):
            return chart.interactive()
    except Exception:  # a chart altair cannot make interactive stays static, not broken
        pass
    return chart


class ChartView:
    """A chart for display: Vega-Lite (interactive in JupyterLab) beside its static SVG."""

    def __init__(self, spec: dict, svg: str, title: str = ""):
        self.spec, self.svg, self.title = spec, svg, title

    @property
    def data(self) -> str:
        """The static SVG (as ``IPython.display.SVG(...).data``)."""
        return self.svg

    @property
    def width(self) -> float:
        """The chart's width in pixels, as drawn."""
        import re

        return float(re.search(r'<svg[^>]*\swidth="([\d.]+)"', self.svg).group(1))

    def _repr_mimebundle_(self, include=None, exclude=None):
        # drawn as SVG (crisp, and its marks are elements a test can find), with no action that
        # needs the network (the Vega editor)
        embed = {"renderer": "svg", "actions": {"export": True, "source": True, "compiled": False, "editor": False}}
        usermeta = {**self.spec.get("usermeta", {}), "embedOptions": embed}
        lab = {**self.spec, "$schema": LAB_SCHEMA, "usermeta": usermeta}
        return {VEGALITE_MIMETYPE: lab, "image/svg+xml": self.svg,
                "text/plain": f"<chart{': ' + self.title if self.title else ''}>"}


def _title(spec: dict) -> str:
    title = spec.get("title", "")
    if isinstance(title, dict):
        title = title.get("text", "")
    return " ".join(title) if isinstance(title, list) else str(title)


def show(chart, save_as: str | Path | None = None) -> ChartView:
    """Display a chart: interactive (tooltips; zoom where its axes are continuous) in
    JupyterLab and in the book's exported pages, a static SVG elsewhere; optionally save
    ``save_as``.svg and .png beside it (the static chart, for papers)."""
    import vl_convert as vlc

    spec_json = chart.to_json()
    svg = vlc.vegalite_to_svg(spec_json)
    if save_as is not None:
        from rlprobe_nb.tables.storage import atomic_path

        base = Path(save_as)
        base.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(base.with_suffix(".svg")) as tmp:
            tmp.write_text(svg, encoding="utf-8")
        with atomic_path(base.with_suffix(".png")) as tmp:
            tmp.write_bytes(vlc.vegalite_to_png(spec_json, scale=2))
    spec = zoomable(chart).to_dict()
    return ChartView(spec, svg, _title(spec))

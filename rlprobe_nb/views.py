"""Readable views of the per-token table: per-rollout summaries, the tokens with the
largest divergence in context, and a trace chart (a response coloured token by token is
drawn by ``rlprobe_nb.render``).

Charts (``show``) are interactive in JupyterLab and in the exported pages, offline: each is
displayed as a Vega-Lite spec (JupyterLab draws it with its own built-in renderer, with
tooltips and, where both axes are continuous, zoom and pan) beside a static SVG; the book's
exporter embeds the spec in the page, drawn by the Vega scripts beside the pages
(``pages.charts``), the static SVG showing until they run. Every mark but a text label
answers a hover with its named values to four significant digits, tiny ones in scientific
notation (``readable_tooltips``).
The SVG and a PNG are also saved for papers.
"""

from __future__ import annotations

import json
import re
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
SAVED_KEY = "rlprobe_svg"  # in a displayed spec's usermeta: the chart's saved SVG file name
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


# A hover over any mark of a chart shows a tooltip: its numbers to four significant digits
# (d3's "r": 0.06055, 1,200, never 0.0605466100921), each under a name.
TOOLTIP_NUMBER = ",.4~r"
# The fields a mark's tooltip names when the chart gives none, in this order.
TOOLTIP_CHANNELS = ("row", "column", "facet", "x", "x2", "xOffset", "y", "y2", "yOffset", "color", "size",
                    "shape", "detail", "theta")
# A line's or an area's own path never shows a tooltip in an SVG drawing (Vega finds the
# datum under the pointer only on a canvas): its data points, drawn over it, do, here
# transparent where the chart draws no points.
HOVER_POINTS = {"filled": True, "opacity": 0, "size": 80}
# Names for the interval bounds, which have no axis title of their own (y2 of a rule).
BOUND_NAMES = {"low": "95% interval, low", "high": "95% interval, high"}
# What a reader calls a column a tooltip shows under no title of the chart's own.
FIELD_NAMES = {**BOUND_NAMES, "kl_ref_ckpt": "KL(ref‖ckpt)", "kl_ckpt_ref": "KL(ckpt‖ref)",
               "js": "Jensen–Shannon", "dlogp": "Δlogp", "step": "RL step",
               "rollout_id": "rollout", "problem_id": "problem", "pos": "position",
               "logp_ref": "log p (reference)", "logp_ckpt": "log p (checkpoint)",
               "rank_ref": "rank (reference)", "rank_ckpt": "rank (checkpoint)",
               "entropy_ref": "entropy (reference)", "entropy_ckpt": "entropy (checkpoint)",
               "entropy_decile": "decile of the reference's entropy",
               "wilson_low": "Wilson low", "wilson_high": "Wilson high", "p": "p-value",
               "q": "q-value", "onset_step": "onset step", "significant": "spike here",
               "statistic": "test statistic T", "n_rollouts": "rollouts"}


def _field_title(channel_def: dict) -> str:
    title = channel_def.get("title")
    if isinstance(title, list):
        title = " ".join(str(t) for t in title)
    if title:
        return str(title)
    field = str(channel_def["field"])
    return FIELD_NAMES.get(field, field)


def _readable_entry(entry: dict) -> dict:
    """A tooltip entry named as a reader would (``FIELD_NAMES``, where the chart gave no
    title), with a number format (four significant digits) if it is quantitative."""
    if "title" not in entry and "field" in entry and str(entry["field"]) in FIELD_NAMES:
        entry = {**entry, "title": FIELD_NAMES[str(entry["field"])]}
    if entry.get("type") == "quantitative" and "format" not in entry and "aggregate" not in entry:
        return {**entry, "format": TOOLTIP_NUMBER}
    return entry


def _default_tooltip(encoding: dict, facets: list[dict]) -> list[dict]:
    """The fields a mark is drawn from (and its facets'), each named, as its tooltip."""
    out, seen = [], set()
    for channel, d in [("facet", f) for f in facets] + [(c, encoding.get(c)) for c in TOOLTIP_CHANNELS]:
        if isinstance(d, dict) and "field" in d and d["field"] not in seen:
            seen.add(d["field"])
            # x2 and y2 have no type of their own: they take x's and y's
            kind = d.get("type") or encoding.get(channel[0], {}).get("type", "nominal")
            out.append(_readable_entry({"field": d["field"], "type": kind, "title": _field_title(d)}))
    return out


def _facet_fields(spec: dict) -> list[dict]:
    """The facet fields a faceted spec splits its panels by (row, column or facet)."""
    found = spec.get("facet", {})
    return [found] if "field" in found else [v for v in found.values() if isinstance(v, dict)]


def readable_tooltips(spec: dict, inherited: dict | None = None, facets: list | None = None) -> dict:
    """``spec`` (a Vega-Lite dict, changed in place and returned) with a tooltip on every
    mark but text: the chart's own, its numbers given four significant digits where it set
    no format, or else one naming the fields the mark is drawn from (and the panel's facet);
    lines and areas get points to hover (``HOVER_POINTS``). Text marks are labels or
    sentences: they get a tooltip only where the chart gives one."""
    own = spec.get("encoding", {})
    encoding, facets = {**(inherited or {}), **own}, list(facets or []) + _facet_fields(spec)
    if "tooltip" in own:
        tips = own["tooltip"] if isinstance(own["tooltip"], list) else [own["tooltip"]]
        own["tooltip"] = [_readable_entry(t) if isinstance(t, dict) else t for t in tips]
    parts = [(p, {}) for key in ("hconcat", "vconcat", "concat") for p in spec.get(key, [])]
    parts += [(spec["spec"], {})] if "spec" in spec else []
    parts += [(p, encoding) for p in spec.get("layer", [])]
    for part, passed_down in parts:
        readable_tooltips(part, passed_down, facets)
    mark = spec.get("mark")
    kind = mark.get("type") if isinstance(mark, dict) else mark
    if kind is not None and kind != "text" and "tooltip" not in encoding:
        spec.setdefault("encoding", {})["tooltip"] = _default_tooltip(encoding, facets)
    if kind is not None:
        _tiny_numbers_in_scientific_notation(spec, {**encoding, **spec.get("encoding", {})})
    if kind in ("line", "area") and not (isinstance(mark, dict) and mark.get("point")):
        spec["mark"] = {**(mark if isinstance(mark, dict) else {"type": kind}), "point": HOVER_POINTS}
    return spec


def _tiny_numbers_in_scientific_notation(unit: dict, encoding: dict) -> None:
    """A unit's tooltip numbers shown as text computed in the chart (a ``calculate``
    transform): four significant digits, or below ``TINY`` in scientific notation (a KL of
    1.2e-05 reads so, not as 0.00001200). Only plain fields of a unit that aggregates
    nothing are rewritten: an aggregate's or a bin's value has no field to format."""
    tips = encoding.get("tooltip")
    if not isinstance(tips, list) or any(
            isinstance(d, dict) and ("aggregate" in d or "bin" in d) for d in encoding.values()):
        return
    shown, transforms = [], []
    for entry in tips:
        field = entry.get("field") if isinstance(entry, dict) else None
        if isinstance(field, str) and entry.get("format") == TOOLTIP_NUMBER \
                and _PLAIN_FIELD.fullmatch(field):
            transforms.append({"calculate": SHOWN_NUMBER.format(field=field), "as": f"{field} (shown)"})
            entry = {"field": f"{field} (shown)", "type": "nominal", "title": _field_title(entry)}
        shown.append(entry)
    if transforms:
        unit["transform"] = [*unit.get("transform", []), *transforms]
        unit.setdefault("encoding", {})["tooltip"] = shown


# Numbers under this size (not zero) read in scientific notation in a tooltip.
TINY = 1e-3
_PLAIN_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_ ]*")  # read as datum['...'] as it is
SHOWN_NUMBER = ("isValid(datum['{field}']) && isFinite(datum['{field}']) ? "
                f"(datum['{{field}}'] != 0 && abs(datum['{{field}}']) < {TINY} ? "
                "format(datum['{field}'], '.3~e') : "
                f"format(datum['{{field}}'], '{TOOLTIP_NUMBER}')) : '–'")


class ChartView:
    """A chart for display: Vega-Lite (interactive in JupyterLab) beside its static SVG;
    ``saved``: the name of its SVG file, when saved (an exported page beside that file shows
    it as its static form instead of carrying the SVG again)."""

    def __init__(self, spec: dict, svg: str, title: str = "", saved: str | None = None):
        self.spec, self.svg, self.title, self.saved = spec, svg, title, saved

    @property
    def data(self) -> str:
        """The static SVG (as ``IPython.display.SVG(...).data``)."""
        return self.svg

    @property
    def width(self) -> float:
        """The chart's width in pixels, as drawn."""
        return float(re.search(r'<svg[^>]*\swidth="([\d.]+)"', self.svg).group(1))

    def _repr_mimebundle_(self, include=None, exclude=None):
        # drawn as SVG (crisp, and its marks are elements a test can find), with no action that
        # needs the network (the Vega editor)
        embed = {"renderer": "svg", "actions": {"export": True, "source": True, "compiled": False, "editor": False}}
        usermeta = {**self.spec.get("usermeta", {}), "embedOptions": embed}
        if self.saved:
            usermeta[SAVED_KEY] = self.saved
        lab = {**self.spec, "$schema": LAB_SCHEMA, "usermeta": usermeta}
        return {VEGALITE_MIMETYPE: lab, "image/svg+xml": self.svg,
                "text/plain": f"<chart{': ' + self.title if self.title else ''}>"}


def _title(spec: dict) -> str:
    title = spec.get("title", "")
    if isinstance(title, dict):
        title = title.get("text", "")
    return " ".join(title) if isinstance(title, list) else str(title)


# Characters XML 1.0 forbids (C0 controls but tab, newline and carriage return): a token's
# text may hold them, and the SVG/PNG renderer refuses a spec that does.
_XML_ILLEGAL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _xml_safe(value):
    """``value`` (a spec as parsed JSON) with every XML-illegal control character in its
    strings replaced by its Control Pictures mark, as ``readable.visible`` shows it."""
    if isinstance(value, str):
        return _XML_ILLEGAL.sub(lambda m: chr(0x2400 + ord(m.group())), value)
    if isinstance(value, list):
        return [_xml_safe(v) for v in value]
    if isinstance(value, dict):
        return {_xml_safe(k): _xml_safe(v) for k, v in value.items()}
    return value


def show(chart, save_as: str | Path | None = None) -> ChartView:
    """Display a chart: interactive (tooltips; zoom where its axes are continuous) in
    JupyterLab and in the book's exported pages, a static SVG elsewhere; optionally save
    ``save_as``.svg and .png beside it (the static chart, for papers)."""
    import vl_convert as vlc

    spec_json = json.dumps(_xml_safe(json.loads(chart.to_json())))
    svg = vlc.vegalite_to_svg(spec_json)
    if save_as is not None:
        from rlprobe_nb.tables.storage import atomic_path

        base = Path(save_as)
        base.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(base.with_suffix(".svg")) as tmp:
            tmp.write_text(svg, encoding="utf-8")
        with atomic_path(base.with_suffix(".png")) as tmp:
            tmp.write_bytes(vlc.vegalite_to_png(spec_json, scale=2))
    spec = readable_tooltips(zoomable(chart).to_dict())
    return ChartView(spec, svg, _title(spec), Path(save_as).with_suffix(".svg").name if save_as else None)


def how_made(facts, summary: str = "How this page was made"):
    """Provenance for a reader who wants it, folded: ``facts`` (a manifest or any mapping:
    one row per leaf, named by its path of keys; or lines of text) in a closed
    ``<details>`` block under ``summary``. The exported page shows folders relative to the
    book (``pages.for_reader``)."""
    import html

    from IPython.display import HTML

    if isinstance(facts, (list, tuple)):
        body = '<pre style="white-space:pre-wrap">' + html.escape("\n".join(map(str, facts))) + "</pre>"
    else:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in _leaves(facts))
        body = f"<table>{rows}</table>"
    return HTML(f'<details class="rp-made"><summary>{html.escape(summary)}</summary>{body}</details>')


def _leaves(value, path: str = ""):
    """(path of keys, value as text) for every leaf of nested mappings; a list of plain
    values is one leaf."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _leaves(v, f"{path} › {k}" if path else str(k))
    elif isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in value):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path} › {i}")
    else:
        text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else \
            "–" if value is None or value == {} else str(value)
        yield path, text


def finding_slot(text: str = "*The chapter's finding is written here once its tables are read "
                             "(below).*"):
    """A display near the top of a chapter that the chapter fills in at its end with
    ``slot.update(Markdown(...))``: the page opens with its finding, computed from the
    tables the chapter reads further down (an executed notebook keeps the update)."""
    from IPython.display import Markdown, display

    return display(Markdown(text), display_id=True)

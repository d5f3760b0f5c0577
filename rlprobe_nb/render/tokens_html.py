"""A response as coloured tokens: one self-contained HTML fragment with CSS-only tooltips.

Each response token is one ``<span class="rp-tok">`` holding exactly its text (the slice
``response[char_start:char_end]`` when the response is given, else the table's ``token``),
so the spans' text concatenated is the response, whitespace and newlines included
(``white-space: pre-wrap``). Its background is its value on a :class:`ColourScale`. Its
tooltip is plain text in a ``data-tip`` attribute, shown on hover by the page runtime
(``page_runtime``: one box on the page's body, kept inside the viewport, so neither a
scrolling ancestor nor JupyterLab's ``contain: strict`` panels can clip or misplace it;
inline, no network, no kernel). Where scripts do not run, CSS shows the same text through
``::after { content: attr(data-tip) }``. The tooltip never enters the text. Newline and
empty tokens (EOS) get a visible marker the same way. Model text is data: every string is
HTML-escaped.
"""

from __future__ import annotations

import html
from collections import namedtuple
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from rlprobe_nb.render.colour_scale import ColourScale
from rlprobe_nb.render.metrics import metric_values
from rlprobe_nb.render.page_runtime import runtime_script
from rlprobe_nb.render.spike_marks import spike_records
from rlprobe_nb.readable import quoted

STYLE = """<style>
.rp-resp{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;
 font-size:13px;line-height:1.75;white-space:pre-wrap;word-break:break-word;color:#000;
 border:1px solid #ccc;padding:6px 8px;background:#fff;text-align:left}
.rp-tok{border-radius:2px}
html:not(.rp-js) .rp-tok:hover::after{content:attr(data-tip);position:fixed;margin-top:1.7em;z-index:1000;
 white-space:pre;background:#fffff4;color:#000;border:1px solid #777;padding:4px 6px;
 font-size:11.5px;line-height:1.35;box-shadow:2px 2px 6px rgba(0,0,0,.25);pointer-events:none}
.rp-tok.rp-nl::before{content:"⏎";color:#888}
.rp-tok.rp-empty::before{content:"∅";color:#888}
.rp-tok.rp-spike{outline:2px solid #111;outline-offset:-1px}
.rp-tok.rp-sel{box-shadow:0 0 0 3px #f5c400}
.rp-tok.rp-dim{opacity:.3}
.rp-tok.rp-hit{outline:2px dashed #00a0a0;outline-offset:1px}
.rp-row{display:flex;gap:8px;align-items:baseline}
.rp-row>.rp-label{font:12px sans-serif;min-width:7em;color:#333}
</style>"""

Decoder = Callable[[int], str]


def make_decoder(decode: Decoder | Mapping[int, str] | None, tokens: pd.DataFrame | None = None) -> Decoder:
    """A ``decode(id) -> str`` from a callable, an id->text mapping, or (``None``) the
    ids seen in ``tokens``; an id it cannot name is shown as ``#id``."""
    if callable(decode):
        cache: dict[int, str] = {}

        def cached(i: int) -> str:
            if i not in cache:
                cache[i] = decode(int(i))
            return cache[i]
        return cached
    table = dict(decode) if decode is not None else {}
    if decode is None and tokens is not None:
        table = dict(zip(tokens.token_id.astype(int), tokens.token))
    return lambda i: table.get(int(i), f"#{int(i)}")


def show_token(text: str) -> str:
    """A token's text made visible on one line: quoted, its whitespace as marks (``"␣the"``,
    ``"⏎"``), a backslash as itself (see ``visible``)."""
    return quoted(text)


class _Labels:
    """Each token id's text as shown in a top-k column (quoted, cut and padded), made once."""

    def __init__(self, decode: Decoder, width: int = 18):
        self.decode, self.width, self.cache = decode, width, {}

    def __call__(self, token_id) -> str:
        i = int(token_id)
        if i not in self.cache:
            self.cache[i] = f"{show_token(self.decode(i))[:self.width]:<{self.width}}"
        return self.cache[i]


_TipRow = namedtuple("_TipRow", ["pos", "token_id", "logp_ref", "logp_ckpt", "rank_ref", "rank_ckpt",
                                  "kl_ref_ckpt", "kl_ckpt_ref", "js", "entropy_ref", "entropy_ckpt",
                                  "topk_ids_ref", "topk_p_ref", "topk_ids_ckpt", "topk_p_ckpt"])


def _as_list(values) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _topk_lines(row, label: _Labels, k: int | None) -> list[str]:
    cols = [_as_list(getattr(row, c))[:k] for c in ("topk_ids_ref", "topk_p_ref", "topk_ids_ckpt", "topk_p_ckpt")]
    left = [f"{label(i)} {p:.3f}" for i, p in zip(cols[0], cols[1])]
    right = [f"{label(i)} {p:.3f}" for i, p in zip(cols[2], cols[3])]
    n = max(len(left), len(right))
    left += [""] * (n - len(left))
    right += [""] * (n - len(right))
    lines = [f"top-{n:<3} {'reference':<24} checkpoint"]
    lines += [f"{j + 1:>4}    {a:<24} {b}" for j, (a, b) in enumerate(zip(left, right))]
    return lines


def tooltip_text(row, text: str, decode: Decoder, spike: dict | None = None,
                 category: str | None = None, topk: int | None = None) -> str:
    """Everything known about one token, as aligned plain-text lines."""
    label = decode if isinstance(decode, _Labels) else _Labels(decode)
    cat = category if category is not None else (spike or {}).get("category")
    lines = [f"{show_token(text)}  id {int(row.token_id)}  pos {int(row.pos)}"
             + (f"  category {cat}" if cat is not None else ""),
             f"log p    ref {row.logp_ref:+.4f}   ckpt {row.logp_ckpt:+.4f}   "
             f"Δlogp {row.logp_ckpt - row.logp_ref:+.4f}",
             f"rank     ref {int(row.rank_ref):<8} ckpt {int(row.rank_ckpt)}",
             f"KL(ref‖ckpt) {row.kl_ref_ckpt:.4f}   KL(ckpt‖ref) {row.kl_ckpt_ref:.4f}   JS {row.js:.4f}",
             f"entropy  ref {row.entropy_ref:.4f}   ckpt {row.entropy_ckpt:.4f}"]
    lines.append(spike_line(spike))
    return "\n".join(lines + _topk_lines(row, label, topk))


def spike_line(spike: dict | None) -> str:
    """A tooltip's line about the token's spike record at its step."""
    if not spike:
        return "not a spike"
    parts = [f"spike {spike.get('sign') or '?'}"]
    if spike.get("persistence") is not None:
        parts.append(str(spike["persistence"]))
    if spike.get("q") is not None:
        parts.append(f"q {spike['q']:.3g}")
    if spike.get("onset") is not None and not pd.isna(spike["onset"]):
        parts.append(f"onset step {int(spike['onset'])}")
    return "  ·  ".join(parts)


@dataclass
class TokenPieces:
    """What a response's rendering needs that does not depend on the colouring, prepared
    once per (checkpoint, rollout) so that recolouring is only a join."""

    pos: np.ndarray
    text: list[str]  # each token's text (raw)
    opening: list[str]  # '<span class="rp-tok' + marker classes, up to the closing quote
    rest: list[str]  # ' data-pos=.. data-tip="..">escaped text</span>'
    spike_q: np.ndarray  # each token's spike q-value, NaN where it is not a spike
    category: np.ndarray  # object array: each token's category (None where unknown)


def token_texts(rows: pd.DataFrame, response: str | None = None) -> list[str]:
    """Each row's text: its slice of ``response`` (spans tile the text), else ``token``."""
    if response is None:
        return rows.token.fillna("").tolist()
    return [response[a:b] for a, b in zip(rows.char_start.to_numpy(), rows.char_end.to_numpy())]


def prepare(rows: pd.DataFrame, decode: Decoder, response: str | None = None,
            spikes: dict[int, dict] | None = None, topk: int | None = None) -> TokenPieces:
    """Escape every token's text and tooltip once; ``rows`` are one (checkpoint, rollout)."""
    rows = rows.sort_values("pos")
    texts = token_texts(rows, response)
    spikes = spikes or {}
    has_cat = "category" in rows.columns
    cats = rows.category.tolist() if has_cat else [None] * len(rows)
    opening, rest, spike_q, category = [], [], [], []
    label = _Labels(decode)
    # Python scalars, not numpy's or Arrow's: formatting 4,000 tooltips is the hot path.
    records = map(_TipRow._make, zip(*(rows[c].tolist() for c in _TipRow._fields)))
    for row, text, cat in zip(records, texts, cats):
        spike = spikes.get(int(row.pos))
        cat = cat if has_cat else (spike or {}).get("category")
        marker = " rp-empty" if text == "" else (" rp-nl" if "\n" in text else "")
        tip = tooltip_text(row, text, label, spike, cat, topk)
        opening.append(f'<span class="rp-tok{marker}')
        rest.append(f' data-pos="{int(row.pos)}" data-tip="{html.escape(tip, quote=True)}">'
                    f"{html.escape(text, quote=False)}</span>")
        q = (spike or {}).get("q")
        spike_q.append(np.nan if spike is None else (0.0 if q is None else float(q)))
        category.append(cat)
    return TokenPieces(rows.pos.to_numpy(), texts, opening, rest, np.array(spike_q, dtype=np.float64),
                       np.array(category, dtype=object))


def paint(pieces: TokenPieces, values: np.ndarray, scale: ColourScale, q_threshold: float | None = None,
          category: str | None = None, selected: int | None = None) -> str:
    """The token spans, coloured: spikes with q <= ``q_threshold`` outlined (all spikes when
    it is None), tokens outside ``category`` dimmed, the ``selected`` position highlighted."""
    colours = scale.colours(values)
    inks = scale.text_colours(values)
    q = pieces.spike_q
    outlined = ~np.isnan(q) if q_threshold is None else (q <= q_threshold)
    if category is not None:
        outlined &= pieces.category == category
    out = []
    for j, (opening, rest) in enumerate(zip(pieces.opening, pieces.rest)):
        extra = ""
        if outlined[j]:
            extra += " rp-spike"
        if category is not None and pieces.category[j] != category:
            extra += " rp-dim"
        if selected is not None and pieces.pos[j] == selected:
            extra += " rp-sel"
        out.append(f'{opening}{extra}" data-v="{values[j]:.6g}" '
                   f'style="background:{colours[j]};color:{inks[j]}"{rest}')
    return "".join(out)


def response_html(rows: pd.DataFrame, scale: ColourScale, decode: Decoder | Mapping[int, str] | None = None,
                  response: str | None = None, spikes: pd.DataFrame | None = None,
                  legend: bool = True, style: bool = True, max_height: str | None = None,
                  q_threshold: float | None = None, topk: int | None = None) -> str:
    """One (checkpoint, rollout)'s response as a self-contained HTML fragment coloured by
    ``scale.metric``, with a legend and per-token tooltips; its spikes at this checkpoint
    (from the spikes table, see ``spike_marks``) outlined."""
    if rows.empty:
        return "<div>(no tokens)</div>"
    ckpts, rollouts = rows.checkpoint.unique(), rows.rollout_id.unique()
    if len(ckpts) != 1 or len(rollouts) != 1:
        raise ValueError(f"response_html takes one checkpoint and one rollout, got {list(ckpts)} x {list(rollouts)}")
    rows = rows.sort_values("pos")
    pieces = prepare(rows, make_decoder(decode, rows), response, spike_records(spikes, ckpts[0], rows), topk)
    body = paint(pieces, metric_values(rows, scale.metric), scale, q_threshold)
    box = f' style="max-height:{max_height};overflow-y:auto"' if max_height else ""
    return ((STYLE + runtime_script() if style else "") + (scale.legend_html() if legend else "")
            + f'<div class="rp-resp"{box}>{body}</div>')

"""The viewer in a page without a kernel: what chapter 07's exported page shows in place of
the live viewer's controls.

A page has no kernel to ask, so it holds its data: the opening rollout and every rollout
the other chapters' pages link to (``viewer_targets.linked_targets``), each at every step,
as numbers (about 100 bytes a token and step, against about 700 for a tooltip's text).
Its script (``static/page_viewer.js``) runs the live viewer's own response pane
(``static/token_pane.js``) with a stand-in for the kernel that answers from those numbers:
hover a token for its tooltip (the same text as the live viewer's, composed in the page),
click it to ring it and show its values over steps and both models' top-k at every step,
search the text (matches outlined and counted), move through the steps (a slider, or ← →
with the response focused), step through the spikes (n / p, "next spike"). The colours are
the opening metric's on the suite's shared scale; the other metrics, scales, filters and
rollouts need the live viewer.

A link from another page opens it at ``#open=<rollout>:<pos>`` (``viewer_links``): the
rollout is shown, the token ringed and scrolled into view with its history; a rollout
the page does not hold gets a note there saying how to open it.

Numbers are stored as the tooltip prints them (rounded to its decimals, so the page's
text is the live viewer's to the character); each token's spike line is stored as text.
"""

from __future__ import annotations

import html
import json
import math

import numpy as np
import pandas as pd

from rlprobe_nb.render.metrics import METRICS, metric_values
from rlprobe_nb.render.page_runtime import STATIC, runtime_script
from rlprobe_nb.render.spike_marks import spike_records
from rlprobe_nb.render.token_pane import PANE_CSS, pack_layer, pane_script
from rlprobe_nb.render.tokens_html import STYLE, spike_line

PAGE_VIEWER_JS = (STATIC / "page_viewer.js").read_text(encoding="utf-8")
PAGE_CSS = """
.rp-page-viewer{font:13px sans-serif;color:#111;margin:6px 0}
.rp-pv-about{font-size:12px;color:#333;margin:2px 0 6px 0;max-width:60em}
.rp-pv-bar{display:flex;flex-wrap:wrap;gap:6px 14px;align-items:center;margin:4px 0}
.rp-pv-bar label{display:flex;gap:6px;align-items:center;max-width:100%}
.rp-pv-bar select{max-width:min(40em, 100%);font:13px sans-serif}
.rp-pv-step input{width:14em}
.rp-pv-note{color:#333}
.rp-pv-missing{display:none;background:#fff4d6;border:1px solid #e0b000;padding:6px 10px;margin:6px 0}
.rp-token-details table td{padding:1px 8px 1px 0;vertical-align:top}
"""


def _fixed(values, decimals: int) -> list:
    """Each value as the tooltip prints it (``f"{x:.{decimals}f}"``), read back as a number;
    None where it is not finite."""
    out = []
    for x in np.asarray(values, dtype=np.float64).tolist():
        out.append(float(f"{x:.{decimals}f}") if math.isfinite(x) else None)
    return out


def _ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).tolist()]


def _flat(column) -> list:
    """A column of lists as one flat list."""
    return [v for row in column for v in (row.tolist() if hasattr(row, "tolist") else list(row))]


def _topk(rows: pd.DataFrame, ids: str, ps: str, vocab: set) -> dict:
    """Every token's top-k (k ids and k probabilities a token, flat), the ids added to ``vocab``."""
    widths = {len(r) for r in rows[ids]}
    if len(widths) > 1:
        raise ValueError(f"{ids}: top-k lists of several lengths {sorted(widths)}")
    flat_ids = _ints(_flat(rows[ids]))
    vocab.update(flat_ids)
    return {"k": widths.pop() if widths else 0, "ids": flat_ids, "p": _fixed(_flat(rows[ps]), 3)}


def _categories(values, names: list[str]) -> list[int]:
    """Each token's category as an index into ``names`` (-1: none), ``names`` grown as needed."""
    out = []
    for c in values:
        if c is None or (not isinstance(c, str) and pd.isna(c)):
            out.append(-1)
            continue
        if str(c) not in names:
            names.append(str(c))
        out.append(names.index(str(c)))
    return out


def step_record(app, checkpoint: str, rollout_id: str, scale, vocab: set, categories: list[str]) -> dict:
    """One checkpoint's numbers and paint of one rollout."""
    rows = app.rows(checkpoint, rollout_id)
    pieces = app.pieces(checkpoint, rollout_id)
    values = metric_values(rows, scale.metric)
    outlined, dim = app.marks(pieces)
    spikes = spike_records(app.spikes, checkpoint, rows)
    logp_ckpt, logp_ref = rows.logp_ckpt.to_numpy(np.float64), rows.logp_ref.to_numpy(np.float64)
    return {"key": checkpoint, "step": app.steps[checkpoint], "label": app.layer_label(checkpoint),
            "layer": pack_layer(checkpoint, app.layer_label(checkpoint), scale.colours(values),
                                scale.text_colours(values), outlined, dim),
            "value": _fixed(values, 4), "logp": _fixed(logp_ckpt, 4), "dlogp": _fixed(logp_ckpt - logp_ref, 4),
            "rank": _ints(rows.rank_ckpt), "entropy": _fixed(rows.entropy_ckpt, 4),
            "kl_ref_ckpt": _fixed(rows.kl_ref_ckpt, 4), "kl_ckpt_ref": _fixed(rows.kl_ckpt_ref, 4),
            "js": _fixed(rows.js, 4), "category": _categories(pieces.category, categories),
            "spike": {str(p): spike_line(s) for p, s in spikes.items()},
            "topk": _topk(rows, "topk_ids_ckpt", "topk_p_ckpt", vocab)}


def rollout_record(app, rollout_id: str, scale, links: list[dict], vocab: set, categories: list[str]) -> dict:
    """One rollout: its tokens, the reference's numbers, and every checkpoint's."""
    final = app.checkpoints[-1]
    rows = app.rows(final, rollout_id)
    pieces = app.pieces(final, rollout_id)
    meta = app.rollout_facts(rollout_id)
    return {"id": rollout_id, "facts": meta, "links": links, "texts": list(pieces.text), "pos": _ints(pieces.pos),
            "token_id": _ints(rows.token_id),
            "ref": {"logp": _fixed(rows.logp_ref, 4), "rank": _ints(rows.rank_ref),
                    "entropy": _fixed(rows.entropy_ref, 4), "topk": _topk(rows, "topk_ids_ref", "topk_p_ref", vocab)},
            "steps": [step_record(app, ck, rollout_id, scale, vocab, categories) for ck in app.checkpoints]}


def held_rollouts(app, linked: pd.DataFrame | None) -> dict[str, list[dict]]:
    """Rollout -> the tokens other pages link to in it (pos, why): the opening rollout
    first, then each linked one."""
    held: dict[str, list[dict]] = {app.rollout.value: []}
    if linked is not None:
        for t in linked.itertuples(index=False):
            if t.rollout_id in app.known_rollouts():
                held.setdefault(t.rollout_id, []).append({"pos": int(t.pos), "why": str(t.why)})
    return held


def page_data(app, linked: pd.DataFrame | None = None) -> dict:
    """Everything the page's script needs, for the rollouts ``held_rollouts`` names."""
    scale = app.scale()
    vocab: set[int] = set()
    categories: list[str] = []
    rollouts = [rollout_record(app, rid, scale, links, vocab, categories)
                for rid, links in held_rollouts(app, linked).items()]
    return {"metric": scale.metric, "metric_short": METRICS[scale.metric].short, "legend": scale.legend_html(),
            "categories": categories, "vocab": {str(i): app.decode(i) for i in sorted(vocab)},
            "opening": {"rollout": app.rollout.value, "pos": app.selected}, "rollouts": rollouts}


def _script_json(value) -> str:
    """``value`` as JSON that cannot end or open anything inside a ``<script>``."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def about_html(data: dict) -> str:
    """What the page's viewer holds and does, in words."""
    others = len(data["rollouts"]) - 1
    held = "the rollout it opens on"
    if others:
        rollouts = "other rollout" if others == 1 else f"{others} other rollouts"
        held += f" and the {rollouts} other chapters' pages link to"
    return (f"<div class='rp-pv-about'>This page has no kernel: its viewer holds {held}, at every step, "
            f"coloured by {html.escape(data['metric_short'])} on the suite's shared scale. Hover a token for its "
            "numbers, click it for its values over steps and both models' top-k, search the text, move "
            "through the steps, step through the spikes. Other rollouts, metrics, scales and filters, and "
            "comparing two checkpoints, need the live viewer (this notebook in JupyterLab).</div>")


def page_viewer_html(app, linked: pd.DataFrame | None = None) -> str:
    """The viewer for a page without a kernel (see the module doc), self-contained."""
    data = page_data(app, linked)
    return (f"{STYLE}<style>{PANE_CSS}{PAGE_CSS}</style>{runtime_script()}"
            f"<div class='rp-page-viewer'>{about_html(data)}"
            f"<script type='application/json' class='rp-viewer-data'>{_script_json(data)}</script></div>"
            f"<script>{pane_script()}</script><script>{PAGE_VIEWER_JS}</script>")

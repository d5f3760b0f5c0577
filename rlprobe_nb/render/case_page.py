"""A case study as HTML, and the page of all of them (``figures/<suite>/case_studies.html``).

One case: the problem, the gold answer, the reference's answer and failure type, every
model's own answers, a caption written from the numbers, the response coloured at the final
checkpoint, the tokens around the case as one row per step (small multiples on the shared
scale), both KL directions and the reference's entropy along the response (inline SVG), and
the top-5 alternatives of both models at the case for every step.

Every number from a table is wrapped in ``<span class="rp-num" data-src='{...}'>`` naming
its table, row and column, so a test can read each one back and compare it with the table.
Each case links to the live viewer at its rollout and token (``viewer_links``). The page is
self-contained: inline CSS and SVG, the page runtime's inline script (tooltips that stay
inside the window), no network.
"""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, Mapping

import pandas as pd

from rlprobe_nb.render.charts import kl_trace_chart, svg
from rlprobe_nb.render.colour_scale import ColourScale
from rlprobe_nb.render.metrics import metric_values
from rlprobe_nb.render.page_runtime import runtime_script
from rlprobe_nb.render.spike_marks import field, spike_records
from rlprobe_nb.render.tokens_html import (
    STYLE,
    Decoder,
    make_decoder,
    paint,
    prepare,
    show_token,
)
from rlprobe_nb.render.viewer_links import link as viewer_link

if TYPE_CHECKING:
    from rlprobe_nb.render.case_studies import Case

PAGE_STYLE = """<style>
body{font-family:sans-serif;max-width:1000px;margin:16px auto;padding:0 12px;color:#111}
.rp-case{border-top:2px solid #333;margin-top:28px;padding-top:6px}
.rp-facts td,.rp-facts th,.rp-table td,.rp-table th{padding:2px 8px;text-align:left;vertical-align:top;
 border-bottom:1px solid #ddd;font-size:13px}
.rp-facts pre{white-space:pre-wrap;margin:0;font-size:13px}
.rp-caption{font-size:14px;line-height:1.5;max-width:900px}
.rp-table code{white-space:pre}
</style>"""


def num(value, fmt: str, **src) -> str:
    """A number from a table, formatted with ``fmt`` and tagged with its source."""
    tag = html.escape(json.dumps(src, sort_keys=True, default=str), quote=True)
    return f'<span class="rp-num" data-src="{tag}">{format(value, fmt)}</span>'


def _pos(case: Case) -> str:
    return num(case.pos, "d", table="case", case=case.number, col="pos")


def _e(text) -> str:
    return html.escape("" if text is None or (not isinstance(text, str) and pd.isna(text)) else str(text))


def _tok(case: Case, row, col: str, fmt: str) -> str:
    return num(getattr(row, col), fmt, table="tokens", checkpoint=row.checkpoint,
               rollout_id=case.rollout_id, pos=int(row.pos), col=col)


def _step(case: Case, row) -> str:
    return num(int(row.step), "d", table="tokens", checkpoint=row.checkpoint, rollout_id=case.rollout_id,
               pos=int(row.pos), col="step")


def facts_html(case: Case) -> str:
    """The problem, the gold answer, the reference's answer and failure type."""
    right = {True: " (right)", False: " (wrong)"}.get(None if case.ref_correct is None else bool(case.ref_correct), "")
    rows = [("problem", f"<pre>{_e(case.problem)}</pre>"), ("gold answer", f"<code>{_e(case.gold)}</code>"),
            ("reference's answer", f"<code>{_e(case.ref_answer)}</code>{right}; failure type: {_e(case.failure_type)}"),
            ("rollout, token", f"{_e(case.rollout_id)}, position {_pos(case)} "
                               f"({viewer_link(case.rollout_id, case.pos, checkpoint=case.checkpoint)})")]
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="rp-facts">{body}</table>'


def answers_html(case: Case) -> str:
    """Each model's own answers to the problem (samples, right, answers given)."""
    if case.answers.empty:
        return "<p>(no answers table given)</p>"
    src = dict(table="answers", problem_id=case.problem_id)
    out = []
    for r in case.answers.itertuples(index=False):
        given = ", ".join(f"<code>{_e(a)}</code> ×{num(int(n), 'd', **src, model=r.model, agg='count', answer=a)}"
                          for a, n in r.answers)
        out.append(f"<tr><td>{_e(r.model)}</td><td>{num(r.n, 'd', **src, model=r.model, agg='n')}</td>"
                   f"<td>{num(r.n_correct, 'd', **src, model=r.model, agg='n_correct')}</td><td>{given}</td></tr>")
    return ('<table class="rp-table"><tr><th>model</th><th>samples</th><th>right</th><th>answers given</th></tr>'
            + "".join(out) + "</table>")


def _spike_at(case: Case, checkpoint: str) -> dict | None:
    """The case's row of the spikes table at this step (a spike there or not), if any."""
    rows = case.spike_steps[case.spike_steps.checkpoint == checkpoint] if len(case.spike_steps) else case.spike_steps
    return None if rows.empty else rows.iloc[0].to_dict()


def _is_spike(spike: dict | None) -> bool:
    return spike is not None and bool(spike.get("significant", True))


def caption_html(case: Case, decode: Decoder) -> str:
    """What the numbers say about this case, written from them."""
    row = case.final_rows[case.final_rows.pos == case.pos].iloc[0]
    tok = f"<code>{_e(show_token(_text(case, row)))}</code>"
    where = (f"At token {_pos(case)} ({tok}) of this response, the final "
             f"checkpoint ({_e(case.checkpoint)}, step {_step(case, row)}) gives the written token "
             f"log p {_tok(case, row, 'logp_ckpt', '+.3f')} against the reference's {_tok(case, row, 'logp_ref', '+.3f')} "
             f"(rank {_tok(case, row, 'rank_ref', 'd')} → {_tok(case, row, 'rank_ckpt', 'd')}). "
             f"KL(ref‖ckpt), how surprised the checkpoint is by what the reference would write, is "
             f"{_tok(case, row, 'kl_ref_ckpt', '.3f')} nats; KL(ckpt‖ref), how surprised the reference is by "
             f"what the checkpoint would write, {_tok(case, row, 'kl_ckpt_ref', '.3f')}; the reference's "
             f"entropy here is {_tok(case, row, 'entropy_ref', '.3f')} nats. ")
    top_c, top_r = int(row.topk_ids_ckpt[0]), int(row.topk_ids_ref[0])
    wants = (f"The checkpoint's first choice is <code>{_e(show_token(decode(top_c)))}</code> (p = "
             f"{_topk(case, row, 'topk_p_ckpt', 0)}), the reference's <code>{_e(show_token(decode(top_r)))}</code> "
             f"(p = {_topk(case, row, 'topk_p_ref', 0)}). ")
    spike = _spike_at(case, case.checkpoint)
    if case.kind == "control":
        verdict = (f"A quiet control: never a spike at any step, chosen because its reference entropy is close "
                   f"to that of case {case.matched_to}.")
    elif case.kind == "departure":
        verdict = ("Chosen as one of the strongest departures by symmetric KL: the detector found no "
                   "spike at any step, so this is a large change, not a significant one.")
    elif not _is_spike(spike):
        verdict = "Not a spike at the final checkpoint."
    else:
        sp = dict(table="spikes", checkpoint=case.checkpoint, rollout_id=case.rollout_id, pos=case.pos)
        verdict = (f"The detector flags it as a spike that {_e(field(spike, 'sign'))} the written token, "
                   f"category “{_e(field(spike, 'category'))}” (q = {num(spike['q'], '.3g', **sp, col='q')})")
        if field(spike, "onset") is not None:
            verdict += (f", first significant at step {num(int(spike['onset_step']), 'd', **sp, col='onset_step')}"
                        f" and {_e(field(spike, 'persistence'))} from there on")
        verdict += "."
    return f'<p class="rp-caption">{where}{wants}{verdict}</p>'


def _topk(case: Case, row, col: str, j: int) -> str:
    return num(float(getattr(row, col)[j]), ".3f", table="tokens", checkpoint=row.checkpoint,
               rollout_id=case.rollout_id, pos=int(row.pos), col=col, index=j)


def _text(case: Case, row) -> str:
    return case.response[row.char_start:row.char_end] if case.response is not None else row.token


def _coloured(rows: pd.DataFrame, case: Case, scale: ColourScale, decode: Decoder, spikes, checkpoint,
              flex: bool = False) -> str:
    """The rows' tokens coloured, in a box that names its checkpoint and rollout."""
    pieces = prepare(rows, decode, case.response, spike_records(spikes, checkpoint, rows))
    body = paint(pieces, metric_values(rows.sort_values("pos"), scale.metric), scale, selected=case.pos)
    style = ' style="flex:1"' if flex else ""
    return (f'<div class="rp-resp" data-checkpoint="{_e(checkpoint)}" data-rollout="{_e(case.rollout_id)}"'
            f"{style}>{body}</div>")


def small_multiples_html(case: Case, scale: ColourScale, decode: Decoder, spikes) -> str:
    """The tokens around the case, one row per step, on the shared scale."""
    out = []
    for ckpt, rows in case.window.groupby("checkpoint", sort=False):
        step = _step(case, rows.iloc[0])
        out.append(f'<div class="rp-row"><span class="rp-label">step {step}</span>'
                   f'{_coloured(rows, case, scale, decode, spikes, ckpt, flex=True)}</div>')
    return "".join(out)


def topk_html(case: Case, decode: Decoder, k: int = 5) -> str:
    """The top-k alternatives of both models at the case's position, at every step."""
    def cell(row, ids: str, ps: str) -> str:
        return "<br>".join(f"<code>{_e(show_token(decode(int(i))))}</code> {_topk(case, row, ps, j)}"
                           for j, i in enumerate(list(getattr(row, ids))[:k]))
    out = []
    for row in case.at_pos.itertuples(index=False):
        spike = _spike_at(case, row.checkpoint)
        sp = dict(table="spikes", checkpoint=row.checkpoint, rollout_id=case.rollout_id, pos=case.pos)
        flag = "—" if spike is None else f"q {num(spike['q'], '.3g', **sp, col='q')}"
        flag = f"{_e(field(spike, 'sign'))}, {flag}" if _is_spike(spike) else f"not significant ({flag})" if spike else flag
        out.append(f"<tr><td>{_step(case, row)}</td><td>{_tok(case, row, 'dlogp', '+.3f')}</td>"
                   f"<td>{_tok(case, row, 'rank_ckpt', 'd')}</td><td>{flag}</td>"
                   f"<td>{cell(row, 'topk_ids_ref', 'topk_p_ref')}</td><td>{cell(row, 'topk_ids_ckpt', 'topk_p_ckpt')}</td></tr>")
    head = ("<tr><th>step</th><th>Δlogp</th><th>rank (ckpt)</th><th>spike</th>"
            f"<th>reference top-{k}</th><th>checkpoint top-{k}</th></tr>")
    return f'<table class="rp-table">{head}{"".join(out)}</table>'


def case_html(case: Case, scale: ColourScale, decode: Decoder | Mapping[int, str] | None = None,
              spikes: pd.DataFrame | None = None, trace: bool = True) -> str:
    """One case as a self-contained HTML fragment."""
    decode = make_decoder(decode, case.final_rows)
    title = f"Case {case.number}: {_e(case.reason)}"
    parts = [STYLE, runtime_script(), f'<div class="rp-case"><h2>{title}</h2>', facts_html(case),
             "<h3>Every model's own answers to this problem</h3>", answers_html(case),
             caption_html(case, decode),
             f"<h3>The response at the final checkpoint ({_e(case.checkpoint)})</h3>", scale.legend_html(),
             _coloured(case.final_rows, case, scale, decode, spikes, case.checkpoint),
             f"<h3>The tokens around position {_pos(case)}, one row per step</h3>",
             small_multiples_html(case, scale, decode, spikes)]
    if trace:
        chart = kl_trace_chart(case.final_rows, case.pos, title=f"{case.checkpoint} vs the reference")
        parts += ["<h3>Both KL directions and the reference's entropy along the response</h3>", svg(chart)]
    parts += [f"<h3>What each model wanted at position {_pos(case)}, step by step</h3>", topk_html(case, decode),
              "</div>"]
    return "".join(parts)


def case_studies_page(cases: list[Case], scale: ColourScale, decode: Decoder | Mapping[int, str] | None = None,
                      spikes: pd.DataFrame | None = None, title: str = "Case studies", intro: str = "") -> str:
    """The whole page: every case, one shared colour scale, as one HTML document."""
    body = "".join(case_html(c, scale, decode, spikes) for c in cases)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title>{PAGE_STYLE}{STYLE}{runtime_script()}</head><body><h1>{_e(title)}</h1>"
            f"<p>{_e(intro)}</p>{body}</body></html>")

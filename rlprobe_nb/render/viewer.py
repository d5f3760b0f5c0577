"""The live viewer: a response's tokens coloured by a chosen metric, opened with one call.

    from rlprobe_nb.render import viewer
    viewer.open_viewer(tokens, spikes, decode=tok.decode, responses=texts)

Pick a group and a problem (or all), then a rollout from a list ranked by how far the final
checkpoint departs from the reference in it; a training step (a slider with play, or ← →
with the response focused) or two checkpoints to compare; the metric; the scale (shared by
the whole suite or fitted to this rollout, linear or symmetric-log, clipped at a quantile);
the q-value at which spikes are outlined (spikes significant at their step whose q is at
most it: a threshold above the spike chapter's own q adds none); a category to keep in
view. Only the controls that apply are shown (compare's two checkpoints in compare mode,
the spike controls where the suite has spikes). Hover a token for its numbers (a tooltip
that stays inside the window); click one, type its position, or step through the spikes
(n / p, "next spike") to see its series over steps and both models' top-k at every step;
search the text to outline every token of a match.

"Next spike" says when the step shown has none, and offers the nearest step that has.

The response is drawn by :class:`token_pane.TokenPane` (an anywidget): a change of step
sends only the new colours, about 8 bytes a token. In a static HTML export, where no kernel
runs the widgets, the viewer's output is the viewer for a page (``page_viewer``, the
``text/html`` fallback of its display bundle): the same pane over the numbers of the
opening rollout and of the rollouts other pages link to (``linked``), at every step.
"""

from __future__ import annotations

import contextlib
import html
from typing import Mapping

import numpy as np
import pandas as pd

from rlprobe_nb.render.charts import series_chart, svg
from rlprobe_nb.render.colour_scale import ColourScale, fit_scale, shared_scale
from rlprobe_nb.render.metrics import DEFAULT_METRIC, METRICS, metric_values
from rlprobe_nb.render.page_runtime import runtime_script
from rlprobe_nb.render.page_viewer import page_viewer_html
from rlprobe_nb.render.rollout_ranking import rank_rollouts, ranked_label
from rlprobe_nb.render.spike_marks import spike_records
from rlprobe_nb.render.token_pane import pack_layer
from rlprobe_nb.render.tokens_html import (
    STYLE,
    Decoder,
    TokenPieces,
    _Labels,
    make_decoder,
    paint,
    prepare,
    show_token,
    tooltip_text,
)
from rlprobe_nb.render.viewer_controls import ALL, build_controls, shown


class Viewer:
    """The app's state and widgets. ``tokens``: every checkpoint against one reference,
    with ``step``; ``spikes``: the spikes table (optional); ``responses``: rollout_id ->
    response text (optional: token texts are used otherwise); ``rollout_id`` and ``token``:
    where to open (a rollout, and a position in it to select); ``linked``: the tokens other
    pages link to (rollout_id, pos, why: ``viewer_targets.linked_targets``), whose rollouts
    the viewer's page holds."""

    def __init__(self, tokens: pd.DataFrame, spikes: pd.DataFrame | None = None,
                 decode: Decoder | Mapping[int, str] | None = None, responses: Mapping[str, str] | None = None,
                 metric: str = DEFAULT_METRIC, quantile: float = 0.99, q: float = 0.05,
                 rollout_id: str | None = None, token: int | None = None, linked: pd.DataFrame | None = None):
        self.tokens = tokens.reset_index(drop=True)
        self.linked = linked
        self.spikes = spikes if spikes is not None else pd.DataFrame(
            columns=["checkpoint", "rollout_id", "pos", "q", "category"])
        self.decode = make_decoder(decode, self.tokens)
        self._labels = _Labels(self.decode)
        self.responses = dict(responses or {})
        steps = self.tokens.groupby("checkpoint")["step"].first()
        self.steps = {str(k): int(v) for k, v in steps.items()}
        self.checkpoints = sorted(self.steps, key=self.steps.get)
        self._rows = self.tokens.groupby(["checkpoint", "rollout_id"], sort=False).indices
        meta_cols = [c for c in ("rollout_id", "problem_id", "group", "failure_type") if c in self.tokens.columns]
        self.rollouts = self.tokens.drop_duplicates("rollout_id")[meta_cols].sort_values("rollout_id")
        self._meta = self.rollouts.set_index("rollout_id")
        self._pieces: dict[tuple[str, str], TokenPieces] = {}
        self._scales: dict[tuple, ColourScale] = {}
        self._rankings: dict[str, pd.DataFrame] = {}
        self._build_widgets(metric, quantile, q)
        if rollout_id is not None:
            self.open(rollout_id, token)
        else:
            self.refresh()

    # -- widgets -------------------------------------------------------------------------
    def _build_widgets(self, metric: str, quantile: float, q: float) -> None:
        groups = sorted(self.rollouts.group.unique()) if "group" in self.rollouts.columns else []
        cats = sorted(map(str, self.spikes.category.dropna().unique())) if "category" in self.spikes.columns else []
        build_controls(self, metric, quantile, q, groups, cats)
        self._holding = 0
        self._fill_problems()
        self.group.observe(lambda _: self._on_group(), "value")
        self.problem.observe(lambda _: self._on_problem(), "value")
        self.rollout.observe(lambda _: self._on_rollout(), "value")
        self.metric.observe(lambda _: self._on_metric(), "value")
        for w in (self.mode, self.step, self.compare_a, self.compare_b, self.scale_kind, self.transform,
                  self.clip, self.q, self.category):
            w.observe(lambda _: self.refresh(), "value")
        self.pane.observe(lambda _: self._on_selected(), "selected")
        self.token.observe(lambda _: self._on_token_typed(), "value")
        self.next_spike.on_click(lambda _: self.jump_to_spike(1))
        self.nearest_step.on_click(lambda _: self._go_to_nearest_spikes())
        self.pane.on_msg(self._on_pane_message)

    @property
    def selected(self) -> int | None:
        """The selected token's position, None when none is."""
        return self.pane.selected if self.pane.selected >= 0 else None

    def select(self, pos: int | None) -> None:
        """Select token ``pos`` of the current rollout (None: none)."""
        self.pane.selected = -1 if pos is None else int(pos)

    def _on_selected(self) -> None:
        self.token.value = "" if self.selected is None else str(self.selected)
        self._show_details()

    def _on_token_typed(self) -> None:
        typed = self.token.value.strip()
        if typed == "":
            self.select(None)
        elif typed.isdigit():
            self.select(int(typed))
        else:  # not a position: show the selection as it is
            self.token.value = "" if self.selected is None else str(self.selected)

    def ranking(self) -> pd.DataFrame:
        """Every rollout ranked by the final checkpoint's largest |metric| in it."""
        m = self.metric.value
        if m not in self._rankings:
            self._rankings[m] = rank_rollouts(self.tokens, m, self.checkpoints[-1])
        return self._rankings[m]

    def _fill_problems(self) -> None:
        r = self.rollouts if self.group.value == ALL else self.rollouts[self.rollouts.group == self.group.value]
        problems = sorted(r.problem_id.unique())
        self.problem.options = [ALL, *problems] if len(problems) > 1 else problems
        self.problem.value = self.problem.options[0] if self.problem.options else None
        self._fill_rollouts()

    def _fill_rollouts(self, keep: str | None = None) -> None:
        ranked = self.ranking()
        if self.problem.value not in (ALL, None):
            ranked = ranked[ranked.problem_id == self.problem.value]
        if self.group.value != ALL and "group" in self._meta.columns:
            ranked = ranked[self._meta.group.reindex(ranked.rollout_id).to_numpy() == self.group.value]
        options = [(ranked_label(r, self.metric.value), r.rollout_id) for r in ranked.itertuples()]
        ids = [rid for _, rid in options]
        self.rollout.options = options
        self.rollout.value = keep if keep in ids else (ids[0] if ids else None)

    @contextlib.contextmanager
    def _hold(self):
        """Change several controls with one recolour at the end."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        self.refresh()

    def _on_group(self) -> None:
        with self._hold():
            self._fill_problems()

    def _on_problem(self) -> None:
        with self._hold():
            self._fill_rollouts()

    def _on_rollout(self) -> None:
        with self._hold():
            self.select(None)  # a position means nothing in another response

    def _on_metric(self) -> None:
        with self._hold():
            self._fill_rollouts(keep=self.rollout.value)

    def open(self, rollout_id: str, token: int | None = None, checkpoint: str | None = None) -> None:
        """Show ``rollout_id`` (every group and problem in the lists), select ``token``,
        and move to ``checkpoint`` if given: what a link from another chapter asks for."""
        if rollout_id not in self._meta.index:
            raise ValueError(f"rollout {rollout_id!r} is not in the token tables")
        with self._hold():
            self.group.value = ALL
            self.problem.value = ALL if ALL in self.problem.options else self._meta.problem_id[rollout_id]
            self.rollout.value = rollout_id
            if checkpoint in self.steps:
                self.mode.value, self.step.value = "step", checkpoint
            self.select(token)

    # -- state -> pictures ---------------------------------------------------------------
    def rows(self, checkpoint: str, rollout_id: str) -> pd.DataFrame:
        return self.tokens.iloc[self._rows[(checkpoint, rollout_id)]].sort_values("pos")

    def pieces(self, checkpoint: str, rollout_id: str) -> TokenPieces:
        key = (checkpoint, rollout_id)
        if key not in self._pieces:
            rows = self.rows(*key)
            self._pieces[key] = prepare(rows, self.decode, self.responses.get(rollout_id),
                                        spike_records(self.spikes, checkpoint, rows))
        return self._pieces[key]

    def scale(self) -> ColourScale:
        """The colour scale the controls ask for: the suite's own (fitted once and cached),
        or fitted to this rollout's rows at every checkpoint."""
        metric, q, transform = self.metric.value, float(self.clip.value), self.transform.value
        if self.scale_kind.value == "shared":
            key = (metric, q)
            if key not in self._scales:
                self._scales[key] = shared_scale(self.tokens, metric, q)
            return self._scales[key].with_options(transform=transform)
        rows = self.tokens[self.tokens.rollout_id == self.rollout.value]
        return fit_scale(metric_values(rows, metric), metric, q, transform,
                         f"Fitted to this rollout alone (all steps): the {q:g} quantile of |value|; "
                         "not comparable with other rollouts.")

    def shown_checkpoints(self) -> list[str]:
        return [self.step.value] if self.mode.value == "step" else [self.compare_a.value, self.compare_b.value]

    def layer_label(self, checkpoint: str) -> str:
        return f"step {self.steps[checkpoint]} · {checkpoint} vs the reference"

    def known_rollouts(self) -> pd.Index:
        """Every rollout of the token tables."""
        return self._meta.index

    def rollout_facts(self, rollout_id: str) -> dict[str, str]:
        """The rollout's problem, group and failure type (those the tables carry)."""
        meta = self._meta.loc[rollout_id]
        return {c: str(meta.get(c)) for c in ("problem_id", "group", "failure_type") if c in meta.index}

    def marks(self, pieces: TokenPieces) -> tuple[np.ndarray, np.ndarray]:
        """Which tokens are outlined (spikes at the q threshold, in the category) and dimmed."""
        outlined = pieces.spike_q <= float(self.q.value)
        dim = np.zeros(len(pieces.pos), dtype=bool)
        if self.category.value != ALL:
            inside = pieces.category == self.category.value
            outlined &= inside
            dim = ~inside
        return outlined, dim

    def layer(self, checkpoint: str, scale: ColourScale) -> dict:
        """One checkpoint's paint of the current rollout, packed for the pane."""
        rid = self.rollout.value
        values = metric_values(self.rows(checkpoint, rid), scale.metric)
        outlined, dim = self.marks(self.pieces(checkpoint, rid))
        return pack_layer(checkpoint, self.layer_label(checkpoint), scale.colours(values), scale.text_colours(values),
                          outlined, dim)

    def refresh(self) -> None:
        """Repaint after any change of state (skipped while a cascade of changes runs)."""
        self._shown_controls()
        if self._holding or self.rollout.value is None:
            return
        rid = self.rollout.value
        n = len(self._rows[(self.checkpoints[-1], rid)])
        facts = [html.escape(v) for v in self.rollout_facts(rid).values()]
        note = "" if len(self.spikes) else " · no spikes table (chapter 05 writes it): nothing is outlined"
        self.info.value = f"<small>{html.escape(rid)}: {n} tokens · {' · '.join(facts)}{note}</small>"
        self._say_spikes(None)
        scale = self.scale()
        texts = self.pieces(self.checkpoints[-1], rid).text
        with self.pane.hold_sync():
            if self.pane.rollout != rid:
                self.pane.rollout, self.pane.texts = rid, list(texts)
            self.pane.legend = scale.legend_html()
            self.pane.layers = [self.layer(ck, scale) for ck in self.shown_checkpoints()]
            self._show_details()

    def _shown_controls(self) -> None:
        step = self.mode.value == "step"
        for w in (self.play, self.step):
            shown(w, step)
        shown(self.compare_row, not step)

    # -- selection -----------------------------------------------------------------------
    def spike_positions(self, checkpoint: str | None = None) -> np.ndarray:
        """Positions outlined (q and category filters) at ``checkpoint`` (default: the one
        shown last), in order."""
        pieces = self.pieces(checkpoint or self.shown_checkpoints()[-1], self.rollout.value)
        return pieces.pos[self.marks(pieces)[0]]

    def jump_to_spike(self, direction: int = 1) -> int | None:
        """Select the next (1) or previous (-1) outlined spike from the selected token,
        wrapping around. None when nothing is outlined at the step shown: the viewer then
        says so, and offers the nearest step of this rollout that has one."""
        found = self.spike_positions()
        self._say_spikes(None if len(found) else self.nearest_step_with_spikes())
        if not len(found):
            return None
        here = -1 if self.selected is None else self.selected
        if direction > 0:
            later = found[found > here]
            self.select(int(later[0] if len(later) else found[0]))
        else:
            earlier = found[(found < here) if here >= 0 else np.ones(len(found), bool)]
            self.select(int(earlier[-1] if len(earlier) else found[-1]))
        return self.selected

    def jump_to_next_spike(self) -> int | None:
        return self.jump_to_spike(1)

    def nearest_step_with_spikes(self) -> str:
        """The checkpoint nearest the one shown last at which this rollout has an outlined
        spike ("" if none has)."""
        here = self.checkpoints.index(self.shown_checkpoints()[-1])
        others = sorted((abs(i - here), i) for i, ck in enumerate(self.checkpoints) if i != here)
        return next((self.checkpoints[i] for _, i in others if len(self.spike_positions(self.checkpoints[i]))), "")

    def _say_spikes(self, nearest: str | None) -> None:
        """The note beside "next spike": none (None), or that the step shown has no spike
        and which step nearest has one ("" if no step has)."""
        shown(self.nearest_step, bool(nearest))
        if nearest is None:
            self.spike_note.value = ""
            return
        step = self.steps[self.shown_checkpoints()[-1]]
        where = (f"; the nearest step with one in this rollout is {self.steps[nearest]}" if nearest
                 else ", nor at any other step of this rollout")
        self.spike_note.value = f"<small>no spike is outlined at step {step}{where}</small>"
        self.nearest_step.description = f"go to step {self.steps[nearest]} ▶" if nearest else ""
        self._nearest = nearest

    def _go_to_nearest_spikes(self) -> None:
        with self._hold():
            if self.mode.value == "step":
                self.step.value = self._nearest
            else:
                self.compare_b.value = self._nearest
        self.jump_to_spike(1)

    def move_step(self, delta: int) -> None:
        """One checkpoint later (1) or earlier (-1), within the ends."""
        if self.mode.value == "step":
            self.step.index = int(np.clip(self.step.index + delta, 0, len(self.checkpoints) - 1))
        else:
            i = self.checkpoints.index(self.compare_b.value)
            self.compare_b.value = self.checkpoints[int(np.clip(i + delta, 0, len(self.checkpoints) - 1))]

    def tooltip(self, checkpoint: str, pos: int) -> str:
        """The tooltip text of token ``pos`` of the current rollout at ``checkpoint``."""
        rid = self.rollout.value
        rows = self.rows(checkpoint, rid)
        row = rows[rows.pos == pos]
        if row.empty:
            return f"no token at position {pos}"
        pieces = self.pieces(checkpoint, rid)
        j = int(np.flatnonzero(pieces.pos == pos)[0])
        spike = spike_records(self.spikes, checkpoint, row).get(int(pos))
        return tooltip_text(next(row.itertuples(index=False)), pieces.text[j], self._labels, spike,
                            pieces.category[j])

    def _on_pane_message(self, _widget, content, _buffers) -> None:
        kind = content.get("type")
        if kind == "tip":
            layers = self.pane.layers
            li = int(content.get("layer", 0))
            if 0 <= li < len(layers):
                key, pos = layers[li]["key"], int(content["pos"])
                self.pane.send({"type": "tip", "rollout": self.pane.rollout, "key": key, "pos": pos,
                                "text": self.tooltip(key, pos)})
        elif kind == "step":
            self.move_step(int(content.get("delta", 1)))
        elif kind == "spike":
            self.jump_to_spike(int(content.get("delta", 1)))
        elif kind == "open" and content.get("rollout") in self._meta.index:
            self.open(content["rollout"], content.get("pos"), content.get("checkpoint"))

    def _show_details(self) -> None:
        if self._holding:
            return
        pos = self.selected
        self.pane.details = self.details_html(pos) if pos is not None and self.rollout.value is not None else ""

    def series(self, pos: int) -> pd.DataFrame:
        """One token of the current rollout at every checkpoint, in step order."""
        rid = self.rollout.value
        at = [self.tokens.iloc[self._rows[(ck, rid)]] for ck in self.checkpoints]
        rows = pd.concat([df[df.pos == pos] for df in at])
        return rows.assign(value=metric_values(rows, self.metric.value)).sort_values("step")

    def details_html(self, pos: int) -> str:
        """A selected token: its metric over steps (a small chart) and both top-k lists."""
        rows = self.series(pos)
        if rows.empty:
            return f"<p>no token at position {pos}</p>"
        text = html.escape(show_token(rows.token.iloc[0]))
        chart = svg(series_chart(rows[["step", "value"]], self.metric.value,
                                 title=f"position {pos}: {show_token(rows.token.iloc[0])} over RL steps"))
        fmt = lambda ids, ps: "  ".join(f"{show_token(self.decode(int(i)))} {p:.3f}" for i, p in zip(ids, ps))
        ref = rows.iloc[-1]
        lines = [f"<tr><td>reference</td><td></td><td><code>{html.escape(fmt(ref.topk_ids_ref, ref.topk_p_ref))}</code></td></tr>"]
        for r in rows.itertuples(index=False):
            lines.append(f"<tr><td>step {int(r.step)}</td><td>{r.value:+.4f}</td>"
                         f"<td><code>{html.escape(fmt(r.topk_ids_ckpt, r.topk_p_ckpt))}</code></td></tr>")
        table = ("<table style='font-size:12px'><tr><th></th><th>" + html.escape(METRICS[self.metric.value].short)
                 + "</th><th>top-k (token p)</th></tr>" + "".join(lines) + "</table>")
        return (f"<div class='rp-token-details' data-pos='{int(pos)}'><b>token {pos}: <code>{text}</code></b>"
                f"<div style='display:flex;gap:16px;flex-wrap:wrap'>{chart}{table}</div></div>")

    # -- static renderings ---------------------------------------------------------------
    def response_fragment(self, checkpoint: str, scale: ColourScale) -> str:
        rid = self.rollout.value
        pieces = self.pieces(checkpoint, rid)
        values = metric_values(self.rows(checkpoint, rid), scale.metric)
        selected = self.selected
        cat = None if self.category.value == ALL else self.category.value
        body = paint(pieces, values, scale, float(self.q.value), cat, selected)
        return (f'<div class="rp-resp" data-checkpoint="{html.escape(checkpoint)}" data-rollout="{html.escape(rid)}"'
                f' style="max-height:28em;overflow-y:auto">{body}</div>')

    def render_html(self) -> str:
        """The coloured response(s) for the current state, with the legend (static HTML)."""
        scale = self.scale()
        parts = [STYLE, runtime_script(), scale.legend_html()]
        for ck in self.shown_checkpoints():
            parts.append(f'<div style="font:12px sans-serif;margin-top:4px">{html.escape(self.layer_label(ck))}</div>')
            parts.append(self.response_fragment(ck, scale))
        return "".join(parts)

    def static_html(self, checkpoints: list[str] | None = None) -> str:
        """What a page without a kernel shows: the current rollout coloured at the current
        step (or at the two ``checkpoints``, one above the other), tooltips included, and
        the selected token's details."""
        head = html.escape(f"rollout {self.rollout.value} (problem {self._meta.problem_id[self.rollout.value]})")
        details = self.details_html(self.selected) if self.selected is not None else ""
        if checkpoints is None:
            return f"<div><div style='font:13px sans-serif'>{head}</div>{self.render_html()}{details}</div>"
        mode, a, b = self.mode.value, self.compare_a.value, self.compare_b.value
        try:
            with self._hold():  # borrow the compare view, then put the controls back
                self.mode.value, self.compare_a.value, self.compare_b.value = "compare", *checkpoints
                body = self.render_html()
        finally:
            with self._hold():
                self.mode.value, self.compare_a.value, self.compare_b.value = mode, a, b
        return f"<div><div style='font:13px sans-serif'>{head}</div>{body}</div>"

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/html"] = page_viewer_html(self, self.linked)
        return bundle


def default_rollout(tokens: pd.DataFrame, spikes: pd.DataFrame | None = None) -> str:
    """The rollout to open on: the most spikes at the final checkpoint (ties: the larger
    |Δlogp| there), or without spikes the one with the largest |Δlogp| at the final checkpoint."""
    final = tokens.groupby("checkpoint")["step"].first().idxmax()
    rows = tokens[tokens.checkpoint == final]
    strongest = pd.Series(np.abs(metric_values(rows, "dlogp")), index=rows.index).groupby(rows.rollout_id).max()
    score = pd.DataFrame({"strongest": strongest, "spikes": 0})
    if spikes is not None and len(spikes):
        counts = spikes[spikes.checkpoint == final].groupby("rollout_id").size()
        score["spikes"] = counts.reindex(score.index).fillna(0)
    return str(score.sort_values(["spikes", "strongest"], ascending=False).index[0])


def open_viewer(tokens: pd.DataFrame, spikes: pd.DataFrame | None = None,
                decode: Decoder | Mapping[int, str] | None = None, responses: Mapping[str, str] | None = None,
                **options) -> Viewer:
    """Build the viewer (options: metric, quantile, q, rollout_id, token); the notebook
    displays it as the cell's value."""
    return Viewer(tokens, spikes, decode, responses, **options)

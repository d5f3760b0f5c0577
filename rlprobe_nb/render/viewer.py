"""The live viewer: a response's tokens coloured by a chosen metric, opened with one call.

    from rlprobe_nb import viewer
    viewer.open_viewer(tokens, spikes, decode=tok.decode, responses=texts)

Pick a group, a problem and one of its rollouts; a training step (a slider with play) or
two checkpoints to compare; the metric; the scale (shared by the whole suite or fitted to
this rollout, linear or symmetric-log, clipped at a quantile); the q-value at which spikes
are outlined (spikes significant at their step whose q is at most it: a threshold above the
spike chapter's own q adds none); a category to keep in view. Hovering a token shows its tooltip (CSS, so it
also works in an exported page); selecting a token (its position, or "next spike") shows
its series over steps and both models' top-k lists at every step.

Recolouring is a join of pre-escaped pieces: each (checkpoint, rollout)'s token texts and
tooltips are prepared once and cached, and a state change only recomputes colours. In a
static HTML export, where no kernel runs the widgets, the viewer's output shows the static
rendering of its current rollout instead (a ``text/html`` fallback in its display bundle).
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
from rlprobe_nb.render.spike_marks import spike_records
from rlprobe_nb.render.tokens_html import (
    STYLE,
    Decoder,
    TokenPieces,
    make_decoder,
    paint,
    prepare,
    show_token,
)

ALL = "(all)"
Q_CHOICES = [0.001, 0.01, 0.05, 0.1]


class Viewer:
    """The app's state and widgets. ``tokens``: every checkpoint against one reference,
    with ``step``; ``spikes``: the spikes table (optional); ``responses``: rollout_id ->
    response text (optional: token texts are used otherwise)."""

    def __init__(self, tokens: pd.DataFrame, spikes: pd.DataFrame | None = None,
                 decode: Decoder | Mapping[int, str] | None = None, responses: Mapping[str, str] | None = None,
                 metric: str = DEFAULT_METRIC, quantile: float = 0.99, q: float = 0.05,
                 rollout_id: str | None = None):
        self.tokens = tokens.reset_index(drop=True)
        self.spikes = spikes if spikes is not None else pd.DataFrame(
            columns=["checkpoint", "rollout_id", "pos", "q", "category"])
        self.decode = make_decoder(decode, self.tokens)
        self.responses = dict(responses or {})
        steps = self.tokens.groupby("checkpoint")["step"].first()
        self.steps = {str(k): int(v) for k, v in steps.items()}
        self.checkpoints = sorted(self.steps, key=self.steps.get)
        self._rows = self.tokens.groupby(["checkpoint", "rollout_id"], sort=False).indices
        meta_cols = [c for c in ("rollout_id", "problem_id", "group", "failure_type") if c in self.tokens.columns]
        self.rollouts = self.tokens.drop_duplicates("rollout_id")[meta_cols].sort_values("rollout_id")
        self._pieces: dict[tuple[str, str], TokenPieces] = {}
        self._scales: dict[tuple, ColourScale] = {}
        self._build_widgets(metric, quantile, q)
        if rollout_id is not None:
            self._choose_rollout(rollout_id)  # recolours
        else:
            self.refresh()

    # -- widgets -------------------------------------------------------------------------
    def _build_widgets(self, metric: str, quantile: float, q: float) -> None:
        import ipywidgets as W

        groups = sorted(self.rollouts.group.unique()) if "group" in self.rollouts.columns else []
        cats = sorted(map(str, self.spikes.category.dropna().unique())) if "category" in self.spikes.columns else []
        ck = [(f"step {self.steps[c]} · {c}", c) for c in self.checkpoints]
        self.group = W.Dropdown(options=[ALL, *groups], description="group")
        self.problem = W.Dropdown(description="problem")
        self.rollout = W.Dropdown(description="rollout")
        self.mode = W.ToggleButtons(options=["step", "compare"], value="step", description="view")
        self.step = W.SelectionSlider(options=ck, value=self.checkpoints[-1], description="checkpoint",
                                      continuous_update=False, layout=W.Layout(width="420px"))
        self.play = W.Play(min=0, max=len(ck) - 1, value=len(ck) - 1, interval=1200, description="play")
        W.link((self.play, "value"), (self.step, "index"))
        self.compare_a = W.Dropdown(options=ck, value=self.checkpoints[0], description="A")
        self.compare_b = W.Dropdown(options=ck, value=self.checkpoints[-1], description="B")
        self.metric = W.Dropdown(options=[(m.short, m.name) for m in METRICS.values()], value=metric,
                                 description="metric")
        self.scale_kind = W.ToggleButtons(options=["shared", "per-rollout"], value="shared", description="scale")
        self.transform = W.ToggleButtons(options=["linear", "log"], value="linear")
        self.clip = W.FloatSlider(value=quantile, min=0.9, max=1.0, step=0.005, readout_format=".3f",
                                  description="clip at q", continuous_update=False)
        self.q = W.Dropdown(options=Q_CHOICES, value=q, description="spikes q ≤")
        self.category = W.Dropdown(options=[ALL, *cats], description="category")
        self.next_spike = W.Button(description="next spike ▶")
        self.token = W.BoundedIntText(value=-1, min=-1, max=10**7, description="token pos",
                                      tooltip="-1: none selected")
        self.info = W.HTML()
        self.html = W.HTML()
        self.details = W.HTML()
        self.widget = W.VBox([
            W.HBox([self.group, self.problem, self.rollout]), self.info,
            W.HBox([self.mode, self.play, self.step]), W.HBox([self.compare_a, self.compare_b]),
            W.HBox([self.metric, self.scale_kind, self.transform, self.clip]),
            W.HBox([self.q, self.category, self.next_spike, self.token]), self.html, self.details])
        self._holding = 0
        self._fill_problems()
        self.group.observe(lambda _: self._on_group(), "value")
        self.problem.observe(lambda _: self._on_problem(), "value")
        self.rollout.observe(lambda _: self._on_rollout(), "value")
        for w in (self.mode, self.step, self.compare_a, self.compare_b, self.metric,
                  self.scale_kind, self.transform, self.clip, self.q, self.category):
            w.observe(lambda _: self.refresh(), "value")
        self.token.observe(lambda _: self.refresh(), "value")
        self.next_spike.on_click(lambda _: self.jump_to_next_spike())

    def _fill_problems(self) -> None:
        r = self.rollouts if self.group.value == ALL else self.rollouts[self.rollouts.group == self.group.value]
        self.problem.options = sorted(r.problem_id.unique())
        self.problem.value = self.problem.options[0] if self.problem.options else None
        self._fill_rollouts()

    def _fill_rollouts(self) -> None:
        r = self.rollouts[self.rollouts.problem_id == self.problem.value]
        if self.group.value != ALL:
            r = r[r.group == self.group.value]
        self.rollout.options = list(r.rollout_id)
        self.rollout.value = self.rollout.options[0] if self.rollout.options else None

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
            self.token.value = -1  # a position means nothing in another response

    def _choose_rollout(self, rollout_id: str) -> None:
        meta = self.rollouts.set_index("rollout_id").loc[rollout_id]
        with self._hold():
            self.group.value = ALL
            self.problem.value = meta.problem_id
            self.rollout.value = rollout_id

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

    def response_fragment(self, checkpoint: str, scale: ColourScale) -> str:
        rid = self.rollout.value
        pieces = self.pieces(checkpoint, rid)
        values = metric_values(self.rows(checkpoint, rid), scale.metric)
        selected = self.token.value if self.token.value >= 0 else None
        cat = None if self.category.value == ALL else self.category.value
        body = paint(pieces, values, scale, float(self.q.value), cat, selected)
        return f'<div class="rp-resp" style="max-height:28em;overflow-y:auto">{body}</div>'

    def render_html(self) -> str:
        """The coloured response(s) for the current state, with the legend."""
        scale = self.scale()
        parts = [STYLE, scale.legend_html()]
        for ck in self.shown_checkpoints():
            label = f"step {self.steps[ck]} · {html.escape(ck)} vs the reference"
            parts.append(f'<div style="font:12px sans-serif;margin-top:4px">{label}</div>')
            parts.append(self.response_fragment(ck, scale))
        return "".join(parts)

    def refresh(self) -> None:
        """Recolour after any change of state (skipped while a cascade of changes runs)."""
        if self._holding or self.rollout.value is None:
            return
        meta = self.rollouts.set_index("rollout_id").loc[self.rollout.value]
        n = len(self._rows[(self.checkpoints[-1], self.rollout.value)])
        facts = [f"{html.escape(str(meta.get(c)))}" for c in ("group", "failure_type") if c in meta.index]
        self.info.value = f"<small>{n} tokens · {' · '.join(facts)}</small>"
        self.html.value = self.render_html()
        self.details.value = self.details_html(self.token.value) if self.token.value >= 0 else ""

    # -- selection -----------------------------------------------------------------------
    def spike_positions(self) -> np.ndarray:
        """Positions outlined in the current view (q and category filters), in order."""
        pieces = self.pieces(self.shown_checkpoints()[-1], self.rollout.value)
        keep = pieces.spike_q <= float(self.q.value)
        if self.category.value != ALL:
            keep &= pieces.category == self.category.value
        return pieces.pos[keep]

    def jump_to_next_spike(self) -> int | None:
        """Select the next outlined spike after the selected token (wrapping around)."""
        found = self.spike_positions()
        if not len(found):
            return None
        later = found[found > self.token.value]
        self.token.value = int(later[0] if len(later) else found[0])
        return self.token.value

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
                                 title=f"position {pos}: {rows.token.iloc[0]!r} over RL steps"))
        fmt = lambda ids, ps: "  ".join(f"{show_token(self.decode(int(i)))} {p:.3f}" for i, p in zip(ids, ps))
        ref = rows.iloc[-1]
        lines = [f"<tr><td>reference</td><td></td><td><code>{html.escape(fmt(ref.topk_ids_ref, ref.topk_p_ref))}</code></td></tr>"]
        for r in rows.itertuples(index=False):
            lines.append(f"<tr><td>step {int(r.step)}</td><td>{r.value:+.4f}</td>"
                         f"<td><code>{html.escape(fmt(r.topk_ids_ckpt, r.topk_p_ckpt))}</code></td></tr>")
        table = ("<table style='font-size:12px'><tr><th></th><th>" + html.escape(METRICS[self.metric.value].short)
                 + "</th><th>top-k (token p)</th></tr>" + "".join(lines) + "</table>")
        return f"<div><b>token {pos}: <code>{text}</code></b><div style='display:flex;gap:16px'>{chart}{table}</div></div>"

    # -- display -------------------------------------------------------------------------
    def static_html(self, checkpoints: list[str] | None = None) -> str:
        """What a page without a kernel shows: the current rollout coloured at the current
        step (or at the two ``checkpoints``, one above the other), tooltips included."""
        head = html.escape(f"rollout {self.rollout.value} (problem {self.problem.value})")
        if checkpoints is None:
            return f"<div><div style='font:13px sans-serif'>{head}</div>{self.render_html()}</div>"
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
        bundle["text/html"] = self.static_html()
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
    """Build the viewer (options: metric, quantile, q, rollout_id); the notebook displays
    it as the cell's value."""
    return Viewer(tokens, spikes, decode, responses, **options)

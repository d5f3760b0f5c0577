"""The live viewer's controls (ipywidgets) and their layout, built once for a ``Viewer``.

Rows wrap instead of squeezing: a row of controls wider than the notebook (JupyterLab at
1,024 px with its file browser open leaves about 640 px) moves its last controls to a
new line, each keeping the width its content needs; squeezed, the rollout list was cut to
its first word, the clip slider lost its value and the token field its number. The rollout
list has a line of its own, as wide as the notebook allows. Nothing shows a sentinel: the
token field is empty ("none") until a token is selected.
"""

from __future__ import annotations

from rlprobe_nb.render.metrics import METRICS

ALL = "(all)"
Q_CHOICES = [0.001, 0.01, 0.05, 0.1]
NO_TOKEN = "none"


def _row(children, **layout):
    import ipywidgets as W

    return W.HBox(children, layout=W.Layout(flex_flow="row wrap", align_items="center",
                                            grid_gap="2px 12px", **layout))


def shown(widget, on: bool) -> None:
    widget.layout.display = None if on else "none"


def build_controls(app, metric: str, quantile: float, q: float, groups: list, categories: list) -> None:
    """Every control of ``app`` (set as its attributes: group, problem, rollout, mode, step,
    play, compare_a, compare_b, metric, scale_kind, transform, clip, q, category,
    next_spike, spike_note, nearest_step, token, info, pane) and ``app.widget``, the whole
    viewer; only the controls that apply are shown."""
    import ipywidgets as W

    from rlprobe_nb.render.token_pane import TokenPane

    has_spikes = len(app.spikes) > 0
    steps = [(str(app.steps[c]), c) for c in app.checkpoints]
    named = [(f"step {app.steps[c]} · {c}", c) for c in app.checkpoints]
    wide = {"description_width": "initial"}

    def fit():  # as wide as its content; a Layout of its own (hiding one hides all who share it)
        return W.Layout(width="auto")

    app.group = W.Dropdown(options=[ALL, *groups], description="group", layout=W.Layout(width="14em"))
    app.problem = W.Dropdown(description="problem", layout=W.Layout(width="16em"))
    app.rollout = W.Dropdown(description="rollout", layout=W.Layout(width="100%", max_width="48em"),
                             tooltip="ranked by the final checkpoint's largest |metric| in the response")
    app.mode = W.ToggleButtons(options=["step", "compare"], value="step", description="view",
                               style={"button_width": "auto"}, layout=W.Layout(width="max-content"))
    app.step = W.SelectionSlider(options=steps, value=app.checkpoints[-1], description="RL step",
                                 continuous_update=False, layout=W.Layout(width="22em"))
    app.play = W.Play(min=0, max=len(steps) - 1, value=len(steps) - 1, interval=1200, description="play")
    W.link((app.play, "value"), (app.step, "index"))
    app.compare_a = W.Dropdown(options=named, value=app.checkpoints[0], description="A", layout=fit())
    app.compare_b = W.Dropdown(options=named, value=app.checkpoints[-1], description="B", layout=fit())
    app.metric = W.Dropdown(options=[(m.short, m.name) for m in METRICS.values()], value=metric,
                            description="metric", layout=W.Layout(width="14em"))
    app.scale_kind = W.Dropdown(options=["shared", "per-rollout"], value="shared", description="scale",
                                layout=W.Layout(width="14em"))
    app.transform = W.Dropdown(options=["linear", "log"], value="linear", layout=W.Layout(width="6em"))
    app.clip = W.FloatSlider(value=quantile, min=0.9, max=1.0, step=0.005, readout_format=".3f",
                             description="clip at quantile", continuous_update=False, style=wide,
                             layout=W.Layout(width="24em", min_width="24em"))
    app.q = W.Dropdown(options=Q_CHOICES, value=q, description="spikes q ≤", style=wide, layout=fit())
    app.category = W.Dropdown(options=[ALL, *categories], description="category", layout=W.Layout(width="16em"))
    app.next_spike = W.Button(description="next spike ▶", disabled=not has_spikes, layout=fit())
    app.spike_note = W.HTML()
    app.nearest_step = W.Button(layout=fit())
    app.token = W.Text(value="", placeholder=NO_TOKEN, description="token pos", style=wide,
                       layout=W.Layout(width="16em"), continuous_update=False)
    app.info = W.HTML()
    app.pane = TokenPane()
    app.step_row = _row([app.mode, app.play, app.step])
    app.compare_row = _row([app.compare_a, app.compare_b])
    spike_row = _row([app.q, app.category, app.next_spike, app.token, app.spike_note, app.nearest_step])
    app.widget = W.VBox([_row([app.group, app.problem]), _row([app.rollout], width="100%"), app.info,
                         app.step_row, app.compare_row, _row([app.metric, app.scale_kind, app.transform, app.clip]),
                         spike_row, app.pane], layout=W.Layout(width="100%"))
    shown(app.group, len(groups) > 1)
    shown(app.mode, len(app.checkpoints) > 1)
    for w in (app.q, app.next_spike):
        shown(w, has_spikes)
    shown(app.category, has_spikes and bool(categories))
    shown(app.nearest_step, False)

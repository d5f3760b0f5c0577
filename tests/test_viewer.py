"""The viewer's logic through ipywidgets' Python API: a change of state repaints what it
should and nothing else (the pane's packed layers); selecting a token shows its series and
both top-k lists; tooltips asked for by the browser carry the table's numbers; rollouts
ranked by divergence; the spike and category controls, shown only where they apply; a
link's target opens a rollout at a token; the static fallback a page without a kernel shows."""

import html
import re

import numpy as np
import pytest
from test_render import Spans

from rlprobe_nb.render import shared_scale, synthetic, tokens_html
from rlprobe_nb.render import viewer as V
from rlprobe_nb.render.metrics import metric_values
from rlprobe_nb.render.token_pane import search_hits, unpack_layer


@pytest.fixture(scope="module")
def suite():
    return synthetic.synthetic_suite(n_problems=3, rollouts_per_problem=2, n_tokens=40, seed=9)


@pytest.fixture()
def app(suite):
    texts = dict(zip(suite["rollouts"].rollout_id, suite["rollouts"].response))
    return V.open_viewer(suite["tokens"], suite["spikes"], synthetic.decode, texts)


def spans(fragment: str) -> list[dict]:
    p = Spans()
    p.feed(fragment)
    return p.spans


def colours(fragment: str) -> dict[int, str]:
    return {int(s["data-pos"]): re.search(r"background:(#\w{6})", s["style"]).group(1) for s in spans(fragment)}


def painted(app, layer: int = 0) -> dict[int, str]:
    """Position -> background colour, as the pane paints the shown layer."""
    return {p: t["bg"] for p, t in enumerate(unpack_layer(app.pane.layers[layer]))}


def outlined(app, layer: int = -1) -> set[int]:
    return {p for p, t in enumerate(unpack_layer(app.pane.layers[layer])) if t["spike"]}


def rows(suite, ckpt, rid):
    t = suite["tokens"]
    return t[(t.checkpoint == ckpt) & (t.rollout_id == rid)].sort_values("pos")


def test_opens_on_the_final_step_with_the_shared_scale(app, suite):
    assert app.step.value == "rlvr_step_1200" and app.metric.value == "dlogp"
    rid = app.rollout.value
    assert app.pane.rollout == rid
    assert "".join(app.pane.texts) == suite["rollouts"].set_index("rollout_id").response[rid]
    scale = shared_scale(suite["tokens"], "dlogp")
    values = metric_values(rows(suite, "rlvr_step_1200", rid), "dlogp")
    assert list(painted(app).values()) == scale.colours(values)
    assert [t["ink"] for t in unpack_layer(app.pane.layers[0])] == scale.text_colours(values)
    assert "Δlogp" in app.pane.legend
    assert app.step.readout and app.step.options[-1] == ("1200", "rlvr_step_1200"), "a short slider label"


def test_the_rollouts_are_ranked_by_divergence(app, suite):
    t = suite["tokens"]
    final = t[(t.checkpoint == "rlvr_step_1200") & ~t.first_token]
    best = final.assign(a=np.abs(metric_values(final, "dlogp"))).groupby("rollout_id").a.max()
    ids = [rid for _, rid in app.rollout.options]
    assert ids == list(best.sort_values(ascending=False).index) and ids[0] == app.rollout.value
    label = app.rollout.options[0][0]
    assert f"max |Δlogp| {best.max():.3g}" in label
    app.metric.value = "js"
    best_js = final.groupby("rollout_id").js.max()
    assert [rid for _, rid in app.rollout.options] == list(best_js.sort_values(ascending=False).index)
    assert app.rollout.value == ids[0], "a change of metric keeps the rollout shown"


def test_moving_the_step_repaints_exactly_the_tokens_that_changed(app, suite):
    rid = app.rollout.value
    texts = list(app.pane.texts)
    before = painted(app)
    app.step.value = "rlvr_step_100"
    after = painted(app)
    scale = shared_scale(suite["tokens"], "dlogp")
    old = scale.colours(metric_values(rows(suite, "rlvr_step_1200", rid), "dlogp"))
    new = scale.colours(metric_values(rows(suite, "rlvr_step_100", rid), "dlogp"))
    changed = {p for p, (a, b) in enumerate(zip(old, new)) if a != b}
    assert changed, "the synthetic checkpoints differ"
    assert {p for p in before if before[p] != after[p]} == changed
    assert app.pane.texts == texts and app.pane.layers[0]["label"].startswith("step 100 · rlvr_step_100")
    app.play.value = 1  # the play widget drives the slider
    assert app.step.value == "rlvr_step_400"
    app._on_pane_message(app.pane, {"type": "step", "delta": 1}, [])  # → from the keyboard
    assert app.step.value == "rlvr_step_1200"
    app._on_pane_message(app.pane, {"type": "step", "delta": 1}, [])
    assert app.step.value == "rlvr_step_1200", "the last step stays the last"


def test_a_tooltip_asked_for_on_hover_carries_the_tables_numbers(app, suite):
    rid = app.rollout.value
    sent = []
    app.pane.send = sent.append
    app._on_pane_message(app.pane, {"type": "tip", "layer": 0, "pos": 4}, [])
    row = rows(suite, "rlvr_step_1200", rid).iloc[4]
    (msg,) = sent
    assert (msg["type"], msg["rollout"], msg["key"], msg["pos"]) == ("tip", rid, "rlvr_step_1200", 4)
    assert f"ref {row.logp_ref:+.4f}   ckpt {row.logp_ckpt:+.4f}" in msg["text"]
    assert f"KL(ref‖ckpt) {row.kl_ref_ckpt:.4f}" in msg["text"] and "top-5" in msg["text"]
    # the same text as the static rendering's tooltip of that token
    static = spans(app.render_html())
    assert html.unescape(static[4]["data-tip"]) == msg["text"]


def test_metric_and_scale_controls(app, suite):
    rid = app.rollout.value
    app.metric.value = "kl_ckpt_ref"
    values = rows(suite, "rlvr_step_1200", rid).kl_ckpt_ref.to_numpy(np.float64)
    got = np.array([float(s["data-v"]) for s in spans(app.render_html())])
    np.testing.assert_allclose(got, values, rtol=1e-5, atol=1e-12)
    assert list(painted(app).values()) == app.scale().colours(values)
    assert "KL(ckpt‖ref)" in app.pane.legend and "surprised" in app.pane.legend
    shared = app.scale()
    app.scale_kind.value = "per-rollout"
    own = app.scale()
    mine = suite["tokens"][suite["tokens"].rollout_id == rid].kl_ckpt_ref.to_numpy(np.float64)
    assert own.vmax == pytest.approx(np.quantile(np.abs(mine), 0.99)) and own.vmax != shared.vmax
    assert "Fitted to this rollout alone" in app.pane.legend
    app.transform.value = "log"
    assert app.scale().transform == "log" and "symmetric log" in app.pane.legend
    app.scale_kind.value = "shared"
    app.clip.value = 0.95
    assert app.scale().vmax == pytest.approx(shared_scale(suite["tokens"], "kl_ckpt_ref", 0.95).vmax)


def test_selecting_a_token_shows_its_series_and_topk_over_steps(app, suite):
    rid = app.rollout.value
    assert app.token.value == "" and app.selected is None, "no sentinel: an empty field"
    app.pane.selected = 7  # a click in the browser
    assert app.token.value == "7" and app.selected == 7
    assert [s["data-pos"] for s in spans(app.render_html()) if "rp-sel" in s["class"]] == ["7"]
    details = app.pane.details
    assert "<svg" in details and "data-pos='7'" in details
    t = suite["tokens"]
    at = t[(t.rollout_id == rid) & (t.pos == 7)].sort_values("step")
    for row in at.itertuples():
        assert f"<td>step {row.step}</td><td>{row.dlogp:+.4f}</td>" in details
        top = synthetic.decode(int(row.topk_ids_ckpt[0]))
        assert f"{row.topk_p_ckpt[0]:.3f}" in details and html.escape(tokens_html.show_token(top)) in details
    app.token.value = "9"  # typed
    assert app.selected == 9 and "data-pos='9'" in app.pane.details
    app.token.value = "nine"
    assert app.token.value == "9" and app.selected == 9, "not a position: the field shows the selection"
    app.rollout.value = [r for _, r in app.rollout.options if r != rid][0]
    assert app.token.value == "" and app.selected is None and app.pane.details == "", \
        "a new response starts unselected"


def test_search_outlines_every_token_of_a_match():
    texts = ["The", " an", "swer", " is", " 12", ".", " THE", " answer"]
    assert search_hits(texts, "answer") == [1, 2, 7]
    assert search_hits(texts, "the") == [0, 6], "case-insensitive"
    assert search_hits(texts, "s 1") == [3, 4] and search_hits(texts, "") == [] and search_hits(texts, "xyz") == []


def test_next_spike_and_the_q_and_category_filters(app, suite):
    rid = app.rollout.value
    sp = suite["spikes"]
    mine = sp[(sp.checkpoint == "rlvr_step_1200") & (sp.rollout_id == rid) & sp.significant].sort_values("pos")
    visited = [app.jump_to_next_spike() for _ in range(len(mine) + 1)]
    assert visited == [*mine.pos, mine.pos.iloc[0]], "in order, wrapping around"
    assert app.jump_to_spike(-1) == mine.pos.iloc[-1], "p: the previous one, wrapping around"
    assert outlined(app) == set(mine.pos)
    app.q.value = 0.001
    assert outlined(app) == set(mine[mine.q <= 0.001].pos)
    app.q.value = 0.1
    cat = mine.category.iloc[0]
    app.category.value = cat
    assert outlined(app) == set(mine[mine.category == cat].pos)
    dimmed = [t["dim"] for t in unpack_layer(app.pane.layers[0])]
    assert sum(dimmed) == len(dimmed) - (mine.category == cat).sum()
    app.select(None)
    assert app.jump_to_next_spike() == mine[mine.category == cat].pos.iloc[0]


def test_group_filter_and_compare_mode_show_only_their_controls(app, suite):
    assert app.compare_a.layout.display == "none" or app.compare_row.layout.display == "none"
    app.group.value = "ref_right"
    ids = [rid for _, rid in app.rollout.options]
    r = suite["rollouts"]
    assert set(ids) <= set(r[~r.rollout_id.str.endswith("#0")].rollout_id)
    assert all(rid.endswith("#1") for rid in ids)
    app.mode.value = "compare"
    assert app.compare_row.layout.display is None and app.step.layout.display == "none"
    app.compare_a.value, app.compare_b.value = "rlvr_step_100", "rlvr_step_1200"
    assert [l["key"] for l in app.pane.layers] == ["rlvr_step_100", "rlvr_step_1200"]
    assert app.pane.layers[0]["label"].startswith("step 100 · rlvr_step_100")
    static = app.render_html()
    assert static.count('class="rp-resp"') == 2 and len(spans(static)) == 2 * 40


def test_without_spikes_the_spike_controls_are_hidden(suite):
    app = V.open_viewer(suite["tokens"], None, synthetic.decode)
    for w in (app.q, app.category, app.next_spike):
        assert w.layout.display == "none"
    assert "no spikes table" in app.info.value and app.jump_to_next_spike() is None
    assert not any(t["spike"] for t in unpack_layer(app.pane.layers[0]))


def test_a_link_target_opens_a_rollout_at_a_token(app, suite):
    target = [rid for _, rid in app.rollout.options][-1]
    app.group.value = "ref_right" if not target.endswith("#1") else "target"
    app._on_pane_message(app.pane, {"type": "open", "rollout": target, "pos": 11, "checkpoint": "rlvr_step_400"}, [])
    assert (app.rollout.value, app.selected, app.step.value) == (target, 11, "rlvr_step_400")
    assert app.pane.rollout == target and "data-pos='11'" in app.pane.details
    texts = dict(zip(suite["rollouts"].rollout_id, suite["rollouts"].response))
    opened = V.open_viewer(suite["tokens"], suite["spikes"], synthetic.decode, texts, rollout_id=target, token=5)
    assert (opened.rollout.value, opened.pane.selected) == (target, 5)
    with pytest.raises(ValueError, match="not in the token tables"):
        opened.open("nowhere#0")


def test_next_spike_says_when_a_step_has_none_and_offers_the_nearest_that_has():
    suite = synthetic.synthetic_suite(n_problems=3, rollouts_per_problem=2, n_tokens=40, seed=4)
    app = V.open_viewer(suite["tokens"], suite["spikes"], synthetic.decode)
    sp = suite["spikes"]
    at = sp[sp.significant].groupby("rollout_id").checkpoint.nunique()
    rid = at[at < len(app.checkpoints)].index[0]  # a rollout whose spikes begin after the first step
    mine = sp[(sp.rollout_id == rid) & sp.significant]
    without = [ck for ck in app.checkpoints if ck not in set(mine.checkpoint)]
    app.open(rid, checkpoint=without[0])
    assert app.jump_to_next_spike() is None and app.selected is None
    nearest = min((ck for ck in app.checkpoints if ck in set(mine.checkpoint)),
                  key=lambda ck: abs(app.checkpoints.index(ck) - app.checkpoints.index(without[0])))
    assert f"no spike is outlined at step {app.steps[without[0]]}" in app.spike_note.value
    assert f"nearest step with one in this rollout is {app.steps[nearest]}" in app.spike_note.value
    assert app.nearest_step.layout.display is None and app.nearest_step.description == f"go to step {app.steps[nearest]} ▶"
    assert app.next_spike.layout.display is None and app.q.layout.display is None, "the spike controls stay"
    app.nearest_step.click()
    assert app.step.value == nearest and app.selected in set(mine[mine.checkpoint == nearest].pos)
    assert app.spike_note.value == "" and app.nearest_step.layout.display == "none"
    assert app.next_spike.layout.display is None and app.compare_a.layout.display is None, \
        "hiding the offer hides nothing else (a Layout each)"
    elsewhere = V.open_viewer(suite["tokens"], sp[sp.rollout_id != rid], synthetic.decode, rollout_id=rid)
    assert elsewhere.jump_to_next_spike() is None and "nor at any other step" in elsewhere.spike_note.value
    assert elsewhere.nearest_step.layout.display == "none"


def test_static_fallback_for_pages_without_a_kernel(app, suite):
    import json

    app.select(3)
    bundle = app._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    page = bundle["text/html"]
    assert "window.rlprobeRuntime" in page and "window.rlprobePane" in page, "the live viewer's pane, in a page"
    data = json.loads(re.search(r"class='rp-viewer-data'>(.*?)</script>", page).group(1))
    assert data["opening"] == {"rollout": app.rollout.value, "pos": 3}
    held = data["rollouts"][0]
    assert held["id"] == app.rollout.value and held["texts"] == app.pane.texts and "".join(held["texts"])
    assert [s["key"] for s in held["steps"]] == app.checkpoints, "every step"
    assert held["steps"][-1]["layer"]["bg"] == app.pane.layers[0]["bg"], "the live pane's colours"


def test_draft_notebook_07_on_synthetic_tables(tmp_path, monkeypatch):
    from test_case_studies import run_draft_notebook

    ns = run_draft_notebook("07_viewer", tmp_path, monkeypatch)
    app = ns["app"]
    assert app.rollout.value == V.default_rollout(ns["tokens"], ns["SPIKES"]) == ns["start"]
    static = app.static_html([ns["P"].checkpoints[0], ns["P"].checkpoints[-1]])
    assert static.count('class="rp-resp"') == 2 and app.mode.value == "step", "controls put back"

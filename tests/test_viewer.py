"""The viewer's logic through ipywidgets' Python API: a change of state recolours what it
should and nothing else; selecting a token shows its series and both top-k lists; the
spike and category controls; the static fallback a page without a kernel shows."""

import re

import numpy as np
import pytest
from test_render import Spans

from rlprobe_nb.render import shared_scale, synthetic
from rlprobe_nb.render import viewer as V
from rlprobe_nb.render.metrics import metric_values


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


def rows(suite, ckpt, rid):
    t = suite["tokens"]
    return t[(t.checkpoint == ckpt) & (t.rollout_id == rid)].sort_values("pos")


def test_opens_on_the_final_step_with_the_shared_scale(app, suite):
    assert app.step.value == "rlvr_step_1200" and app.metric.value == "dlogp"
    rid = app.rollout.value
    shown = spans(app.html.value)
    assert "".join(s["text"] for s in shown) == suite["rollouts"].set_index("rollout_id").response[rid]
    scale = shared_scale(suite["tokens"], "dlogp")
    want = scale.colours(metric_values(rows(suite, "rlvr_step_1200", rid), "dlogp"))
    assert list(colours(app.html.value).values()) == want


def test_moving_the_step_recolours_exactly_the_tokens_that_changed(app, suite):
    rid = app.rollout.value
    before = colours(app.html.value)
    app.step.value = "rlvr_step_100"
    after = colours(app.html.value)
    scale = shared_scale(suite["tokens"], "dlogp")
    old = scale.colours(metric_values(rows(suite, "rlvr_step_1200", rid), "dlogp"))
    new = scale.colours(metric_values(rows(suite, "rlvr_step_100", rid), "dlogp"))
    changed = {p for p, (a, b) in enumerate(zip(old, new)) if a != b}
    assert changed, "the synthetic checkpoints differ"
    assert {p for p in before if before[p] != after[p]} == changed
    app.play.value = 1  # the play widget drives the slider
    assert app.step.value == "rlvr_step_400"


def test_metric_and_scale_controls(app, suite):
    rid = app.rollout.value
    app.metric.value = "kl_ckpt_ref"
    got = np.array([float(s["data-v"]) for s in spans(app.html.value)])
    want = rows(suite, "rlvr_step_1200", rid).kl_ckpt_ref.to_numpy(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)
    assert "KL(ckpt‖ref)" in app.html.value and "surprised" in app.html.value
    shared = app.scale()
    app.scale_kind.value = "per-rollout"
    own = app.scale()
    mine = suite["tokens"][suite["tokens"].rollout_id == rid].kl_ckpt_ref.to_numpy(np.float64)
    assert own.vmax == pytest.approx(np.quantile(np.abs(mine), 0.99)) and own.vmax != shared.vmax
    assert "Fitted to this rollout alone" in app.html.value
    app.transform.value = "log"
    assert app.scale().transform == "log" and "symmetric log" in app.html.value
    app.scale_kind.value = "shared"
    app.clip.value = 0.95
    assert app.scale().vmax == pytest.approx(shared_scale(suite["tokens"], "kl_ckpt_ref", 0.95).vmax)


def test_selecting_a_token_shows_its_series_and_topk_over_steps(app, suite):
    rid = app.rollout.value
    app.token.value = 7
    assert 'rp-sel' in app.html.value and [s["data-pos"] for s in spans(app.html.value) if "rp-sel" in s["class"]] == ["7"]
    details = app.details.value
    assert "<svg" in details
    t = suite["tokens"]
    at = t[(t.rollout_id == rid) & (t.pos == 7)].sort_values("step")
    for row in at.itertuples():
        assert f"<td>step {row.step}</td><td>{row.dlogp:+.4f}</td>" in details
        top = synthetic.decode(int(row.topk_ids_ckpt[0]))
        assert f"{row.topk_p_ckpt[0]:.3f}" in details and (top == "" or top.strip() in details.replace("&quot;", '"')
                                                           .replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
    app.rollout.value = [r for r in app.rollout.options if r != rid][0]
    assert app.token.value == -1 and app.details.value == "", "a new response starts unselected"


def test_next_spike_and_the_q_and_category_filters(app, suite):
    rid = app.rollout.value
    sp = suite["spikes"]
    mine = sp[(sp.checkpoint == "rlvr_step_1200") & (sp.rollout_id == rid) & sp.significant].sort_values("pos")
    visited = [app.jump_to_next_spike() for _ in range(len(mine) + 1)]
    assert visited == [*mine.pos, mine.pos.iloc[0]], "in order, wrapping around"
    outlined = {int(s["data-pos"]) for s in spans(app.html.value) if "rp-spike" in s["class"]}
    assert outlined == set(mine.pos)
    app.q.value = 0.001
    strict = set(mine[mine.q <= 0.001].pos)
    assert {int(s["data-pos"]) for s in spans(app.html.value) if "rp-spike" in s["class"]} == strict
    app.q.value = 0.1
    cat = mine.category.iloc[0]
    app.category.value = cat
    shown = spans(app.html.value)
    assert {int(s["data-pos"]) for s in shown if "rp-spike" in s["class"]} == set(mine[mine.category == cat].pos)
    assert sum("rp-dim" in s["class"] for s in shown) == len(shown) - (mine.category == cat).sum()
    app.token.value = -1
    assert app.jump_to_next_spike() == mine[mine.category == cat].pos.iloc[0]


def test_group_filter_and_compare_mode(app, suite):
    app.group.value = "ref_right"
    r = suite["rollouts"]
    assert set(app.rollout.options) <= set(r[~r.rollout_id.str.endswith("#0")].rollout_id)
    assert all(rid.endswith("#1") for rid in app.rollout.options)
    app.mode.value = "compare"
    app.compare_a.value, app.compare_b.value = "rlvr_step_100", "rlvr_step_1200"
    assert app.html.value.count('class="rp-resp"') == 2
    assert "step 100 · rlvr_step_100" in app.html.value and "step 1200 · rlvr_step_1200" in app.html.value
    assert len(spans(app.html.value)) == 2 * 40


def test_static_fallback_for_pages_without_a_kernel(app):
    bundle = app._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/html"].count('class="rp-tok') == 40 and "<script" not in bundle["text/html"]


def test_draft_notebook_07_on_synthetic_tables(tmp_path, monkeypatch):
    from test_case_studies import run_draft_notebook

    ns = run_draft_notebook("07_viewer", tmp_path, monkeypatch)
    app = ns["app"]
    assert app.rollout.value == V.default_rollout(ns["tokens"], ns["SPIKES"]) == ns["start"]
    static = app.static_html([ns["P"].checkpoints[0], ns["P"].checkpoints[-1]])
    assert static.count('class="rp-resp"') == 2 and app.mode.value == "step", "controls put back"

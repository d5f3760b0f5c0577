"""The case-study page in a real browser with the network cut off: every token is a span
whose computed colour is its value on the shared scale, the spans' text is the response,
hovering a token shows its tooltip with both top-k lists, nothing left the page, and the
screenshot is not blank."""

import os
import shutil

import pytest
from browser_harness import headless_chromium, pixel_spread, tooltip_visible

from rlprobe_nb.render import case_page, shared_scale, synthetic
from rlprobe_nb.render import case_studies as cs
from rlprobe_nb.render.metrics import metric_values
from rlprobe_nb.render.tokens_html import show_token

pytestmark = pytest.mark.browser

BLOCKS = """() => [...document.querySelectorAll('.rp-resp[data-checkpoint]')].map(b => ({
    checkpoint: b.dataset.checkpoint, rollout: b.dataset.rollout,
    children: b.children.length,
    spans: [...b.querySelectorAll(':scope > span.rp-tok')].map(s => ({
        pos: +s.dataset.pos, bg: getComputedStyle(s).backgroundColor, text: s.textContent}))}))"""
AFTER = "el => { const a = getComputedStyle(el, '::after'); return {content: a.content, display: a.display}; }"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    suite = synthetic.synthetic_suite(n_problems=3, rollouts_per_problem=2, n_tokens=48, seed=21)
    choices = cs.select_cases(suite["tokens"], suite["spikes"], cs.CaseRule(n_categories=2, seed=5))
    cases = cs.build_cases(choices, suite["tokens"], suite["spikes"], suite["problems"], suite["rollouts"],
                           suite["answers"])
    scale = shared_scale(suite["tokens"], "dlogp")
    path = tmp_path_factory.mktemp("page") / "case_studies.html"
    path.write_text(case_page.case_studies_page(cases, scale, synthetic.decode, suite["spikes"]), encoding="utf-8")
    return suite, cases, scale, path


def test_case_study_page_in_chromium(built, tmp_path):
    suite, cases, scale, path = built
    tokens = suite["tokens"].set_index(["checkpoint", "rollout_id", "pos"])
    responses = suite["rollouts"].set_index("rollout_id").response
    with headless_chromium(tmp_path) as (context, guard):
        page = context.new_page()
        page.goto(path.as_uri())
        blocks = page.evaluate(BLOCKS)
        assert len(blocks) == len(cases) * 4, "per case: the final response and one row per step"
        for b in blocks:
            assert b["children"] == len(b["spans"]) > 0, "every token is a span, nothing else"
            rows = tokens.loc[[(b["checkpoint"], b["rollout"], s["pos"]) for s in b["spans"]]]
            want = ["rgb(%d, %d, %d)" % tuple(c) for c in scale.rgb(metric_values(rows, "dlogp"))]
            assert [s["bg"] for s in b["spans"]] == want
            text = responses[b["rollout"]][rows.char_start.iloc[0]:rows.char_end.iloc[-1]]
            assert "".join(s["text"] for s in b["spans"]) == text
        final = [b for b in blocks if b["checkpoint"] == cases[0].checkpoint and b["rollout"] == cases[0].rollout_id]
        assert "".join(s["text"] for s in final[0]["spans"]) == responses[cases[0].rollout_id]

        case = cases[0]
        token = page.locator(f'.rp-case >> nth=0 >> .rp-resp[data-checkpoint="{case.checkpoint}"] '
                             f'>> span.rp-tok[data-pos="{case.pos}"]').first
        assert page.locator(".rp-tipbox").count() == 0 or not page.locator(".rp-tipbox").is_visible(), \
            "no tooltip before hovering"
        assert tooltip_visible(page, token)
        assert token.evaluate(AFTER)["content"] in ("none", "normal"), "the script's box, not the CSS fallback"
        shown_tip = page.locator(".rp-tipbox").text_content()
        assert shown_tip == token.get_attribute("data-tip") and "top-5" in shown_tip
        row = tokens.loc[(case.checkpoint, case.rollout_id, case.pos)]
        for ids, ps in (("topk_ids_ref", "topk_p_ref"), ("topk_ids_ckpt", "topk_p_ckpt")):
            for i, p in zip(row[ids], row[ps]):
                shown = show_token(synthetic.decode(int(i)))[:18]
                assert f"{shown:<18} {p:.3f}" in shown_tip
        shot = tmp_path / "case_study.png"
        png = page.screenshot(path=str(shot))
        spread = pixel_spread(context, png)
        blank = pixel_spread(context, context.new_page().screenshot())
    guard.assert_nothing_left()
    assert path.as_uri() in guard.requests, "the guard saw the page load"
    assert spread["std"] > 20 and blank["std"] < 1, (spread, blank)
    keep = os.environ.get("RLPROBE_SCREENSHOTS")
    if keep:
        shutil.copy(shot, os.path.join(keep, "case_study.png"))


def test_the_guard_sees_and_stops_a_request_to_the_network(tmp_path):
    page_file = tmp_path / "leaky.html"
    page_file.write_text('<p>x</p><img src="http://pixel.invalid/p.png"><script src="https://cdn.invalid/x.js"></script>')
    with headless_chromium(tmp_path) as (context, guard):
        context.new_page().goto(page_file.as_uri())
    assert set(guard.non_local()) == {"http://pixel.invalid/p.png", "https://cdn.invalid/x.js"}
    assert set(guard.blocked) == set(guard.non_local())
    with pytest.raises(AssertionError, match="tried to reach the network"):
        guard.assert_nothing_left()

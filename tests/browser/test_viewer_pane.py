"""The viewer's response pane (its ES module) in a real browser, without Jupyter: a stand-in
for the widget model (``pane_harness``) plays the kernel. Hover asks for a tooltip and shows
the answer inside the window; a click selects; the search box outlines every token of a
match; a new layer repaints exactly the colours it carries; keys and links send what the
viewer acts on. The same module runs in JupyterLab (``test_lab_viewer``)."""

import pytest
from browser_harness import headless_chromium
from pane_harness import mount_pane

from rlprobe_nb.render import synthetic, viewer
from rlprobe_nb.render.token_pane import search_hits, unpack_layer

pytestmark = pytest.mark.browser

COLOURS = "() => [...document.querySelectorAll('#pane .rp-tok')].map(e => getComputedStyle(e).backgroundColor)"


def rgb(hex_colour: str) -> str:
    return "rgb(%d, %d, %d)" % tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


@pytest.fixture(scope="module")
def app():
    s = synthetic.synthetic_suite(n_problems=2, rollouts_per_problem=1, n_tokens=120, seed=5)
    return viewer.open_viewer(s["tokens"], s["spikes"], synthetic.decode,
                              dict(zip(s["rollouts"].rollout_id, s["rollouts"].response)))


def test_the_pane_hovers_clicks_searches_and_repaints(app, tmp_path):
    with headless_chromium(tmp_path, width=1000, height=700) as (context, guard):
        page = context.new_page()
        mount_pane(page, app.pane)
        assert page.eval_on_selector_all("#pane .rp-tok", "es => es.map(e => e.textContent)") == app.pane.texts
        assert page.evaluate(COLOURS) == [rgb(t["bg"]) for t in unpack_layer(app.pane.layers[0])]

        # hover: the pane asks the kernel, shows a placeholder, then the answer
        token = page.locator("#pane .rp-tok").nth(7)
        token.hover()
        sent = page.evaluate("window.paneModel.sent")
        assert {"type": "tip", "layer": 0, "pos": 7} in sent
        text = app.tooltip(app.pane.layers[0]["key"], 7)
        page.evaluate("([key, rollout, text]) => window.paneModel.emit('msg:custom', "
                      "{type: 'tip', key, rollout, pos: 7, text})", [app.pane.layers[0]["key"], app.pane.rollout, text])
        box = page.evaluate("""() => { const b = document.querySelector('.rp-tipbox'); const r = b.getBoundingClientRect();
            return {text: b.textContent, shown: b.style.display, left: r.left, top: r.top, right: r.right,
                    bottom: r.bottom, w: innerWidth, h: innerHeight}; }""")
        assert box["text"] == text and box["shown"] == "block"
        assert 0 <= box["left"] and box["right"] <= box["w"] and 0 <= box["top"] and box["bottom"] <= box["h"]

        # click selects (and a second click clears)
        token.click()
        assert page.evaluate("window.paneModel.get('selected')") == 7
        assert page.locator("#pane .rp-tok.rp-sel").count() == 1
        token.click()
        assert page.evaluate("window.paneModel.get('selected')") == -1

        # search: every token of a match outlined; Enter selects the first
        page.fill("#pane .rp-search", "the")
        hits = page.eval_on_selector_all("#pane .rp-tok", "es => es.flatMap((e, i) => e.classList.contains('rp-hit') ? [i] : [])")
        assert hits == search_hits(app.pane.texts, "the") and hits
        assert page.text_content("#pane .rp-search-count").startswith(f"{len(hits)} token")
        page.press("#pane .rp-search", "Enter")
        assert page.evaluate("window.paneModel.get('selected')") == hits[0]

        # a new layer (another step) repaints exactly its colours; the texts stay
        app.step.value = app.checkpoints[0]
        page.evaluate("(layers) => window.paneModel.set('layers', layers)", app.pane.layers)
        assert page.evaluate(COLOURS) == [rgb(t["bg"]) for t in unpack_layer(app.pane.layers[0])]
        assert page.text_content("#pane .rp-layer-label") == app.pane.layers[0]["label"], "the label follows"
        hovered = page.evaluate("document.querySelector('#pane .rp-tok:hover').dataset.pos")
        assert page.evaluate("window.paneModel.sent").count({"type": "tip", "layer": 0, "pos": int(hovered)}) == 2, \
            "the open tooltip asks for the new step's numbers"
        assert page.locator("#pane .rp-tok.rp-sel").count() == 1, "the selection survives a repaint"

        # keys step and walk spikes; a link's announcement asks to open its target
        page.locator("#pane .rp-pane-body").focus()
        page.keyboard.press("ArrowRight")
        page.keyboard.press("n")
        page.evaluate("window.rlprobeRuntime.announce({rollout: 'synthetic/1#0', pos: 3})")
        sent = page.evaluate("window.paneModel.sent")
        assert {"type": "step", "delta": 1} in sent and {"type": "spike", "delta": 1} in sent
        assert {"type": "open", "rollout": "synthetic/1#0", "pos": 3, "checkpoint": None} in sent
    guard.assert_nothing_left()


def test_a_link_clicked_before_the_viewer_starts_is_opened_by_it(app, tmp_path):
    with headless_chromium(tmp_path) as (context, guard):
        page = context.new_page()
        blank = tmp_path / "blank.html"  # a page with an origin: about:blank has no localStorage
        blank.write_text("<!DOCTYPE html><html><body></body></html>")
        page.goto(blank.as_uri())
        page.add_script_tag(content=app.pane._esm.split("\nfunction digits")[0])  # the runtime alone
        page.evaluate("window.rlprobeRuntime.announce({rollout: 'synthetic/1#0', pos: 9})")
        mount_pane(page, app.pane, keep=True)
        assert {"type": "open", "rollout": "synthetic/1#0", "pos": 9, "checkpoint": None} in \
            page.evaluate("window.paneModel.sent")
        assert page.evaluate("localStorage.getItem('rlprobe.viewer.open')") is None, "taken once"
    guard.assert_nothing_left()

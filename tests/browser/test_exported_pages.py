"""Exported pages in a real browser with the network cut off (issue 26, acceptance 1–3):
an altair chart keeps its tooltip; a token's tooltip stays fully inside the window at its
right and bottom edges; input cells are hidden (by their tags) until "show code"; the
navigation bar links the neighbouring pages."""

import nbformat
import pytest
from browser_harness import headless_chromium
from nbclient import NotebookClient

from rlprobe_nb import book
from rlprobe_nb.kernels import LocalKernelManager
from rlprobe_nb.pages import navigation
from rlprobe_nb.render import synthetic, viewer

pytestmark = pytest.mark.browser

CELLS = [
    "import altair as alt, pandas as pd\n"
    "from rlprobe_nb import views\n"
    "from rlprobe_nb.render import synthetic, viewer",
    "data = pd.DataFrame({'step': [100, 400, 1200], 'kl': [0.0125, 0.25, 1.5], 'label': ['a', 'b', 'c']})\n"
    "views.show(alt.Chart(data).mark_point(size=400, filled=True).encode(\n"
    "    x='step:Q', y='kl:Q', tooltip=['label', 'step', 'kl']).properties(width=300, height=200))",
    "s = synthetic.synthetic_suite(n_problems=1, rollouts_per_problem=1, n_tokens=400, seed=3)\n"
    "viewer.open_viewer(s['tokens'], s['spikes'], synthetic.decode,\n"
    "                   dict(zip(s['rollouts'].rollout_id, s['rollouts'].response)))",
]
TIPBOX = "() => { const b = document.querySelector('.rp-tipbox'); if (!b || b.style.display === 'none') return null;" \
         " const r = b.getBoundingClientRect(); return {left: r.left, top: r.top, right: r.right, bottom: r.bottom," \
         " w: document.documentElement.clientWidth, h: document.documentElement.clientHeight, text: b.textContent}; }"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pages")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=300, kernel_name="python3", kernel_manager_class=LocalKernelManager).execute()
    path = folder / "02_second.ipynb"
    nbformat.write(nb, path)
    pages = [navigation.Page("01_first", "01", "01 · First: what comes first?"),
             navigation.Page("02_second", "02", "02 · Second: and then?"),
             navigation.Page("03_third", "03", "03 · Third: and last?")]
    page, network = book.export_html(path, pages)
    assert network == [], network
    return page


def test_an_altair_chart_shows_its_tooltip_offline(exported, tmp_path):
    size = exported.stat().st_size
    print(f"page with one chart and a 400-token viewer fallback: {size / 1e6:.2f} MB")
    with headless_chromium(tmp_path, width=1280, height=900) as (context, guard):
        page = context.new_page()
        page.goto(exported.as_uri())
        page.wait_for_selector(".rp-vega .vega-embed svg .mark-symbol path", timeout=30_000)
        assert page.locator(".rp-vega-static").count() == 0, "the interactive chart replaced the static one"
        point = page.locator(".rp-vega .mark-symbol path").nth(2)
        box = point.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        tip = page.wait_for_selector("#vg-tooltip-element.visible", timeout=10_000)
        text = tip.text_content()
        assert "label" in text and "c" in text and "1,200" in text.replace("1200", "1,200") and "1.5" in text
    guard.assert_nothing_left()


@pytest.mark.parametrize("edge", ["right", "bottom", "bottom-right"])
def test_a_token_tooltip_stays_inside_the_window_at_its_edges(exported, tmp_path, edge):
    with headless_chromium(tmp_path, width=900, height=600) as (context, guard):
        page = context.new_page()
        page.goto(exported.as_uri())
        tokens = page.locator(".jp-OutputArea-output .rp-tok")
        assert tokens.count() == 400
        # the token nearest the wanted corner of the window, after scrolling it there
        pick = page.evaluate("""(edge) => {
            const toks = [...document.querySelectorAll('.jp-OutputArea-output .rp-tok')];
            const resp = toks[0].closest('.rp-resp');
            resp.scrollTop = resp.scrollHeight;  // the response box's last lines
            window.scrollBy(0, resp.getBoundingClientRect().bottom - window.innerHeight + 4);  // at the bottom
            const box = resp.getBoundingClientRect();
            const W = document.documentElement.clientWidth, H = document.documentElement.clientHeight;
            let best = -1, score = -Infinity;
            toks.forEach((t, i) => {
                const r = t.getBoundingClientRect();
                const shown = r.top >= Math.max(0, box.top) && r.bottom <= Math.min(H, box.bottom) && r.right <= W;
                if (r.width < 4 || !shown || t.getClientRects().length !== 1 || t.classList.contains("rp-nl")) return;
                const s = (edge.includes('right') ? r.right : 0) + (edge.includes('bottom') ? r.bottom : 0);
                if (s > score) { score = s; best = i; }
            });
            return best; }""", edge)
        assert pick >= 0
        page.wait_for_timeout(200)  # the scroll events, which hide a tooltip, have fired
        token = tokens.nth(pick)
        box = token.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        tip = page.evaluate(TIPBOX)
        assert tip is not None, "the tooltip shows"
        assert tip["left"] >= 0 and tip["top"] >= 0 and tip["right"] <= tip["w"] and tip["bottom"] <= tip["h"], tip
        if "bottom" in edge:
            assert tip["bottom"] <= box["y"] + 1, "flipped above the token"
        assert "top-5" in tip["text"] and f"pos {pick}" in tip["text"]
    guard.assert_nothing_left()


def test_inputs_are_hidden_by_tags_until_show_code_and_the_bar_links_the_neighbours(exported, tmp_path):
    with headless_chromium(tmp_path) as (context, guard):
        page = context.new_page()
        page.goto(exported.as_uri())
        inputs = page.locator(".jp-CodeCell .jp-Cell-inputWrapper")
        assert inputs.count() == len(CELLS), "hidden, not deleted"
        assert all(c.get_attribute("class").count("celltag_hide-input") for c in page.locator(".jp-CodeCell").all())
        assert not any(i.is_visible() for i in inputs.all())
        assert page.locator(".jp-CodeCell").first.is_hidden(), "a cell with no output takes no space"
        page.locator("#rp-show-code").first.check()
        assert all(i.is_visible() for i in inputs.all())
        hrefs = page.eval_on_selector_all("nav.rp-nav a", "as => as.map(a => [a.rel, a.getAttribute('href')])")
        assert ["prev", "01_first.html"] in hrefs and ["next", "03_third.html"] in hrefs
        assert ["", "index.html"] in hrefs
        assert page.locator("nav.rp-nav").count() == 2, "at the top and at the bottom"
    guard.assert_nothing_left()


def test_the_viewers_page_shows_a_linked_token_or_says_how_to_open_it(tmp_path):
    from rlprobe_nb.render import page_viewer, viewer_links, viewer_targets

    s = synthetic.synthetic_suite(n_problems=4, rollouts_per_problem=1, n_tokens=300, seed=4)
    linked = viewer_targets.linked_targets(s["tokens"], s["spikes"], s["spike_tests"])
    app = viewer.open_viewer(s["tokens"], s["spikes"], synthetic.decode, linked=linked)
    page_file = tmp_path / "07_viewer.html"
    page_file.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body><h1>07</h1>"
                         "<div style='height:1500px'></div>" + page_viewer.page_viewer_html(app, linked) + "</body></html>",
                         encoding="utf-8")
    held = linked[linked.rollout_id != app.rollout.value].iloc[-1]  # not the rollout it opens on
    with headless_chromium(tmp_path) as (context, guard):
        page = context.new_page()
        page.goto(f"{page_file.as_uri()}#{viewer_links.fragment(held.rollout_id, held.pos)}")
        token = page.locator(f".rp-page-viewer .rp-pane-body .rp-tok.rp-sel[data-pos='{held.pos}']")
        assert token.count() == 1, "the token ringed"
        assert page.eval_on_selector(".rp-page-viewer select", "s => s.value") == held.rollout_id
        box, view = token.bounding_box(), page.viewport_size
        assert 0 <= box["y"] and box["y"] + box["height"] <= view["height"], "scrolled into the window"
        assert page.locator(f".rp-details .rp-token-details[data-pos='{held.pos}']").count() == 1, "its history"
        assert page.locator(".rp-pv-missing").is_hidden()
        page.goto(f"{page_file.as_uri()}#{viewer_links.fragment('elsewhere#0', 3)}")
        note = page.locator(".rp-pv-missing")
        assert note.is_visible() and "papermill notebooks/07_viewer.ipynb" in note.text_content()
        assert "-p rollout_id 'elsewhere#0' -p token 3" in note.text_content()
        box = note.bounding_box()
        assert 0 <= box["y"] and box["y"] + box["height"] <= view["height"], "the note where the page opens"
    guard.assert_nothing_left()

"""The small book's exported pages as a reader meets them, in one headless chromium with the
network cut off (issue 35): every page quiet in the console and free of printed missing
values; every chart answering a hover with named, readable numbers; every link landing on
what it names, in the window; the viewer's page doing what the live viewer does with the
data it holds (hover, click, search, steps)."""

from __future__ import annotations

import re

import pytest
from book_reader import (hover_every_chart, landing, links, narrow_problems, open_page, too_precise,
                         visible_text_problems)
from browser_harness import headless_chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with headless_chromium(tmp_path_factory.mktemp("reader"), width=1280, height=900) as (context, guard):
        yield context, guard
    guard.assert_nothing_left()


@pytest.fixture(scope="module")
def pages(small_book):
    found = sorted(small_book["figures"].glob("*.html"))
    assert len(found) >= 10 and any(p.name == "index.html" for p in found)
    return found


def listen(page) -> list[str]:
    said = []
    page.on("console", lambda m: said.append(f"{m.type}: {m.text}") if m.type in ("warning", "error") else None)
    page.on("pageerror", lambda e: said.append(f"page error: {e}"))
    return said


def test_every_page_is_quiet_and_prints_no_missing_value(browser, pages):
    context, _ = browser
    page = context.new_page()
    said = listen(page)
    problems = {}
    for path in pages:
        said.clear()
        open_page(page, path)
        page.wait_for_timeout(200)  # late warnings (a chart's data flow) arrive
        found = said + [f"shows {w!r}" for w in visible_text_problems(page)]
        if found:
            problems[path.name] = found
    page.close()
    assert problems == {}, problems


def test_every_chart_answers_a_hover_with_named_readable_numbers(browser, pages):
    context, _ = browser
    page = context.new_page()
    dumb, unreadable, n = [], [], 0
    for path in pages:
        open_page(page, path)
        for hover in hover_every_chart(page):
            n += 1
            where = f"{path.name} chart {hover['chart']} layer {hover['mark']} ({hover['kind']})"
            tip = hover["tooltip"]
            if tip is None:
                dumb.append(f"{where}: no tooltip")
                continue
            if not tip["rows"] or any(not key.strip() for key, _ in tip["rows"]):
                unreadable.append(f"{where}: a value without a name {tip['rows']}")
            long = too_precise(tip["text"])
            if long:
                unreadable.append(f"{where}: {long}")
    page.close()
    assert n >= 20, "the small book's charts"
    assert dumb == [] and unreadable == [], (dumb, unreadable)


def test_every_link_lands_on_what_it_names(browser, pages):
    context, _ = browser
    page = context.new_page()
    targets = {}
    for path in pages:
        page.goto(path.as_uri())
        for a in links(page):
            assert a["url"].startswith("file:"), f"{path.name} links off the book: {a}"
            targets.setdefault(a["url"], (path.name, a["text"]))
    opens = [u for u in targets if "#open=" in u]
    assert opens and any(targets[u][0] == "05_spikes.html" for u in opens) \
        and any(targets[u][0] == "06_case_studies.html" for u in opens), "05's and 06's links to the viewer"
    missed = [(source, text, where) for url, (source, text) in targets.items()
              if not (where := landing(page, url))["landed"]]
    page.close()
    assert missed == [], missed


def test_at_800_px_tables_keep_their_columns_in_view_and_chart_labels_stay_readable(browser, pages):
    """Issue 41, acceptance 4: in an 800-px window no table hides more than a third of its
    columns behind a scrollbar (the others wait behind a button), no chart label is under
    9 px (a wide chart scrolls instead of shrinking)."""
    context, _ = browser
    page = context.new_page()
    page.set_viewport_size({"width": 800, "height": 900})
    problems = {}
    for path in pages:
        open_page(page, path)
        found = narrow_problems(page)
        if found:
            problems[path.name] = found
    page.close()
    assert problems == {}, problems


def test_the_index_states_the_answer_on_its_first_screen(browser, pages):
    """Issue 41, acceptance 1: at 1280 x 800 the index's first screen holds the findings
    paragraph whole, with three or more numbers read from the tables."""
    context, _ = browser
    page = context.new_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(next(p for p in pages if p.name == "index.html").as_uri())
    box = page.eval_on_selector("p.rp-findings", "p => p.getBoundingClientRect().bottom")
    numbers = page.eval_on_selector_all("p.rp-findings .rp-num", "ns => ns.length")
    page.close()
    assert box <= 800 and numbers >= 3, (box, numbers)


def test_the_viewers_page_hovers_selects_searches_and_steps(browser, small_book, monkeypatch):
    from test_lab_viewer import book_viewer

    from rlprobe_nb.render.token_pane import search_hits, unpack_layer

    context, _ = browser
    app, P = book_viewer(small_book, monkeypatch)
    page = context.new_page()
    open_page(page, small_book["figures"] / "07_viewer.html")
    viewer = page.locator(".rp-page-viewer")
    tokens = viewer.locator(".rp-pane-body .rp-tok")
    texts = tokens.evaluate_all("es => es.map(e => e.textContent)")
    assert page.eval_on_selector(".rp-page-viewer select", "s => s.value") == app.rollout.value
    assert texts == app.pane.texts, "the opening rollout, token by token"
    assert "has no kernel" in viewer.text_content(), "the page says what its viewer holds and does"

    for pos in (1, len(texts) // 2, len(texts) - 1):  # hover: the live viewer's tooltip, to the character
        tokens.nth(pos).scroll_into_view_if_needed()
        tokens.nth(pos).hover()
        assert page.text_content(".rp-tipbox") == app.tooltip(P.checkpoints[-1], pos)

    pos = len(texts) // 2
    tokens.nth(pos).click()  # click: ringed, and its values over steps with both models' top-k
    assert viewer.locator(".rp-tok.rp-sel").evaluate_all("es => es.map(e => +e.dataset.pos)") == [pos]
    details = viewer.locator(f".rp-details .rp-token-details[data-pos='{pos}']")
    assert details.count() == 1
    for row in app.series(pos).itertuples():
        assert f"step {int(row.step)}{row.value:+.4f}" in details.text_content()

    needle = next(t.strip() for t in texts if len(t.strip()) >= 2)  # search: outlined and counted
    viewer.locator(".rp-search").fill(needle)
    hits = tokens.evaluate_all("es => es.flatMap((e, i) => e.classList.contains('rp-hit') ? [i] : [])")
    assert hits == search_hits(texts, needle) and hits
    assert viewer.locator(".rp-search-count").text_content() == \
        f"{len(hits)} token{'' if len(hits) == 1 else 's'} match"

    first = P.checkpoints[0]  # the step slider: the colours of that step, and its tooltips
    viewer.locator(".rp-pv-step input").evaluate("(s) => { s.value = 0; s.dispatchEvent(new Event('input')); }")
    app.step.value = first
    colours = tokens.evaluate_all("es => es.map(e => getComputedStyle(e).backgroundColor)")
    assert colours == [rgb(t["bg"]) for t in unpack_layer(app.pane.layers[0])]
    tokens.nth(pos).hover()
    assert page.text_content(".rp-tipbox") == app.tooltip(first, pos)

    viewer.locator("button", has_text="next spike").click()  # selects a spike, or says there is none
    note = viewer.locator(".rp-pv-bar .rp-pv-note").text_content()
    selected = viewer.locator(".rp-tok.rp-sel").get_attribute("class")
    assert ("rp-spike" in selected and note == "") or re.search(r"no spike is outlined at step \d+", note), note
    page.close()


def rgb(colour: str) -> str:
    return "rgb(%d, %d, %d)" % tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))

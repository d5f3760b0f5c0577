"""The live viewer as a user meets it (issue 16, acceptance 2; issue 26, acceptance 1;
issue 35): JupyterLab, started with the project's settings on localhost, opens
notebooks/07_viewer.ipynb in headless Debian chromium with the network cut off and runs all
cells against the small book's tables. Then, as a reader would:

- at 1,024 px with the file browser open, every control is readable (no list cut short, no
  slider without its value, no label cut, nothing past the notebook's edge, no sentinel),
  and "next spike" selects a spike or says the step has none and which step has;
- hovering a token shows its tooltip inside the window, with the table's numbers (the text
  the package writes for that token and step);
- clicking a token selects it (ringed; its values over steps and top-k at every step shown);
- searching a string outlines every token of its occurrences;
- moving the step slider recolours exactly the tokens whose value changed between the two
  steps, each to the colour the package computes;
- a chart of 04 shows its tooltip (JupyterLab's own Vega renderer, offline);
- in chapter 06, a case's tokens (static HTML) show their tooltips inside the window too,
  and a link in a case opens the viewer at that case's rollout and token.
"""

import re
import shutil
from pathlib import Path

import pytest
import session_book
from browser_harness import headless_chromium, pixel_spread, require_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(2400)]
REPO = Path(__file__).resolve().parents[2]
TOKENS = ".rp-pane-body .rp-tok"
COLOURS = "els => els.map(e => getComputedStyle(e).backgroundColor)"
TIPBOX = """() => { const b = document.querySelector('.rp-tipbox');
    if (!b || b.style.display === 'none') return null;
    const r = b.getBoundingClientRect();
    return {text: b.textContent, left: r.left, top: r.top, right: r.right, bottom: r.bottom,
            w: document.documentElement.clientWidth, h: document.documentElement.clientHeight}; }"""


def book_viewer(book, monkeypatch):
    """The viewer on the small book's tables, as notebook 07 opens it."""
    from rlprobe_nb.render import viewer
    from rlprobe_nb.suite import params
    from rlprobe_nb.tables import lineage, suite_tables

    for name in ("RLPROBE_OUT", "RLPROBE_PARAMS"):
        monkeypatch.setenv(name, book["env"][name])
    P = params.load("demo")
    tokens = suite_tables.read_tokens(P)
    tokens = tokens[tokens.reference == P.reference]
    spikes = lineage.read_derived(P, "spikes")
    rollouts, _ = lineage.read_current(P, "rollouts")
    from rlprobe_nb.suite import models

    tokenizer = models.load_tokenizer(P.reference, P)
    return viewer.open_viewer(tokens, spikes, lambda i: tokenizer.decode([i]),
                              dict(zip(rollouts.rollout_id, rollouts.response)),
                              rollout_id=viewer.default_rollout(tokens, spikes)), P


def expected_colours(app, checkpoint: str) -> list[str]:
    from rlprobe_nb.render.token_pane import unpack_layer

    app.step.value = checkpoint
    return [css_rgb(t["bg"]) for t in unpack_layer(app.pane.layers[0])]


def css_rgb(colour: str) -> str:
    """'#rrggbb' as 'rgb(r, g, b)' (what getComputedStyle returns)."""
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def open_and_run(page, lab, path: str) -> None:
    """Open ``path`` in JupyterLab (in the app already loaded, if any: its other notebooks
    and their widgets stay alive) and run all its cells."""
    if "/lab" in page.url:
        page.evaluate("(path) => { window.jupyterapp.commands.execute('docmanager:open', {path}); }", path)
    else:
        page.goto(lab.browser_url(f"/lab/tree/{path}"))
    wait_for_kernel(page, path)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")


def wait_for_kernel(page, path: str) -> None:
    page.wait_for_function("(path) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                           " return w && w.context && w.context.path === path && w.sessionContext"
                           " && w.sessionContext.session && w.sessionContext.session.kernel"
                           " && w.sessionContext.session.kernel.connectionStatus === 'connected'; }",
                           arg=path, timeout=180_000)
    page.wait_for_timeout(2000)  # the kernel settles


def hover_tooltip(page, token) -> dict:
    token.scroll_into_view_if_needed()
    page.wait_for_timeout(300)  # scrolling hides a tooltip: let its events pass
    box = token.bounding_box()
    page.mouse.move(box["x"] + 2, box["y"] + box["height"] / 2)
    page.wait_for_function("() => { const b = document.querySelector('.rp-tipbox');"
                           " return b && b.style.display !== 'none' && b.textContent.includes('top-'); }",
                           timeout=60_000)
    page.wait_for_timeout(500)  # an answer for another step, if one was on its way, has come
    return page.evaluate(TIPBOX)


# Every control of the viewer at 1,024 px with the file browser open: what a reader cannot
# read (a list cut short, a slider's value lost, a label cut, a control past the notebook's
# edge, a sentinel in the token field).
CONTROLS_UNREADABLE = """() => {
  const root = [...document.querySelectorAll('.jp-OutputArea-output .widget-vbox')]
    .find(v => v.querySelector('.rp-pane'));
  const area = root.closest('.jp-OutputArea-output').getBoundingClientRect();
  const out = [];
  const canvas = document.createElement('canvas').getContext('2d');
  const width = (el, text) => { const s = getComputedStyle(el); canvas.font = `${s.fontSize} ${s.fontFamily}`;
                                return canvas.measureText(text).width; };
  for (const w of root.querySelectorAll('.widget-inline-hbox, .widget-button, .widget-toggle-buttons')) {
    const r = w.getBoundingClientRect();
    if (!r.width) continue;  // not shown
    if (r.right > area.right + 1 || r.left < area.left - 1) out.push(`past the edge: ${w.textContent.trim().slice(0, 30)}`);
  }
  for (const label of root.querySelectorAll('.widget-label')) {
    if (label.getBoundingClientRect().width && label.scrollWidth > label.clientWidth + 1) out.push(`label cut: ${label.textContent}`);
  }
  for (const select of root.querySelectorAll('select')) {
    const shown = select.options[select.selectedIndex];
    if (shown && select.getBoundingClientRect().width && width(select, shown.textContent) > select.clientWidth - 24)
      out.push(`list cut: ${shown.textContent.slice(0, 40)}`);
  }
  for (const readout of root.querySelectorAll('.widget-readout')) {
    const r = readout.getBoundingClientRect();
    if (readout.closest('.widget-hslider').getBoundingClientRect().width &&
        (!r.width || r.right > area.right + 1 || readout.scrollWidth > readout.clientWidth + 1))
      out.push(`slider value lost: ${readout.textContent}`);
  }
  for (const input of root.querySelectorAll('input[type=text], input[type=number]')) {
    if (/^-1$/.test(input.value.trim())) out.push(`a sentinel shown: ${input.value}`);
    const shown = input.value || input.placeholder, s = getComputedStyle(input);
    const room = input.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
    if (input.getBoundingClientRect().width && width(input, shown) > room) out.push(`text cut: ${shown}`);
  }
  return out;
}"""


def test_the_viewer_in_jupyterlab(small_book, tmp_path, monkeypatch):
    from lab_server import lab_server

    from rlprobe_nb.render.token_pane import search_hits

    require_browser()
    app, P = book_viewer(small_book, monkeypatch)
    want_final = expected_colours(app, P.checkpoints[-1])
    want_earlier = expected_colours(app, P.checkpoints[-2])
    app.step.value = P.checkpoints[-1]
    with lab_server(REPO, tmp_path / "lab", args=("--LabApp.expose_app_in_browser=True",)) as lab, \
            headless_chromium(tmp_path, width=1280, height=900) as (context, guard):
        page = context.new_page()
        open_and_run(page, lab, "notebooks/07_viewer.ipynb")
        page.wait_for_selector(TOKENS, timeout=600_000)

        # 1,024 px with the file browser open: every control readable, no sentinel shown
        page.set_viewport_size({"width": 1024, "height": 800})
        page.evaluate("window.jupyterapp.commands.execute('filebrowser:activate')")
        page.wait_for_timeout(1500)
        assert page.evaluate("window.jupyterapp.shell.leftCollapsed") is False
        assert page.evaluate(CONTROLS_UNREADABLE) == []
        assert page.locator(".widget-text input").first.get_attribute("placeholder").startswith("none")
        # "next spike": a spike selected, or says the step has none and which step has (the
        # spike controls show only where the suite has spikes)
        next_spike = page.locator(".widget-button", has_text="next spike")
        if next_spike.is_visible():
            next_spike.scroll_into_view_if_needed()
            next_spike.click()
            page.wait_for_function("() => document.querySelector('.rp-pane-body .rp-tok.rp-sel.rp-spike') || "
                                   "[...document.querySelectorAll('.widget-html-content')].some("
                                   "e => /no spike is outlined at step \\d+/.test(e.textContent))", timeout=60_000)
            assert page.evaluate(CONTROLS_UNREADABLE) == [], "readable with the note beside next spike too"
        selected = page.locator(f"{TOKENS}.rp-sel")
        if selected.count():  # a second click clears the selection: none for what follows
            selected.first.click()
            page.wait_for_function(f"() => !document.querySelector('{TOKENS}.rp-sel')", timeout=60_000)
        page.set_viewport_size({"width": 1280, "height": 900})
        page.evaluate("window.jupyterapp.shell.collapseLeft()")
        page.wait_for_timeout(1000)
        final = page.eval_on_selector_all(TOKENS, COLOURS)
        texts = page.eval_on_selector_all(TOKENS, "els => els.map(e => e.textContent)")
        assert texts == app.pane.texts, "the opening rollout, token by token"

        # hover: the tooltip, inside the window, with the table's numbers for that token
        pos = min(5, len(texts) - 1)
        tip = hover_tooltip(page, page.locator(TOKENS).nth(pos))
        assert tip["text"] == app.tooltip(P.checkpoints[-1], pos)
        assert 0 <= tip["left"] and tip["right"] <= tip["w"] and 0 <= tip["top"] and tip["bottom"] <= tip["h"], tip

        # click: selected, its series over steps and top-k at every step shown
        page.locator(TOKENS).nth(pos).click()
        page.wait_for_selector(f".rp-details .rp-token-details[data-pos='{pos}']", timeout=60_000)
        assert page.locator(f"{TOKENS}.rp-sel").count() == 1
        for ck in P.checkpoints:
            assert f"step {P.steps[ck]}" in page.text_content(".rp-details")

        # search: a token's text outlines every token of its occurrences
        needle = next(t.strip() for t in texts if len(t.strip()) >= 2)
        page.fill(".rp-pane .rp-search", needle)
        hits = page.eval_on_selector_all(TOKENS, "es => es.flatMap((e, i) => e.classList.contains('rp-hit') ? [i] : [])")
        assert hits == search_hits(texts, needle) and hits
        page.fill(".rp-pane .rp-search", "")

        # the step slider: one checkpoint earlier recolours exactly the tokens that changed
        slider = page.locator(".widget-hslider", has_text="RL step").locator(".noUi-handle").first
        slider.focus()
        page.keyboard.press("ArrowLeft")
        page.wait_for_function(f"(before) => {{ const now = [...document.querySelectorAll('{TOKENS}')]"
                               ".map(e => getComputedStyle(e).backgroundColor);"
                               " return now.length === before.length && now.some((c, i) => c !== before[i]); }",
                               arg=final, timeout=120_000)
        earlier = page.eval_on_selector_all(TOKENS, COLOURS)
        tip = hover_tooltip(page, page.locator(TOKENS).nth(pos))
        assert tip["text"] == app.tooltip(P.checkpoints[-2], pos), "the tooltip of the step shown"
        label = page.text_content(".rp-pane-body .rp-layer-label")
        assert label.startswith(f"step {P.steps[P.checkpoints[-2]]} · {P.checkpoints[-2]}"), label
        for toast in page.locator(".Toastify__toast button", has_text="No").all():
            toast.click()  # JupyterLab's question about its news: not part of the picture
        page.wait_for_timeout(1500)
        hover_tooltip(page, page.locator(TOKENS).nth(pos))  # the picture shows a tooltip
        shot = tmp_path / "lab_viewer.png"
        png = page.screenshot(path=str(shot), full_page=False)
        spread = pixel_spread(context, png)

        # a link from chapter 06 opens the running viewer at its case's rollout and token
        open_and_run(page, lab, "notebooks/06_case_studies.ipynb")
        link = page.locator(".rp-case a.rp-open").first
        link.wait_for(timeout=600_000)
        # a static rendering's tooltip (the case's response) works inside JupyterLab too
        case_token = page.locator(".rp-case .rp-resp .rp-tok").nth(3)
        case_tip = hover_tooltip(page, case_token)
        assert case_tip["text"] == case_token.get_attribute("data-tip")
        assert 0 <= case_tip["left"] and case_tip["right"] <= case_tip["w"] and 0 <= case_tip["top"] \
            and case_tip["bottom"] <= case_tip["h"], case_tip
        target = link.get_attribute("data-rp-open")
        link.click()
        rollout, token = re.search(r'"rollout": "([^"]+)", "pos": (\d+)', target).groups()
        page.wait_for_selector(f".rp-details .rp-token-details[data-pos='{token}']", timeout=120_000)
        assert page.locator(f"{TOKENS}.rp-sel").first.get_attribute("data-pos") == token
        assert rollout in page.text_content(".widget-html-content"), "the viewer shows the case's rollout"
        chosen = page.evaluate("""() => { const d = [...document.querySelectorAll('.widget-dropdown')]
            .find(d => (d.querySelector('label') || {}).textContent === 'rollout');
            const s = d.querySelector('select'); return s.options[s.selectedIndex].textContent; }""")
        assert chosen.split()[0] == rollout, (chosen, rollout)
    guard.assert_nothing_left()
    assert final == want_final, "the tokens at the final checkpoint"
    assert earlier == want_earlier, "the tokens one step earlier"
    changed = {i for i, (a, b) in enumerate(zip(want_earlier, want_final)) if a != b}
    assert changed and changed == {i for i, (a, b) in enumerate(zip(earlier, final)) if a != b}
    assert spread["std"] > 20, spread
    keep = REPO / "figures" / "lab_viewer.png"
    if not keep.exists():  # committed once, shown in the README
        shutil.copy(shot, keep)


def test_a_chart_of_04_shows_its_tooltip_in_jupyterlab(small_book, tmp_path, monkeypatch):
    """JupyterLab draws the book's charts with its own Vega renderer: interactive, offline."""
    from lab_server import lab_server

    require_browser()
    copy = session_book.private_copy(small_book, tmp_path / "book")  # 04 writes its figures
    for name in ("RLPROBE_OUT", "RLPROBE_PARAMS"):
        monkeypatch.setenv(name, copy["env"][name])
    with lab_server(REPO, tmp_path / "lab", args=("--LabApp.expose_app_in_browser=True",)) as lab, \
            headless_chromium(tmp_path, width=1280, height=900) as (context, guard):
        page = context.new_page()
        open_and_run(page, lab, "notebooks/04_divergence.ipynb")
        page.evaluate("window.jupyterapp.shell.collapseLeft()")  # the file browser closed
        marks = page.locator(".jp-RenderedVegaCommon5 .mark-symbol path")
        marks.first.wait_for(timeout=600_000)
        page.wait_for_timeout(3000)  # every chart drawn
        shown = None
        for i in range(min(marks.count(), 60)):  # the first mark whose chart has a tooltip
            point = marks.nth(i)
            point.scroll_into_view_if_needed()
            page.wait_for_timeout(150)
            box = point.bounding_box()
            if not box:
                continue
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            try:
                shown = page.wait_for_selector("#vg-tooltip-element.visible", timeout=1500)
                break
            except Exception:
                continue
        assert shown is not None and shown.text_content().strip(), "a chart's tooltip in JupyterLab"
        widths = page.eval_on_selector_all(".jp-RenderedVegaCommon5 svg.marks",
                                           "ss => ss.map(s => Math.round(s.getBoundingClientRect().right))")
        assert widths and max(widths) <= 1280, ("no chart cut off in a 1280-px window", widths)
    guard.assert_nothing_left()

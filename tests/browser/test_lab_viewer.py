"""The live viewer as a user meets it (issue 16, acceptance 2): JupyterLab, started with the
project's settings on localhost, opens notebooks/07_viewer.ipynb in headless Debian
chromium with the network cut off, runs all cells against the small book's tables, and
the widget shows the response's tokens coloured. Moving the checkpoint slider one step
recolours exactly the tokens whose value changed between the two steps: every token's
colour in the browser equals the one the package computes for that step."""

import re
import shutil
from pathlib import Path

import pytest
from browser_harness import headless_chromium, pixel_spread, require_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]
TOKENS = ".jupyter-widgets .rp-resp .rp-tok"
COLOURS = f"els => els.map(e => getComputedStyle(e).backgroundColor)"


def expected_colours(book, monkeypatch) -> tuple[list[str], list[str]]:
    """The viewer's colour of every token of its opening rollout at the last two
    checkpoints, as the package computes it (the same tables and defaults as notebook 07)."""
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
    app = viewer.open_viewer(tokens, spikes, None, dict(zip(rollouts.rollout_id, rollouts.response)),
                             rollout_id=viewer.default_rollout(tokens, spikes))
    out = []
    for ckpt in P.checkpoints[-2:]:
        app.step.value = ckpt
        out.append([css_rgb(c) for c in re.findall(
            r'class="rp-tok[^"]*"[^>]*style="background:([^;"]+)', app.html.value)])
    return out[0], out[1]


def css_rgb(colour: str) -> str:
    """'#rrggbb' or 'rgb(r, g, b)' as 'rgb(r, g, b)' (what getComputedStyle returns)."""
    colour = colour.strip()
    if colour.startswith("#"):
        r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
        return f"rgb({r}, {g}, {b})"
    return re.sub(r"\s*,\s*", ", ", colour)


def test_the_viewer_recolours_in_jupyterlab(small_book, tmp_path, monkeypatch):
    from lab_server import lab_server

    require_browser()
    for name in ("RLPROBE_OUT", "RLPROBE_PARAMS"):  # the kernel reads the small book
        monkeypatch.setenv(name, small_book["env"][name])
    with lab_server(REPO, tmp_path / "lab", args=("--LabApp.expose_app_in_browser=True",)) as lab, \
            headless_chromium(tmp_path, width=1400, height=1000) as (context, guard):
        page = context.new_page()
        page.goto(lab.browser_url("/lab/tree/notebooks/07_viewer.ipynb"))
        page.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget"
                               " && window.jupyterapp.shell.currentWidget.sessionContext"
                               " && window.jupyterapp.shell.currentWidget.sessionContext.session",
                               timeout=180_000)
        page.wait_for_timeout(2000)  # the kernel settles
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_selector(TOKENS, timeout=600_000)
        final = page.eval_on_selector_all(TOKENS, COLOURS)
        slider = page.locator(".widget-hslider", has_text="checkpoint").locator(".noUi-handle").first
        slider.focus()
        page.keyboard.press("ArrowLeft")  # one checkpoint earlier
        page.wait_for_function(f"(before) => {{ const now = [...document.querySelectorAll('{TOKENS}')]"
                               ".map(e => getComputedStyle(e).backgroundColor);"
                               " return now.length === before.length && now.some((c, i) => c !== before[i]); }",
                               arg=final, timeout=120_000)
        earlier = page.eval_on_selector_all(TOKENS, COLOURS)
        shot = tmp_path / "lab_viewer.png"
        png = page.screenshot(path=str(shot), full_page=False)
        spread = pixel_spread(context, png)
    guard.assert_nothing_left()
    want_earlier, want_final = expected_colours(small_book, monkeypatch)
    assert final == want_final, "the tokens at the final checkpoint"
    assert earlier == want_earlier, "the tokens one step earlier"
    changed = {i for i, (a, b) in enumerate(zip(want_earlier, want_final)) if a != b}
    assert changed and changed == {i for i, (a, b) in enumerate(zip(earlier, final)) if a != b}
    assert spread["std"] > 20, spread
    keep = REPO / "figures" / "lab_viewer.png"
    if not keep.exists():  # committed once, shown in the README
        shutil.copy(shot, keep)

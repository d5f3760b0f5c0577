"""A notebook that opens the viewer, executed by a kernel and exported to HTML the way the
book exports every chapter: in a browser without a kernel or network, the viewer's output
is not empty but the coloured response (its static fallback), tooltips included.

nbclient (and papermill, built on it) stores the widgets' state in the notebook; nbconvert
then renders a widget output through a widget manager loaded from a CDN instead of the
output's text/html fallback, which offline leaves the viewer's area empty. The export must
drop that state (``nb.metadata["widgets"]``) for the fallback to show.
"""

import nbformat
import pytest
from nbclient import NotebookClient

from browser_harness import headless_chromium, pixel_spread, tooltip_visible
from rlprobe_nb import book

pytestmark = pytest.mark.browser

CELLS = [
    "from rlprobe_nb import viewer\nfrom rlprobe_nb.render import synthetic\n"
    "s = synthetic.synthetic_suite(n_problems=2, rollouts_per_problem=1, n_tokens=30, seed=3)",
    "viewer.open_viewer(s['tokens'], s['spikes'], synthetic.decode,\n"
    "                   dict(zip(s['rollouts'].rollout_id, s['rollouts'].response)))",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    assert "widgets" in nb.metadata, "the kernel's widget state is stored, as papermill stores it"
    return nb, tmp_path_factory.mktemp("nb")


@pytest.fixture(scope="module")
def exported(executed):
    nb, folder = executed
    nbformat.write(nb, folder / "viewer.ipynb")
    return book.export_html(folder / "viewer.ipynb")


@pytest.fixture(scope="module")
def exported_without_widget_state(executed):
    nb, folder = executed
    nb = nbformat.from_dict(nb)
    del nb.metadata["widgets"]
    nbformat.write(nb, folder / "viewer_stateless.ipynb")
    return book.export_html(folder / "viewer_stateless.ipynb")


def check_static_viewer(path, tmp_path):
    with headless_chromium(tmp_path) as (context, guard):
        page = context.new_page()
        page.goto(path.as_uri())
        spans = page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output .rp-tok')]
            .map(s => getComputedStyle(s).backgroundColor)""")
        assert len(spans) == 30, "the widget's output area holds the static rendering"
        assert len(set(spans)) > 5, "coloured by value"
        token = page.locator(".jp-OutputArea-output .rp-tok").nth(3)
        assert tooltip_visible(page, token), "the tooltip shows, unclipped by the output area"
        assert "top-5" in token.evaluate("el => getComputedStyle(el, '::after').content")
        spread = pixel_spread(context, page.screenshot(full_page=True))
    assert spread["std"] > 10


def test_fallback_shows_when_the_export_drops_the_widget_state(exported_without_widget_state, tmp_path):
    check_static_viewer(exported_without_widget_state, tmp_path)


@pytest.mark.xfail(strict=True, reason="book.export_html keeps the widget state papermill stores, so "
                                       "nbconvert loads a widget manager from a CDN instead of the fallback")
def test_exported_viewer_shows_the_coloured_response(exported, tmp_path):
    check_static_viewer(exported, tmp_path)


@pytest.mark.xfail(strict=True, reason="book.export_html links require.js and MathJax from a CDN "
                                       "(nbconvert's defaults); the lead owns that exporter")
def test_exported_page_requests_nothing(exported, tmp_path):
    with headless_chromium(tmp_path) as (context, guard):
        context.new_page().goto(exported.as_uri())
    guard.assert_nothing_left()

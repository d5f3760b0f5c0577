"""A notebook that opens the viewer, executed by a kernel (which stores the widgets'
state, as papermill does) and exported by the book's own exporter: in a browser without a
kernel or network, the viewer's output is not empty but the viewer for a page (its
text/html fallback): the coloured response, with the live viewer's tooltips, and the page
requests nothing."""

import nbformat
import pytest
from browser_harness import headless_chromium, pixel_spread, tooltip_visible
from nbclient import NotebookClient

from rlprobe_nb import book
from rlprobe_nb.kernels import LocalKernelManager

pytestmark = pytest.mark.browser

CELLS = [
    "from rlprobe_nb.render import synthetic, viewer\n"
    "s = synthetic.synthetic_suite(n_problems=2, rollouts_per_problem=1, n_tokens=30, seed=3)",
    "viewer.open_viewer(s['tokens'], s['spikes'], synthetic.decode,\n"
    "                   dict(zip(s['rollouts'].rollout_id, s['rollouts'].response)))",
]


def live_viewer():
    """The viewer the notebook opens, built here from the same synthetic tables."""
    from rlprobe_nb.render import synthetic, viewer

    s = synthetic.synthetic_suite(n_problems=2, rollouts_per_problem=1, n_tokens=30, seed=3)
    return viewer.open_viewer(s["tokens"], s["spikes"], synthetic.decode,
                              dict(zip(s["rollouts"].rollout_id, s["rollouts"].response)))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=300, kernel_name="python3", kernel_manager_class=LocalKernelManager).execute()
    assert "widgets" in nb.metadata, "the kernel's widget state is stored, as papermill stores it"
    path = tmp_path_factory.mktemp("nb") / "viewer.ipynb"
    nbformat.write(nb, path)
    page, network = book.export_html(path)
    assert network == [], network
    return page


def test_exported_viewer_shows_the_coloured_response(exported, tmp_path):
    with headless_chromium(tmp_path) as (context, guard):
        page = context.new_page()
        page.goto(exported.as_uri())
        spans = page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output .rp-tok')]
            .map(s => getComputedStyle(s).backgroundColor)""")
        assert len(spans) == 30, "the widget's output area holds the static rendering"
        assert len(set(spans)) > 5, "coloured by value"
        token = page.locator(".jp-OutputArea-output .rp-tok").nth(3)
        assert tooltip_visible(page, token), "the tooltip shows, unclipped by the output area"
        assert page.text_content(".rp-tipbox") == live_viewer().tooltip("rlvr_step_1200", 3), "the live one's text"
        assert "top-5" in page.text_content(".rp-tipbox")
        spread = pixel_spread(context, page.screenshot(full_page=True))
    guard.assert_nothing_left()
    assert spread["std"] > 10

"""`python -m rlprobe_nb.book` as a user meets it: a failed run keeps its executed
notebook and says where; every exported page opens with no network (no CDN scripts,
progress bars as text, no widget-only outputs, formulas readable as LaTeX)."""

import re
from pathlib import Path

import nbformat
import pytest

from rlprobe_nb import book, progress
from rlprobe_nb.suite import paths

pytestmark = pytest.mark.timeout(600)


def write_notebook(path: Path, *cells: str) -> Path:
    """A notebook of code cells; a cell starting with 'md:' is markdown."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"},
        "jupytext": {"formats": "ipynb,py:percent"}})  # paired, as the chapters are
    nb.cells = [nbformat.v4.new_markdown_cell(c[3:]) if c.startswith("md:")
                else nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)
    return path


def outputs(nb_path: Path) -> list[dict]:
    return [o for c in nbformat.read(nb_path, 4).cells for o in c.get("outputs", [])]


# ----------------------------------------------------------------------------- a failed run

@pytest.fixture()
def out(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path / "out"))
    monkeypatch.delenv("RLPROBE_SUITE", raising=False)
    return paths.figures_dir("demo")


def test_a_failed_run_keeps_its_executed_notebook_and_exits_nonzero(tmp_path, out, monkeypatch, capsys):
    nb = write_notebook(tmp_path / "zz_flaky.ipynb",
                        "import os\nprint('first cell ran')",
                        "if os.environ.get('FLAKY_FAIL'):\n"
                        "    raise ValueError('the answer column is missing')\nprint('second cell ran')")
    monkeypatch.setattr(book, "notebooks", lambda: [nb])
    assert book.main(["--only", "zz_flaky"]) == 0
    good, good_page = (out / "zz_flaky.ipynb").read_bytes(), (out / "zz_flaky.html").read_bytes()

    monkeypatch.setenv("FLAKY_FAIL", "1")
    assert book.main(["--only", "zz_flaky"]) == 1
    failed = out / "zz_flaky.FAILED.ipynb"
    said = capsys.readouterr().err
    assert str(failed) in said and "ValueError: the answer column is missing" in said
    traceback = "\n".join("\n".join(o.get("traceback", [])) for o in outputs(failed))
    assert "the answer column is missing" in traceback
    assert any("first cell ran" in o.get("text", "") for o in outputs(failed))
    assert "the answer column is missing" in failed.with_suffix(".html").read_text()
    assert (out / "zz_flaky.ipynb").read_bytes() == good, "the last good output was replaced"
    assert (out / "zz_flaky.html").read_bytes() == good_page
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "temporary files left"

    monkeypatch.delenv("FLAKY_FAIL")
    assert book.main(["--only", "zz_flaky"]) == 0
    assert not failed.exists() and not failed.with_suffix(".html").exists(), (
        "a stale failure beside a good output would mislead")


def test_executed_notebooks_are_not_paired(tmp_path, out, monkeypatch):
    """Saved from JupyterLab, an executed notebook must not grow a .py twin in figures/."""
    nb = write_notebook(tmp_path / "zz_paired.ipynb", "import os",
                        "assert not os.environ.get('PAIRED_FAIL')")
    monkeypatch.setattr(book, "notebooks", lambda: [nb])
    assert book.main(["--only", "zz_paired"]) == 0
    monkeypatch.setenv("PAIRED_FAIL", "1")
    assert book.main(["--only", "zz_paired"]) == 1
    for executed in (out / "zz_paired.ipynb", out / "zz_paired.FAILED.ipynb"):
        assert "formats" not in nbformat.read(executed, 4).metadata.get("jupytext", {})


# ----------------------------------------------------------------------------- offline pages

# Grepped independently of book.network_references: what a browser would fetch.
SCRIPT_SRC = re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"']?\s*(?:https?:)?//", re.I)
LINK_HREF = re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?\s*(?:https?:)?//", re.I)
SCRIPT_BODY = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.I | re.S)
CSS_IMPORT = re.compile(r"(?:@import|url\()\s*[\"']?\s*(?:https?:)?//", re.I)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def offline_problems(page: str) -> list[str]:
    problems = [m[0] for m in SCRIPT_SRC.finditer(page)] + [m[0] for m in LINK_HREF.finditer(page)]
    # the inlined Vega scripts (marked data-rp-bundle) name URLs they never fetch; the
    # browser tests load their pages with the network cut off and see no request
    problems += [f"script body loads {url}" for attrs, body in SCRIPT_BODY.findall(page)
                 if "data-rp-bundle" not in attrs for url in re.findall(r"https?://[^\s\"'`]+", body)]
    problems += [m[0] for m in CSS_IMPORT.finditer(page)]
    if WIDGET_VIEW in page:
        problems.append("a widget view only the widget manager (a CDN script) can draw")
    return problems


def widget_only_outputs(nb_path: Path) -> list[str]:
    """Cells whose widget view has no static output (HTML, image) beside it."""
    found = []
    for cell in nbformat.read(nb_path, 4).cells:
        data = [o.get("data", {}) for o in cell.get("outputs", [])]
        static = any(m in d for d in data for m in book.STATIC_MIMETYPES)
        if any(WIDGET_VIEW in d for d in data) and not static:
            found.append(cell.source.splitlines()[0])
    return found


HAZARDS = [
    "md:Forward KL $\\mathrm{KL}(P \\| Q)$ and entropy $$H(p) = -\\sum_x p(x) \\log p(x)$$",
    "from rlprobe_nb.generation import rollouts  # as the chapters do",
    "from rlprobe_nb.progress import tqdm\nfor _ in tqdm(range(40), desc='book loop'):\n    pass",
    "from transformers.utils import logging as hf_logging  # the bar of 'Loading weights'\n"
    "for _ in hf_logging.tqdm(range(30), desc='Loading weights'):\n    pass",
    "import datasets\ndatasets.Dataset.from_dict({'x': list(range(20))}).map(lambda row: row)",
    "from huggingface_hub.utils import tqdm as hub_tqdm\nfor _ in hub_tqdm(range(10), desc='hub files'):\n"
    "    pass",
    "import altair as alt, pandas as pd\nfrom rlprobe_nb import views\n"
    "views.show(alt.Chart(pd.DataFrame({'x': [1, 2], 'y': [3, 4]})).mark_line().encode(x='x', y='y'))",
    "import ipywidgets\nipywidgets.IntSlider(value=3)",
]


def test_exported_page_needs_no_network(tmp_path, out):
    nb = write_notebook(tmp_path / "hazards.ipynb", *HAZARDS)
    out.mkdir(parents=True)
    book.run_one(nb, {}, "hazards", out)
    page = (out / "hazards.html").read_text()
    assert offline_problems(page) == []
    assert book.network_references(page) == []

    # progress bars: the book's and transformers' as text in the executed notebook (a live
    # reader sees them), datasets' and the hub's off; the page leaves them all out
    widgets = [o for o in outputs(out / "hazards.ipynb") if WIDGET_VIEW in o.get("data", {})]
    assert len(widgets) == 1, "only the slider may be a widget; progress bars are text"
    printed = "".join(o.get("text", "") for o in outputs(out / "hazards.ipynb"))
    assert "book loop: 100%" in printed and "40/40" in printed
    assert "Loading weights: 100%" in printed
    assert "book loop: " not in page and "Loading weights: " not in page and "%|" not in page
    assert "Map" not in printed and "hub files" not in printed
    # the slider, which has no static form, says so instead of drawing an empty box
    assert book.WIDGET_NOTE in page
    # formulas stay readable as their LaTeX source; charts are inline SVG
    assert "$\\mathrm{KL}(P \\| Q)$" in page and "$$H(p) = -\\sum_x p(x) \\log p(x)$$" in page
    assert "data:image/svg+xml" in page or "<svg" in page


def test_network_references_finds_what_a_browser_would_fetch():
    page = ('<script src="https://cdn.example.org/require.js"></script>'
            '<link rel="stylesheet" href="//fonts.example.org/a.css">'
            '<script>loadScript("https://cdn.jsdelivr.net/npm/vega@6")</script>'
            '<style>@import url("https://fonts.example.org/b.css");</style>'
            '<a href="https://example.org/paper">a link is not a fetch</a>'
            '<svg xmlns="http://www.w3.org/2000/svg"></svg>'
            '<script>document.createElementNS("http://www.w3.org/2000/svg", "g")</script>')
    found = book.network_references(page)
    assert len(found) == 4 and all("example.org/paper" not in f for f in found)
    assert len(offline_problems(page)) >= 4


def test_progress_bars_are_text_outside_kernels_too():
    from tqdm.notebook import tqdm as widget_tqdm

    assert not issubclass(progress.tqdm, widget_tqdm)
    progress.quiet_library_progress()
    progress.quiet_library_progress()  # idempotent
    from transformers.utils import logging as hf_logging

    bar = hf_logging.tqdm(range(3), disable=False)
    assert isinstance(bar, progress.tqdm)
    bar.close()


# Pages a user already has: `make demo` writes them under figures/<suite>/.
PAGES = sorted((paths.out_root() / "figures").glob("*/*.html"))


@pytest.mark.parametrize("page", PAGES or [None], ids=lambda p: p and f"{p.parent.name}/{p.name}")
def test_every_exported_page_under_figures_needs_no_network(page):
    if page is None:
        pytest.skip("no exported pages under figures/ yet (make demo writes them)")
    assert offline_problems(page.read_text()) == [], f"{page} needs the network (rerun make demo?)"
    executed = page.with_suffix(".ipynb")
    if executed.exists():
        assert widget_only_outputs(executed) == []


def test_the_appendix_page_needs_no_network(out):
    out.mkdir(parents=True)
    appendix = paths.notebooks_dir() / "appendix_demo_suite.ipynb"
    book.run_one(appendix, {}, "appendix_demo_suite", out)
    assert offline_problems((out / "appendix_demo_suite.html").read_text()) == []
    assert widget_only_outputs(out / "appendix_demo_suite.ipynb") == []

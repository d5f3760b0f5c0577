"""Run the book headlessly: every notebook in order through papermill (03 once per
checkpoint), each executed notebook and its HTML export under figures/<suite>/.

    python -m rlprobe_nb.book                 # the active suite (demo unless named)
    python -m rlprobe_nb.book --suite tulu3   # the real suite, on GPUs
    python -m rlprobe_nb.book --only 03       # one chapter
    python -m rlprobe_nb.book --only 03 --checkpoint rlvr_step_1200   # one run of 03
    python -m rlprobe_nb.book --overwrite     # recompute tables whose inputs changed
    python -m rlprobe_nb.book --prepare       # one-time set-up (convert the demo GGUF)

Notebooks skip work whose tables are already complete, so a second run is quick. The
first run of 03 forces every checkpoint (the reference's cache read and the metrics
compiled once in its kernel); the later runs of 03 only read their tables and draw their
pages. On a CPU, everything after that first run goes in two lanes side by side: chapter
09, which reads nothing written after 03, beside the readers and 04-08 (``waves``), each
kernel told how many of the cores it may use while the other lane runs (``cores``: one
each, then all to the lane left). On a GPU the chapters run one at a time, the readers of
03 two at a time (kernel start, imports and page export keep one core busy).

Several GPUs: the sharded stages (sampling in 01/02, teacher forcing in 03) start one
worker process per GPU (``distributed``); the first run of 03 forces the checkpoints one
per GPU at a time. From a shell,
``accelerate launch --multi_gpu --num_processes N -m rlprobe_nb.book ...`` does the same:
rank 0 runs the book with N workers per stage, the other ranks exit.

A run that fails keeps its executed notebook, traceback included, as
``figures/<suite>/<stem>.FAILED.ipynb`` (and ``.FAILED.html``) beside the last good output,
which it never replaces; the book stops there and exits with status 1.

The HTML pages open with no network: nbconvert's lab template without the scripts it
would fetch from a CDN (require.js, MathJax, mermaid, the widget manager). Formulas
therefore show as their LaTeX source (nbconvert has no server-side math renderer, and
MathJax itself cannot load offline); a widget view, which only the widget manager could
draw, shows its static fallback or a note. Charts shown through ``views.show`` stay
interactive. What every page would otherwise carry is one file beside the pages: the Vega
scripts that draw the charts (``pages.charts``) and JupyterLab's styles
(``pages.page_styles``), read from the same folder with no network. Input cells are
hidden by cell tags, with a "show code" switch (``pages.code_cells``); every page links to
the suite's index and to its previous and next pages, and the index (``index.html``, written
after every run) lists the chapters with their headline numbers read from the tables
(``pages.navigation``, ``pages.headlines``). Pages that still reference the network (an
output's own script, e.g. a chart displayed as an altair object instead of through
``views.show``) are listed at the end of the run.

Kernels are started with IPC transport where the system has it (``kernels``), so the run's
report is not interrupted by ipykernel's warning about unencrypted TCP. Lines in which a
notebook says it reused a complete table are repeated in the run's report.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

from rlprobe_nb import book_runs, cores, distributed
from rlprobe_nb.book_runs import NotebookFailed  # noqa: F401 (raised by run_one, caught here)
from rlprobe_nb.pages import navigation, page_styles
from rlprobe_nb.suite import params, paths
from rlprobe_nb.tables.atomic import FILE_MODE
from rlprobe_nb.tables.storage import MANIFEST

PER_CHECKPOINT = "03_teacher_forcing"


def notebooks() -> list[Path]:
    """Chapters in order (01, 02, ...), then appendices."""
    found = sorted(paths.notebooks_dir().glob("*.ipynb"))
    chapters = [p for p in found if p.stem[:2].isdigit()]
    return chapters + [p for p in found if p not in chapters]


def declared_parameters(nb: Path) -> set[str]:
    import papermill as pm

    return set(pm.inspect_notebook(str(nb)))


def runs(P: params.Params, only: list[str] | None = None,
         overwrite: bool = False, checkpoints: list[str] | None = None) -> list[tuple[Path, dict, str]]:
    """(notebook, papermill parameters, output stem) for each run of the book. A notebook
    gets ``suite`` only if it declares it (the appendix is about the demo suite alone), and
    ``overwrite=True`` (recompute tables whose inputs changed) if asked and declared;
    ``checkpoints`` keeps only those runs of the per-checkpoint chapter (03)."""
    unknown = sorted(set(checkpoints or []) - set(P.forced))
    if unknown:
        raise params.ParamsError(f"unknown checkpoint(s) {unknown} for suite {P.suite!r}; "
                                 f"valid: {list(P.forced)}")
    wanted = [c for c in P.forced if not checkpoints or c in checkpoints]
    out = []
    for nb in notebooks():
        if only and not any(nb.stem.startswith(o) for o in only):
            continue
        declared = declared_parameters(nb)
        base = {"suite": P.suite} if "suite" in declared else {}
        if overwrite and "overwrite" in declared:
            base["overwrite"] = True
        if nb.stem == PER_CHECKPOINT:  # the RLVR run, then the placebo run (05's null)
            for i, ckpt in enumerate(wanted):
                # the first run forces every checkpoint: one process loads the reference's
                # cache and compiles once (on several devices, one checkpoint per device)
                spread = i == 0 and "checkpoints" in declared and len(wanted) > 1
                extra = {"checkpoints": wanted} if spread else {}
                out.append((nb, {**base, "checkpoint": ckpt, **extra}, f"{nb.stem}__{ckpt}"))
        else:
            out.append((nb, base, nb.stem))
    return out


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
STATIC_MIMETYPES = ("text/html", "image/svg+xml", "image/png", "image/jpeg", "text/markdown")
WIDGET_NOTE = "[interactive widget: run this notebook in JupyterLab to use it]"

# nbconvert's lab template (the default) minus every script it loads from a CDN, plus what
# the book adds (``resources["rp"]``: head, top and bottom): the charts' scripts, the
# styles that hide input cells, the navigation bars; JupyterLab's styles marked, to be moved
# to their file beside the pages (``pages.page_styles``).
OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}{{ super() }}{{ resources.get('rp', {}).get('head', '') }}{%- endblock extra_css -%}
{%- block body_header -%}{{ super() }}{{ resources.get('rp', {}).get('top', '') }}{%- endblock body_header -%}
{%- block body_footer -%}{{ resources.get('rp', {}).get('bottom', '') }}{{ super() }}{%- endblock body_footer -%}
""" + page_styles.TEMPLATE_BLOCK


def failed_path(out_dir: Path, stem: str) -> Path:
    return out_dir / f"{stem}.FAILED.ipynb"


def without_widget_views(nb):
    """Each widget view replaced by its static fallback, or a note when it has none: only
    the widget manager (a CDN script) could draw it. The saved widget state goes too."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data:
                del data[WIDGET_VIEW]
                if not any(m in data for m in STATIC_MIMETYPES):
                    data["text/plain"] = WIDGET_NOTE
    return nb


def offline_exporter():
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    # Coalescing streams applies carriage returns, so a text progress bar shows its last state.
    config = Config({"CoalesceStreamsPreprocessor": {"enabled": True}})
    return HTMLExporter(config=config, embed_images=True, template_file="offline.html.j2",
                        extra_loaders=[DictLoader({"offline.html.j2": OFFLINE_TEMPLATE})])


class _NetworkReferences(HTMLParser):
    """Collects what a page would fetch: absolute src/href URLs, URLs in script code, CSS
    imports. The chart scripts (marked ``data-rp-bundle``) are a file beside the page, named
    by a relative ``src``: a local read. Their code names a few URLs (schema ids, the Vega
    editor's address for an action the book turns off) that it never fetches, so it would
    not be searched even inline (the browser tests load the pages with the network cut off
    and check that no request was made)."""

    FETCHED = re.compile(r"(?:https?:)?//", re.I)  # an absolute or protocol-relative URL
    IN_CODE = re.compile(r"""https?://[^\s"'`<>)]+""", re.I)
    IN_CSS = re.compile(r"""(?:@import|url\()\s*["']?((?:https?:)?//[^"')\s]+)""", re.I)
    NAMESPACES = ("http://www.w3.org/",)  # XML namespace names, never fetched

    def __init__(self):
        super().__init__()
        self.found, self._inside = [], None

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if tag != "a" and name in ("src", "href") and value and self.FETCHED.match(value.strip()):
                self.found.append(f"<{tag} {name}={value.strip()}>")  # <a href> is followed, not fetched
        bundle = tag == "script" and any(name == "data-rp-bundle" for name, _ in attrs)
        self._inside = tag if tag in ("script", "style") and not bundle else None

    def handle_endtag(self, tag):
        self._inside = None

    def handle_data(self, data):
        if self._inside == "script":
            self.found += [f"script code loads {url}" for url in self.IN_CODE.findall(data)
                           if not url.startswith(self.NAMESPACES)]
        elif self._inside == "style":
            self.found += [f"style loads {url}" for url in self.IN_CSS.findall(data)]


def network_references(page: str) -> list[str]:
    """What an HTML page would load from the network (empty: it works offline)."""
    parser = _NetworkReferences()
    parser.feed(page)
    return parser.found


def export_html(executed: Path, pages: list[navigation.Page] | None = None) -> tuple[Path, list[str]]:
    """The executed notebook as a page beside it, self-contained but for the files every
    page shares, written beside it too (the chart scripts, ``pages.charts``; JupyterLab's
    styles, ``pages.page_styles``); also returns what the
    page would still load from the network (outputs' own scripts), if anything. ``pages``:
    the suite's pages in order, for the previous / next links (none without it)."""
    import nbformat

    from rlprobe_nb.pages import charts, code_cells, for_reader, wide_tables
    from rlprobe_nb.render import viewer_links
    from rlprobe_nb.tables.storage import atomic_write_text

    nb = without_widget_views(nbformat.read(executed, 4))
    for_reader.for_reader(nb)  # no progress bar, no absolute path of this machine
    for cell in nb.cells:  # before nbconvert re-serialises the page (attributes reordered)
        for output in cell.get("outputs", []):
            if "text/html" in output.get("data", {}):
                output["data"]["text/html"] = viewer_links.for_exported_page(output["data"]["text/html"])
    n_charts = charts.embed_charts(nb, executed.parent)
    code_cells.tag_inputs(nb)
    stem = executed.stem
    listed = pages is not None and stem in [p.stem for p in pages]
    top = navigation.nav_html(pages, stem, code_cells.toggle_html()) if listed else \
        f'<nav class="rp-nav">{code_cells.toggle_html()}</nav>'
    head = (navigation.NAV_CSS + code_cells.CSS + wide_tables.HEAD
            + charts.page_head(n_charts, executed.parent))
    resources = {"rp": {"head": head, "top": top,
                        "bottom": navigation.nav_html(pages, stem, bottom=True) if listed else ""}}
    body, _ = offline_exporter().from_notebook_node(nb, resources=resources)
    body = page_styles.share(body, executed.parent)
    return atomic_write_text(executed.with_suffix(".html"), body), network_references(body)


def write_index(P: params.Params, pages: list[navigation.Page]) -> Path:
    """The suite's index page (``index.html`` beside the pages), its numbers read now."""
    from rlprobe_nb.pages import findings, headlines
    from rlprobe_nb.tables.storage import atomic_write_text

    figures = paths.figures_dir(P.suite)
    numbers = headlines.headlines(P, pages, paths.data_dir(P.suite))
    answer = findings.findings_html(headlines.Tables(paths.data_dir(P.suite)), P)
    return atomic_write_text(figures / f"{navigation.INDEX}.html",
                             navigation.index_html(P.suite, pages, figures, numbers, answer))


REUSED = re.compile(r"^reusing .*$", re.M)


def reused_lines(executed: Path) -> list[str]:
    """What the executed notebook printed about tables it reused (``reusing …``)."""
    import nbformat

    text = "".join(o.get("text", "") for c in nbformat.read(executed, 4).cells for o in c.get("outputs", [])
                   if o.get("output_type") == "stream")
    return REUSED.findall(text)


def unpair(executed: Path) -> None:
    """Drop the jupytext pairing the chapter's metadata carries into its executed copy:
    saved from JupyterLab, a result must not grow a .py twin beside it."""
    import nbformat

    nb = nbformat.read(executed, 4)
    if nb.metadata.get("jupytext", {}).pop("formats", None) is not None:
        nbformat.write(nb, executed)


def _error_line(err: BaseException) -> str:
    if hasattr(err, "ename"):  # papermill's error from a cell
        return f"cell In [{err.exec_count}]: {err.ename}: {err.evalue}"
    return f"{type(err).__name__}: {err}"


def _keep_failed(tmp: Path, failed: Path) -> Path | None:
    """Move a failed run's executed notebook to ``failed`` and export it; None if the run
    wrote nothing (e.g. the kernel did not start)."""
    if not tmp.exists() or tmp.stat().st_size == 0:
        return None
    os.chmod(tmp, FILE_MODE)  # a private temporary file (0600) until now
    os.replace(tmp, failed)
    failed.with_suffix(".html").unlink(missing_ok=True)  # an earlier failure's page
    try:
        unpair(failed)
        export_html(failed)
    except Exception as err:  # the notebook itself is what matters; say why there is no page
        print(f"      (no HTML for {failed.name}: {type(err).__name__}: {err})", flush=True)
    return failed


# The runs of 03 after one that forced every checkpoint only read their tables and draw
# their pages: kernel start, imports and charts, mostly on one core. Two at a time.
READERS_AT_ONCE = 2
# Chapters that read nothing written after chapter 03 (its token tables and the problems):
# on a CPU they run in a lane of their own beside the chapters that read each other's.
BESIDE = ("09_takeover",)


def waves(plan: list[tuple[Path, dict, str]], lanes: bool = False) -> list[book_runs.Wave]:
    """The plan's runs (indices) grouped into waves of lanes: the lanes of a wave run at
    once, the runs of a lane in order. Without ``lanes`` every run is a wave of its own,
    except the runs of 03 that follow a run forcing every checkpoint (``checkpoints``),
    ``READERS_AT_ONCE`` at a time. With ``lanes`` (a CPU: the cores are shared out,
    ``cores``), everything after the forcing run goes into two lanes: the ``BESIDE``
    chapters in one, every other run (those readers too) in the other, in plan order;
    on the demo the two lanes then hold about the same work (09; 03's readers and 04-08)."""
    forced_at = next((i for i, (_, p, _) in enumerate(plan) if "checkpoints" in p), None)
    readers = {i for i, (nb, p, _) in enumerate(plan)
               if forced_at is not None and i > forced_at and nb.stem == PER_CHECKPOINT}
    if lanes:
        start = forced_at + 1 if forced_at is not None else next(
            (i for i, (nb, _, _) in enumerate(plan) if nb.stem > PER_CHECKPOINT), len(plan))
        side = [i for i in range(start, len(plan)) if plan[i][0].stem in BESIDE]
        main = [i for i in range(start, len(plan)) if i not in side]
        after = [lane for lane in (main, side) if lane]
        return [[[i]] for i in range(start)] + ([after] if after else [])
    out: list[book_runs.Wave] = []
    for i in range(len(plan)):
        if i in readers and out and out[-1][0][0] in readers and len(out[-1]) < READERS_AT_ONCE:
            out[-1].append([i])
        else:
            out.append([[i]])
    return out


def runs_on_cpu(P: params.Params) -> bool:
    """Whether the suite's chapters compute on the CPU (their cores are then shared out
    between two lanes, ``waves``); a GPU suite runs its chapters one at a time."""
    if P.runtime.device != "auto":
        return P.runtime.device == "cpu"
    import torch

    return not torch.cuda.is_available()


def run_one(nb: Path, parameters: dict, stem: str, out_dir: Path,
            pages: list[navigation.Page] | None = None) -> tuple[float, list[str]]:
    """Execute ``nb`` into ``out_dir/<stem>.ipynb`` and export it; returns the seconds taken
    and what the page would load from the network. On failure raises ``NotebookFailed``
    after keeping the executed notebook as ``<stem>.FAILED.ipynb``; the last good output
    stays as it was."""
    import papermill as pm

    from rlprobe_nb.kernels import LocalKernelManager

    start = time.perf_counter()
    target, failed = out_dir / f"{stem}.ipynb", failed_path(out_dir, stem)
    tmp = book_runs.temporary_notebook(out_dir, stem)
    try:
        try:
            pm.execute_notebook(str(nb), str(tmp), parameters=parameters, kernel_name="python3",
                                cwd=str(paths.REPO_ROOT), progress_bar=False,
                                kernel_manager_class=LocalKernelManager)
        except BaseException as err:  # Ctrl-C too: the partial notebook shows how far it got
            kept = _keep_failed(tmp, failed)
            if not isinstance(err, Exception):
                raise
            raise NotebookFailed(nb, _error_line(err), kept) from err
        unpair(tmp)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    for stale in (failed, failed.with_suffix(".html")):  # an old failure would mislead now
        stale.unlink(missing_ok=True)
    _, offline_problems = export_html(target, pages)
    return time.perf_counter() - start, offline_problems


def report_failure(failure: NotebookFailed, out_dir: Path, stem: str) -> None:
    print(f"\nFAILED: {failure.notebook.name}: {failure.error}", file=sys.stderr)
    if failure.kept is not None:
        print(f"  executed notebook with the traceback: {failure.kept}", file=sys.stderr)
        if failure.kept.with_suffix(".html").exists():
            print(f"  and its page: {failure.kept.with_suffix('.html')}", file=sys.stderr)
    else:
        print("  the run wrote no notebook (did the kernel start?)", file=sys.stderr)
    last_good = out_dir / f"{stem}.ipynb"
    if last_good.exists():
        print(f"  the last good output is unchanged: {last_good}", file=sys.stderr)


def prepare() -> None:
    """One-time set-up for the demo suite: convert its GGUF to a safetensors cache."""
    from rlprobe_nb.suite import gguf_cache, models

    P = params.load(params.DEFAULT_SUITE)
    for name, spec in P.models.items():
        if spec["kind"] == "gguf":
            path = gguf_cache.convert_gguf(models.gguf_file(spec), paths.cache_dir() / "models")
            print(f"demo model {name!r} ready: {path}")


def launched_rank() -> int:
    """Under ``accelerate launch``/torchrun (several processes, each running this module):
    this process's rank. Rank 0 keeps the number of processes as its workers per sharded
    stage and drops the launcher's variables, so the notebooks' kernels start their own
    workers; the other ranks have nothing to do. 0 when not launched."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        os.environ.setdefault(distributed.PROCESSES_ENV, str(world))
        for name in distributed.LAUNCHER_ENV:
            os.environ.pop(name, None)
    return rank


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--suite", default=None, help="suite name (default: $RLPROBE_SUITE or demo)")
    ap.add_argument("--only", nargs="*", help="notebook name prefixes to run, e.g. 01 03")
    ap.add_argument("--checkpoint", nargs="*", metavar="NAME",
                    help="only these checkpoints' runs of 03, e.g. rlvr_step_1200")
    ap.add_argument("--prepare", action="store_true", help="one-time set-up, then exit")
    ap.add_argument("--overwrite", action="store_true",
                    help="recompute tables computed from other inputs than the current ones "
                         "(without it, such tables are refused, naming what changed)")
    args = ap.parse_args(argv)
    rank = launched_rank()
    if rank != 0:
        print(f"rank {rank}: rank 0 runs the book, with one worker per device in each "
              "sharded stage")
        return 0
    if args.prepare:
        prepare()
        return 0
    P = params.load(args.suite)  # a bad params file fails here, before any model loads
    try:
        plan = runs(P, args.only, args.overwrite, args.checkpoint)
    except params.ParamsError as err:
        print(f"rlprobe_nb: {err}", file=sys.stderr)
        return 2
    stale = book_runs.out_of_sync([nb for nb, _, _ in plan])
    if stale:
        print(f"rlprobe_nb: {'; '.join(stale)}: run `make sync` (the book runs the .ipynb "
              "twins)", file=sys.stderr)
        return 2
    out_dir = paths.figures_dir(P.suite)
    out_dir.mkdir(parents=True, exist_ok=True)
    for left in book_runs.remove_stale_temporaries(out_dir):
        print(f"removed {left.name}, the temporary notebook of an interrupted run")
    pages = navigation.book_pages(runs(P))  # every page, for the links between them
    total = time.perf_counter()
    print(f"rlprobe_nb: suite {P.suite!r}, {len(plan)} notebook runs")
    needs_network: dict[str, list[str]] = {}

    def finished(i: int, outcome: tuple[float, list[str]]) -> None:
        stem, (seconds, problems) = plan[i][2], outcome
        for line in reused_lines(out_dir / f"{stem}.ipynb"):
            print(f"      {line}")
        print(f"      done in {seconds:.1f} s -> {out_dir / stem}.html", flush=True)
        if problems:
            needs_network[f"{out_dir / stem}.html"] = problems

    on_cpu = runs_on_cpu(P)
    status = book_runs.run_waves(
        plan, waves(plan, lanes=on_cpu),
        lambda nb, parameters, stem: run_one(nb, parameters, stem, out_dir, pages),
        finished, lambda i, failure: report_failure(failure, out_dir, plan[i][2]),
        lambda stem: failed_path(out_dir, stem), lanes=lambda: cores.Lanes(out_dir))
    if status:
        write_index(P, pages)
        return status
    index = write_index(P, pages)
    minutes = (time.perf_counter() - total) / 60
    print(f"\nThe book ran in {minutes:.1f} min.")
    print(f"  start reading at: {index}")
    print(f"  executed notebooks and HTML: {out_dir}")
    print(f"  tables (a folder each: parquet parts + {MANIFEST}): {paths.data_dir(P.suite)}")
    for page, problems in needs_network.items():
        print(f"WARNING: {page} needs the network (offline, these outputs stay blank):\n    "
              + "\n    ".join(sorted(set(problems))), file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # between notebooks (a wave's Ctrl-C is run_waves')
        print("\nrlprobe_nb: interrupted", file=sys.stderr)
        sys.exit(130)

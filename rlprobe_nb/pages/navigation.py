"""The order of a suite's pages, the links between them, and the suite's index page.

The pages are the book's runs in order (01, 02, 03 once per checkpoint, 04 … 08, then the
appendices), each exported as ``figures/<suite>/<stem>.html``, and ``index.html`` before
them. Every page gets a bar at its top and bottom: the index, the previous page and the
next page by title (the first page's previous and the last page's next are the index). The
index lists every chapter in order with its title (the notebook's heading: the chapter's
one-line question) and its headline numbers (``headlines``), and links each page that
exists; a chapter not run yet says so.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

INDEX = "index"

NAV_CSS = """<style>
nav.rp-nav{display:flex;gap:14px;align-items:center;flex-wrap:wrap;font:13px sans-serif;
 padding:6px 12px;margin:0 0 8px 0;border-bottom:1px solid #ddd;background:#fafafa}
nav.rp-nav.rp-bottom{border-top:1px solid #ddd;border-bottom:none;margin:16px 0 0 0}
nav.rp-nav a{color:#0b57d0;text-decoration:none}
nav.rp-nav .rp-spacer{flex:1}
</style>"""


@dataclass(frozen=True)
class Page:
    stem: str  # the file stem under figures/<suite>/
    chapter: str  # "01" … "08", or the appendix's stem
    title: str  # the notebook's heading
    detail: str = ""  # e.g. "checkpoint rlvr_step_400" for the runs of 03

    @property
    def label(self) -> str:
        return f"{self.title} ({self.detail})" if self.detail else self.title

    @property
    def short(self) -> str:
        """The chapter's name without its question: "03 · Teacher forcing (rlvr_step_400)"."""
        name = self.title.split(":")[0]
        return f"{name} ({self.detail.split()[-1]})" if self.detail else name


def notebook_title(notebook: Path) -> str:
    """The first ``# `` heading of the notebook's first markdown cell (its stem if none)."""
    import nbformat

    for cell in nbformat.read(notebook, 4).cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", cell.source, re.M)
            if m:
                return m.group(1).strip()
    return notebook.stem


def book_pages(plan) -> list[Page]:
    """The pages of a plan of runs (``book.runs``: notebook, parameters, stem), in order."""
    titles: dict[Path, str] = {}
    pages = []
    for nb, parameters, stem in plan:
        if nb not in titles:
            titles[nb] = notebook_title(nb)
        chapter = nb.stem[:2] if nb.stem[:2].isdigit() else nb.stem
        detail = f"checkpoint {parameters['checkpoint']}" if "checkpoint" in parameters else ""
        pages.append(Page(stem, chapter, titles[nb], detail))
    return pages


def neighbours(pages: list[Page], stem: str) -> tuple[Page | None, Page | None]:
    """The pages before and after ``stem`` (None: the index)."""
    stems = [p.stem for p in pages]
    i = stems.index(stem)
    return (pages[i - 1] if i > 0 else None), (pages[i + 1] if i + 1 < len(pages) else None)


def _a(page: Page | None, arrow: str, rel: str) -> str:
    target, text = (f"{INDEX}.html", "contents") if page is None else (f"{page.stem}.html", page.short)
    text = f"{arrow} {html.escape(text)}" if arrow == "←" else f"{html.escape(text)} {arrow}"
    return f'<a rel="{rel}" href="{target}" title="{html.escape(page.label if page else "the book")}">{text}</a>'


def nav_html(pages: list[Page], stem: str, extra: str = "", bottom: bool = False) -> str:
    """The bar of page ``stem``: the index, the previous and the next page (``extra``: more
    controls at its right, e.g. the "show code" switch)."""
    before, after = neighbours(pages, stem)
    cls = "rp-nav rp-bottom" if bottom else "rp-nav"
    return (f'<nav class="{cls}" aria-label="pages"><a href="{INDEX}.html">⌂ contents</a>'
            f'{_a(before, "←", "prev")}<span class="rp-spacer"></span>{_a(after, "→", "next")}{extra}</nav>')


def _heading(title: str, href: str | None) -> str:
    text = html.escape(title)
    return f'<a href="{href}">{text}</a>' if href else f"{text} <i>(not run yet)</i>"


def index_html(suite: str, pages: list[Page], figures: Path, headlines: dict[str, list[str]],
               findings: str = "") -> str:
    """The index page of a suite: the book's answer (``findings``: an HTML paragraph,
    ``pages.findings``) first, then every chapter in order, its title linking its page (a
    chapter run once per checkpoint lists its runs), and its headline numbers
    (``headlines``: page stem -> HTML sentences whose numbers carry their source)."""
    chapters: list[tuple[str, str, list[Page]]] = []
    for page in pages:
        if chapters and chapters[-1][0] == page.chapter:
            chapters[-1][2].append(page)
        else:
            chapters.append((page.chapter, page.title, [page]))
    sections = []
    for chapter, title, runs in chapters:
        exists = {p.stem: (figures / f"{p.stem}.html").exists() for p in runs}
        if len(runs) == 1 and not runs[0].detail:
            page = runs[0]
            body = " ".join(headlines.get(page.stem, []))
            head = _heading(title, f"{page.stem}.html" if exists[page.stem] else None)
            inner = f"<p>{body}</p>" if body else ""
        else:
            head = html.escape(title)
            items = [f'<li data-stem="{html.escape(p.stem)}">'
                     f"{_heading(p.detail, f'{p.stem}.html' if exists[p.stem] else None)}"
                     f"{': ' + ' '.join(headlines[p.stem]) if headlines.get(p.stem) else ''}</li>" for p in runs]
            inner = f"<ul>{''.join(items)}</ul>"
        sections.append(f'<section class="rp-chapter" data-chapter="{html.escape(chapter)}"><h2>{head}</h2>'
                        f"{inner}</section>")
    first = pages[0].stem if pages else INDEX
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>rlprobe_nb · suite {html.escape(suite)}</title>{NAV_CSS}<style>"
            "body{font-family:sans-serif;max-width:980px;margin:0 auto;padding:0 16px 32px;color:#111;line-height:1.45}"
            "h1{font-size:24px}h2{font-size:17px;margin:20px 0 4px}h2 a{color:#0b57d0;text-decoration:none}"
            "p,ul{margin:2px 0}ul{padding-left:22px}"
            "p.rp-findings{font-size:16px;margin:10px 0 14px;padding:10px 14px;background:#f4f7fb;"
            "border-left:4px solid #0b57d0}a.rp-from{color:#0b57d0}"
            "</style></head><body>"
            f'<nav class="rp-nav" aria-label="pages"><span>contents</span><span class="rp-spacer"></span>'
            f'<a rel="next" href="{first}.html">start →</a></nav>'
            f"<h1>At which tokens does RLVR change the model's reasoning? · suite {html.escape(suite)}</h1>"
            + findings +
            "<p>The chapters in order, each with its question and its headline numbers, read from the "
            "suite's tables when this page was written. Every page opens offline.</p>"
            + "".join(sections) + "</body></html>")

"""JupyterLab's styles, which nbconvert writes into every page (about 260 KB: most of a
page without charts), as one file beside the pages that each page links to.

The exporter's template marks where nbconvert puts them (``TEMPLATE_BLOCK``); ``share``
moves what lies between the marks into ``lab-<hash of the text>.css`` in the page's folder
(written once) and links it in their place: read from the same folder on ``file://``,
with no network. A page copied away without that file shows its text unstyled.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

START, END = "<!-- rp-lab-styles -->", "<!-- /rp-lab-styles -->"
# In the exporter's template: nbconvert's own styles, between the marks.
TEMPLATE_BLOCK = "{%- block notebook_css -%}" + START + "{{ super() }}" + END + "{%- endblock notebook_css -%}"
_STYLE = re.compile(r"<style[^>]*>(.*?)</style>", re.S)


def share(page: str, folder: Path) -> str:
    """``page`` with the styles between the marks moved to their file in ``folder``."""
    start, end = page.find(START), page.find(END)
    if start < 0 or end < start:
        raise ValueError("the page has no marked styles: is it from the book's exporter?")
    marked = page[start + len(START):end]
    leftover = _STYLE.sub("", marked).strip()
    if leftover:
        raise ValueError(f"the marked styles hold more than <style> elements: {leftover[:80]!r}")
    text = "\n".join(body.strip() for body in _STYLE.findall(marked)) + "\n"
    name = f"lab-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]}.css"
    path = folder / name
    if not path.exists():
        from rlprobe_nb.tables.storage import atomic_write_text

        atomic_write_text(path, text)
    return page[:start] + f'<link rel="stylesheet" href="{name}">' + page[end + len(END):]

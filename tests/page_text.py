"""What a reader of a built page reads, and what it must not hold (issue 41, acceptance 2):
the text of a page as shown, code inputs (hidden behind "show code"), scripts and styles
left out, checked for the build machine's folders, progress bars, pandas reprs,
placeholders, "(s)" plurals and commands cut short by an ellipsis.

    python tests/page_text.py figures/demo      # every page of a built book, its findings
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
COMMAND = re.compile(r"^\s*(?:\$\s*)?(?:python|make|papermill|pip|jupyter|bash|accelerate|cd|"
                     r"\.venv/bin/)\b")
FORBIDDEN = {
    "a progress bar": re.compile(r"\d{1,3}%\|"),
    "a pandas repr (dtype:)": re.compile(r"\bdtype: \w+"),
    "a pandas repr (Name:)": re.compile(r"(?m)^Name: |\bName: \w+, dtype"),
    "a (s) plural": re.compile(r"\w\(s\)"),
    "a placeholder None": re.compile(r"\bNone\b"),
    "a placeholder nan": re.compile(r"(?<![\w-])(?:nan|NaN|<NA>)(?![\w-])"),
    "internal history": re.compile(r"\bprior project\b"),
    "a plural after one": re.compile(r"(?<![\d.,])\b1 (?:problems|rollouts|checkpoints|contexts|"
                                     r"spikes|cases|tables|tokens|labels|digits|steps)\b"),
    "a range from a number to itself": re.compile(r"(?<![\d.])(\d[\d.]*)–\1(?![\d])"),
}


class PageText(HTMLParser):
    """The shown text of a page (``text``) and its code spans (``codes``)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.codes, self._stack, self._code = [], [], [], None

    def _hidden(self) -> bool:
        return any(tag in ("script", "style", "template") or "jp-InputArea" in cls
                   for tag, cls in self._stack)

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        self._stack.append((tag, dict(attrs).get("class") or ""))
        if tag == "code" and not self._hidden():
            self._code = []

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        while self._stack:
            if self._stack.pop()[0] == tag:
                break
        if tag == "code" and self._code is not None:
            self.codes.append("".join(self._code))
            self._code = None
        if tag in ("p", "div", "tr", "li", "pre", "h1", "h2", "h3", "td", "th"):
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._hidden():
            self.parts.append(data)
            if self._code is not None:
                self._code.append(data)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def problems(page: str, folders: list[str]) -> list[str]:
    """What a reader should not meet on ``page`` (its HTML), each with its text around it;
    ``folders``: absolute folders of the machine that built it."""
    found = PageText()
    found.feed(page)
    text, out = found.text, []
    for folder in folders:  # anywhere in the page, scripts and chart data included
        if folder in page:
            at = page.index(folder)
            out.append(f"the folder {folder}: …{page[max(0, at - 60):at + 80]}…")
    for what, pattern in FORBIDDEN.items():
        for m in list(pattern.finditer(text))[:3]:
            around = " ".join(text[max(0, m.start() - 60):m.end() + 60].split())
            out.append(f"{what}: …{around}…")
    for code in found.codes:
        if COMMAND.match(code) and ("…" in code or "..." in code):
            out.append(f"a command cut short: {code}")
    return out


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    roots = sys.argv[2:] or [str(Path.cwd().resolve())]
    for page in sorted(folder.glob("*.html")):
        if ".FAILED" in page.name:
            continue
        for line in problems(page.read_text(encoding="utf-8"), roots):
            print(f"{page.name}: {line}")

"""The live viewer's response pane: an anywidget (one ES module, ``static/token_pane.js``,
runs in JupyterLab, Notebook 7, VS Code and Colab) that draws a rollout's tokens and repaints
them when the kernel sends new colours.

What travels to the browser, and when:

- ``texts`` (the rollout's token texts) and ``rollout``: once per rollout;
- ``layers``: per shown checkpoint, the paint of every token packed as strings (six hex
  digits of background, one digit of ink, one digit of marks): a move of the step slider
  sends one layer, about 8 bytes a token, and nothing else;
- ``legend``: when the colour scale changes; ``details``: when the selected token changes;
- tooltips: asked for by the browser on hover (message ``{"type": "tip"}``) and answered
  with the plain text of ``tokens_html.tooltip_text``, once per rollout, checkpoint and
  position (the browser caches them).

From the browser: ``selected`` (a click on a token), ``query`` (the search box) and the
messages ``step`` (← →), ``spike`` (n / p) and ``open`` (a link from another chapter, see
``viewer_links``); the viewer (``viewer.Viewer``) handles them through ``on_msg``.
"""

from __future__ import annotations

import re

import anywidget
import numpy as np
import traitlets as T

from rlprobe_nb.render.page_runtime import RUNTIME_JS, STATIC
from rlprobe_nb.render.tokens_html import STYLE

PANE_CSS = """
.rp-pane{font:13px sans-serif;color:#111}
.rp-pane-bar{display:flex;gap:10px;align-items:center;margin:2px 0 4px 0;flex-wrap:wrap}
.rp-pane-bar .rp-search{width:16em;font:13px sans-serif;padding:2px 4px}
.rp-pane-bar .rp-search-count{color:#333;min-width:6em}
.rp-pane-bar .rp-keys{color:#666;font-size:12px}
.rp-pane-body{outline:none}
.rp-pane-body:focus-visible{box-shadow:0 0 0 2px #7aa7ff}
.rp-pane-body .rp-resp{max-height:28em;overflow-y:auto}
.rp-layer-label{font:12px sans-serif;margin-top:4px}
.rp-pane-body .rp-tok{cursor:pointer}
.rp-details{margin-top:6px}
"""


def _bare_css(style_element: str) -> str:
    return re.sub(r"</?style>", "", style_element)


def pack_layer(key: str, label: str, colours: list[str], inks: list[str], spike: np.ndarray,
               dim: np.ndarray) -> dict:
    """One checkpoint's paint of a rollout, as the pane receives it."""
    mark = np.asarray(spike, dtype=np.int8) + 2 * np.asarray(dim, dtype=np.int8)
    return {"key": key, "label": label,
            "bg": "".join(c[1:7] for c in colours),
            "ink": "".join("1" if c.lower() == "#ffffff" else "0" for c in inks),
            "mark": "".join(map(str, mark.tolist()))}


def unpack_layer(layer: dict) -> list[dict]:
    """The per-token paint of a packed layer (for tests and tools): background colour,
    text colour, spike outline, dimmed."""
    n = len(layer["ink"])
    return [{"bg": "#" + layer["bg"][6 * j:6 * j + 6],
             "ink": "#ffffff" if layer["ink"][j] == "1" else "#000000",
             "spike": bool(int(layer["mark"][j]) & 1), "dim": bool(int(layer["mark"][j]) & 2)}
            for j in range(n)]


PANE_JS = (STATIC / "token_pane.js").read_text(encoding="utf-8")
MODULE_EXPORT = "export default { render };"


def pane_script() -> str:
    """The pane's module as a classic script that sets ``window.rlprobePane`` (for a page
    without a widget manager: ``page_viewer``); the page runtime must come before it."""
    if MODULE_EXPORT not in PANE_JS:
        raise ValueError(f"token_pane.js no longer ends with {MODULE_EXPORT!r}")
    body = PANE_JS.replace(MODULE_EXPORT, "window.rlprobePane = { render: render };")
    return "(function () {\n" + body + "\n})();"


class TokenPane(anywidget.AnyWidget):
    """See the module docstring. Holds no table: the viewer sets its traits."""

    _esm = RUNTIME_JS + "\n" + PANE_JS
    _css = _bare_css(STYLE) + PANE_CSS

    rollout = T.Unicode("").tag(sync=True)
    texts = T.List(T.Unicode()).tag(sync=True)
    layers = T.List(T.Dict()).tag(sync=True)
    legend = T.Unicode("").tag(sync=True)
    details = T.Unicode("").tag(sync=True)
    selected = T.Int(-1).tag(sync=True)
    query = T.Unicode("").tag(sync=True)


def search_hits(texts: list[str], query: str) -> list[int]:
    """Indices of the tokens that overlap a case-insensitive match of ``query`` in the
    concatenated text (what the pane outlines; the same rule as its script)."""
    if not query:
        return []
    full, q = "".join(texts).lower(), query.lower()
    starts = np.cumsum([0] + [len(t) for t in texts])
    found: set[int] = set()
    i = full.find(q)
    while i >= 0:
        lo = int(np.searchsorted(starts, i, side="right")) - 1
        j = max(lo, 0)
        while j < len(texts) and starts[j] < i + len(q):
            if starts[j + 1] > i:
                found.add(j)
            j += 1
        i = full.find(q, i + 1)
    return sorted(found)

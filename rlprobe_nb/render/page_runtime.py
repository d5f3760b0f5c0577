"""The one script every token rendering carries (``static/runtime.js``): tooltips placed by
script in a single box on the page's ``<body>``, kept inside the viewport (moved left at the
right edge, flipped above the token at the bottom edge), and the hand-off of "open in the
viewer" links to a live viewer. Inline, no network; installing itself once per page however
many outputs carry it. Where scripts do not run (an untrusted notebook), the CSS tooltip
of ``tokens_html.STYLE`` shows instead."""

from __future__ import annotations

from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"
RUNTIME_JS = (STATIC / "runtime.js").read_text(encoding="utf-8")


def runtime_script() -> str:
    """The runtime as an inline ``<script>`` element."""
    return f"<script>{RUNTIME_JS}</script>"

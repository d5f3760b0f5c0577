"""Links that open the viewer (chapter 07) at one rollout and token, from any other page.

    viewer_links.link("p12#0", 40)   # '<a class="rp-open" href="07_viewer.ipynb" ...>open in the viewer</a>'

One link serves both places a reader meets it:

- in JupyterLab (a chapter run live, or its executed notebook), ``href`` opens chapter 07
  beside the current notebook and the page runtime (``page_runtime``) records the target
  from ``data-rp-open``: the live viewer, running or started next (within ten minutes),
  opens at that rollout and selects that token;
- in an exported page, the exporter points ``href`` at ``data-rp-html``: the viewer's page
  with the target in its fragment (``07_viewer.html#open=<rollout>:<pos>``), which shows
  that rollout if the page holds it (see ``viewer_targets``).

Without a browser, the same target is chapter 07's parameters: ``-p rollout_id <rollout>
-p token <pos>``. :func:`with_links` shows a table of tokens (rows with ``rollout_id`` and
``pos``) with such a link in each row.
"""

from __future__ import annotations

import html
import json
import re
from urllib.parse import quote, unquote

VIEWER = "07_viewer"
LINK_TEXT = "open in the viewer"


def fragment(rollout_id: str, pos: int) -> str:
    """``open=<rollout>:<pos>``, the rollout percent-encoded."""
    return f"open={quote(str(rollout_id), safe='')}:{int(pos)}"


def parse_fragment(frag: str) -> tuple[str, int] | None:
    """The (rollout, pos) of a ``#open=...`` fragment, or None."""
    m = re.fullmatch(r"#?open=([^:]+):(-?\d+)", frag or "")
    return (unquote(m.group(1)), int(m.group(2))) if m else None


def link(rollout_id: str, pos: int, text: str = LINK_TEXT, checkpoint: str | None = None) -> str:
    """An ``<a>`` that opens the viewer at ``rollout_id``, token ``pos`` (see the module doc)."""
    target = {"rollout": str(rollout_id), "pos": int(pos)}
    if checkpoint is not None:
        target["checkpoint"] = str(checkpoint)
    data = html.escape(json.dumps(target), quote=True)
    page = html.escape(f"{VIEWER}.html#{fragment(rollout_id, pos)}", quote=True)
    title = html.escape(f"chapter 07 at rollout {rollout_id}, token {int(pos)}", quote=True)
    return (f'<a class="rp-open" href="{VIEWER}.ipynb" data-rp-html="{page}" data-rp-open="{data}" '
            f'title="{title}">{html.escape(text)}</a>')


_IN_PAGE = re.compile(r'href="[^"]*\.ipynb" data-rp-html="([^"]*)"')


def for_exported_page(page: str) -> str:
    """``page`` with every viewer link pointing at the viewer's exported page."""
    return _IN_PAGE.sub(lambda m: f'href="{m.group(1)}" data-rp-html="{m.group(1)}"', page)


class LinkedTable:
    """A DataFrame shown with a first column of viewer links (``frame``: the table itself)."""

    def __init__(self, frame, rollout: str = "rollout_id", pos: str = "pos", column: str = "viewer"):
        self.frame, self._cols = frame, (rollout, pos, column)

    def _repr_html_(self) -> str:
        from rlprobe_nb.readable import frame_html
        from rlprobe_nb.render.page_runtime import runtime_script

        rollout, pos, column = self._cols
        shown = self.frame.copy()
        shown.insert(0, column, [link(r, p, "open ↗") for r, p in zip(shown[rollout], shown[pos])])
        return runtime_script() + frame_html(shown, html_columns=(column,))

    def __repr__(self) -> str:
        from rlprobe_nb.readable import frame_text

        return frame_text(self.frame)

    def __len__(self) -> int:
        return len(self.frame)


def with_links(frame, rollout: str = "rollout_id", pos: str = "pos") -> LinkedTable:
    """``frame`` (rows naming a rollout and a token position) shown with a link per row that
    opens the viewer there."""
    return LinkedTable(frame, rollout, pos)

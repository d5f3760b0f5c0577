"""Input cells hidden in an exported page, by cell tags, with a switch to show them.

A page reads as a report: narrative, results, charts. When it is exported, every code cell
of the (in-memory copy of the) executed notebook is tagged ``hide-input`` unless it carries
``show-input`` (the tags of jupyter-book and other tools), and the page's CSS hides the
input of cells so tagged; a code cell with neither output nor visible input (the imports,
the ``parameters`` and papermill's ``injected-parameters`` cells) then takes no space at
all. Nothing is deleted: "show code" at the top of the page shows every input again (a
checkbox and CSS, no script). A chapter that wants a cell's code read tags it
``show-input``.
"""

from __future__ import annotations

HIDE, SHOW = "hide-input", "show-input"
TOGGLE_ID = "rp-show-code"

CSS = f"""<style>
body:not(:has(#{TOGGLE_ID}:checked)) .jp-CodeCell.celltag_{HIDE} .jp-Cell-inputWrapper{{display:none}}
body:not(:has(#{TOGGLE_ID}:checked)) .jp-CodeCell.celltag_{HIDE}.jp-mod-noOutputs{{display:none}}
label.rp-code-toggle{{font:13px sans-serif;color:#333;cursor:pointer;white-space:nowrap}}
</style>"""


def tag_inputs(nb) -> int:
    """Tag every code cell of ``nb`` (in place) ``hide-input`` unless it is tagged
    ``show-input``; returns how many were tagged."""
    n = 0
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        tags = list(cell.get("metadata", {}).get("tags", []))
        if SHOW not in tags and HIDE not in tags:
            cell.setdefault("metadata", {})["tags"] = tags + [HIDE]
            n += 1
    return n


def toggle_html() -> str:
    """The "show code" switch (a checkbox the CSS reads)."""
    return (f'<label class="rp-code-toggle"><input type="checkbox" id="{TOGGLE_ID}"> show code</label>')

"""Charts stay interactive in an exported page, with no network.

A chart shown through ``views.show`` is a Vega-Lite spec beside its static SVG. In a page,
each becomes a ``<div class="rp-vega">`` holding its static form and the spec (JSON in a
``<script type="application/json">``), and a few lines in the page's head draw every chart
in place of its static form: tooltips and zoom work as in JupyterLab. The static form is
the chart's SVG file where it was saved beside the page (``views.show(..., save_as=...)``),
else the SVG inline (carried twice, the SVGs were the largest part of a page after the
scripts).

The Vega, Vega-Lite and Vega-Embed scripts that draw them (vl-convert carries them, about
0.9 MB) are one file beside the pages, ``vega-<vl-convert version>.js``, which every page
with a chart loads by a relative ``<script src>``: a browser reads it from the same folder
on ``file://`` with no network, once for the whole book (inlined in every page with a chart,
they made up most of the book's size). A page copied away without that file shows its
charts' static forms, those inline. The bundle is built once per vl-convert version and
kept in the cache folder (building it takes seconds).
"""

from __future__ import annotations

import json
from pathlib import Path

VEGALITE_MIMETYPES = ("application/vnd.vegalite.v5+json", "application/vnd.vegalite.v6+json",
                      "application/vnd.vegalite.v6.json")
BUNDLE_MARK = 'data-rp-bundle="vega"'  # the chart scripts: offline by construction

DRAW = """(function () {
  function draw() {
    if (!window.vegaEmbed) return;  // the scripts' file is not beside the page: the static forms stay
    document.querySelectorAll("div.rp-vega:not([data-drawn])").forEach(function (box) {
      box.setAttribute("data-drawn", "1");
      var spec = JSON.parse(box.querySelector("script.rp-vega-spec").textContent);
      var target = document.createElement("div");
      box.appendChild(target);
      window.vegaEmbed(target, spec, {actions: false, renderer: "svg"}).then(function () {
        var still = box.querySelector(".rp-vega-static");
        if (still) still.remove();
      }).catch(function () { target.remove(); });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();"""

_bundle: str | None = None


def vega_bundle() -> str:
    """vl-convert's Vega, Vega-Lite and Vega-Embed bundle (a classic script that sets
    ``window.vegaEmbed``), wrapped in a function so its names stay out of the page's scope."""
    global _bundle
    if _bundle is None:
        import vl_convert as vlc

        from rlprobe_nb.suite import paths

        cached = paths.cache_dir() / f"vega-bundle-{vlc.__version__}.js"
        if cached.exists():
            _bundle = cached.read_text(encoding="utf-8")
        else:
            _bundle = "(function () {\n" + vlc.javascript_bundle() + "\n})();"
            try:
                from rlprobe_nb.tables.storage import atomic_write_text

                cached.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(cached, _bundle)
            except OSError:  # a read-only cache still gets a bundle, only not a saved one
                pass
    return _bundle


def _script_json(value) -> str:
    return json.dumps(value).replace("</", "<\\/")


def chart_html(spec: dict, svg: str | None, folder: Path | None = None) -> str:
    """One chart in a page: its static SVG until the scripts draw it from ``spec``; the SVG
    file the chart was saved as where it is beside the page (in ``folder``), else inline."""
    import html

    from rlprobe_nb.views import SAVED_KEY

    saved = spec.get("usermeta", {}).get(SAVED_KEY)
    if folder is not None and saved and (folder / saved).is_file():
        title = spec.get("title", "")
        title = title.get("text", "") if isinstance(title, dict) else title
        alt = " ".join(title) if isinstance(title, list) else str(title)
        still = (f'<img class="rp-vega-static" loading="lazy" src="{html.escape(saved, quote=True)}" '
                 f'alt="{html.escape(alt or saved, quote=True)}">')
    else:
        still = f'<div class="rp-vega-static">{svg}</div>' if svg else ""
    return (f'<div class="rp-vega">{still}<script type="application/json" class="rp-vega-spec">'
            f"{_script_json(spec)}</script></div>")


def embed_charts(nb, folder: Path | None = None) -> int:
    """Replace every Vega-Lite output of ``nb`` (in place) by its page form (``folder``: the
    page's); returns how many there were."""
    count = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            kind = next((m for m in VEGALITE_MIMETYPES if m in data), None)
            if kind is None:
                continue
            spec = data.pop(kind)
            spec = json.loads(spec) if isinstance(spec, str) else dict(spec)
            spec.pop("$schema", None)  # drawn by the bundle's own Vega-Lite
            svg = data.pop("image/svg+xml", None)
            data.pop("image/png", None)
            data["text/html"] = chart_html(spec, svg, folder)
            count += 1
    return count


def bundle_name() -> str:
    """The chart scripts' file name, beside the pages (one per vl-convert version)."""
    import vl_convert as vlc

    return f"vega-{vlc.__version__}.js"


def write_bundle(folder: Path) -> Path:
    """The chart scripts in ``folder`` (written once; rewritten if their text differs)."""
    from rlprobe_nb.tables.storage import atomic_write_text

    path = folder / bundle_name()
    text = vega_bundle()
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        atomic_write_text(path, text)
    return path


def page_head(n_charts: int, folder: Path | None = None) -> str:
    """What a page with ``n_charts`` charts needs in its head (nothing without charts): the
    chart scripts loaded from their file beside the page (written to ``folder``, the
    page's folder, when given) and the lines that draw the charts."""
    if not n_charts:
        return ""
    if folder is not None:
        write_bundle(folder)
    return (f'<script {BUNDLE_MARK} src="{bundle_name()}"></script><script>{DRAW}</script>'
            "<style>.rp-vega{overflow-x:auto}</style>")

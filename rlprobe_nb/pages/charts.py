"""Charts stay interactive in an exported page, with no network.

A chart shown through ``views.show`` is a Vega-Lite spec beside its static SVG. In a page,
each becomes a ``<div class="rp-vega">`` holding the SVG and the spec (JSON in a
``<script type="application/json">``); the Vega, Vega-Lite and Vega-Embed scripts, which
vl-convert carries (about 0.9 MB), are inlined once in the page's head with a few lines
that draw every chart in place of its SVG: tooltips and zoom work as in JupyterLab. If the
scripts cannot run, the SVG stays. The bundle is built once per vl-convert version and kept
in the cache folder (building it takes seconds).
"""

from __future__ import annotations

import json

VEGALITE_MIMETYPES = ("application/vnd.vegalite.v5+json", "application/vnd.vegalite.v6+json",
                      "application/vnd.vegalite.v6.json")
BUNDLE_MARK = 'data-rp-bundle="vega"'  # the inlined scripts: offline by construction

DRAW = """(function () {
  function draw() {
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


def chart_html(spec: dict, svg: str | None) -> str:
    """One chart in a page: its static SVG until the scripts draw it from ``spec``."""
    still = f'<div class="rp-vega-static">{svg}</div>' if svg else ""
    return (f'<div class="rp-vega">{still}<script type="application/json" class="rp-vega-spec">'
            f"{_script_json(spec)}</script></div>")


def embed_charts(nb) -> int:
    """Replace every Vega-Lite output of ``nb`` (in place) by its page form; returns how
    many there were."""
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
            data["text/html"] = chart_html(spec, svg)
            count += 1
    return count


def page_head(n_charts: int) -> str:
    """What a page with ``n_charts`` charts needs in its head (nothing without charts)."""
    if not n_charts:
        return ""
    return (f"<script {BUNDLE_MARK}>{vega_bundle()}</script><script>{DRAW}</script>"
            "<style>.rp-vega{overflow-x:auto}</style>")

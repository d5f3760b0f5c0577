"""A reader of the book's exported pages in a real browser (``browser_harness``): what a page
says in the console, its visible text, every chart's answer to a hover, every link and
where it lands. Used by ``test_book_pages`` on the small book, and by hand on a full one:

    python tests/browser/book_reader.py figures/demo      # a report of every page
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

# A word a page must never show: a missing or infinite value printed as such.
NOT_A_NUMBER = re.compile(r"(?<![\w.])(nan|NaN|NAN|inf|-inf|Inf|Infinity|-Infinity|<NA>|NaT)(?![\w.])")
NUMBER = re.compile(r"[-−]?\d[\d,]*(?:\.\d+)?(?:e[-+−]?\d+)?", re.I)
CHARTS_DRAWN = """() => [...document.querySelectorAll('div.rp-vega')].every(
    b => b.querySelector('.vega-embed svg.marks') && !b.querySelector('.rp-vega-static'))"""
# Every data mark layer of every chart (the marks Vega draws from data; axes, legends and
# titles are not), with a point inside one of its items where a reader would hover: a rect's
# centre (where a label sits), a symbol's centre, the middle of a line, rule or area's path.
# The data mark layers of every chart (the marks Vega draws from data; axes, legends and
# titles are not): [chart][layer] -> the mark's kind.
MARK_LAYERS = """() => [...document.querySelectorAll('div.rp-vega')].map(chart =>
  [...chart.querySelectorAll('.vega-embed svg.marks g.role-mark')].map(g =>
    [...g.classList].find(k => k.startsWith('mark-')).slice(5)))"""
# One item of a chart's mark layer scrolled into view, and a point inside it where a reader
# would hover: a rect's centre (where a label sits), a symbol's centre, the middle of a
# rule; a line's or an area's middle data point (a line's own path never answers in an SVG
# drawing, its points do). null when the layer drew nothing.
MARK_POINT = r"""([c, m]) => {
  const g = document.querySelectorAll('div.rp-vega')[c].querySelectorAll('.vega-embed svg.marks g.role-mark')[m];
  const kind = [...g.classList].find(k => k.startsWith('mark-')).slice(5);
  const sized = [...g.children].filter(e => ['path', 'line', 'rect', 'text', 'circle'].includes(e.tagName))
    .map(e => ({e, box: e.getBoundingClientRect()})).filter(x => x.box.width > 0 || x.box.height > 0);
  if (!sized.length) return null;
  // the layer's largest item, as a reader would hover it (a bar near zero is a sliver)
  const e = sized.reduce((a, b) => b.box.width * b.box.height > a.box.width * a.box.height ? b : a).e;
  e.scrollIntoView({block: 'center', inline: 'center'});
  const box = e.getBoundingClientRect(), ctm = e.getScreenCTM();
  const screen = (px, py) => [ctm.a * px + ctm.c * py + ctm.e, ctm.b * px + ctm.d * py + ctm.f];
  let [x, y] = [box.left + box.width / 2, box.top + box.height / 2];
  // a line's vertices (an area's upper edge: the first half of its outline), M and L commands
  const vertices = [...(e.getAttribute('d') || '').matchAll(/[ML]\s*(-?[\d.]+(?:e-?\d+)?)[ ,](-?[\d.]+(?:e-?\d+)?)/g)];
  if (['line', 'area'].includes(kind) && vertices.length) {
    // from the middle outwards, the first vertex where a point is there to hover (one at the
    // plot's edge can be cut by its clip)
    const upper = kind === 'area' ? vertices.slice(0, Math.ceil(vertices.length / 2)) : vertices;
    const middle = Math.floor((upper.length - 1) / 2);
    const order = upper.map((v, i) => [Math.abs(i - middle), v]).sort((a, b) => a[0] - b[0]).map(a => a[1]);
    const at = order.map(v => screen(Number(v[1]), Number(v[2])).map(Math.round));
    const hit = at.find(([px, py]) => { const top = document.elementFromPoint(px, py);
                                        return top && top.closest('g.mark-symbol.role-mark'); });
    [x, y] = hit || at[0];
    return {kind, x, y, items: sized.length};
  } else if (e.tagName === 'line') {
    [x, y] = screen((e.x1.baseVal.value + e.x2.baseVal.value) / 2, (e.y1.baseVal.value + e.y2.baseVal.value) / 2);
  }
  // a thin stroke is hit within a pixel of it, as a reader aims: the nearest whole pixel on it
  if (kind !== 'rect') {
    const near = [];
    for (let dx = -3; dx <= 3; dx++) for (let dy = -3; dy <= 3; dy++) near.push([dx, dy]);
    near.sort((a, b) => Math.hypot(...a) - Math.hypot(...b));
    const hit = near.map(([dx, dy]) => [Math.round(x) + dx, Math.round(y) + dy])
      .find(([px, py]) => document.elementFromPoint(px, py) === e);
    if (hit) [x, y] = hit;
  }
  return {kind, x, y, items: sized.length};
}"""
TOOLTIP = """() => { const t = document.querySelector('#vg-tooltip-element.visible');
  if (!t) return null;
  return {text: t.innerText, rows: [...t.querySelectorAll('tr')].map(r =>
    [(r.querySelector('td.key') || {}).innerText || '', (r.querySelector('td.value') || {}).innerText || ''])}; }"""


def significant_digits(number: str) -> int:
    """How many significant digits a printed decimal has (``0.06055`` → 4); an integer
    (a count, a step, an id) counts as exact: 0."""
    mantissa = re.split(r"[eE]", number.replace("−", "-").replace(",", "").lstrip("-"))[0]
    if "." not in mantissa:
        return 0
    return len(mantissa.replace(".", "").lstrip("0"))


def too_precise(text: str, most: int = 4) -> list[str]:
    """The decimals in ``text`` printed with more than ``most`` significant digits."""
    return [n for n in NUMBER.findall(text) if significant_digits(n) > most]


def open_page(page, path: Path, timeout: float = 30_000) -> None:
    """Load ``path`` and wait until its charts are drawn."""
    page.goto(path.as_uri())
    page.wait_for_function(CHARTS_DRAWN, timeout=timeout)


def visible_text_problems(page) -> list[str]:
    """Words of the rendered text that print a missing or infinite value."""
    text = page.evaluate("() => document.body.innerText")
    return sorted({m.group(0) for m in NOT_A_NUMBER.finditer(text)})


def hover_every_chart(page) -> list[dict]:
    """Hover one item of every data mark layer (text labels aside) of every chart: for each,
    the chart and layer, the mark kind, and the tooltip shown (None: none). A line or an
    area is hovered at a data point: its own path never answers in an SVG drawing
    (Vega finds the datum under the pointer only on a canvas), points drawn over it must."""
    out = []
    for c, kinds in enumerate(page.evaluate(MARK_LAYERS)):
        for m, kind in enumerate(kinds):
            if kind == "text":
                continue
            point = page.evaluate(MARK_POINT, [c, m])
            if point is None:
                continue
            page.mouse.move(1, 1)
            page.wait_for_timeout(50)
            page.mouse.move(point["x"], point["y"], steps=2)
            try:
                page.wait_for_selector("#vg-tooltip-element.visible", timeout=1500)
                tip = page.evaluate(TOOLTIP)
            except Exception:  # playwright's timeout: no tooltip came
                tip = None
            out.append({**point, "chart": c, "mark": m, "tooltip": tip})
    page.mouse.move(1, 1)
    return out


def links(page) -> list[dict]:
    """Every link a reader can see on the page: its text and where it points."""
    return page.evaluate("""() => [...document.querySelectorAll('a[href]')]
        .filter(a => a.getClientRects().length && getComputedStyle(a).visibility !== 'hidden')
        .map(a => ({text: a.innerText.trim(), href: a.getAttribute('href'), url: a.href}))""")


def in_viewport(page, selector: str) -> bool:
    return page.evaluate("""(sel) => { const e = document.querySelector(sel); if (!e) return false;
        const r = e.getBoundingClientRect();
        return r.width > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight && r.right <= innerWidth; }""",
                         selector)


def landing(page, url: str) -> dict:
    """Follow ``url`` (a link of the book) and say where it landed (``landed``: on what it
    names, in the window): a page at its top; the section its fragment names; the token a
    viewer link names (``#open=<rollout>:<pos>``), shown in its rollout, ringed, with its
    history."""
    target, frag = urldefrag(url)
    page.goto(url)
    page.wait_for_load_state("load")
    page.wait_for_timeout(150)
    out = {"url": url, "page": Path(unquote(urlsplit(target).path)).name}
    if frag.startswith("open="):
        rollout, _, pos = unquote(frag[5:]).rpartition(":")
        token = f".rp-page-viewer .rp-pane-body .rp-tok.rp-sel[data-pos='{pos}']"
        out.update(shown=page.evaluate("() => (document.querySelector('.rp-page-viewer select') || {}).value"),
                   ringed=page.locator(token).count() == 1, visible=in_viewport(page, token),
                   history=page.locator(f".rp-page-viewer .rp-token-details[data-pos='{pos}']").count() == 1)
        out["landed"] = out["shown"] == rollout and out["ringed"] and out["visible"] and out["history"]
    elif frag:
        selector = f"[id='{unquote(frag)}']"
        out.update(found=page.locator(selector).count() == 1, visible=in_viewport(page, selector))
        out["landed"] = out["found"] and out["visible"]
    else:
        out.update(visible=in_viewport(page, "h1, nav.rp-nav"))
        out["landed"] = out["visible"]
    return out


if __name__ == "__main__":  # a report of a folder of pages
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from browser_harness import headless_chromium

    folder = Path(sys.argv[1]).resolve()
    with headless_chromium(Path("/tmp/book_reader")) as (context, guard):
        page = context.new_page()
        said = []
        page.on("console", lambda m: said.append(f"{m.type}: {m.text[:160]}"))
        page.on("pageerror", lambda e: said.append(f"error: {e}"))
        for path in sorted(folder.glob("*.html")):
            said.clear()
            open_page(page, path)
            hovers = hover_every_chart(page)
            dumb = [h for h in hovers if not h["tooltip"]]
            long = [(h["chart"], n) for h in hovers if h["tooltip"] for n in too_precise(h["tooltip"]["text"])]
            print(f"{path.name}: {len(said)} console, nan {visible_text_problems(page)}, "
                  f"{len(hovers)} mark layers, {len(dumb)} without tooltip {[(h['chart'], h['kind']) for h in dumb]}, "
                  f"too precise {long[:6]}")
            for s in said[:5]:
                print("   ", s)
        guard.assert_nothing_left()


# Per table of a page's outputs: its columns shown (a column hidden on request is not one,
# nor a table folded in a closed <details>) and how many of those lie beyond the right edge
# of its output area (behind a scrollbar).
TABLE_COLUMNS = """() => [...document.querySelectorAll('.jp-OutputArea-output table')].map(t => {
  if (t.closest('details:not([open])')) return {shown: 0, behind: 0, head: ''};  // folded: on request
  const box = t.closest('.jp-OutputArea-output').getBoundingClientRect();
  const row = t.tHead && t.tHead.rows.length ? t.tHead.rows[t.tHead.rows.length - 1] : t.rows[0];
  const shown = row ? [...row.cells].filter(c => c.getClientRects().length) : [];
  return {shown: shown.length,
          behind: shown.filter(c => c.getBoundingClientRect().right > box.right + 1).length,
          head: shown.slice(0, 4).map(c => c.innerText).join(' | ')};
})"""
# The smallest label of every drawn chart, in screen pixels (its font size times the
# drawing's scale), with its text.
CHART_LABELS = """() => [...document.querySelectorAll('div.rp-vega .vega-embed svg.marks')].map(svg => {
  let least = null;
  svg.querySelectorAll('text').forEach(t => {
    if (!t.textContent.trim() || !t.getClientRects().length) return;
    const ctm = t.getScreenCTM();
    const px = parseFloat(getComputedStyle(t).fontSize) * Math.hypot(ctm.a, ctm.b);
    if (!least || px < least.px) least = {px: Math.round(px * 10) / 10, text: t.textContent};
  });
  return least;
})"""


def narrow_problems(page, most_behind: float = 1 / 3, least_px: float = 9.0) -> list[str]:
    """At the page's current width: the tables that hide more than ``most_behind`` of their
    columns behind a scrollbar, and the charts with a label under ``least_px`` pixels."""
    out = []
    for i, t in enumerate(page.evaluate(TABLE_COLUMNS)):
        if t["shown"] and t["behind"] > most_behind * t["shown"]:
            out.append(f"table {i} ({t['head']} …): {t['behind']} of {t['shown']} columns behind a scrollbar")
    for i, label in enumerate(page.evaluate(CHART_LABELS)):
        if label and label["px"] < least_px:
            out.append(f"chart {i}: a {label['px']}-px label {label['text']!r}")
    return out

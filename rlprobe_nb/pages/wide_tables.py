"""Tables and charts that read in a narrow window (800 px): cells wrap at spaces instead of
stretching a table or being cut; a table still wider than its output area shows the
columns that fit, a button beside it shows the others on request (rather than most of them
behind a scrollbar); a chart keeps its drawn size, its labels their font size, and scrolls
sideways where it is wider than the page (JupyterLab's styles shrank a wide chart to the
window, its 10-px labels to 6 px).

A link to a section of a page lands with the heading whole in the window (8 px above it),
and keeps it in view while the page settles (charts drawn, images loaded above it), until
the reader scrolls.

``HEAD`` goes in every page's head (``book.export_html``).
"""

from __future__ import annotations

CSS = """<style>
.jp-RenderedHTMLCommon table{table-layout:auto}
.jp-RenderedHTMLCommon td,.jp-RenderedHTMLCommon th{white-space:normal;overflow-wrap:break-word;
 word-break:normal;max-width:30em}
.jp-OutputArea-output{overflow-x:auto}
details.rp-made td{overflow-wrap:anywhere}
.rp-vega svg,.rp-vega img.rp-vega-static{max-width:none!important;height:auto}
h1,h2,h3,h4{scroll-margin-top:8px}
button.rp-more-columns{font:12px sans-serif;margin:4px 0;padding:2px 8px;cursor:pointer}
</style>"""

# Hides a wide table's rightmost columns until it fits its box (a column of links stays; a
# table whose header spans columns is left to scroll), and adds the button that shows them.
JS = """<script>(function () {
  function cells(table, i) {
    return [...table.rows].map(r => r.cells[i]).filter(c => c);
  }
  function fit(table) {
    const box = table.closest('.jp-OutputArea-output') || table.parentElement;
    if (!box || table.scrollWidth <= box.clientWidth + 1) return;
    if ([...table.querySelectorAll('th,td')].some(c => c.colSpan > 1)) return;
    const n = Math.max(...[...table.rows].map(r => r.cells.length));
    const hidden = [];
    for (let i = n - 1; i >= 2 && table.scrollWidth > box.clientWidth + 1; i--) {
      if (cells(table, i).some(c => c.querySelector('a'))) continue;  // a column of links stays
      cells(table, i).forEach(c => { c.style.display = 'none'; });
      hidden.push(i);
    }
    if (!hidden.length) return;
    const button = document.createElement('button');
    button.className = 'rp-more-columns';
    const more = 'show the other ' + hidden.length + ' of ' + n + ' columns';
    button.textContent = more;
    button.addEventListener('click', function () {
      const show = button.textContent === more;
      hidden.forEach(i => cells(table, i).forEach(c => { c.style.display = show ? '' : 'none'; }));
      button.textContent = show ? 'show fewer columns' : more;
    });
    table.parentElement.insertBefore(button, table);
  }
  // A link to a section (#id) lands there, and stays there while the page settles: charts
  // drawn and images loaded above it grow the page; until the reader scrolls, or 4 s.
  function hold() {
    const target = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
    if (!target || !window.ResizeObserver) return;
    const watch = new ResizeObserver(function () { target.scrollIntoView(); });
    const stop = function () { watch.disconnect(); };
    watch.observe(document.body);
    ['wheel', 'keydown', 'touchstart', 'mousedown'].forEach(e => window.addEventListener(e, stop, {once: true}));
    setTimeout(stop, 4000);
  }
  function all() { document.querySelectorAll('.jp-OutputArea-output table').forEach(fit); hold(); }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', all);
  else all();
})();</script>"""

HEAD = CSS + JS

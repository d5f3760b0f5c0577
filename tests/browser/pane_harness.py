"""The viewer's response pane (``token_pane.js``) in a blank browser page, without Jupyter:
its ES module imported from a blob URL and rendered with a stand-in for the widget model
(``window.paneModel``: get/set/on/send/save_changes, and ``sent``, the messages it sent).
For fast browser tests of the pane and for the viewer benchmark.

    mount_pane(page, app.pane)          # the pane's current state
    page.evaluate("window.paneModel.set('selected', 3)")
"""

from __future__ import annotations

MODEL_JS = """
window.makePaneModel = (state) => {
  const handlers = {};
  const model = {
    sent: [],
    get: (k) => state[k],
    set: (k, v) => { state[k] = v; (handlers['change:' + k] || []).forEach((f) => f()); },
    on: (ev, f) => { (handlers[ev] = handlers[ev] || []).push(f); },
    off: () => {},
    save_changes: () => {},
    send: (m) => model.sent.push(m),
    emit: (ev, ...args) => (handlers[ev] || []).forEach((f) => f(...args)),
  };
  return model;
};
"""

MOUNT_JS = """async ([esm, css, state]) => {
  const style = document.createElement('style');
  style.textContent = css;
  document.head.appendChild(style);
  const url = URL.createObjectURL(new Blob([esm], {type: 'text/javascript'}));
  const mod = await import(url);
  const el = document.createElement('div');
  el.id = 'pane';
  document.body.appendChild(el);
  window.paneModel = window.makePaneModel(state);
  mod.default.render({model: window.paneModel, el});
}"""

STATE = ("rollout", "texts", "layers", "legend", "details", "selected", "query")


def mount_pane(page, pane, html: str = "<!DOCTYPE html><html><body></body></html>", keep: bool = False) -> None:
    """Render ``pane`` (a ``TokenPane``) in ``page`` with its current state (``keep``: in the
    page as it is, else in a fresh blank one)."""
    if not keep:
        page.set_content(html)
    page.evaluate(MODEL_JS)
    page.evaluate(MOUNT_JS, [pane._esm, pane._css, {k: getattr(pane, k) for k in STATE}])
    page.wait_for_selector("#pane .rp-tok")

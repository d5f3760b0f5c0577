// The page runtime of rlprobe_nb's token renderings: one tooltip box for the whole page, and
// the hand-off of "open in the viewer" links. Safe to include any number of times (the
// first copy installs itself; later copies find window.rlprobeRuntime and stop).
//
// Tooltips: every element with a data-tip attribute shows it on hover in one box appended
// to <body>, position: fixed against the viewport (JupyterLab's panels use `contain:
// strict`, which would turn a fixed box *inside* an output into one placed against the
// panel). The box is placed below the element, moved left to stay inside the right edge,
// flipped above the element near the bottom edge, and clamped to the viewport when neither
// side has room. The live viewer shows its own (lazily fetched) texts through show().
//
// Links: a click on <a data-rp-open='{"rollout": ..., "pos": ...}'> records the target in
// localStorage and announces it as a window event, so a live viewer (already running, or
// the next one to start within ten minutes) opens at that rollout and token.
(function () {
  "use strict";
  if (typeof window === "undefined" || window.rlprobeRuntime) return;
  const MARGIN = 6, GAP = 4, OPEN_KEY = "rlprobe.viewer.open";
  let box = null, anchor = null;

  function tipBox() {
    if (!box || !box.isConnected) {
      box = document.createElement("div");
      box.className = "rp-tipbox";
      box.setAttribute("role", "tooltip");
      box.style.cssText = [
        "position:fixed", "left:0", "top:0", "z-index:2147483000", "display:none",
        "pointer-events:none", "white-space:pre", "text-align:left", "background:#fffff4",
        "color:#000", "border:1px solid #777", "padding:4px 6px", "box-sizing:border-box",
        "font:11.5px/1.35 ui-monospace,SFMono-Regular,Menlo,Consolas,'DejaVu Sans Mono',monospace",
        "box-shadow:2px 2px 6px rgba(0,0,0,.25)", "max-width:calc(100vw - 12px)",
        "max-height:calc(100vh - 12px)", "overflow:hidden"].join(";");
      document.body.appendChild(box);
    }
    return box;
  }

  // Where a box of size (w, h) goes for an element at rect r in a viewport (vw, vh).
  function position(r, w, h, vw, vh) {
    let left = Math.max(MARGIN, Math.min(r.left, vw - MARGIN - w));
    let top = r.bottom + GAP;
    if (top + h > vh - MARGIN) {
      const above = r.top - GAP - h;
      top = above >= MARGIN ? above : Math.max(MARGIN, vh - MARGIN - h);
    }
    return { left: left, top: top };
  }

  function place() {
    if (!anchor || !box) return;
    const doc = document.documentElement;
    const p = position(anchor.getBoundingClientRect(), box.offsetWidth, box.offsetHeight,
                       doc.clientWidth, doc.clientHeight);
    box.style.left = p.left + "px";
    box.style.top = p.top + "px";
  }

  function show(target, text) {
    const b = tipBox();
    b.textContent = text;
    b.style.display = "block";
    anchor = target;
    place();
  }

  function hide(target) {
    if (box && (!target || target === anchor)) {
      box.style.display = "none";
      anchor = null;
    }
  }

  function closest(node, selector) {
    return node && node.nodeType === 1 ? node.closest(selector) : null;
  }

  document.addEventListener("mouseover", function (e) {
    const t = closest(e.target, "[data-tip]");
    if (t) show(t, t.getAttribute("data-tip"));
  }, true);
  document.addEventListener("mouseout", function (e) {
    if (anchor && anchor.contains(e.target) && !(e.relatedTarget && anchor.contains(e.relatedTarget))) hide();
  }, true);
  document.addEventListener("scroll", function () { hide(); }, true);
  window.addEventListener("resize", function () { hide(); });

  function announce(target) {
    target = Object.assign({}, target, { t: Date.now() });
    try { window.localStorage.setItem(OPEN_KEY, JSON.stringify(target)); } catch (err) { /* storage off */ }
    window.dispatchEvent(new CustomEvent("rlprobe-open", { detail: target }));
  }

  // The target recorded by a link's click within the last ten minutes, taken (once).
  function takePending() {
    try {
      const raw = window.localStorage.getItem(OPEN_KEY);
      if (!raw) return null;
      window.localStorage.removeItem(OPEN_KEY);
      const target = JSON.parse(raw);
      return Date.now() - (target.t || 0) < 600000 ? target : null;
    } catch (err) {
      return null;
    }
  }

  document.addEventListener("click", function (e) {
    const a = closest(e.target, "a[data-rp-open]");
    if (!a) return;
    try { announce(JSON.parse(a.getAttribute("data-rp-open"))); } catch (err) { /* not ours */ }
  }, true);

  document.documentElement.classList.add("rp-js");
  window.rlprobeRuntime = { show: show, hide: hide, place: place, position: position,
                            announce: announce, takePending: takePending };
})();

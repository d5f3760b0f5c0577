// The live viewer's response pane (an anywidget ES module; rlprobe_nb/render/token_pane.py).
//
// The kernel sends a rollout's token texts once (trait `texts`), then per shown checkpoint a
// "layer" of paint: `bg` six hex digits per token, `ink` one digit per token (1: white text),
// `mark` one digit per token (bit 1: outlined spike, bit 2: dimmed). A move of the step
// slider therefore sends one layer (about 8 bytes a token) and nothing else. Tooltips are
// asked for on hover (a message to the kernel, answered once per rollout, checkpoint and
// position, then cached here) and shown by the page runtime's single box, which stays
// inside the viewport. Click a token to select it (trait `selected`); type in the search
// box to outline every token of a matching stretch of text (Enter: select the next one);
// keys, with the pane focused: ← → step, n / p next / previous spike, Esc clears.

function digits(s, i, width) { return s.substr(i * width, width); }

function render({ model, el }) {
  const rt = window.rlprobeRuntime;
  const tips = new Map();
  let spans = [];  // spans[layer][position index]
  let hits = [];
  let hitCursor = -1;

  el.classList.add("rp-pane");
  el.innerHTML = "";
  const bar = document.createElement("div");
  bar.className = "rp-pane-bar";
  const search = document.createElement("input");
  search.type = "search";
  search.className = "rp-search";
  search.placeholder = "search the text…";
  search.setAttribute("aria-label", "search the response's text");
  const count = document.createElement("span");
  count.className = "rp-search-count";
  const keys = document.createElement("span");
  keys.className = "rp-keys";
  keys.textContent = "click a token to select it · ← → step · n / p next / previous spike · Esc clear";
  bar.append(search, count, keys);
  const legend = document.createElement("div");
  const body = document.createElement("div");
  body.className = "rp-pane-body";
  body.tabIndex = 0;
  const details = document.createElement("div");
  details.className = "rp-details";
  el.append(bar, legend, body, details);

  function posOf(span) { return Number(span.dataset.pos); }

  function build() {
    const texts = model.get("texts") || [];
    const layers = model.get("layers") || [];
    const positions = model.get("positions") || texts.map((_, i) => i);
    body.innerHTML = "";
    spans = layers.map((layer, li) => {
      const label = document.createElement("div");
      label.className = "rp-layer-label";
      label.textContent = layer.label || "";
      const resp = document.createElement("div");
      resp.className = "rp-resp";
      resp.dataset.layer = String(li);
      resp.dataset.checkpoint = layer.key;
      const row = texts.map((text, j) => {
        const s = document.createElement("span");
        s.className = "rp-tok" + (text === "" ? " rp-empty" : text.indexOf("\n") >= 0 ? " rp-nl" : "");
        s.dataset.pos = String(positions[j]);
        s.textContent = text;
        return s;
      });
      resp.append(...row);
      body.append(label, resp);
      return row;
    });
    tips.clear();
    paint();
    highlight();
  }

  function paint() {
    const layers = model.get("layers") || [];
    if (layers.length !== spans.length || (spans[0] && spans[0].length !== (model.get("texts") || []).length)) {
      build();
      return;
    }
    const selected = model.get("selected");
    body.querySelectorAll(".rp-layer-label").forEach((label, li) => {
      label.textContent = (layers[li] && layers[li].label) || "";
    });
    layers.forEach((layer, li) => {
      const row = spans[li];
      for (let j = 0; j < row.length; j++) {
        const s = row[j];
        const mark = Number(layer.mark.charAt(j) || 0);
        s.style.background = "#" + digits(layer.bg, j, 6);
        s.style.color = layer.ink.charAt(j) === "1" ? "#fff" : "#000";
        s.classList.toggle("rp-spike", (mark & 1) !== 0);
        s.classList.toggle("rp-dim", (mark & 2) !== 0);
        s.classList.toggle("rp-sel", posOf(s) === selected);
      }
    });
    const hovered = body.querySelector(".rp-tok:hover");
    if (hovered) showTip(hovered);  // a new step: the open tooltip shows the new step's numbers
  }

  function showSelected(scroll) {
    const selected = model.get("selected");
    let first = null;
    for (const row of spans) {
      for (const s of row) {
        const on = posOf(s) === selected;
        s.classList.toggle("rp-sel", on);
        if (on && !first) first = s;
      }
    }
    if (scroll && first) first.scrollIntoView({ block: "nearest", inline: "nearest" });
  }

  // Tokens overlapping a match of the query in the response's text (case-insensitive).
  function matches(query) {
    const texts = model.get("texts") || [];
    if (!query) return [];
    const full = texts.join("").toLowerCase(), q = query.toLowerCase();
    const starts = [];
    let at = 0;
    for (const t of texts) { starts.push(at); at += t.length; }
    const found = new Set();
    for (let i = full.indexOf(q); i >= 0; i = full.indexOf(q, i + 1)) {
      for (let j = 0; j < texts.length; j++) {
        const a = starts[j], b = a + texts[j].length;
        if (b > i && a < i + q.length) found.add(j);
        if (a >= i + q.length) break;
      }
    }
    return [...found].sort((x, y) => x - y);
  }

  function highlight() {
    const query = model.get("query") || "";
    if (search.value !== query) search.value = query;
    hits = matches(query);
    const on = new Set(hits);
    for (const row of spans) row.forEach((s, j) => s.classList.toggle("rp-hit", on.has(j)));
    count.textContent = query ? `${hits.length} token${hits.length === 1 ? "" : "s"} match` : "";
    hitCursor = -1;
  }

  function tipKey(li, pos) {
    const layer = (model.get("layers") || [])[li];
    return `${model.get("rollout")}|${layer ? layer.key : ""}|${pos}`;
  }

  function onOver(e) {
    const s = e.target.closest && e.target.closest(".rp-tok");
    if (s && body.contains(s)) showTip(s);
  }

  // The hovered token's tooltip for the layer it is in now (asked for if not known yet).
  function showTip(s) {
    const li = Number(s.parentElement.dataset.layer), pos = posOf(s);
    const key = tipKey(li, pos);
    if (tips.has(key)) { rt.show(s, tips.get(key)); return; }
    rt.show(s, "…");
    model.send({ type: "tip", layer: li, pos: pos });
  }

  function onClick(e) {
    const s = e.target.closest && e.target.closest(".rp-tok");
    if (!s || !body.contains(s)) return;
    body.focus({ preventScroll: true });
    const pos = posOf(s);
    model.set("selected", model.get("selected") === pos ? -1 : pos);
    model.save_changes();
  }

  function onKey(e) {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    const step = { ArrowLeft: -1, ArrowRight: 1 }[e.key];
    if (step) { model.send({ type: "step", delta: step }); e.preventDefault(); return; }
    if (e.key === "n" || e.key === "p") { model.send({ type: "spike", delta: e.key === "n" ? 1 : -1 }); e.preventDefault(); return; }
    if (e.key === "Escape") { model.set("selected", -1); model.save_changes(); e.preventDefault(); }
  }

  function onSearchKey(e) {
    if (e.key === "Enter" && hits.length) {
      hitCursor = (hitCursor + 1) % hits.length;
      const s = spans[spans.length - 1][hits[hitCursor]];
      model.set("selected", posOf(s));
      model.save_changes();
      e.preventDefault();
    } else if (e.key === "Escape") {
      search.value = "";
      model.set("query", "");
      model.save_changes();
    }
    e.stopPropagation();
  }

  function onMessage(msg) {
    if (!msg || msg.type !== "tip") return;
    const layers = model.get("layers") || [];
    const li = layers.findIndex((l) => l.key === msg.key);
    if (msg.rollout !== model.get("rollout") || li < 0) return;
    const key = `${msg.rollout}|${msg.key}|${msg.pos}`;
    tips.set(key, msg.text);
    const s = (spans[li] || []).find((x) => posOf(x) === msg.pos);
    if (s && s.matches(":hover")) rt.show(s, msg.text);
  }

  function open(target) {
    if (target && target.rollout) model.send({ type: "open", rollout: target.rollout, pos: target.pos,
                                               checkpoint: target.checkpoint || null });
  }
  const onOpen = (e) => open(e.detail);

  body.addEventListener("mouseover", onOver);
  body.addEventListener("click", onClick);
  body.addEventListener("keydown", onKey);
  search.addEventListener("input", () => { model.set("query", search.value); model.save_changes(); });
  search.addEventListener("keydown", onSearchKey);
  window.addEventListener("rlprobe-open", onOpen);
  model.on("change:texts", build);
  model.on("change:layers", paint);
  model.on("change:selected", () => showSelected(true));
  model.on("change:query", highlight);
  model.on("change:legend", () => { legend.innerHTML = model.get("legend"); });
  model.on("change:details", () => { details.innerHTML = model.get("details"); });
  model.on("msg:custom", onMessage);

  legend.innerHTML = model.get("legend") || "";
  details.innerHTML = model.get("details") || "";
  build();
  open(rt.takePending());
  return () => {
    window.removeEventListener("rlprobe-open", onOpen);
    rt.hide();
  };
}

export default { render };

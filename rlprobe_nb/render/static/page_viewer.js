// The viewer in a page without a kernel (rlprobe_nb/render/page_viewer.py): the live
// viewer's response pane (window.rlprobePane, token_pane.js) run against a stand-in for the
// kernel that answers from the numbers the page holds (a JSON script in the viewer's box).
//
// The stand-in is the widget model the pane expects (get / set / on / save_changes / send):
// a hover's "tip" is answered with the tooltip composed here, to the character the live
// viewer's (tokens_html.tooltip_text); a click's "selected" shows the token's values over
// steps and both models' top-k at every step (viewer.details_html); "step" and "spike"
// (← →, n / p) move the step and the selection. Around the pane: the rollouts the page
// holds, a step slider, "next spike" (which says when a step has none and offers the
// nearest step that has), and a note for a link to a rollout the page does not hold.
// Links land at #open=<rollout>:<pos> (viewer_links.fragment).
(function () {
  "use strict";
  if (typeof window === "undefined" || window.rlprobePageViewer) return;

  const MARKS = { " ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍", "\x7f": "␡" };
  const LABEL = 18;  // a top-k token's width in a tooltip (tokens_html._Labels)

  function visible(text) {
    return Array.from(text, (ch) => {
      if (MARKS[ch]) return MARKS[ch];
      const code = ch.codePointAt(0);
      return code < 0x20 ? String.fromCodePoint(0x2400 + code) : ch;
    }).join("");
  }
  const quoted = (text) => `"${visible(text)}"`;
  const chars = (text) => Array.from(text).length;
  const padEnd = (text, n) => text + " ".repeat(Math.max(0, n - chars(text)));
  const padStart = (text, n) => " ".repeat(Math.max(0, n - chars(text))) + text;
  const cut = (text, n) => Array.from(text).slice(0, n).join("");
  // Python's f"{x:.{d}f}" (and f"{x:+.{d}f}" with plus) of a number stored already rounded.
  function fixed(x, d, plus) {
    if (x === null || x === undefined) return "–";
    const negative = x < 0 || Object.is(x, -0);
    return (negative ? "-" : plus ? "+" : "") + Math.abs(x).toFixed(d);
  }
  const escapeHtml = (t) => String(t).replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

  function parseTarget(hash) {
    const m = /^#?open=([^:]+):(-?\d+)$/.exec(hash || "");
    return m ? { rollout: decodeURIComponent(m[1]), pos: Number(m[2]) } : null;
  }

  // The top-k lists of token j (ids and probabilities) from a {k, ids, p} record.
  function topk(rec, j) {
    const k = rec.k, start = j * k;
    return { ids: rec.ids.slice(start, start + k), p: rec.p.slice(start, start + k) };
  }

  function mount(root, data) {
    const vocab = data.vocab, word = (id) => vocab[id] ?? `#${id}`;
    const label = (id) => padEnd(cut(quoted(word(id)), LABEL), LABEL);
    const handlers = {};
    const state = { rollout: "", texts: [], positions: [], layers: [], legend: data.legend, details: "",
                    selected: -1, query: "" };
    const model = {
      get: (k) => state[k],
      set: (k, v) => { state[k] = v; (handlers["change:" + k] || []).forEach((f) => f()); },
      on: (ev, f) => { (handlers[ev] = handlers[ev] || []).push(f); },
      off: () => {},
      save_changes: () => {},
      send: (msg) => answer(msg),
    };
    const emit = (ev, msg) => (handlers[ev] || []).forEach((f) => f(msg));
    let rec = null, stepAt = 0;

    const bar = el("div", "rp-pv-bar");
    const rolloutPick = el("select");
    data.rollouts.forEach((r) => {
      const o = el("option");
      o.value = r.id;
      const at = r.links.map((l) => l.pos).join(", ");
      const plural = r.links.length > 1 ? "s" : "";
      o.textContent = `${r.id} · ${r.texts.length} tokens` + (at ? ` · linked at token${plural} ${at}`
                                                                  : " · the viewer opens on it");
      rolloutPick.append(o);
    });
    const stepSlider = el("input");
    Object.assign(stepSlider, { type: "range", min: 0, max: data.rollouts[0].steps.length - 1, step: 1 });
    const stepText = el("span");
    const nextSpike = el("button");
    nextSpike.type = "button";
    nextSpike.textContent = "next spike ▶";
    const spikeNote = el("span", "rp-pv-note");
    const nearest = el("button");
    nearest.type = "button";
    nearest.style.display = "none";
    const stepLabel = labelled("RL step", stepSlider, stepText);
    stepLabel.className = "rp-pv-step";
    bar.append(labelled("rollout", rolloutPick), stepLabel, nextSpike, spikeNote, nearest);
    const info = el("div", "rp-pv-note");
    const missing = el("div", "rp-pv-missing");
    const paneBox = el("div");
    root.append(bar, info, missing, paneBox);

    function el(tag, cls) { const e = document.createElement(tag); if (cls) e.className = cls; return e; }
    function labelled(text, ...inner) {
      const l = el("label");
      l.append(text, ...inner);
      return l;
    }

    function tooltip(s, j) {
      const step = rec.steps[s], ref = rec.ref, cat = step.category[j];
      const head = `${quoted(rec.texts[j])}  id ${rec.token_id[j]}  pos ${rec.pos[j]}`
        + (cat >= 0 ? `  category ${data.categories[cat]}` : "");
      const lines = [head,
        `log p    ref ${fixed(ref.logp[j], 4, true)}   ckpt ${fixed(step.logp[j], 4, true)}   `
          + `Δlogp ${fixed(step.dlogp[j], 4, true)}`,
        `rank     ref ${padEnd(String(ref.rank[j]), 8)} ckpt ${step.rank[j]}`,
        `KL(ref‖ckpt) ${fixed(step.kl_ref_ckpt[j], 4)}   KL(ckpt‖ref) ${fixed(step.kl_ckpt_ref[j], 4)}   `
          + `JS ${fixed(step.js[j], 4)}`,
        `entropy  ref ${fixed(ref.entropy[j], 4)}   ckpt ${fixed(step.entropy[j], 4)}`,
        step.spike[String(rec.pos[j])] || "not a spike"];
      const a = topk(ref.topk, j), b = topk(step.topk, j);
      const left = a.ids.map((id, i) => `${label(id)} ${fixed(a.p[i], 3)}`);
      const right = b.ids.map((id, i) => `${label(id)} ${fixed(b.p[i], 3)}`);
      const n = Math.max(left.length, right.length);
      lines.push(`top-${padEnd(String(n), 3)} ${padEnd("reference", 24)} checkpoint`);
      for (let i = 0; i < n; i++) {
        lines.push(`${padStart(String(i + 1), 4)}    ${padEnd(left[i] || "", 24)} ${right[i] || ""}`);
      }
      return lines.join("\n");
    }

    function seriesSvg(j) {
      const W = 260, H = 130, L = 46, R = 10, T = 10, B = 26;
      const pts = rec.steps.map((s) => [s.step, s.value[j]]).filter((p) => p[1] !== null);
      const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]).concat([0]);
      const [x0, x1] = [Math.min(...xs, 0), Math.max(...xs, 1)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
      const X = (x) => L + (W - L - R) * (x - x0) / ((x1 - x0) || 1);
      const Y = (y) => T + (H - T - B) * (1 - (y - y0) / ((y1 - y0) || 1));
      const line = pts.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
      const dots = pts.map((p) => `<circle cx="${X(p[0]).toFixed(1)}" cy="${Y(p[1]).toFixed(1)}" r="3">`
        + `<title>step ${p[0]}: ${fixed(p[1], 4, true)}</title></circle>`).join("");
      const text = (x, y, t, anchor) => `<text x="${x}" y="${y}" font-size="10" text-anchor="${anchor}">${escapeHtml(t)}</text>`;
      return `<svg class="rp-series" width="${W}" height="${H}" role="img" aria-label="${escapeHtml(data.metric_short)} over RL steps">`
        + `<line x1="${L}" x2="${W - R}" y1="${Y(0).toFixed(1)}" y2="${Y(0).toFixed(1)}" stroke="#bbb" stroke-dasharray="3,3"/>`
        + `<polyline fill="none" stroke="#333" points="${line}"/>${dots}`
        + text(L - 4, T + 8, fixed(y1, 4, true), "end") + text(L - 4, H - B, fixed(y0, 4, true), "end")
        + text(L, H - 8, String(x0), "start") + text(W - R, H - 8, String(x1), "end")
        + text((L + W - R) / 2, H - 8, "RL step", "middle") + "</svg>";
    }

    function details(pos) {
      const j = rec.pos.indexOf(pos);
      if (j < 0) return "";
      const list = (t) => t.ids.map((id, i) => `${quoted(word(id))} ${fixed(t.p[i], 3)}`).join("  ");
      const rows = [`<tr><td>reference</td><td></td><td><code>${escapeHtml(list(topk(rec.ref.topk, j)))}</code></td></tr>`]
        .concat(rec.steps.map((s) => `<tr><td>step ${s.step}</td><td>${fixed(s.value[j], 4, true)}</td>`
          + `<td><code>${escapeHtml(list(topk(s.topk, j)))}</code></td></tr>`));
      return `<div class="rp-token-details" data-pos="${pos}"><b>token ${pos}: <code>${escapeHtml(quoted(rec.texts[j]))}</code></b>`
        + `<div style="display:flex;gap:16px;flex-wrap:wrap">${seriesSvg(j)}<table style="font-size:12px">`
        + `<tr><th></th><th>${escapeHtml(data.metric_short)}</th><th>top-k (token p)</th></tr>${rows.join("")}</table></div></div>`;
    }

    function outlined(s) {
      const mark = rec.steps[s].layer.mark, out = [];
      for (let j = 0; j < mark.length; j++) if (Number(mark.charAt(j)) & 1) out.push(rec.pos[j]);
      return out;
    }

    function nearestWithSpikes() {
      let best = -1;
      rec.steps.forEach((_, s) => {
        if (s !== stepAt && outlined(s).length && (best < 0 || Math.abs(s - stepAt) < Math.abs(best - stepAt))) best = s;
      });
      return best;
    }

    function jumpToSpike(direction) {
      const found = outlined(stepAt), here = state.selected;
      nearest.style.display = "none";
      if (!found.length) {
        const near = nearestWithSpikes();
        spikeNote.textContent = `no spike is outlined at step ${rec.steps[stepAt].step}` +
          (near >= 0 ? `; the nearest step with spikes in this rollout is ${rec.steps[near].step}` : " nor at any other step of this rollout");
        if (near >= 0) {
          nearest.textContent = `go to step ${rec.steps[near].step} ▶`;
          nearest.dataset.step = String(near);
          nearest.style.display = "";
        }
        return;
      }
      spikeNote.textContent = "";
      let pos;
      if (direction > 0) pos = found.find((p) => p > here) ?? found[0];
      else pos = [...found].reverse().find((p) => here < 0 || p < here) ?? found[found.length - 1];
      select(pos, true);
    }

    function showStep(s) {
      stepAt = Math.max(0, Math.min(rec.steps.length - 1, s));
      stepSlider.value = String(stepAt);
      stepText.textContent = `step ${rec.steps[stepAt].step} · ${rec.steps[stepAt].key}`;
      spikeNote.textContent = "";
      nearest.style.display = "none";
      model.set("layers", [Object.assign({}, rec.steps[stepAt].layer, { label: rec.steps[stepAt].label })]);
    }

    function select(pos, scroll) {
      model.set("selected", pos);
      if (scroll) {
        const token = paneBox.querySelector(`.rp-tok[data-pos="${pos}"]`);
        if (token) token.scrollIntoView({ block: "center", inline: "nearest" });
      }
    }

    function showRollout(id, pos) {
      rec = data.rollouts.find((r) => r.id === id);
      rolloutPick.value = id;
      const facts = Object.values(rec.facts).join(" · ");
      const linked = rec.links.map((l) => `token ${l.pos} (${l.why})`).join("; ");
      info.textContent = `${id}: ${rec.texts.length} tokens · ${facts}` + (linked ? ` · linked from: ${linked}` : "");
      state.rollout = id;
      state.positions = rec.pos;
      state.selected = -1;
      state.details = "";
      showStep(rec.steps.length - 1);
      model.set("texts", rec.texts);
      model.set("details", "");
      if (pos !== null && pos !== undefined) select(pos, true);
    }

    // A link's target: shown, ringed and scrolled to if the page holds it, else a note here.
    function open(target) {
      if (!target) return;
      const held = data.rollouts.some((r) => r.id === target.rollout);
      missing.style.display = held ? "none" : "block";
      if (held) { showRollout(target.rollout, target.pos); return; }
      missing.textContent = `This page does not hold rollout ${target.rollout} (token ${target.pos}): it holds the `
        + `rollouts listed above. In JupyterLab the link opens the live viewer there; or run: papermill `
        + `notebooks/07_viewer.ipynb out.ipynb -p rollout_id '${target.rollout}' -p token ${target.pos}`;
      missing.scrollIntoView({ block: "center" });
    }

    function answer(msg) {
      if (!msg || !rec) return;
      if (msg.type === "tip") {
        const j = rec.pos.indexOf(msg.pos);
        if (j >= 0) emit("msg:custom", { type: "tip", rollout: rec.id, key: rec.steps[stepAt].key, pos: msg.pos,
                                         text: tooltip(stepAt, j) });
      } else if (msg.type === "step") {
        showStep(stepAt + msg.delta);
      } else if (msg.type === "spike") {
        jumpToSpike(msg.delta);
      } else if (msg.type === "open") {
        open(msg);
      }
    }

    model.on("change:selected", () => model.set("details", state.selected >= 0 ? details(state.selected) : ""));
    rolloutPick.addEventListener("change", () => showRollout(rolloutPick.value, null));
    stepSlider.addEventListener("input", () => showStep(Number(stepSlider.value)));
    nextSpike.addEventListener("click", () => jumpToSpike(1));
    nearest.addEventListener("click", () => { showStep(Number(nearest.dataset.step)); jumpToSpike(1); });
    window.addEventListener("hashchange", () => open(parseTarget(location.hash)));

    showRollout(data.opening.rollout, null);
    window.rlprobePane.render({ model: model, el: paneBox });  // (it opens a link clicked just before)
    if (data.opening.pos !== null && state.rollout === data.opening.rollout && state.selected < 0) {
      select(data.opening.pos, false);
    }
    open(parseTarget(location.hash));
  }

  function mountAll() {
    document.querySelectorAll(".rp-page-viewer:not([data-mounted])").forEach((root) => {
      root.setAttribute("data-mounted", "1");
      const data = JSON.parse(root.querySelector("script.rp-viewer-data").textContent);
      mount(root, data);
    });
  }
  window.rlprobePageViewer = { mountAll: mountAll, parseTarget: parseTarget };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", mountAll);
  else mountAll();
})();

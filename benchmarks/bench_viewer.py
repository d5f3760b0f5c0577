"""What the live viewer sends to the browser and how fast it recolours (prints its figures;
not a test).

    .venv/bin/python benchmarks/bench_viewer.py [--tokens 1000] [--repeats 5]

A synthetic suite with one response of ``--tokens`` tokens at five checkpoints, opened in
the viewer as a notebook opens it. Every message the widgets would send to the browser is
counted as Jupyter serialises it (JSON, UTF-8, plus binary buffers; the message envelope of
a few hundred bytes is not counted), by replacing the comm that ipywidgets uses outside a
kernel with one that measures:
  - a move of the step slider (median over moves through all five steps),
  - opening another rollout (its texts once, then its paint),
  - one tooltip (asked for on hover, answered once per token and step),
  - and, for comparison, the whole coloured HTML of the response with its tooltips, which
    the viewer sent on every move before the response pane sent only colours.
Time in the kernel's process, median of ``--repeats``:
  - a step the viewer has not shown yet (escape texts and tooltips, then colour),
  - a step shown before (colour only), a change of metric, of scale, of the spike threshold.
If Debian's chromium is installed, also the browser's side: the pane's script repainting
the response for a new step (in a blank page, with a stand-in for the widget model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def timed(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return statistics.median(out)


class Wire:
    """Counts the bytes of every comm message the widgets send (as jupyter_client packs them)."""

    def __init__(self):
        self.sizes: list[int] = []

    def __enter__(self):
        import comm

        self._original = comm.DummyComm.publish_msg
        wire = self

        def publish_msg(comm_self, msg_type, data=None, metadata=None, buffers=None, **keys):
            packed = json.dumps(data or {}, ensure_ascii=False, allow_nan=False, default=str).encode()
            wire.sizes.append(len(packed) + sum(len(memoryview(b).cast("B")) for b in buffers or []))

        comm.DummyComm.publish_msg = publish_msg
        return self

    def __exit__(self, *exc):
        import comm

        comm.DummyComm.publish_msg = self._original

    def measure(self, fn) -> int:
        start = len(self.sizes)
        fn()
        return sum(self.sizes[start:])


def browser_repaint_seconds(app, repeats: int) -> float | None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
    from browser_harness import FLAGS, chromium_path
    from pane_harness import mount_pane

    binary = chromium_path()
    if binary is None:
        return None
    from playwright.sync_api import sync_playwright

    scale = app.scale()
    layers = [[app.layer(ck, scale)] for ck in app.checkpoints]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=binary, headless=True, args=FLAGS)
        page = browser.new_page()
        mount_pane(page, app.pane)
        times = page.evaluate("""(layers) => {
            const out = [];
            for (const l of layers) {
                const t0 = performance.now();
                window.paneModel.set('layers', l);
                document.body.offsetHeight;  // force style + layout
                out.push((performance.now() - t0) / 1000);
            }
            return out; }""", layers * repeats)
        browser.close()
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    from rlprobe_nb.render import synthetic, viewer

    steps = {f"rlvr_step_{s}": s for s in (100, 200, 400, 800, 1200)}
    suite = synthetic.synthetic_suite(n_problems=1, rollouts_per_problem=2, n_tokens=args.tokens, steps=steps,
                                      spikes_per_rollout=40, seed=0)
    texts = dict(zip(suite["rollouts"].rollout_id, suite["rollouts"].response))
    with Wire() as wire:
        start = time.perf_counter()
        app = viewer.open_viewer(suite["tokens"], suite["spikes"], synthetic.decode, texts)
        opened = time.perf_counter() - start
        ckpts = app.checkpoints
        fresh = iter(ckpts[:-1])

        def new_step():
            app._pieces.clear()  # as if never shown
            app.step.value = next(fresh, ckpts[0])

        cold = timed(new_step, min(args.repeats, len(ckpts) - 1))
        for ck in ckpts:  # every step shown once: what follows is recolouring only
            app.step.value = ck
        move_bytes = []

        def move():
            nxt = ckpts[(ckpts.index(app.step.value) + 1) % len(ckpts)]
            move_bytes.append(wire.measure(lambda: setattr(app.step, "value", nxt)))

        warm = timed(move, max(args.repeats, len(ckpts)))
        metrics = iter(["kl_ref_ckpt", "kl_ckpt_ref", "js", "dentropy", "dlogp"] * args.repeats)
        metric = timed(lambda: setattr(app.metric, "value", next(metrics)), args.repeats)
        kinds = iter(["per-rollout", "shared"] * args.repeats)
        scale = timed(lambda: setattr(app.scale_kind, "value", next(kinds)), args.repeats)
        transforms = iter(["log", "linear"] * args.repeats)
        log = timed(lambda: setattr(app.transform, "value", next(transforms)), args.repeats)
        qs = iter([0.01, 0.05] * args.repeats)
        q = timed(lambda: setattr(app.q, "value", next(qs)), args.repeats)
        tip_bytes = wire.measure(lambda: app._on_pane_message(app.pane, {"type": "tip", "layer": 0, "pos": 10}, []))
        other = [r for _, r in app.rollout.options if r != app.rollout.value][0]
        rollout_bytes = wire.measure(lambda: setattr(app.rollout, "value", other))
    whole_html = len(app.render_html().encode())
    in_browser = browser_repaint_seconds(app, args.repeats)

    n = len(app.rows(ckpts[-1], app.rollout.value))
    print(f"viewer on one {n}-token response, 5 checkpoints (median of {args.repeats}; seconds)")
    print(f"  open the viewer (shared scale fitted, first rendering) {opened:8.3f}")
    print(f"  step not shown before (escape + tooltips + colour)     {cold:8.3f}")
    print(f"  step shown before (recolour only)                      {warm:8.3f}")
    print(f"  change of metric                                       {metric:8.3f}")
    print(f"  change of scale (shared <-> per-rollout)               {scale:8.3f}")
    print(f"  change of transform (linear <-> log)                   {log:8.3f}")
    print(f"  change of spike threshold q                            {q:8.3f}")
    print("sent to the browser (bytes; JSON as Jupyter packs it, envelope not counted)")
    print(f"  per move of the step slider: {statistics.median(move_bytes):,.0f} "
          f"({statistics.median(move_bytes) / n:.1f} a token; min {min(move_bytes):,}, max {max(move_bytes):,})")
    print(f"  opening another rollout (its texts and paint): {rollout_bytes:,}")
    print(f"  one tooltip, on hover: {tip_bytes:,}")
    print(f"  for comparison, the whole coloured HTML with tooltips (what a move sent before): {whole_html:,}")
    if in_browser is None:
        print("  browser side: skipped (no chromium; scripts/ensure_browser.sh installs it)")
    else:
        print(f"  browser side: the pane repaints the response for a new step {in_browser:8.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

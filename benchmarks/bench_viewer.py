"""How fast the viewer recolours a long response (prints its figures; not a test).

    .venv/bin/python benchmarks/bench_viewer.py [--tokens 4000] [--repeats 5]

A synthetic suite with one response of ``--tokens`` tokens at five checkpoints. Measured in
the kernel's process, through the widgets' Python API as a user's click runs it (state
change -> the HTML widget's new value), median of ``--repeats``:
  - a step the viewer has not shown yet (escape texts and tooltips, then colour),
  - a step shown before (colour only: the cached pieces are joined),
  - a change of metric, of scale (per-rollout, log), of the spike threshold.
If Debian's chromium is installed, also the browser's side: replacing a page's response
with the new HTML and laying it out (``innerHTML`` + a forced layout), median of repeats.
"""

from __future__ import annotations

import argparse
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


def browser_apply_seconds(fragments: list[str], repeats: int) -> float | None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
    from browser_harness import FLAGS, chromium_path

    binary = chromium_path()
    if binary is None:
        return None
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=binary, headless=True, args=FLAGS)
        page = browser.new_page()
        page.set_content("<div id='host'></div>")
        times = page.evaluate("""(frags) => {
            const host = document.getElementById('host'), out = [];
            for (const f of frags) {
                const t0 = performance.now();
                host.innerHTML = f;
                host.getBoundingClientRect(); document.body.offsetHeight;  // force style + layout
                out.push((performance.now() - t0) / 1000);
            }
            return out; }""", fragments * repeats)
        browser.close()
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    from rlprobe_nb.render import synthetic, viewer

    steps = {f"rlvr_step_{s}": s for s in (100, 200, 400, 800, 1200)}
    suite = synthetic.synthetic_suite(n_problems=1, rollouts_per_problem=1, n_tokens=args.tokens, steps=steps,
                                      spikes_per_rollout=40, seed=0)
    texts = dict(zip(suite["rollouts"].rollout_id, suite["rollouts"].response))
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
    warm = timed(lambda: setattr(app.step, "value", ckpts[(ckpts.index(app.step.value) + 1) % len(ckpts)]),
                 args.repeats)
    metrics = iter(["kl_ref_ckpt", "kl_ckpt_ref", "js", "dentropy", "dlogp"] * args.repeats)
    metric = timed(lambda: setattr(app.metric, "value", next(metrics)), args.repeats)
    kinds = iter(["per-rollout", "shared"] * args.repeats)
    scale = timed(lambda: setattr(app.scale_kind, "value", next(kinds)), args.repeats)
    transforms = iter(["log", "linear"] * args.repeats)
    log = timed(lambda: setattr(app.transform, "value", next(transforms)), args.repeats)
    qs = iter([0.01, 0.05] * args.repeats)
    q = timed(lambda: setattr(app.q, "value", next(qs)), args.repeats)
    size = len(app.html.value.encode())
    frags = []
    for ck in ckpts:
        app.step.value = ck
        frags.append(app.html.value)
    in_browser = browser_apply_seconds(frags, args.repeats)

    n = len(app.rows(ckpts[-1], app.rollout.value))
    print(f"viewer on one {n}-token response, 5 checkpoints (median of {args.repeats}; seconds)")
    print(f"  open the viewer (shared scale fitted, first rendering) {opened:8.3f}")
    print(f"  step not shown before (escape + tooltips + colour)     {cold:8.3f}")
    print(f"  step shown before (recolour only)                      {warm:8.3f}")
    print(f"  change of metric                                       {metric:8.3f}")
    print(f"  change of scale (shared <-> per-rollout)               {scale:8.3f}")
    print(f"  change of transform (linear <-> log)                   {log:8.3f}")
    print(f"  change of spike threshold q                            {q:8.3f}")
    print(f"  HTML sent to the browser per recolour: {size / 1e6:.2f} MB")
    if in_browser is None:
        print("  browser side: skipped (no chromium; scripts/ensure_browser.sh installs it)")
    else:
        print(f"  browser side: replace the response's HTML and lay it out {in_browser:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

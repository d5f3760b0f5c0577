"""Run the book headlessly: every notebook in order through papermill (03 once per
checkpoint), each executed notebook and its HTML export under figures/<suite>/.

    python -m rlprobe_nb.book                 # the active suite (demo unless named)
    python -m rlprobe_nb.book --suite tulu3   # the real suite, on GPUs
    python -m rlprobe_nb.book --only 03       # one chapter
    python -m rlprobe_nb.book --prepare       # one-time set-up (convert the demo GGUF)

Notebooks skip work whose tables are already complete, so a second run is quick.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import params, paths

PER_CHECKPOINT = "03_teacher_forcing"


def notebooks() -> list[Path]:
    """Chapters in order (01, 02, ...), then appendices."""
    found = sorted(paths.notebooks_dir().glob("*.ipynb"))
    chapters = [p for p in found if p.stem[:2].isdigit()]
    return chapters + [p for p in found if p not in chapters]


def declared_parameters(nb: Path) -> set[str]:
    import papermill as pm

    return set(pm.inspect_notebook(str(nb)))


def runs(P: params.Params, only: list[str] | None = None) -> list[tuple[Path, dict, str]]:
    """(notebook, papermill parameters, output stem) for each run of the book. A notebook
    gets ``suite`` only if it declares it (the appendix is about the demo suite alone)."""
    out = []
    for nb in notebooks():
        if only and not any(nb.stem.startswith(o) for o in only):
            continue
        base = {"suite": P.suite} if "suite" in declared_parameters(nb) else {}
        if nb.stem == PER_CHECKPOINT:
            for ckpt in P.checkpoints:
                out.append((nb, {**base, "checkpoint": ckpt}, f"{nb.stem}__{ckpt}"))
        else:
            out.append((nb, base, nb.stem))
    return out


def export_html(executed: Path) -> Path:
    import nbformat
    from nbconvert import HTMLExporter

    from .storage import atomic_write_text

    body, _ = HTMLExporter(embed_images=True).from_notebook_node(nbformat.read(executed, 4))
    return atomic_write_text(executed.with_suffix(".html"), body)


def run_one(nb: Path, parameters: dict, stem: str, out_dir: Path) -> float:
    import papermill as pm

    from .storage import atomic_path

    start = time.perf_counter()
    target = out_dir / f"{stem}.ipynb"
    with atomic_path(target) as tmp:
        pm.execute_notebook(str(nb), str(tmp), parameters=parameters, kernel_name="python3",
                            cwd=str(paths.REPO_ROOT), progress_bar=False)
    export_html(target)
    return time.perf_counter() - start


def prepare() -> None:
    """One-time set-up for the demo suite: convert its GGUF to a safetensors cache."""
    from . import gguf_cache, models

    P = params.load(params.DEFAULT_SUITE)
    spec = P.model_spec(P.reference)
    path = gguf_cache.convert_gguf(models.gguf_file(spec), paths.cache_dir() / "models")
    print(f"demo model ready: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--suite", default=None, help="suite name (default: $RLPROBE_SUITE or demo)")
    ap.add_argument("--only", nargs="*", help="notebook name prefixes to run, e.g. 01 03")
    ap.add_argument("--prepare", action="store_true", help="one-time set-up, then exit")
    args = ap.parse_args(argv)
    if args.prepare:
        prepare()
        return 0
    P = params.load(args.suite)  # a bad params file fails here, before any model loads
    out_dir = paths.figures_dir(P.suite)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = runs(P, args.only)
    total = time.perf_counter()
    print(f"rlprobe_nb: suite {P.suite!r}, {len(plan)} notebook runs")
    for i, (nb, parameters, stem) in enumerate(plan, 1):
        extra = f" (checkpoint {parameters['checkpoint']})" if "checkpoint" in parameters else ""
        print(f"[{i}/{len(plan)}] {nb.name}{extra} ...", flush=True)
        seconds = run_one(nb, parameters, stem, out_dir)
        print(f"      done in {seconds:.1f} s -> {out_dir / stem}.html", flush=True)
    minutes = (time.perf_counter() - total) / 60
    print(f"\nThe book ran in {minutes:.1f} min.")
    print(f"  executed notebooks and HTML: {out_dir}")
    print(f"  tables (parquet + manifest.json): {paths.data_dir(P.suite)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

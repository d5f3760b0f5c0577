"""The package's imports go one way only, as the book reads: a stage imports earlier
stages, never later ones, and nothing outside ``demo/`` imports the demo suite's code.

Layers, lowest first (every import of the package is read, at module level and inside
functions alike, with ``ast``; nothing is imported to check):

  base        progress, statistics, readable (how values read on a page), reporting (how
              an estimate and its interval are printed), cores (how many threads a
              notebook may use while another runs), the package's ``__init__``: import no
              other module of the package
  foundation  suite/, tables/: what a suite is and how results are kept; import each
              other and base only
  helpers     views (pandas displays every stage shows), distributed (worker processes for
              any stage), reporting (how every chapter prints an estimate): import
              foundation and base only, so that any stage may use them
  stages      problems <- generation <- forcing <- divergence <- spikes <- render and
              counterfactuals: each imports foundation, base, helpers and earlier stages;
              render and counterfactuals are siblings (chapters 06-07 and 08) and neither
              imports the other; takeover (09) comes after counterfactuals
  book        runs the notebooks (book, book_runs), starts their kernels (kernels) and writes their
              pages and the index (pages/); import_rollouts, a command that turns a trainer's
              dump into a rollouts table: may import anything but demo/
  demo/       the demo suite's own code (its GRPO run, tiny stand-ins): may import anything,
              and only itself imports it
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlprobe_nb.suite import paths

PACKAGE = "rlprobe_nb"
BASE = {"progress", "statistics", "readable", "reporting", "cores", "(init)"}
FOUNDATION = {"suite", "tables"}
HELPERS = {"views", "distributed"}
RUNNER = {"book", "book_runs", "kernels", "pages", "import_rollouts"}
STAGES = {"problems": 1, "generation": 2, "forcing": 3, "divergence": 4, "spikes": 5,
          "render": 6, "counterfactuals": 6, "takeover": 7}


def module_name(path: Path) -> str:
    parts = path.relative_to(paths.PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(paths.PACKAGE_DIR.rglob("*.py"))}


def imported(path: Path, known: set[str]) -> set[str]:
    """Every module of the package that ``path`` imports, wherever the import stands."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: the package uses absolute imports only
                out.add(f"(relative import in {path.name})")
                continue
            for alias in node.names:  # `from pkg import module` imports the module
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in known else node.module)
    return {m for m in out if m.split(".")[0] == PACKAGE or m.startswith("(")}


def unit(module: str) -> str:
    """The layer unit of a module: its subpackage, or the top-level module's own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(init)"


def allowed(src: str, dst: str) -> bool:
    if src == dst or src == "demo":
        return True
    if dst == "demo":
        return False
    if src in BASE:
        return dst in BASE
    if src in FOUNDATION:
        return dst in FOUNDATION | BASE
    if src in HELPERS:
        return dst in FOUNDATION | BASE
    if src in STAGES:
        return dst in FOUNDATION | BASE | HELPERS or (
            dst in STAGES and STAGES[dst] < STAGES[src])
    if src in RUNNER:
        return True
    raise AssertionError(f"module group {src!r} has no place in the layers: add it to this test")


def violations() -> list[str]:
    mods = modules()
    bad = []
    for name, path in mods.items():
        for dst in sorted(imported(path, set(mods))):
            if dst.startswith("("):
                bad.append(f"{name}: {dst}")
            elif not allowed(unit(name), unit(dst)):
                bad.append(f"{name} imports {dst} ({unit(name)} -> {unit(dst)})")
    return bad


def test_imports_go_downward_only():
    bad = violations()
    assert not bad, "imports against the layers:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("src,dst,ok", [
    ("forcing", "generation", True), ("generation", "forcing", False),
    ("render", "counterfactuals", False), ("tables", "problems", False),
    ("suite", "tables", True), ("distributed", "forcing", False),
    ("statistics", "tables", False), ("book", "demo", False), ("demo", "forcing", True),
    ("pages", "render", True), ("render", "readable", True), ("readable", "render", False),
])
def test_the_rules_say_what_the_docstring_says(src, dst, ok):
    assert allowed(src, dst) is ok


def test_every_import_form_is_seen(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import rlprobe_nb.forcing.engine\nfrom rlprobe_nb import demo\n"
                 "def g():\n    from rlprobe_nb.spikes import table\n")
    known = {"rlprobe_nb.demo", "rlprobe_nb.spikes.table", "rlprobe_nb.forcing.engine"}
    assert imported(f, known) == known

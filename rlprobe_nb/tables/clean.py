"""Delete what the book wrote for one suite (tables, caches, figures); never its shipped
inputs, never anything outside the suite's own result folders.

    python -m rlprobe_nb.tables.clean --suite demo
"""

from __future__ import annotations

import argparse
import shutil
import sys

from rlprobe_nb.suite import params, paths


def clean_results(suite: str) -> list[str]:
    """Remove data/<suite>/* except shipped/, and figures/<suite>/. The suite must be a
    plain name with a folder under params/ (so an empty or '../..' name deletes nothing)."""
    name = params.check_name(suite, "suite")
    if name not in params.available_suites():
        raise params.ParamsError(f"no suite {name!r} (valid: {params.available_suites()}); "
                                 "nothing deleted")
    removed = []
    data = paths.data_dir(name)
    if data.is_dir():
        for entry in data.iterdir():
            if entry.name == "shipped":
                continue
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            removed.append(str(entry))
    figures = paths.figures_dir(name)
    if figures.is_dir():
        shutil.rmtree(figures)
        removed.append(str(figures))
    return removed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--suite", required=True)
    args = ap.parse_args(argv)
    try:
        removed = clean_results(args.suite)
    except params.ParamsError as err:
        print(f"clean-results: {err}", file=sys.stderr)
        return 2
    print(f"removed {len(removed)} entries of suite {args.suite!r}" +
          "".join(f"\n  {r}" for r in removed))
    return 0


if __name__ == "__main__":
    sys.exit(main())

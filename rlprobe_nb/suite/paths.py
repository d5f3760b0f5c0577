"""Every path the book reads or writes comes from here (never '../data' in a notebook).

Layout, relative to the repository root:
  params/<suite>/suite.yaml, params/<suite>/<checkpoint>.yaml   parameters
  data/<suite>/shipped/...        inputs committed with the book (demo adapters, run logs)
  data/<suite>/<table>/...        tables the notebooks write (ignored by git)
  figures/<suite>/...             executed notebooks, HTML exports, charts
  .cache/                         converted models and other reusable caches
RLPROBE_OUT moves what the notebooks write (data/<suite>/ tables and figures/) to another
root, e.g. a scratch disk or a test's temporary folder; params, notebooks and shipped inputs
stay in the checkout. RLPROBE_PARAMS reads suites from another folder; RLPROBE_CACHE moves
the cache folder.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = PACKAGE_DIR.parent


def out_root() -> Path:
    """Where results are written (read at call time, so a test can redirect it)."""
    return Path(os.environ.get("RLPROBE_OUT", REPO_ROOT)).resolve()


def params_dir() -> Path:
    """The suites' parameter folders; RLPROBE_PARAMS points elsewhere (e.g. a lab's own)."""
    return Path(os.environ.get("RLPROBE_PARAMS", REPO_ROOT / "params")).resolve()


def suite_params_dir(suite: str) -> Path:
    return params_dir() / _plain(suite)


def notebooks_dir() -> Path:
    return REPO_ROOT / "notebooks"


def _plain(suite: str) -> str:
    """Suite names become folder names: refuse anything that could leave the folder."""
    if not isinstance(suite, str) or not suite or "/" in suite or "\\" in suite \
            or suite.startswith(".") or suite != suite.strip():
        raise ValueError(f"suite name {suite!r} is not a plain folder name")
    return suite


def data_dir(suite: str) -> Path:
    return out_root() / "data" / _plain(suite)


def shipped_dir(suite: str) -> Path:
    """Inputs committed with the book for this suite (e.g. the demo LoRA adapters)."""
    return REPO_ROOT / "data" / _plain(suite) / "shipped"


def table_dir(suite: str, table: str) -> Path:
    return data_dir(suite) / table


def token_table_name(checkpoint: str, reference: str) -> str:
    """The folder of the per-token table of a compared pair, under the suite's data folder."""
    return f"tokens/{checkpoint}__vs__{reference}"


def figures_dir(suite: str) -> Path:
    return out_root() / "figures" / _plain(suite)


def cache_dir() -> Path:
    return Path(os.environ.get("RLPROBE_CACHE", REPO_ROOT / ".cache")).resolve()


def resolve(path: str | os.PathLike) -> Path:
    """A path from a params file: absolute as given, relative to the repository root."""
    p = Path(os.path.expanduser(str(path)))
    return p if p.is_absolute() else REPO_ROOT / p


def relative(path: str | os.PathLike) -> Path:
    """``path`` as a page shows it: relative to where the book writes (``out_root``: e.g.
    ``data/demo/tokens/…``) or to the checkout, never this machine's absolute folder."""
    p = Path(path).resolve()
    for root in (out_root(), REPO_ROOT.resolve()):
        if p.is_relative_to(root):
            return p.relative_to(root)
    return p

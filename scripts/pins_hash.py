"""A short hash of everything `make install` installs from: constraints.txt, the package's
requirements in pyproject.toml (not the rest of it: a change to pytest's settings is no
reason to reinstall) and the pins the Makefile passes as arguments. The Makefile names its
install stamp after it, so `make lab` / `make test` / `make demo` reinstall only when a pin
changed.

    python3 scripts/pins_hash.py "torch==2.13.0" ...
"""

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def requirements() -> object:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the whole file stands in for its requirements
        return text
    project = tomllib.loads(text).get("project", {})
    return {k: project.get(k) for k in ("requires-python", "dependencies", "optional-dependencies")}


def main(argv: list[str]) -> str:
    h = hashlib.sha256()
    h.update((ROOT / "constraints.txt").read_bytes())
    h.update(json.dumps([requirements(), argv], sort_keys=True).encode())
    return h.hexdigest()[:12]


if __name__ == "__main__":
    print(main(sys.argv[1:]))

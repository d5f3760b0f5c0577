"""Key hashes, and the differences between two keys in words.

A key is any JSON-able mapping of what a table's rows depend on (``lineage`` says what
goes in one); its hash is the first 16 hex digits of the sha256 of its canonical JSON.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))


def key_sha(key: Any) -> str:
    """A stable 16-hex-digit hash of a key (any JSON-able value)."""
    return hashlib.sha256(canonical(key).encode()).hexdigest()[:16]


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as {dotted.path: leaf value}; lists and scalars are leaves."""
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for k in sorted(obj, key=str):
            out.update(flatten(obj[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix or "(key)": obj}


def _short(value: Any, width: int = 60) -> str:
    text = canonical(value) if not isinstance(value, str) else value
    if isinstance(value, list) and len(value) > 6:
        text = f"[{len(value)} items, sha {key_sha(value)}]"
    return text if len(text) <= width else text[: width - 1] + "…"


def differences(old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """(path, old value, new value) for every leaf that differs."""
    a, b = flatten(old if old is not None else {}), flatten(new if new is not None else {})
    return [(k, a.get(k, "(absent)"), b.get(k, "(absent)"))
            for k in sorted(set(a) | set(b)) if a.get(k, "(absent)") != b.get(k, "(absent)")]


def describe_difference(old: Any, new: Any, limit: int = 8) -> str:
    """'a.b: old -> new; ...' for the differing leaves of two keys."""
    if old is None:
        return "it records no key (written by an older version of the book)"
    diff = differences(old, new)
    if not diff:
        return "the keys' hashes differ"
    parts = [f"{k}: {_short(a)} -> {_short(b)}" for k, a, b in diff[:limit]]
    more = f"; and {len(diff) - limit} more" if len(diff) > limit else ""
    return "; ".join(parts) + more

"""What each table's content depends on: its *key*.

The rule, for every table and cache the book writes: its key covers everything its rows
depend on — the resolved identity of every model involved (weight-file and adapter hashes
or the hub commit, which also covers tokenizer and chat template), the problems' source
and content, every parameter that changes rows, the grader's version, and the version of
the code that produces the table (``STAGE_VERSIONS``, bumped when a change alters rows).
Keys chain: a table's key holds the hash of the key of each table it is computed from, so
a change anywhere upstream reaches every table below it.

Same key: the table is reused, and the notebook says so in one line. Different key: the
writing notebook refuses, naming each difference, unless run with ``overwrite=True``;
a notebook that reads the table refuses it as stale (``storage.StaleTableError``), naming
the notebook to rerun. Parameters that change only how fast rows are computed (batch
sizes of the teacher-forcing engine, chunk sizes, compiled kernels) are not in any key:
results are invariant to them within float rounding (measured in the tests).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Bump a stage's version when its code changes the rows it writes.
STAGE_VERSIONS = {
    "problems": 1,
    "answers": 2,
    "selection": 2,
    "rollouts": 2,
    "tokens": 2,
    "hidden": 1,
    # chapters 04 on: tables computed from the token tables
    "divergence_when": 1, "divergence_per_problem": 1, "divergence_changes": 1,
    "divergence_ecdf": 1, "divergence_tails": 1, "divergence_position": 1,
    "divergence_categories": 1, "divergence_similarity": 1, "entropy_deciles": 1,
    "entropy_share": 1, "estimator_lab": 2, "estimator_reweighted": 2,
    "divergence_ground_truth": 1, "divergence_onsets": 1, "divergence_contrasts": 1,
    "divergence_change_by_label": 1,
    "spikes": 1, "spike_regions": 1, "branches": 1,
}


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


def stage(name: str, **parts: Any) -> dict:
    """A table's key: its stage, the stage's code version and the given parts."""
    return {"table": name, "version": STAGE_VERSIONS[name], **parts}

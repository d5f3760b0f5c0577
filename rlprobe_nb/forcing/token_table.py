"""One batch of the per-token table (schemas.TOKENS), built column by column in Arrow from
the packed metric block of ``heads.pair_metrics`` and the sequences' own facts: no
per-row Python objects but the token strings, so writing keeps up with the GPU."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from rlprobe_nb.forcing import metrics
from rlprobe_nb.forcing.heads import METRIC_COLUMNS
from rlprobe_nb.forcing.sequences import ForcedSequence, SequenceSet
from rlprobe_nb.tables import schemas


def _check_finite(members: Sequence[ForcedSequence], host: np.ndarray) -> None:
    lengths = [s.n_rows for s in members]
    finite_cols = [j for j, name in enumerate(metrics.FLOAT_METRICS) if name != "k3"]
    bad = (~np.isfinite(host[:, finite_cols]).all(axis=1)
           | np.isnan(host[:, :len(METRIC_COLUMNS)]).any(axis=1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        seq = int(np.repeat(np.arange(len(members)), lengths)[i])
        raise FloatingPointError(
            f"non-finite metrics at rollout {members[seq].rollout_id!r} pos "
            f"{i - int(np.sum(lengths[:seq]))}: the logits were not finite, or one model "
            "gives zero probability where the other does not (an infinite KL)")


def _per_row(members: Sequence[ForcedSequence], label: str, lengths: list[int],
             dtype=None) -> np.ndarray:
    values = [s.labels.get(label) for s in members]
    if dtype is np.float32:
        values = [np.nan if v is None else v for v in values]
    return np.repeat(np.asarray(values, dtype=dtype or object), lengths)


def rows_table(members: Sequence[ForcedSequence], host: np.ndarray, suite: str,
               checkpoint: str, reference: str, topk: int,
               shared: set[int] | None = None) -> pa.Table:
    """The rows of ``members`` (in order) with metrics ``host`` [rows, packed columns].
    ``shared``: the context ids that occur in more than one forced rollout
    (``SequenceSet.shared_contexts``)."""
    lengths = [s.n_rows for s in members]
    n = int(sum(lengths))
    if host.shape[0] != n:
        raise RuntimeError(f"internal: {host.shape[0]} metric rows for {n} response tokens")
    _check_finite(members, host)
    pos = np.concatenate([np.arange(k, dtype=np.int32) for k in lengths])
    last = np.repeat(np.asarray(lengths, dtype=np.int32) - 1, lengths)
    stopped = _per_row(members, "finish_reason", lengths) == "stop"
    context = np.concatenate([s.context_ids() for s in members])
    cols: dict[str, Any] = {
        "suite": pa.array([suite] * n, pa.string()),
        "checkpoint": pa.array([checkpoint] * n, pa.string()),
        "reference": pa.array([reference] * n, pa.string()),
        "group": pa.array(_per_row(members, "group", lengths), pa.string()),
        "problem_id": pa.array(np.repeat([s.problem_id for s in members], lengths), pa.string()),
        "rollout_id": pa.array(np.repeat([s.rollout_id for s in members], lengths), pa.string()),
        "failure_type": pa.array(_per_row(members, "failure_type", lengths), pa.string()),
        "temperature": _per_row(members, "temperature", lengths, np.float32),
        "pos": pos,
        "token_id": np.concatenate([np.asarray(s.response_ids, dtype=np.int32) for s in members]),
        "token": pa.array([t for s in members for t in s.tokens], pa.string()),
        "char_start": np.concatenate([np.asarray(s.char_start, dtype=np.int32) for s in members]),
        "char_end": np.concatenate([np.asarray(s.char_end, dtype=np.int32) for s in members]),
        "first_token": pos == 0,
        "is_eos": stopped & (pos == last),
        "context_id": context,
        "shared_context": np.isin(context, np.fromiter(shared or (), dtype=np.int64)),
    }
    for j, name in enumerate(METRIC_COLUMNS):
        col = host[:, j]
        cols[name] = col.astype(np.int32) if name in metrics.INT_METRICS else col.astype(np.float32)
    cols["dlogp"] = -cols["k1"]  # k1 = -(logp_ckpt - logp_ref), rounded once: negation is exact
    base = len(METRIC_COLUMNS)
    offsets = pa.array(np.arange(0, (n + 1) * topk, topk, dtype=np.int32))
    for j, name in enumerate(metrics.TOPK_METRICS):
        block = host[:, base + j * topk: base + (j + 1) * topk]
        block = block.astype(np.int32 if "ids" in name else np.float32).reshape(-1)
        cols[name] = pa.ListArray.from_arrays(offsets, pa.array(block))
    return pa.Table.from_pydict({name: cols[name] for name in schemas.TOKENS.names},
                                schema=schemas.TOKENS)


UNIQUE = ["checkpoint", "reference", "rollout_id", "pos"]

# A part's parquet metadata: the batch_tokens it was computed at. Rows move with the
# batches within float32 rounding (``precision.BATCH_TOLERANCE``), so a table resumed at
# another batch size names every size its rows come from (``batch_sizes``).
BATCH_TOKENS = b"rlprobe_nb.batch_tokens"


def with_batch_tokens(table: pa.Table, batch_tokens: int) -> pa.Table:
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          BATCH_TOKENS: str(int(batch_tokens)).encode()})


def batch_sizes(parts: dict[str, Path]) -> dict:
    """The manifest's record of the batch sizes a token table's ``parts`` were computed
    at, however many runs wrote them: every size (largest first) and its parts."""
    import pyarrow.parquet as pq

    used = Counter(int(pq.read_schema(path).metadata[BATCH_TOKENS]) for path in parts.values())
    sizes = sorted(used, reverse=True)
    return {"batch_tokens": sizes, "shards_by_batch_tokens": {str(n): used[n] for n in sizes}}


def covered_rollouts(parts: dict) -> dict[str, set[str]]:
    """shard key -> the rollout ids its part holds (read from the parts' own rows)."""
    import pyarrow.parquet as pq

    from rlprobe_nb.tables.storage import DamagedTableError
    out = {}
    for key, path in parts.items():
        try:
            table = pq.read_table(path, columns=["rollout_id"])
        except (OSError, pa.ArrowException) as err:
            raise DamagedTableError(f"{path} cannot be read as parquet ({err}): delete it "
                                    "and rerun") from err
        out[key] = set(table.column(0).unique().to_pylist())
    return out


def table_key(seqs: SequenceSet, checkpoint: str, reference: str, topk: int,
              inputs: dict | None = None) -> dict:
    """The token table's key: the caller's key (``lineage.tokens_key``: model identities,
    parameters, the rollouts table, the code) with the forced sequences (ids, labels,
    tokenizer) and their number of rows, the pair and top-k added to its settings."""
    base = dict(inputs) if inputs else {"table": "tokens"}
    # "rows": how many rows the table holds (one per forced response token); in the key,
    # so a part removed with the manifest's totals and checksum redone is still refused
    # (``storage.verify``) unless every part is rewritten under another key
    settings = {**base.get("settings", {}), "checkpoint": checkpoint, "reference": reference,
                "sequences": seqs.fingerprint(), "rows": int(seqs.n_rows()), "topk": int(topk)}
    return {**base, "settings": settings}



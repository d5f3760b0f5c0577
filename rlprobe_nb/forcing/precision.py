"""How exact the per-token table is, measured on a real model: three comparisons.

1. *The metric math* against float64 math from the same hidden states (the engine's own
   final hidden states, the LM heads applied in float64): what the engine adds.
2. *The whole row* against a float64 forward of the same models: what the model body's
   own float32 arithmetic adds on top (a property of running the model in float32).
3. *Batch and chunk invariance*: the same table computed with other batch and chunk
   sizes: a float32 matmul's result for one row depends on how many rows share the
   call, so rows move by the body's rounding, while ranks and top-k ids hold.

``measure`` returns one row per metric and comparison with the largest relative error
(absolute below a floor, see ``FLOORS``); ``benchmarks/precision_demo.py`` prints it for
the demo suite and the tests hold the engine to it.

What a batch size may change (``batch_effect``): the model body's kernels round some
positions of a sequence differently when its batch pads it or not (measured on the CPU:
those past its last full block of 16 positions), so rows move by float32 rounding of the
hidden states, and a value of the table moves by at most ``BATCH_TOLERANCE`` ×
max(1, |value|) nats: absolute below 1 nat, relative above (a k2 of 37 nats moves more
than a KL of 0.1). How many rows move depends on the padding: 1.8% of 2,839 demo tokens,
59% of the demo's whole forced set of 3,862 (``benchmarks/batch_effect_demo.py``), where
the largest change was 1.3e-4 nats on KL(ckpt‖ref); the tolerance is about twice that.
A change in the fourth decimal of a KL is why batch and chunk sizes are in no table's key
(a table names every size its rows were computed at in its manifest).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rlprobe_nb import forcing
from rlprobe_nb.forcing import metrics
from rlprobe_nb.tables import storage

METRICS = metrics.FLOAT_METRICS + metrics.INT_METRICS
# Values below these are compared in absolute terms: a KL of 1e-9 has no meaningful 6th
# significant digit when its inputs are float32 (log r ~ k1 is a difference of two logits).
FLOORS = {**{m: 0.03 for m in metrics.FLOAT_METRICS}, "k1": 0.3, "k2": 0.3, "k3": 0.3}
KW = dict(suite="precision", topk=5, device="cpu", compile=False, progress=False)
BATCH_TOLERANCE = 2.5e-4  # measured: 1.3e-4 on KL(ckpt||ref), the demo's whole forced set


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["rollout_id", "pos"]).reset_index(drop=True)


def _errors(got: pd.DataFrame, want: dict, label: str) -> list[dict]:
    rows = []
    for name in METRICS:
        w = torch.as_tensor(want[name]).double()
        err = metrics.relative_error(torch.tensor(got[name].to_numpy()), w,
                                        FLOORS.get(name, 1e-12))
        rows.append({"comparison": label, "metric": name, "max_error": float(err.max())})
    return rows


def _f64_rows(models_: list, seqs: forcing.SequenceSet) -> list[torch.Tensor]:
    """float64 log-probs of every response-predicting position of each model, one
    sequence at a time, no padding."""
    out = []
    for model in models_:
        m64 = copy.deepcopy(model).double().eval()
        rows = []
        with torch.no_grad():
            for s in seqs.sequences:
                logits = m64(torch.tensor([s.input_ids])).logits[0].double()
                rows.append(torch.log_softmax(logits, -1)[s.prompt_len - 1: len(s.input_ids) - 1])
        out.append(torch.cat(rows))
    return out


def _tables(seqs: forcing.SequenceSet, ckpt, ref, sizes, folder: Path) -> list[pd.DataFrame]:
    """The table of ``ckpt`` vs ``ref`` at each (batch_tokens, chunk_positions) of
    ``sizes``, rows in (rollout_id, pos) order; hidden states cached under ``folder``."""
    tables = []
    for k, (batch, chunk) in enumerate(sizes):
        out = forcing.run_pair(seqs, forcing.Side("ckpt", ckpt, cache_dir=folder / f"hc{k}"),
                               forcing.Side("ref", ref, cache_dir=folder / f"hr{k}"),
                               folder / f"t{k}", batch_tokens=batch, chunk_positions=chunk, **KW)
        tables.append(_sorted(storage.read_table(out)))
    return tables


@torch.no_grad()
def batch_effect(seqs: forcing.SequenceSet, ckpt, ref,
                 sizes=((4096, 256), (1024, 256))) -> pd.DataFrame:
    """Per metric and size after the first: the largest change from the table at the first
    (batch_tokens, chunk_positions), in nats (``max_change``) and scaled as
    ``BATCH_TOLERANCE`` holds it (``scaled``: change / max(1, |value|)), the share of rows
    that moved, and for ranks and top-k ids the share of rows that changed."""
    with tempfile.TemporaryDirectory() as tmp:
        base, *others = _tables(seqs, ckpt, ref, sizes, Path(tmp))
    rows = []
    for (batch, chunk), other in zip(sizes[1:], others):
        for name in metrics.FLOAT_METRICS:
            a, b = base[name].to_numpy(np.float64), other[name].to_numpy(np.float64)
            change = np.abs(a - b)
            rows.append({"batch_tokens": batch, "chunk_positions": chunk, "metric": name,
                         "max_change": change.max(), "rows_moved": (change > 0).mean(),
                         "scaled": (change / np.maximum(1.0, np.abs(a))).max()})
        for name in ("rank_ckpt", "rank_ref", "topk_ids_ckpt", "topk_ids_ref"):
            moved = [not np.array_equal(x, y) for x, y in zip(base[name], other[name])]
            rows.append({"batch_tokens": batch, "chunk_positions": chunk, "metric": name,
                         "rows_moved": float(np.mean(moved))})
    return pd.DataFrame(rows)


@torch.no_grad()
def measure(seqs: forcing.SequenceSet, ckpt, ref, sizes=((4096, 256), (97, 7))) -> pd.DataFrame:
    """The three comparisons for checkpoint ``ckpt`` vs reference ``ref`` (float32 models)
    over ``seqs``; ``sizes`` are (batch_tokens, chunk_positions) settings, the first one the
    base of the invariance comparison."""
    targets = torch.tensor([t for s in seqs.sequences for t in s.response_ids])
    with tempfile.TemporaryDirectory() as tmp:
        tables = _tables(seqs, ckpt, ref, sizes, Path(tmp))
        order = {s.rollout_id: i for i, s in enumerate(seqs.sequences)}
        base = tables[0]
        in_seq = (base.assign(_o=base.rollout_id.map(order)).sort_values(["_o", "pos"])
                  .drop(columns="_o").reset_index(drop=True))
        hidden = [forcing.HiddenCache(Path(tmp) / n).rows(seqs.sequences).double()
                  for n in ("hc0", "hr0")]
    heads = [m.get_output_embeddings().weight.double() for m in (ckpt, ref)]
    same_states = [torch.log_softmax(h @ w.t(), -1) for h, w in zip(hidden, heads)]
    rows = _errors(in_seq, metrics.reference_metrics_f64(*same_states, targets), "math")
    forward = _f64_rows([ckpt, ref], seqs)
    rows += _errors(in_seq, metrics.reference_metrics_f64(*forward, targets), "row")
    for (batch, chunk), other in zip(sizes[1:], tables[1:]):
        rows += _errors(other, {m: torch.tensor(base[m].to_numpy()) for m in METRICS},
                        f"batch {batch}, chunk {chunk}")
        for name in ("topk_ids_ckpt", "topk_ids_ref"):
            same = all((a == b).all() for a, b in zip(base[name], other[name]))
            rows.append({"comparison": f"batch {batch}, chunk {chunk}", "metric": name,
                         "max_error": 0.0 if same else 1.0})
    return pd.DataFrame(rows)

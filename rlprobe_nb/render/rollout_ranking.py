"""Rollouts ranked by how far a checkpoint departs from the reference in them, for the
viewer's list: the largest |value| of a metric over a response's tokens at one checkpoint
(the first response token left out: its prediction depends on the prompt alone)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb.render.metrics import metric, metric_values


def rank_rollouts(tokens: pd.DataFrame, metric_name: str, checkpoint: str) -> pd.DataFrame:
    """One row per rollout at ``checkpoint``: ``rollout_id``, ``problem_id``, ``score`` (the
    largest |metric| over its tokens, first token excluded), ``at`` (that token's position),
    largest score first (ties: rollout id)."""
    rows = tokens[tokens.checkpoint == checkpoint]
    if "first_token" in rows.columns:
        body = rows[~rows.first_token.astype(bool)]
        rows = body if len(body) else rows
    values = np.abs(metric_values(rows, metric_name))
    df = pd.DataFrame({"rollout_id": rows.rollout_id.to_numpy(), "problem_id": rows.problem_id.to_numpy(),
                       "pos": rows.pos.to_numpy(), "score": np.nan_to_num(values, nan=-1.0)})
    best = df.sort_values(["rollout_id", "score", "pos"], ascending=[True, False, True]).drop_duplicates("rollout_id")
    best = best.rename(columns={"pos": "at"}).sort_values(["score", "rollout_id"], ascending=[False, True])
    return best[["rollout_id", "problem_id", "score", "at"]].reset_index(drop=True)


def ranked_label(row, metric_name: str) -> str:
    """How a ranked rollout reads in the list: ``p12#0 · max |Δlogp| 3.21 at 40``."""
    return f"{row.rollout_id} · max |{metric(metric_name).short}| {row.score:.3g} at {int(row.at)}"

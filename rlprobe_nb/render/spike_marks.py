"""Which tokens of a response are spikes at a checkpoint, read from the spikes table.

The spikes table (chapter 05) has one row per (checkpoint, context, written token) that is
a spike at one step or more, at every step; ``significant`` marks the steps where it is
one, the other rows are its series. A context shared by several rollouts (the same prompt
and the same tokens before it) is one row naming the first rollout, so a token is matched
to its spike by (``context_id``, ``token_id``) when both tables carry ``context_id``, and
by (``rollout_id``, ``pos``) otherwise. A table without ``significant`` is read as spikes
only. The sign is read from ``sign`` (or ``sign_class``).
"""

from __future__ import annotations

import pandas as pd

FIELDS = {"category": ("category",), "sign": ("sign", "sign_class"), "q": ("q",),
          "onset": ("onset_step",), "persistence": ("persistence",)}


def field(record, name: str, default=None):
    """``name`` (a key of ``FIELDS``) from a spike row or record, whichever column it has."""
    for column in FIELDS[name]:
        if column in record and not (record[column] is None or
                                     (not isinstance(record[column], str) and pd.isna(record[column]))):
            return record[column]
    return default


def significant(spikes: pd.DataFrame | None) -> pd.DataFrame:
    """The rows that are spikes at their checkpoint."""
    if spikes is None:
        return pd.DataFrame(columns=["checkpoint", "rollout_id", "pos"])
    return spikes[spikes["significant"].astype(bool)] if "significant" in spikes.columns else spikes


def by_context(spikes: pd.DataFrame, rows: pd.DataFrame) -> bool:
    return "context_id" in spikes.columns and "context_id" in rows.columns


def spike_records(spikes: pd.DataFrame | None, checkpoint: str, rows: pd.DataFrame) -> dict[int, dict]:
    """pos -> {category, sign, q, onset, persistence} for the ``rows`` (one rollout at
    ``checkpoint``) that are spikes there."""
    sp = significant(spikes)
    sp = sp[sp.checkpoint == checkpoint]
    if sp.empty or rows.empty:
        return {}
    if by_context(sp, rows):
        keys = ["context_id", "token_id"]
        found = rows[["pos", *keys]].merge(sp.drop(columns=["pos"]), on=keys)
    else:
        found = sp[sp.rollout_id == rows.rollout_id.iloc[0]]
        found = found[found.pos.isin(rows.pos)]
    return {int(r["pos"]): {name: field(r, name) for name in FIELDS} for r in found.to_dict("records")}


def ever_spiked(spikes: pd.DataFrame | None, rows: pd.DataFrame) -> pd.Series:
    """For each of ``rows``: is it a spike at any step (any row of the spikes table)?"""
    if spikes is None or spikes.empty:
        return pd.Series(False, index=rows.index)
    if by_context(spikes, rows):
        keys = set(zip(spikes.context_id, spikes.token_id))
        return pd.Series([k in keys for k in zip(rows.context_id, rows.token_id)], index=rows.index)
    keys = set(zip(spikes.rollout_id, spikes.pos.astype(int)))
    return pd.Series([(r, int(p)) in keys for r, p in zip(rows.rollout_id, rows.pos)], index=rows.index)

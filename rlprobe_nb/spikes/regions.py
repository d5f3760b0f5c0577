"""Adjacent spikes merged into regions of text, for case studies.

A spike is a context; every rollout that passes through that context carries it. Per
checkpoint and rollout, spike positions no more than ``max_gap`` apart (1: adjacent
tokens) form one region, with its span in the response text (``char_start`` of its
first token to ``char_end`` of its last).
"""

from __future__ import annotations

import pandas as pd


def spike_positions(tokens: pd.DataFrame, tests: pd.DataFrame) -> pd.DataFrame:
    """Every token row (checkpoint, rollout, pos) whose context and written token are a
    spike, with the spike's sign and divergence."""
    spikes = tests.loc[tests.significant, ["checkpoint", "context_id", "token_id", "sign",
                                           "divergence", "statistic"]]
    cols = ["checkpoint", "problem_id", "rollout_id", "pos", "context_id", "token_id",
            "token", "char_start", "char_end"] + (["step"] if "step" in tokens else [])
    rows = tokens.loc[tokens.context_id.isin(spikes.context_id), cols]
    return rows.merge(spikes, on=["checkpoint", "context_id", "token_id"], how="inner")


def merge_regions(positions: pd.DataFrame, max_gap: int = 1) -> pd.DataFrame:
    """One row per region: checkpoint, rollout_id, region_id, pos_start, pos_end,
    char_start, char_end, n_spikes, signs (the distinct signs, '+'-joined),
    max_divergence (and step when the positions have it)."""
    if positions.empty:
        return pd.DataFrame(columns=["checkpoint", "rollout_id", "region_id", "pos_start",
                                     "pos_end", "char_start", "char_end", "n_spikes", "signs",
                                     "max_divergence"])
    p = positions.sort_values(["checkpoint", "rollout_id", "pos"], kind="stable")
    same_run = (p.checkpoint.eq(p.checkpoint.shift()) & p.rollout_id.eq(p.rollout_id.shift())
                & (p.pos - p.pos.shift() <= max_gap))
    p = p.assign(region=(~same_run).cumsum())
    g = p.groupby("region", sort=False)
    out = g.agg(checkpoint=("checkpoint", "first"), problem_id=("problem_id", "first"),
                rollout_id=("rollout_id", "first"), pos_start=("pos", "min"),
                pos_end=("pos", "max"), char_start=("char_start", "min"),
                char_end=("char_end", "max"), n_spikes=("pos", "size"),
                signs=("sign", lambda s: "+".join(sorted(set(s)))),
                max_divergence=("divergence", "max"))
    if "step" in p:
        out.insert(1, "step", g.step.first())
    out.insert(3, "region_id", out.rollout_id + "@" + out.pos_start.astype(str) + "-"
               + out.pos_end.astype(str))
    return out.reset_index(drop=True)


def region_of(positions: pd.DataFrame, regions: pd.DataFrame) -> pd.Series:
    """The region_id of each spike position (checkpoint, rollout_id, pos)."""
    r = regions[["checkpoint", "rollout_id", "pos_start", "pos_end", "region_id"]]
    m = positions[["checkpoint", "rollout_id", "pos"]].reset_index().merge(
        r, on=["checkpoint", "rollout_id"], how="left")
    m = m[(m.pos >= m.pos_start) & (m.pos <= m.pos_end)]
    return m.set_index("index").region_id.reindex(positions.index)


def region_text(tokens: pd.DataFrame, regions: pd.DataFrame) -> pd.Series:
    """The text of each region: its tokens joined (from one checkpoint's rows; the text
    is the same at every checkpoint)."""
    one = tokens.drop_duplicates(["rollout_id", "pos"]).set_index(["rollout_id", "pos"]).token
    texts = []
    for rid, a, b in zip(regions.rollout_id, regions.pos_start, regions.pos_end):
        texts.append("".join(one.loc[[(rid, k) for k in range(a, b + 1)]].astype(str)))
    return pd.Series(texts, index=regions.index, dtype=object)

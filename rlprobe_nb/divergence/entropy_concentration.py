"""Does the divergence sit where the reference was unsure? KL by the reference's entropy,
and the share of all KL carried by the highest-entropy positions (the "80/20" claim:
RL changes mostly the ~20% of tokens where the model hesitates) against two baselines.

``high_entropy_share`` compares the observed share with:

- a **permutation null**: the KL values of each problem shuffled among that problem's
  positions. It keeps every KL value (the magnitudes: a few large values can put any
  fifth of the positions far above 20%) and each problem's share of high-entropy
  positions (a problem with many uncertain positions and much KL keeps both), and breaks
  only the link between a position's entropy and its KL. So it answers "is KL
  concentrated at high-entropy positions more than its marginal distribution and the
  problems' mix would give by chance?". Its mean and spread are exact (sampling without
  replacement within each problem: E = sum_g m_g mean_g, Var = sum_g m_g (n_g - m_g) /
  (n_g - 1) var_g, over the total) and the band is mean +- 1.96 sd; the tests check it
  against explicit shuffles.
- a **mechanical share**: what the high-entropy positions would carry if the checkpoint
  nudged every logit at every position by the same small random amount. To second order
  KL(q‖p) = KL(p‖q) = Var_q(delta) / 2 for a logit change delta, and for independent
  changes of variance s^2, E Var_q(delta) = s^2 (1 - sum_v q_v^2): a peaked position
  cannot move, a flat one can. The share of sum_i (1 - sum_v q_iv^2) carried by the top
  positions is then the concentration that needs no targeting at all. The table stores
  only the reference's top-k probabilities, so sum_v q_v^2 is bounded: at least the
  top-k sum, at most that plus the tail mass times the k-th probability; the share is
  given as that range (``mechanical_low`` / ``mechanical_high``).

Re-applying one position's actual logit change to another position (a magnitude-matched
shuffle of the changes themselves) needs both models' full logits, not this table: see
``estimator_lab`` for the function the hidden-state caches could provide.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb.divergence import clustered
from rlprobe_nb.divergence.summary import KEYS, SHARE, analysed_rows, bounds_of


def entropy_deciles(tokens: pd.DataFrame) -> pd.Series:
    """The decile 0..9 of each row's reference entropy among the distinct positions
    (rollout_id, pos) of its group (ties broken by position order)."""
    positions = tokens.drop_duplicates(["rollout_id", "pos"]).sort_values(["rollout_id", "pos"])
    ranks = positions.groupby("group").entropy_ref.rank(method="first").to_numpy()
    sizes = positions.groupby("group").entropy_ref.transform("size").to_numpy()
    decile = np.minimum(((ranks - 1) * 10 // sizes).astype(int), 9)
    where = pd.MultiIndex.from_frame(positions[["rollout_id", "pos"]]).get_indexer(
        pd.MultiIndex.from_frame(tokens[["rollout_id", "pos"]]))
    return pd.Series(decile[where], index=tokens.index, name="entropy_decile")


def entropy_decile_table(tokens: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per group, step and decile of the reference's entropy: mean KL in both directions
    and mean entropy change (checkpoint − reference) with intervals, and the decile's
    entropy range."""
    rows = analysed_rows(tokens)
    rows = rows.assign(entropy_decile=entropy_deciles(rows),
                       entropy_change=rows.entropy_ckpt - rows.entropy_ref)
    keys = KEYS + ["entropy_decile"]
    metrics = ["kl_ref_ckpt", "kl_ckpt_ref", "entropy_change"]
    out = [clustered.ratio_table(rows, keys, metrics, seed=seed,
                                 bounds={m: bounds_of(m) for m in metrics})]
    ranges = rows.groupby(["group", "entropy_decile"]).entropy_ref.agg(
        entropy_from="min", entropy_to="max").reset_index()
    table = pd.concat(out, ignore_index=True).merge(ranges, on=["group", "entropy_decile"])
    return table.sort_values(["group", "metric", "entropy_decile", "step"], ignore_index=True)[
        ["group", "metric", "entropy_decile", "entropy_from", "entropy_to", "step",
         "checkpoint", "estimate", "low", "high", "se", "problems", "rows"]]


def high_entropy_positions(tokens: pd.DataFrame, top: float = 0.2) -> pd.Series:
    """Whether each row is among the ``top`` share of its group's distinct positions by
    reference entropy."""
    positions = tokens.drop_duplicates(["rollout_id", "pos"])
    ranks = positions.groupby("group").entropy_ref.rank(method="first", ascending=False)
    sizes = positions.groupby("group").entropy_ref.transform("size")
    high = pd.Series((ranks <= np.ceil(top * sizes)).to_numpy(),
                     index=pd.MultiIndex.from_frame(positions[["rollout_id", "pos"]]))
    keys = pd.MultiIndex.from_frame(tokens[["rollout_id", "pos"]])
    return pd.Series(high.reindex(keys).to_numpy(bool), index=tokens.index, name="high_entropy")


def collision_bounds(topk_p) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on sum_v q_v^2 from each row's top-k probabilities (sorted descending): the
    top-k sum, and that plus the tail mass times the k-th probability."""
    probs = _topk_matrix(topk_p)
    top = np.nansum(probs * probs, axis=1)
    tail = np.clip(1.0 - np.nansum(probs, axis=1), 0.0, 1.0)
    kth = np.nanmin(probs, axis=1)
    return top, np.minimum(top + tail * kth, 1.0)


def _topk_matrix(topk_p) -> np.ndarray:
    lists = list(topk_p)
    width = max((len(x) for x in lists), default=0)
    out = np.full((len(lists), max(width, 1)), np.nan)
    for i, x in enumerate(lists):
        out[i, :len(x)] = x
    return out


def permutation_null(values, high, problems, z: float = 1.96) -> tuple[float, float, float]:
    """Mean and band (mean +- z sd, clipped to [0, 1]) of the share of sum(values) that
    the ``high`` rows carry when ``values`` are shuffled among the rows of each problem."""
    frame = pd.DataFrame({"v": np.asarray(values, np.float64), "h": np.asarray(high, bool),
                          "g": np.asarray(problems)})
    per = frame.groupby("g").agg(n=("v", "size"), m=("h", "sum"), mean=("v", "mean"),
                                 var=("v", lambda v: v.var(ddof=0)))
    total = frame.v.sum()
    if total == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float((per.m * per["mean"]).sum() / total)
    finite = per.n > 1
    var = (per.m * (per.n - per.m) / (per.n - 1).where(finite, 1) * per["var"])[finite].sum()
    sd = float(np.sqrt(var) / total)
    return mean, max(0.0, mean - z * sd), min(1.0, mean + z * sd)


def high_entropy_share(tokens: pd.DataFrame, metrics=("kl_ref_ckpt", "kl_ckpt_ref"),
                       top: float = 0.2, seed: int = 0) -> pd.DataFrame:
    """Per group, metric and step: the share of the total metric carried by the ``top``
    highest-entropy positions, with its interval, the permutation null band and the
    mechanical share (see the module's docstring)."""
    rows = analysed_rows(tokens)
    rows = rows.assign(high_entropy=high_entropy_positions(rows, top))
    low_c, high_c = collision_bounds(rows.topk_p_ref)
    rows = rows.assign(_room_low=0.5 * (1 - high_c), _room_high=0.5 * (1 - low_c))
    out = []
    for m in metrics:
        table = clustered.ratio_table(rows.assign(_in_top=rows[m] * rows.high_entropy),
                                      KEYS, "_in_top", m, seed=seed, bounds=SHARE)
        nulls, mechanical = [], []
        for (group, step), part in rows.groupby(["group", "step"], sort=True):
            nulls.append((group, step) + permutation_null(part[m], part.high_entropy,
                                                          part.problem_id))
            mechanical.append((group, step) + _mechanical_share(part))
        table = table.merge(pd.DataFrame(nulls, columns=["group", "step", "null_mean",
                                                         "null_low", "null_high"]))
        table = table.merge(pd.DataFrame(mechanical, columns=["group", "step", "mechanical_low",
                                                              "mechanical_high"]))
        out.append(table.assign(metric=m, top=top))
    table = pd.concat(out, ignore_index=True)
    return table.sort_values(["group", "metric", "step"], ignore_index=True)[
        ["group", "metric", "top", "step", "checkpoint", "estimate", "low", "high",
         "null_mean", "null_low", "null_high", "mechanical_low", "mechanical_high",
         "problems", "rows"]]


def _mechanical_share(part: pd.DataFrame) -> tuple[float, float]:
    """The range of sum_high room / sum_all room when each position's room lies in
    [_room_low, _room_high]."""
    h = part.high_entropy.to_numpy(bool)
    lo, hi = part._room_low.to_numpy(), part._room_high.to_numpy()
    least = lo[h].sum() / max(lo[h].sum() + hi[~h].sum(), 1e-300)
    most = hi[h].sum() / max(hi[h].sum() + lo[~h].sum(), 1e-300)
    return float(least), float(most)

"""Plants in a real per-token table: what the detector finds where the answer is known.

A plant sets the checkpoint's probability of the written token x at a context to
q(x)·e^d (q: the reference's probability, d: the planted change in nats, so Δlogp = d
exactly) and rescales every other token by the same factor r = (1 - q e^d) / (1 - p(x)),
p being the checkpoint's own distribution there: the checkpoint's preferences among the
other tokens stay what they were. Every metric of the row that the row determines is
then recomputed exactly from its own columns (no logits are needed):

  logp_ckpt      log q(x) + d
  entropy_ckpt   -a' log a' + r (H(P) + a log a) - (1 - a') log r      (a = p(x), a' = q e^d)
  kl_ckpt_ref    a' (log a' - log q) + r (KL(P‖Q) - a (log a - log q)) + (1 - a') log r
  kl_ref_ckpt    q (log q - log a') + KL(Q‖P) - q (log q - log a) - (1 - q) log r
  k1, k2, k3     from log r = logp_ckpt - logp_ref = d
  dlogp          d
  topk_*_ckpt    the other tokens' probabilities times r, x's set to a', re-sorted
  rank_ckpt      1 + the tokens above a' (exact where the checkpoint's top-k holds every
                 token above it, otherwise the smallest rank the row allows)

Jensen–Shannon is the one metric the row does not determine (it needs each token's two
probabilities, not only their sums), so a planted row's ``js`` is NaN: test another
divergence on planted tables (the detector's default, Jeffreys, is determined). When x
leaves the checkpoint's top-k, the token that takes its place is not in the row; x stays
listed last with its new probability, a lower bound on the k-th probability.

``plant`` writes plants into a table; ``choose_contexts`` picks where (never a first
response token, never a context shared by several rollouts, whose rows would have to be
planted together, never two plants within a few tokens of each other); ``recall`` reads
what a detector run found. The notebook's plant check
and the tests use these same functions.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from rlprobe_nb.spikes.detector import detect
from rlprobe_nb.statistics import seed_from


def _log1mexp(a: np.ndarray) -> np.ndarray:
    """log(1 - exp(a)) for a < 0, accurate at both ends."""
    a = np.minimum(a, -1e-300)
    return np.where(a > -np.log(2.0), np.log(-np.expm1(a)), np.log1p(-np.exp(a)))


def _xlogx(log_x: np.ndarray) -> np.ndarray:
    return np.exp(log_x) * log_x


def planted_rows(rows: pd.DataFrame, d) -> pd.DataFrame:
    """``rows`` (token-table rows) with the checkpoint's probability of the written token
    set to q(x)·e^d and every other metric recomputed (see the module docstring)."""
    d = np.broadcast_to(np.asarray(d, dtype=np.float64), (len(rows),))
    lq = rows.logp_ref.to_numpy(np.float64)
    la = rows.logp_ckpt.to_numpy(np.float64)
    la_new = lq + d
    if np.any(la_new >= 0):
        raise ValueError("a plant would give the written token a probability of 1 or more: "
                         "q(x)·e^d must stay below 1")
    log_r = _log1mexp(la_new) - _log1mexp(la)  # the other tokens' common factor
    r = np.exp(log_r)
    a_new = np.exp(la_new)
    q_x = np.exp(lq)
    h_p = rows.entropy_ckpt.to_numpy(np.float64)
    kl_pq = rows.kl_ckpt_ref.to_numpy(np.float64)
    kl_qp = rows.kl_ref_ckpt.to_numpy(np.float64)
    out = rows.copy()
    out["logp_ckpt"] = la_new.astype(np.float32)
    out["entropy_ckpt"] = np.maximum(
        -_xlogx(la_new) + r * (h_p + _xlogx(la)) - (1 - a_new) * log_r, 0).astype(np.float32)
    out["kl_ckpt_ref"] = np.maximum(
        a_new * (la_new - lq) + r * (kl_pq - np.exp(la) * (la - lq)) + (1 - a_new) * log_r,
        0).astype(np.float32)
    out["kl_ref_ckpt"] = np.maximum(
        q_x * (lq - la_new) + kl_qp - q_x * (lq - la) - (1 - q_x) * log_r, 0).astype(np.float32)
    if "js" in out:
        out["js"] = np.float32(np.nan)  # not determined by the row
    out["k1"], out["k2"] = (-d).astype(np.float32), (0.5 * d * d).astype(np.float32)
    out["k3"] = (np.expm1(d) - d).astype(np.float32)
    out["dlogp"] = d.astype(np.float32)
    ids, probs, rank = _planted_topk(rows, a_new, r)
    out["topk_ids_ckpt"], out["topk_p_ckpt"], out["rank_ckpt"] = ids, probs, rank
    return out


def _planted_topk(rows: pd.DataFrame, a_new: np.ndarray, r: np.ndarray):
    """The checkpoint's top-k after a plant, and the written token's rank (exact where
    the list holds every token above the written one, else a lower bound)."""
    ids = np.stack(rows.topk_ids_ckpt.to_numpy())
    p = np.stack(rows.topk_p_ckpt.to_numpy()).astype(np.float64)
    token = rows.token_id.to_numpy()[:, None]
    k = ids.shape[1]
    is_x = ids == token
    # a token outside the list had at most the list's smallest probability
    unknown_at_most = r * p.min(1)
    p_new = np.where(is_x, a_new[:, None], p * r[:, None])
    enters = ~is_x.any(1) & (a_new > p_new[:, -1])
    last = np.arange(k) == k - 1
    ids = np.where(enters[:, None] & last, token, ids)
    p_new = np.where(enters[:, None] & last, a_new[:, None], p_new)
    order = np.argsort(-p_new, axis=1, kind="stable")
    ids = np.take_along_axis(ids, order, 1)
    p_new = np.take_along_axis(p_new, order, 1)
    above = ((p_new > a_new[:, None]) & (ids != token)).sum(1) + 1
    exact = a_new > unknown_at_most
    fell = a_new < np.exp(rows.logp_ckpt.to_numpy(np.float64))
    old_rank = rows.rank_ckpt.to_numpy()
    rank = np.where(exact, above, np.where(fell, np.maximum(above, old_rank), above))
    return list(ids.astype(np.int32)), list(p_new.astype(np.float32)), rank.astype(np.int32)


def eligible_rows(tokens: pd.DataFrame, d: float) -> pd.Series:
    """Rows where a plant is meaningful and alone: not a first response token, not EOS, a
    context written by one rollout only, and q(x)·e^d below 1."""
    ok = tokens.pos.to_numpy() > 0
    if "first_token" in tokens:
        ok &= ~tokens.first_token.to_numpy(bool)
    if "is_eos" in tokens:
        ok &= ~tokens.is_eos.to_numpy(bool)
    per_ckpt = tokens.groupby(["checkpoint", "context_id"]).rollout_id.transform("nunique")
    ok &= per_ckpt.to_numpy() == 1
    ok &= tokens.logp_ref.to_numpy(np.float64) + d < -1e-3
    return pd.Series(ok, index=tokens.index)


def choose_contexts(tokens: pd.DataFrame, n: int, d: float = -3.0, seed: int = 0,
                    taken: pd.DataFrame | None = None, spacing: int = 8,
                    strict: bool = True) -> pd.Index:
    """``n`` rows of one checkpoint's table to plant in, drawn at random among
    ``eligible_rows``, no two (nor any of the rows ``taken``: rollout_id, pos) of one
    rollout closer than ``spacing`` positions, so that no plant sits in another's
    immediate context. A table with room for fewer raises, or with ``strict=False``
    gives as many as it has room for."""
    if tokens.checkpoint.nunique() != 1:
        raise ValueError("choose plants in one checkpoint's table at a time")
    pool = tokens[eligible_rows(tokens, d).to_numpy()]
    rng = np.random.default_rng(seed_from("plants", seed, tokens.checkpoint.iloc[0], d))
    order = rng.permutation(len(pool))
    near: dict[str, list[int]] = {}
    if taken is not None:
        for rid, pos in zip(taken.rollout_id, taken.pos):
            near.setdefault(rid, []).append(int(pos))
    picked = []
    for i in order:
        rid, pos = pool.rollout_id.iat[i], int(pool.pos.iat[i])
        if any(abs(pos - other) < spacing for other in near.get(rid, [])):
            continue
        near.setdefault(rid, []).append(pos)
        picked.append(pool.index[i])
        if len(picked) == n:
            return pd.Index(picked)
    if not strict:
        return pd.Index(picked)
    raise ValueError(f"only {len(picked)} contexts {spacing} or more tokens apart can hold a "
                     f"plant of {d} nats; asked for {n}")


def plant(tokens: pd.DataFrame, where: pd.Index, d) -> pd.DataFrame:
    """``tokens`` with the rows ``where`` planted (``planted_rows``) and a boolean
    ``planted`` column."""
    out = tokens.copy()
    out.loc[where] = planted_rows(tokens.loc[where], d)
    out["planted"] = out.index.isin(where)
    return out


def plant_sizes(tokens: pd.DataFrame, sizes=(-1.0, -3.0), n: int = 10, seed: int = 0,
                strict: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One checkpoint's table with ``n`` plants of each size in ``sizes`` (nats, Δlogp),
    apart from each other (``choose_contexts``; ``strict=False``: fewer where a small
    table has no room). Returns (planted table, plants: row, context_id, problem_id, d,
    logp_ref)."""
    where, size = [], []
    for i, d in enumerate(sizes):
        picked = choose_contexts(tokens, n, d, seed_from(seed, i),
                                 taken=tokens.loc[where, ["rollout_id", "pos"]], strict=strict)
        where += list(picked)
        size += [d] * len(picked)
    index = pd.Index(where)
    planted = plant(tokens, index, np.asarray(size))
    plants = pd.DataFrame({"row": index, "context_id": tokens.loc[index, "context_id"].to_numpy(),
                           "problem_id": tokens.loc[index, "problem_id"].to_numpy(),
                           "d": size, "logp_ref": tokens.loc[index, "logp_ref"].to_numpy()})
    return planted, plants


def recall(tests: pd.DataFrame, plants: pd.DataFrame, sign: str | None = "rejects") -> pd.DataFrame:
    """Per plant size: plants, found (a spike at the plant's context, with ``sign`` when
    given), recall; and discoveries elsewhere (spike contexts that hold no plant)."""
    spikes = tests[tests.significant]
    hit = spikes if sign is None else spikes[spikes.sign == sign]
    found = plants.context_id.isin(hit.context_id)
    per = plants.assign(found=found).groupby("d", sort=True).agg(
        plants=("found", "size"), found=("found", "sum"))
    per["recall"] = per.found / per.plants
    per["other_discoveries"] = spikes.loc[~spikes.context_id.isin(plants.context_id),
                                          "context_id"].nunique()
    per["discoveries"] = spikes.context_id.nunique()
    return per.reset_index()


def plant_check(tokens: pd.DataFrame, nulls: Mapping[str, pd.DataFrame] | None = None,
                sizes=(-1.0, -3.0), n: int = 10, runs: int = 2, seed: int = 0,
                **detect_kw) -> pd.DataFrame:
    """The detector's power on a suite's own tables: per checkpoint, ``runs`` tables each
    with ``n`` rejections of each size in ``sizes`` planted (``plant_sizes``), tested as
    the checkpoint is (``detect`` with the same ``nulls`` and settings). One row per
    checkpoint and size: step, null, plants, found (spikes that reject the written token
    at the plant), recall, and the discoveries elsewhere per run (contexts that hold no
    plant: real spikes, or false ones)."""
    nulls = dict(nulls or {})
    out = []
    for ckpt, rows in tokens.groupby("checkpoint", sort=False):
        rows = rows.reset_index(drop=True)
        null = {ckpt: nulls[ckpt]} if ckpt in nulls else None
        for run in range(runs):
            planted, where = plant_sizes(rows, sizes, n, seed_from(seed, run), strict=False)
            tests = detect(planted, nulls=null, **detect_kw)
            found = recall(tests, where).assign(checkpoint=ckpt, run=run)
            out.append(found.assign(step=rows.step.iloc[0] if "step" in rows else None,
                                    null=tests.null.iloc[0]))
    per = pd.concat(out, ignore_index=True).groupby(["checkpoint", "d"], sort=False).agg(
        step=("step", "first"), null=("null", "first"), plants=("plants", "sum"),
        found=("found", "sum"), other_per_run=("other_discoveries", "mean")).reset_index()
    per["recall"] = per.found / per.plants
    return per.sort_values(["step", "d"], ascending=[True, False]).reset_index(drop=True)[
        ["checkpoint", "step", "null", "d", "plants", "found", "recall", "other_per_run"]]


def plant_ranks(tokens: pd.DataFrame, nulls: Mapping[str, pd.DataFrame] | None = None,
                sizes=(-3.0,), n: int = 10, seed: int = 0, **detect_kw) -> pd.DataFrame:
    """Per checkpoint and plant size: how the plants rank among the checkpoint's real
    contexts in one planted table — ``ranked_above``, the share of (plant, real context)
    pairs where the plant has the smaller p-value (1: every plant above every real
    context; 0.5: no better than chance), and the plants' median p-value beside BH's
    bar for the first discovery, q / m."""
    nulls = dict(nulls or {})
    q = detect_kw.get("q", 0.05)
    out = []
    for ckpt, rows in tokens.groupby("checkpoint", sort=False):
        rows = rows.reset_index(drop=True)
        planted, where = plant_sizes(rows, sizes, n, seed, strict=False)
        tests = detect(planted, nulls={ckpt: nulls[ckpt]} if ckpt in nulls else None,
                       **detect_kw).drop_duplicates("context_id")
        real = np.sort(tests.p[~tests.context_id.isin(where.context_id)].to_numpy())
        by_ctx = tests.set_index("context_id").p
        for d, part in where.groupby("d", sort=False):
            p = by_ctx.reindex(part.context_id).to_numpy()
            above = (len(real) - np.searchsorted(real, p, side="right")) / len(real)
            out.append({"checkpoint": ckpt, "step": rows.step.iloc[0] if "step" in rows else None,
                        "null": tests.null.iloc[0], "d": d, "plants": len(p),
                        "ranked_above": float(np.mean(above)),
                        "median_p": float(np.median(p)),
                        "bar (q / m)": q / int(tests.n_tests.iloc[0])})
    return pd.DataFrame(out)

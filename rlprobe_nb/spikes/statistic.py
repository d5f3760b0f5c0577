"""What is measured at a token: how far the checkpoint's distribution moved, which way it
moved relative to the written token, and where the probability went.

The *divergence* (default: Jeffreys, KL(ref‖ckpt) + KL(ckpt‖ref)) is the size of the
departure and the quantity the detector tests. It is a property of the predictive context
alone, so rollouts that share a context share it.

The *sign* says what the departure does to the token the reference wrote. Coarse-grain
both distributions to {written token, anything else}: by the data-processing inequality
the divergence of the two Bernoulli distributions is at most the full divergence, and
their ratio, the *written share*, is the part of the departure carried by the written
token (1 when only its probability changed and the other tokens kept their ratios, 0 when
mass moved only among tokens that were not written). A departure is

- ``rejects``: written share >= ``share`` and dlogp < 0 (the checkpoint takes
  probability away from what the reference wrote);
- ``endorses``: written share >= ``share`` and dlogp > 0;
- ``redistributes``: written share < ``share`` (mass moved among other tokens).

The *log-odds change* of the written token (``written_logodds_change``) is the second
quantity the detector tests: signed like dlogp, but unbounded in both directions and with
a null scale that hardly depends on how likely the token was.

``moved_to`` reads what the checkpoint moved probability to from the two top-k lists.
``reference_covariates`` and ``written_covariates`` are what the null conditions on.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LN2 = np.log(2.0)
SIGNS = ("rejects", "endorses", "redistributes")

DIVERGENCE_LABELS = {
    "jeffreys": "KL(ref‖ckpt) + KL(ckpt‖ref), nats",
    "kl_ref_ckpt": "KL(ref‖ckpt): how surprised the checkpoint is by what the reference would write, nats",
    "kl_ckpt_ref": "KL(ckpt‖ref): how surprised the reference is by what the checkpoint would write, nats",
    "js": "Jensen–Shannon, nats",
}


def divergence(tokens: pd.DataFrame, kind: str = "jeffreys") -> np.ndarray:
    """The tested divergence of every row, float64, in nats."""
    if kind == "jeffreys":
        return tokens.kl_ref_ckpt.to_numpy(np.float64) + tokens.kl_ckpt_ref.to_numpy(np.float64)
    if kind in ("kl_ref_ckpt", "kl_ckpt_ref", "js"):
        return tokens[kind].to_numpy(np.float64)
    raise ValueError(f"divergence must be one of {sorted(DIVERGENCE_LABELS)}, got {kind!r}")


def _log1mexp(a: np.ndarray) -> np.ndarray:
    """log(1 - exp(a)) for a <= 0, accurate at both ends."""
    a = np.minimum(a, 0.0)
    with np.errstate(divide="ignore"):
        return np.where(a > -LN2, np.log(-np.expm1(a)), np.log1p(-np.exp(a)))


def _bernoulli_kl(log_a, log1m_a, log_b, log1m_b) -> np.ndarray:
    a, one_minus_a = np.exp(log_a), np.exp(log1m_a)
    with np.errstate(invalid="ignore"):
        first = np.where(a > 0, a * (log_a - log_b), 0.0)
        second = np.where(one_minus_a > 0, one_minus_a * (log1m_a - log1m_b), 0.0)
    return first + second


def written_divergence(tokens: pd.DataFrame, kind: str = "jeffreys") -> np.ndarray:
    """The divergence between the two distributions coarse-grained to {written, other}."""
    lq = tokens.logp_ref.to_numpy(np.float64)
    lp = tokens.logp_ckpt.to_numpy(np.float64)
    l1q, l1p = _log1mexp(lq), _log1mexp(lp)
    if kind == "kl_ref_ckpt":
        return _bernoulli_kl(lq, l1q, lp, l1p)
    if kind == "kl_ckpt_ref":
        return _bernoulli_kl(lp, l1p, lq, l1q)
    if kind == "jeffreys":
        return _bernoulli_kl(lq, l1q, lp, l1p) + _bernoulli_kl(lp, l1p, lq, l1q)
    if kind == "js":
        lm = np.logaddexp(lq, lp) - LN2
        l1m = np.logaddexp(l1q, l1p) - LN2
        return 0.5 * (_bernoulli_kl(lq, l1q, lm, l1m) + _bernoulli_kl(lp, l1p, lm, l1m))
    raise ValueError(f"divergence must be one of {sorted(DIVERGENCE_LABELS)}, got {kind!r}")


def written_share(tokens: pd.DataFrame, kind: str = "jeffreys") -> np.ndarray:
    """Share of the divergence carried by the written token, in [0, 1] (0 where the
    divergence is 0). Rounding of the float32 table can push the raw ratio a few ulps
    past 1; it is clipped."""
    total = divergence(tokens, kind)
    part = written_divergence(tokens, kind)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total > 0, part / total, 0.0)
    return np.clip(share, 0.0, 1.0)


def sign_class(tokens: pd.DataFrame, share: float = 0.5, kind: str = "jeffreys") -> np.ndarray:
    """'rejects', 'endorses' or 'redistributes' for every row (see the module docstring)."""
    on_written = written_share(tokens, kind) >= share
    up = tokens.dlogp.to_numpy() > 0 if "dlogp" in tokens else (
        tokens.logp_ckpt.to_numpy() > tokens.logp_ref.to_numpy())
    return np.where(on_written, np.where(up, "endorses", "rejects"), "redistributes")


def moved_to(tokens: pd.DataFrame) -> pd.DataFrame:
    """Where the checkpoint put probability: among the checkpoint's top-k tokens, the one
    whose probability grew most over the reference's.

    A token outside the reference's top-k has a reference probability of at most the
    reference's k-th probability; that bound is used for its gain, so the gain is never
    overstated. Columns: moved_to_id, moved_to_p_ckpt, moved_to_p_ref (NaN when outside
    the reference's top-k), moved_to_gain (a lower bound on p_ckpt - p_ref).
    """
    if tokens.empty:
        return pd.DataFrame({"moved_to_id": pd.Series(dtype=np.int32),
                             "moved_to_p_ckpt": pd.Series(dtype=np.float32),
                             "moved_to_p_ref": pd.Series(dtype=np.float32),
                             "moved_to_gain": pd.Series(dtype=np.float32)}, index=tokens.index)
    ids_c = np.stack(tokens.topk_ids_ckpt.to_numpy())
    p_c = np.stack(tokens.topk_p_ckpt.to_numpy()).astype(np.float64)
    ids_r = np.stack(tokens.topk_ids_ref.to_numpy())
    p_r = np.stack(tokens.topk_p_ref.to_numpy()).astype(np.float64)
    match = ids_c[:, :, None] == ids_r[:, None, :]  # [n, k_ckpt, k_ref]
    known = match.any(-1)
    p_ref_known = (match * p_r[:, None, :]).sum(-1)
    p_ref_bound = np.where(known, p_ref_known, p_r[:, -1:])
    gain = p_c - p_ref_bound
    best = gain.argmax(1)
    rows = np.arange(len(tokens))
    return pd.DataFrame({
        "moved_to_id": ids_c[rows, best].astype(np.int32),
        "moved_to_p_ckpt": p_c[rows, best].astype(np.float32),
        "moved_to_p_ref": np.where(known[rows, best], p_ref_known[rows, best], np.nan).astype(np.float32),
        "moved_to_gain": gain[rows, best].astype(np.float32),
    }, index=tokens.index)


def reference_covariates(tokens: pd.DataFrame) -> pd.DataFrame:
    """What the reference alone says about a position's uncertainty (never the checkpoint:
    conditioning on the checkpoint would explain the effect away).

    log_entropy_ref = log(entropy_ref + 1e-6) (near-deterministic positions span orders
    of magnitude; below 1e-6 nats the float32 entropy is rounding); log_top_gap = log p1 -
    log p2 of the reference's top two (large when one token dominates); log_collision =
    log of the sum of the squared top-k probabilities (the chance two reference draws
    agree, which the top-k determines up to the tail).
    """
    p = np.stack(tokens.topk_p_ref.to_numpy()).astype(np.float64)
    tiny = np.finfo(np.float32).tiny  # a second probability can underflow in float32
    return pd.DataFrame({
        "log_entropy_ref": np.log(tokens.entropy_ref.to_numpy(np.float64).clip(0) + 1e-6),
        "log_top_gap": np.log(np.maximum(p[:, 0], tiny)) - np.log(np.maximum(p[:, 1], tiny)),
        "log_collision": np.log(np.maximum((p * p).sum(1), tiny)),
    }, index=tokens.index)


def written_logodds_change(tokens: pd.DataFrame) -> np.ndarray:
    """The change in log-odds of the written token x, logit p_ckpt(x) - logit p_ref(x).

    It has the sign of dlogp but is not bounded by it: an endorsement of a token the
    reference gave 0.4 can raise dlogp by at most 0.92 nats, its log-odds by any
    amount. And its null scale hardly depends on q(x): to first order, under small
    independent logit changes d, it is d_x minus the average of the other tokens' d
    weighted by their share of the mass not on x, whose variance is between 1 and 2
    times a logit's, where dlogp's shrinks to 0 as q(x) goes to 1. log(1 - p) is formed
    from log p without cancellation."""
    lq = tokens.logp_ref.to_numpy(np.float64)
    lp = tokens.logp_ckpt.to_numpy(np.float64)
    return (lp - _log1mexp(lp)) - (lq - _log1mexp(lq))


def written_covariates(tokens: pd.DataFrame) -> pd.DataFrame:
    """The reference's view of the written token: logp_ref (a token the reference was
    sure of sits in a different part of its distribution than one it hardly expected)."""
    return pd.DataFrame({"logp_ref": tokens.logp_ref.to_numpy(np.float64)}, index=tokens.index)

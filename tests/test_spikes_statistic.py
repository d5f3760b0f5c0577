"""What is measured at a token: divergence, written share, sign, where probability went;
and the simulator's planted changes are exactly the KL they claim (float64 reference)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from rlprobe_nb.forcing.metrics import token_metrics
from rlprobe_nb.spikes import simulate, statistic


def _table(logits_ref: np.ndarray, logits_ckpt: np.ndarray, token: np.ndarray) -> pd.DataFrame:
    m = token_metrics(torch.from_numpy(logits_ckpt.astype(np.float32)),
                      torch.from_numpy(logits_ref.astype(np.float32)),
                      torch.from_numpy(token), topk=5)
    df = pd.DataFrame({k: (list(v.numpy()) if v.dim() == 2 else v.numpy()) for k, v in m.items()})
    return df.assign(token_id=token, dlogp=df.logp_ckpt - df.logp_ref)


def _probs64(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(1, keepdims=True)


def _kl64(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0).sum(-1)


@pytest.fixture(scope="module")
def pair():
    rng = np.random.default_rng(0)
    ref = (rng.uniform(0.3, 8, (400, 1)) * rng.standard_normal((400, 96))).astype(np.float32)
    ckpt = ref + (0.7 * rng.standard_normal(ref.shape)).astype(np.float32)
    token = np.array([rng.choice(96, p=p) for p in _probs64(ref)], dtype=np.int64)
    return ref, ckpt, token


def test_written_divergence_matches_coarse_grained_float64(pair):
    ref, ckpt, token = pair
    df = _table(ref, ckpt, token)
    q, p = _probs64(ref), _probs64(ckpt)
    rows = np.arange(len(token))
    q2 = np.stack([q[rows, token], 1 - q[rows, token]], 1)
    p2 = np.stack([p[rows, token], 1 - p[rows, token]], 1)
    m2 = 0.5 * (p2 + q2)
    want = {"kl_ref_ckpt": _kl64(q2, p2), "kl_ckpt_ref": _kl64(p2, q2),
            "jeffreys": _kl64(q2, p2) + _kl64(p2, q2), "js": 0.5 * (_kl64(p2, m2) + _kl64(q2, m2))}
    for kind, value in want.items():
        got = statistic.written_divergence(df, kind)
        # inputs are the float32 log-probs of the table: ~1e-7 relative each
        np.testing.assert_allclose(got, value, rtol=2e-4, atol=1e-7, err_msg=kind)
        share = statistic.written_share(df, kind)
        assert ((share >= 0) & (share <= 1)).all()
        # data processing: the coarse-grained divergence never exceeds the full one
        assert (value <= statistic.divergence(df, kind) * (1 + 1e-4) + 1e-7).all(), kind


@pytest.mark.parametrize("kind", simulate.KINDS)
def test_sign_of_noise_free_plants(pair, kind):
    ref, _, token = pair
    q_x = _probs64(ref)[np.arange(len(token)), token]
    lo, hi = simulate.ELIGIBLE[kind]
    keep = (q_x >= lo) & (q_x <= hi)
    delta = simulate.plant_delta(ref[keep], token[keep], kind, 1.0)
    df = _table(ref[keep], ref[keep] + delta, token[keep])
    assert keep.sum() > 50
    assert (statistic.sign_class(df) == kind).all()
    share = statistic.written_share(df)
    if kind == "redistributes":
        assert share.max() < 1e-3  # the written token's probability did not move
    else:
        assert share.min() > 0.999  # the other tokens kept their ratios


@pytest.mark.parametrize("kind", simulate.KINDS)
@pytest.mark.parametrize("kl", [0.5, 1.0, 2.0, 4.0])
def test_planted_kl_is_what_it_says(pair, kind, kl):
    ref, _, token = pair
    q = _probs64(ref)
    q_x = q[np.arange(len(token)), token]
    lo, hi = simulate.ELIGIBLE[kind]
    keep = (q_x >= lo) & (q_x <= hi)
    delta = simulate.plant_delta(ref[keep], token[keep], kind, kl)
    got = _kl64(q[keep], _probs64(ref[keep].astype(np.float64) + delta))
    np.testing.assert_allclose(got, kl, rtol=1e-6)


def test_moved_to_reads_both_topk_lists():
    tokens = pd.DataFrame({
        "topk_ids_ckpt": [np.array([7, 3, 9]), np.array([1, 2, 3])],
        "topk_p_ckpt": [np.array([0.5, 0.3, 0.1]), np.array([0.4, 0.35, 0.22])],
        "topk_ids_ref": [np.array([3, 7, 4]), np.array([1, 2, 5])],
        "topk_p_ref": [np.array([0.6, 0.2, 0.1]), np.array([0.5, 0.3, 0.15])],
    })
    out = statistic.moved_to(tokens)
    # row 0: token 7 gained 0.3 (3 lost 0.3). Row 1: token 2 gained 0.05; token 3 is
    # outside the reference's top-k, so its reference probability is at most 0.15 and its
    # gain at least 0.07: it wins on the bound.
    assert out.moved_to_id.tolist() == [7, 3]
    assert out.moved_to_p_ckpt.tolist() == pytest.approx([0.5, 0.22])
    assert out.moved_to_p_ref.iloc[0] == pytest.approx(0.2) and np.isnan(out.moved_to_p_ref.iloc[1])
    assert out.moved_to_gain.tolist() == pytest.approx([0.3, 0.07])


def test_covariates_are_finite_where_probabilities_underflow():
    ref = np.zeros((2, 64), dtype=np.float32)
    ref[0, 0] = 200.0  # every other token underflows to 0 in float32
    df = _table(ref, ref, np.array([0, 5]))
    cov = pd.concat([statistic.reference_covariates(df), statistic.written_covariates(df)], axis=1)
    assert np.isfinite(cov.to_numpy()).all()

"""metrics.token_metrics against textbook float64 formulas on the same fp32 logits."""

import math

import pytest
import torch

from rlprobe_nb.forcing import metrics
from rlprobe_nb.forcing.metrics import (
    LN2,
    reference_metrics_f64,
    relative_error,
    token_metrics,
)

ALL_ROW = metrics.FLOAT_METRICS + metrics.INT_METRICS
# fp32 per-entry terms carry ~1e-7 relative error, so a divergence is exact to about
# 1e-7 * sum_v p|d| nats absolute: below ~0.03 nats "1e-5 relative" means 3e-7 absolute.
DIVERGENCE_FLOOR = {"kl_ckpt_ref": 0.03, "kl_ref_ckpt": 0.03, "js": 0.03}


def _pair(n=48, v=3000, scale=3.0, noise=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, v, generator=g) * scale
    b = a + torch.randn(n, v, generator=g) * noise
    t = torch.randint(0, v, (n,), generator=g)
    return a, b, t


def _ref(a, b, t):
    return reference_metrics_f64(torch.log_softmax(a.double(), -1),
                                 torch.log_softmax(b.double(), -1), t, a.double(), b.double())


@pytest.mark.parametrize("scale,noise", [(1.0, 0.3), (3.0, 0.5), (8.0, 2.0), (20.0, 1.0)])
def test_every_metric_matches_float64_within_1e5_relative(scale, noise):
    a, b, t = _pair(scale=scale, noise=noise)
    got, want = token_metrics(a, b, t, topk=5), _ref(a, b, t)
    for name in ALL_ROW:
        err = relative_error(got[name], want[name], DIVERGENCE_FLOOR.get(name, 1e-12)).max().item()
        assert err < 1e-5, (name, err)
    # the test is only meaningful if the divergences are not negligible
    assert want["kl_ckpt_ref"].median() > 1e-3


def test_topk_matches_full_sort_and_probabilities():
    a, b, t = _pair(n=16, v=5003)  # not a multiple of the prefilter block
    got = token_metrics(a, b, t, topk=7)
    for side, logits in (("ckpt", a), ("ref", b)):
        vals, ids = torch.topk(logits, 7, dim=-1)
        assert torch.equal(got[f"topk_ids_{side}"].long(), ids)
        want_p = torch.softmax(logits.double(), -1).gather(1, ids)
        assert relative_error(got[f"topk_p_{side}"], want_p, 1e-12).max() < 1e-5
    # the block prefilter finds maxima sitting in the short tail block
    x = torch.zeros(3, 5003)
    x[:, -1] = 5.0
    x[:, 0] = 4.0
    vals, ids = metrics.topk_logits(x, 2)
    assert ids[:, 0].eq(5002).all() and ids[:, 1].eq(0).all()


def test_rank_counts_strictly_larger_logits():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 2.0]])
    for tok, rank in [(1, 1), (2, 1), (4, 3), (0, 4), (3, 5)]:
        out = token_metrics(logits, logits, torch.tensor([tok]), topk=2)
        assert out["rank_ckpt"].item() == rank


def test_identical_distributions_give_exact_zeros():
    a, _, t = _pair()
    out = token_metrics(a, a.clone(), t, topk=3, clamp=False)
    for name in ("kl_ckpt_ref", "kl_ref_ckpt", "js", "k1", "k2", "k3"):
        assert torch.count_nonzero(out[name]) == 0, name
    assert torch.equal(out["entropy_ckpt"], out["entropy_ref"])


def test_swapping_the_pair_swaps_forward_and_reverse_kl_exactly():
    a, b, t = _pair()
    pq, qp = token_metrics(a, b, t), token_metrics(b, a, t)
    assert torch.equal(pq["kl_ckpt_ref"], qp["kl_ref_ckpt"])
    assert torch.equal(pq["kl_ref_ckpt"], qp["kl_ckpt_ref"])
    assert torch.equal(pq["js"], qp["js"])
    assert torch.equal(pq["k1"], -qp["k1"])


def test_ranges_hold_at_the_extremes():
    g = torch.Generator().manual_seed(3)
    v = 2000
    near = torch.randn(8, v, generator=g) * 4
    cases = {
        "nearly identical": (near, near + torch.randn(8, v, generator=g) * 1e-6),
        "very peaked": (torch.randn(8, v, generator=g) * 60, torch.randn(8, v, generator=g) * 60),
        "disjoint": (torch.cat([torch.full((8, v // 2), 50.0), torch.full((8, v // 2), -50.0)], 1),
                     torch.cat([torch.full((8, v // 2), -50.0), torch.full((8, v // 2), 50.0)], 1)),
    }
    t = torch.randint(0, v, (8,), generator=g)
    for name, (a, b) in cases.items():
        raw = token_metrics(a, b, t, topk=0, clamp=False)
        out = token_metrics(a, b, t, topk=0)
        for key in metrics.FLOAT_METRICS:
            if key != "k3":  # k3 = expm1(log r) - log r overflows to +inf for log r > 88.7
                assert torch.isfinite(out[key]).all(), (name, key)
        assert (out["kl_ckpt_ref"] >= 0).all() and (out["kl_ref_ckpt"] >= 0).all()
        assert (out["js"] >= 0).all() and (out["js"] <= LN2).all()
        assert (out["k2"] >= 0).all() and (out["k3"] >= 0).all()
        # the clamp only absorbs rounding, never a real violation
        assert (raw["kl_ckpt_ref"] > -1e-6).all() and (raw["js"] < LN2 + 1e-6).all(), name
        want = _ref(a, b, t)
        for key in ("kl_ckpt_ref", "kl_ref_ckpt", "js"):
            assert (out[key].double() - want[key]).abs().max() < 1e-5 * max(1.0, want[key].abs().max()), (name, key)
    # disjoint supports: JS = ln 2 (to fp32 rounding), KL huge but finite
    out = token_metrics(*cases["disjoint"], t, topk=0)
    assert torch.allclose(out["js"], torch.full_like(out["js"], LN2), atol=1e-6)
    assert (out["kl_ckpt_ref"] > 90).all()


def test_k_estimators_follow_their_definitions():
    a, b, t = _pair()
    out = token_metrics(a, b, t)
    log_r = out["logp_ckpt"].double() - out["logp_ref"].double()
    assert torch.allclose(out["k1"].double(), -log_r, atol=1e-5)
    assert torch.allclose(out["k2"].double(), 0.5 * log_r ** 2, rtol=1e-4, atol=1e-6)
    assert torch.allclose(out["k3"].double(), torch.expm1(log_r) - log_r, rtol=1e-4, atol=1e-6)
    # k1 averaged over tokens sampled from Q estimates KL(Q||P): check on one row
    g = torch.Generator().manual_seed(5)
    lq = torch.log_softmax(b[:1].double(), -1)
    samples = torch.multinomial(lq.exp().expand(4000, -1), 1, generator=g).squeeze(1)
    rows = token_metrics(a[:1].expand(4000, -1).contiguous(), b[:1].expand(4000, -1).contiguous(),
                         samples, topk=0)
    exact = rows["kl_ref_ckpt"][0].item()
    for k in ("k1", "k3"):
        est = rows[k].double().mean().item()
        se = rows[k].double().std().item() / math.sqrt(4000)
        assert abs(est - exact) < 5 * se + 1e-3, (k, est, exact)


def test_refuses_low_precision_logits():
    a, b, t = _pair(n=2, v=50)
    with pytest.raises(TypeError, match="float32"):
        token_metrics(a.bfloat16(), b.bfloat16(), t)
    with pytest.raises(ValueError):
        token_metrics(a, b[:, :40], t)

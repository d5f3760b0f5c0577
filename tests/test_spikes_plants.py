"""The plant routine (``spikes.plants``): a row planted from its own columns equals the row
computed from the planted distributions themselves, every metric the row determines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.spikes import plants
from tests.synthetic_tokens import pair_metrics

V, K = 40, 5


def _rows(lp: np.ndarray, lq: np.ndarray, token: np.ndarray) -> pd.DataFrame:
    m = pair_metrics(lp, lq, token, K)
    return pd.DataFrame({**m, "token_id": token, "dlogp": m["logp_ckpt"] - m["logp_ref"]})


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def distributions():
    rng = np.random.default_rng(5)
    n = 400
    lq = _log_softmax(rng.standard_normal((n, V)) * rng.uniform(0.3, 6, (n, 1)))
    lp = _log_softmax(lq + rng.standard_normal((n, V)) * 0.7)
    # the written token: the reference's favourite half the time, else any token
    token = np.where(rng.random(n) < 0.5, lq.argmax(1), rng.integers(0, V, n))
    return lp, lq, token


@pytest.mark.parametrize("d", [-3.0, -1.0, 0.5])
def test_a_planted_row_is_the_row_of_the_planted_distributions(distributions, d):
    lp, lq, token = distributions
    rows = np.arange(len(token))
    keep = lq[rows, token] + d < -1e-3
    lp, lq, token, rows = lp[keep], lq[keep], token[keep], rows[: keep.sum()]
    # the planted distribution itself: x at q(x) e^d, the others rescaled together
    la_new = lq[rows, token] + d
    scale = np.log1p(-np.exp(la_new)) - np.log1p(-np.exp(lp[rows, token]))
    lp_new = lp + scale[:, None]
    lp_new[rows, token] = la_new
    truth = _rows(lp_new, lq, token)
    got = plants.planted_rows(_rows(lp, lq, token), d)
    for col in ("logp_ckpt", "entropy_ckpt", "kl_ckpt_ref", "kl_ref_ckpt", "k1", "k2", "k3",
                "dlogp"):
        np.testing.assert_allclose(got[col].to_numpy(np.float64), truth[col], rtol=2e-5,
                                   atol=2e-6, err_msg=col)
    assert got.js.isna().all()  # the row does not determine it
    # ranks: exact where claimed, a lower bound elsewhere
    assert (got.rank_ckpt.to_numpy() <= truth["rank_ckpt"]).all()
    inside = got.rank_ckpt.to_numpy() < K  # listed with a listed token below it: exact
    assert inside.sum() > 20
    np.testing.assert_array_equal(got.rank_ckpt.to_numpy()[inside], truth["rank_ckpt"][inside])
    # the top-k: probabilities of the planted distribution, in order
    p_true = np.exp(lp_new)
    for ids, p in zip(got.topk_ids_ckpt, got.topk_p_ckpt):
        assert np.all(np.diff(p) <= 1e-7)
    ids = np.stack(got.topk_ids_ckpt.to_numpy())
    np.testing.assert_allclose(np.stack(got.topk_p_ckpt.to_numpy()),
                               np.take_along_axis(p_true, ids, 1), rtol=2e-5, atol=1e-7)


def test_plants_are_placed_apart_and_found_by_recall():
    rng = np.random.default_rng(2)
    n_rollouts, length = 12, 30
    lq = _log_softmax(rng.standard_normal((n_rollouts * length, V)) * 3)
    lp = _log_softmax(lq + 0.3 * rng.standard_normal(lq.shape))
    token = lq.argmax(1)
    table = _rows(lp, lq, token).assign(
        checkpoint="c", problem_id=np.repeat([f"p{i // 3}" for i in range(n_rollouts)], length),
        rollout_id=np.repeat([f"r{i}" for i in range(n_rollouts)], length),
        pos=np.tile(np.arange(length), n_rollouts), context_id=np.arange(n_rollouts * length))
    # a context shared by two rollouts is never planted
    table.loc[table.pos == 5, "context_id"] = 10 ** 6 + table.loc[table.pos == 5, "problem_id"].str[1:].astype(int)
    planted, where = plants.plant_sizes(table, sizes=(-1.0, -3.0), n=10, seed=3)
    assert len(where) == 20 and where.row.is_unique
    spots = planted.loc[where.row, ["rollout_id", "pos"]].sort_values(["rollout_id", "pos"])
    gaps = spots.groupby("rollout_id").pos.diff().dropna()
    assert (gaps >= 8).all()
    assert (planted.loc[where.row, "pos"] > 0).all() and (planted.loc[where.row, "pos"] != 5).all()
    np.testing.assert_allclose(planted.loc[where.row, "dlogp"], where.d)
    untouched = ~planted.planted
    pd.testing.assert_frame_equal(planted[untouched].drop(columns="planted"), table[untouched])
    tests = pd.DataFrame({"context_id": planted.context_id, "sign": "rejects",
                          "significant": planted.planted & (planted.dlogp < -2)})
    out = plants.recall(tests, where).set_index("d")
    assert out.loc[-3.0, "recall"] == 1.0 and out.loc[-1.0, "recall"] == 0.0
    assert (out.other_discoveries == 0).all()

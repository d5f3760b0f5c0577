"""The null's tail (``spikes.tail``): p-values far beyond the null values' bulk, where BH
over thousands of contexts decides, checked on fresh draws from known distributions."""

from __future__ import annotations

import numpy as np
import pytest

from rlprobe_nb.spikes.tail import TailModel


def _far_share(model: TailModel, fresh: np.ndarray, level: float) -> float:
    return float(np.mean(model.sf(fresh) <= level))


def test_a_heavy_tail_keeps_its_far_p_values_right_where_an_exponential_one_does_not():
    """|Student t, 3 df|: a power-law tail (Pareto shape 1/3), like a placebo's early
    departures. Fitted on 2,800 values (a demo table's contexts), tested on 400,000 fresh
    ones: the Pareto tail's share of p <= 0.001 stays at or below 0.001; the exponential
    tail continued from the 80th-95th percentiles gives several times more."""
    rng = np.random.default_rng(5)
    fresh = np.abs(rng.standard_t(3, 400_000))
    pareto, exponential = [], []
    for seed in range(10):
        train = np.abs(np.random.default_rng(100 + seed).standard_t(3, 2_800))
        pareto.append(_far_share(TailModel.from_null(train), fresh, 1e-3))
        exponential.append(_far_share(TailModel.from_training(train), fresh, 1e-3))
    print(f"\nshare p <= 0.001 over 10 fits: Pareto tail {np.round(pareto, 5)}, exponential "
          f"{np.round(exponential, 5)}")
    assert np.mean(pareto) <= 1e-3 and max(pareto) <= 2e-3
    assert np.mean(exponential) >= 3e-3


def test_an_exponential_tail_is_not_made_much_heavier():
    """Where the null's tail is exponential, the Pareto fit's shape stays near 0 and its
    far p-values keep power: p <= 0.001 for at least a fifth of the draws that deserve it."""
    rng = np.random.default_rng(6)
    fresh = rng.exponential(1.0, 400_000)
    shares, shapes = [], []
    for seed in range(10):
        model = TailModel.from_null(np.random.default_rng(200 + seed).exponential(1.0, 2_800))
        shares.append(_far_share(model, fresh, 1e-3))
        shapes.append(model.shape)
    print(f"\nexponential null: shapes {np.round(shapes, 3)}, share p <= 0.001 {np.round(shares, 5)}")
    assert max(shapes) <= 0.2 and max(shares) <= 1.2e-3 and min(shares) >= 2e-4


@pytest.mark.parametrize("fit", [TailModel.from_null, TailModel.from_training])
def test_the_survival_function_is_monotone_and_bounded(fit):
    values = np.abs(np.random.default_rng(7).standard_t(3, 1_000))
    model = fit(values)
    grid = np.array([-np.inf, np.nan, 0.0, *np.linspace(0, 200, 400), np.inf])
    p = model.sf(grid)
    assert p[0] == p[1] == 1.0 and p[-1] == 0.0
    assert np.all(np.diff(p[2:]) <= 1e-15) and np.all((p >= 0) & (p <= 1))
    # continuous at the anchor: the tail starts where the empirical part ends
    a = model.anchor_value
    assert model.sf(np.array([a + 1e-9]))[0] == pytest.approx(1 - model.anchor, rel=1e-6)

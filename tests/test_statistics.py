from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rlprobe_nb.statistics import (
    clopper_pearson_ci,
    cluster_bootstrap_ci,
    mcnemar_exact,
    rate_table,
    seed_from,
    wilson_ci,
)


def wilson_closed_form(k, n, z=1.959963984540054):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 10), (3, 10), (7, 16), (50, 100), (999, 1000)])
def test_wilson_matches_the_closed_form(k, n):
    lo, hi = wilson_ci(k, n)
    want = wilson_closed_form(k, n)
    assert lo == pytest.approx(want[0], abs=1e-12) and hi == pytest.approx(want[1], abs=1e-12)


# Textbook values (Newcombe 1998, Stat. Med. 17:857, table I; Clopper & Pearson 1934):
# (k, n) -> Wilson, Clopper-Pearson 95% limits to 4 decimals.
TEXTBOOK = {(81, 263): ((0.2553, 0.3662), (0.2527, 0.3676)),
            (15, 148): ((0.0624, 0.1605), (0.0578, 0.1617)),
            (0, 20): ((0.0000, 0.1611), (0.0000, 0.1684)),
            (1, 29): ((0.0061, 0.1718), (0.0009, 0.1776))}


@pytest.mark.parametrize("k,n", sorted(TEXTBOOK))
def test_wilson_and_clopper_pearson_match_textbook_values(k, n):
    (wl, wh), (cl, ch) = TEXTBOOK[(k, n)]
    assert wilson_ci(k, n) == pytest.approx((wl, wh), abs=1e-4)
    assert clopper_pearson_ci(k, n) == pytest.approx((cl, ch), abs=1e-4)


@pytest.mark.parametrize("n", [5, 20, 80])
def test_clopper_pearson_never_undercovers(n):
    """Exact coverage, summed over the binomial distribution on a grid of true rates."""
    limits = [clopper_pearson_ci(k, n) for k in range(n + 1)]
    for p in np.linspace(0.001, 0.999, 199):
        pmf = stats.binom.pmf(np.arange(n + 1), n, p)
        cover = sum(w for w, (lo, hi) in zip(pmf, limits) if lo <= p <= hi)
        assert cover >= 0.95 - 1e-9, (n, p, cover)


def test_rate_table_never_calls_a_collapsed_bootstrap_an_interval():
    df = pd.DataFrame({"model": ["a"] * 80, "problem_id": np.repeat(np.arange(20), 4),
                       "correct": [False] * 80})
    row = rate_table(df, ["model"]).iloc[0]
    assert np.isnan(row.boot_low) and "collapses" in row.boot_note
    assert row.wilson_high == pytest.approx(0.0458, abs=1e-4)  # not [0, 0]
    assert row.cp_high == pytest.approx(1 - 0.025 ** (1 / 80), abs=1e-12)


def test_wilson_bad_input():
    assert wilson_ci(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson_ci(5, 3)


@pytest.mark.parametrize("b,c", [(0, 0), (0, 1), (1, 0), (3, 3), (2, 9), (10, 1), (25, 40)])
def test_mcnemar_matches_scipy_binomtest(b, c):
    expected = 1.0 if b + c == 0 else stats.binomtest(b, b + c, 0.5).pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)


def test_cluster_bootstrap_matches_loop_reference():
    rng = np.random.default_rng(1)
    clusters = np.repeat(np.arange(12), rng.integers(1, 6, size=12))
    values = (rng.random(len(clusters)) < 0.4).astype(float)
    mean, lo, hi = cluster_bootstrap_ci(values, clusters, n_boot=500, seed=7)
    # float64 reference: the same draws, concatenating each drawn cluster's samples
    draws = np.random.default_rng(7).integers(0, 12, size=(500, 12))
    by = [values[clusters == c] for c in range(12)]
    boot = np.array([np.concatenate([by[c] for c in row]).mean() for row in draws])
    assert mean == pytest.approx(values.mean(), abs=0)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])), abs=1e-12)
    assert cluster_bootstrap_ci(values, clusters, n_boot=500, seed=7) == (mean, lo, hi)


def test_cluster_bootstrap_is_wider_than_iid_when_clusters_are_homogeneous():
    # 10 problems x 8 samples, each problem all-right or all-wrong: the effective n is 10.
    clusters = np.repeat(np.arange(10), 8)
    values = np.repeat([1, 0, 1, 0, 0, 1, 0, 0, 1, 0], 8).astype(float)
    _, lo, hi = cluster_bootstrap_ci(values, clusters, n_boot=4000, seed=0)
    wlo, whi = wilson_ci(int(values.sum()), len(values))
    assert hi - lo > 1.5 * (whi - wlo)


def test_seed_from_is_stable():
    assert seed_from(1, "p#0", 3) == seed_from(1, "p#0", 3)
    assert seed_from(1, "p#0", 3) != seed_from(1, "p#0", 4)
    assert seed_from(0, "x") == 2521716577954912382  # fixed across processes and versions
    assert 0 <= seed_from("a") < 2**63


def test_rate_table_counts():
    df = pd.DataFrame({"model": ["a"] * 4 + ["b"] * 4, "problem_id": list("ppqq") * 2,
                       "correct": [1, 0, 1, 1, 0, 0, 0, 1]})
    t = rate_table(df, ["model"]).set_index("model")
    assert t.loc["a", "correct"] == 3 and t.loc["a", "n"] == 4 and t.loc["a", "rate"] == 0.75
    assert t.loc["b", "problems"] == 2
    assert t.loc["a", "wilson_low"] < 0.75 < t.loc["a", "wilson_high"]

"""Interval functions of chapter 08 against textbook values and plain recomputations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.counterfactuals import branching
from rlprobe_nb.counterfactuals.intervals import (
    cluster_bootstrap_difference,
    newcombe_ci,
)
from rlprobe_nb.statistics import cluster_bootstrap_ci, seed_from

# Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10 (hybrid score,
# no continuity correction): (k1, n1, k2, n2) -> 95% interval for p1 - p2, 4 decimals.
NEWCOMBE_TABLE_II = [
    ((56, 70, 48, 80), (0.0524, 0.3339)),
    ((9, 10, 3, 10), (0.1705, 0.8090)),
    ((6, 7, 2, 7), (0.0582, 0.8062)),
    ((5, 56, 0, 29), (-0.0381, 0.1926)),
    ((0, 10, 0, 20), (-0.1611, 0.2775)),
    ((0, 10, 0, 10), (-0.2775, 0.2775)),
    ((10, 10, 0, 20), (0.6791, 1.0000)),
    ((10, 10, 0, 10), (0.6075, 1.0000)),
]


@pytest.mark.parametrize("counts,expected", NEWCOMBE_TABLE_II)
def test_newcombe_matches_the_published_table(counts, expected):
    d, low, high = newcombe_ci(*counts)
    k1, n1, k2, n2 = counts
    assert d == pytest.approx(k1 / n1 - k2 / n2, abs=1e-12)
    assert (low, high) == pytest.approx(expected, abs=5e-5)


def test_newcombe_is_antisymmetric_and_inside_its_range():
    for k1, n1, k2, n2 in [(3, 8, 7, 8), (0, 5, 5, 5), (1, 1, 0, 1), (4, 9, 4, 9)]:
        d, lo, hi = newcombe_ci(k1, n1, k2, n2)
        d2, lo2, hi2 = newcombe_ci(k2, n2, k1, n1)
        assert (d2, lo2, hi2) == pytest.approx((-d, -hi, -lo))
        assert -1 <= lo <= d <= hi <= 1
    assert np.isnan(newcombe_ci(0, 0, 3, 4)[0])


def test_newcombe_coverage_at_branch_sizes():
    """Exact coverage at n = 8 per arm (a branch's size), by enumerating both binomials over
    a grid of true rates: close to 95% on average, as Newcombe reports for method 10, and
    never far below it (a discrete interval's coverage oscillates with the true rates)."""
    from scipy.stats import binom

    n = 8
    ci = {(a, b): newcombe_ci(a, n, b, n)[1:] for a in range(n + 1) for b in range(n + 1)}
    grid = np.linspace(0.05, 0.95, 19)
    coverage = np.array([sum(binom.pmf(a, n, p1) * binom.pmf(b, n, p2)
                             for (a, b), (lo, hi) in ci.items() if lo <= p1 - p2 <= hi)
                         for p1 in grid for p2 in grid])
    assert 0.94 <= coverage.mean() <= 0.96
    assert coverage.min() >= 0.85


def _plain_difference(va, ca, vb, cb, n_boot, alpha, seed):
    """The bootstrap of a difference of means, one draw at a time."""
    problems = list(pd.unique(np.concatenate([np.asarray(ca, object), np.asarray(cb, object)])))
    rng = np.random.default_rng(seed)
    boot = []
    while len(boot) < n_boot:
        draws = rng.integers(0, len(problems), size=(n_boot, len(problems)))
        for row in draws:
            picked = [problems[i] for i in row]
            a = [v for p in picked for v, c in zip(va, ca) if c == p]
            b = [v for p in picked for v, c in zip(vb, cb) if c == p]
            if a and b:
                boot.append(np.mean(a) - np.mean(b))
    boot = np.array(boot[:n_boot])
    return float(np.mean(va) - np.mean(vb)), *np.quantile(boot, [alpha / 2, 1 - alpha / 2])


def test_bootstrap_difference_equals_a_plain_recomputation():
    rng = np.random.default_rng(1)
    ca = rng.choice([f"p{i}" for i in range(7)], 25)
    cb = rng.choice([f"p{i}" for i in range(4, 12)], 18)
    va, vb = rng.normal(0.2, 0.3, 25), rng.normal(0.0, 0.3, 18)
    fast = cluster_bootstrap_difference(va, ca, vb, cb, n_boot=300, seed=5)
    plain = _plain_difference(va, ca, vb, cb, 300, 0.05, 5)
    assert fast == pytest.approx(plain, abs=1e-12)


def test_bootstrap_difference_is_empty_without_one_group():
    assert all(np.isnan(cluster_bootstrap_difference([], [], [1.0], ["a"])))


def _effects_frame(seed=2):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(60):
        kind = "point" if i % 2 == 0 else "control"
        rows.append({"model": "ck", "kind": kind, "arm": "top1", "rollout_id": f"r{i % 9}",
                     "pos": i, "problem_id": f"p{i % 7}",
                     "rule": ["operand", "spikes", "result_correct"][i % 3],
                     "passes_keep": 4, "n_keep": 16, "passes_arm": 8, "n_arm": 16,
                     "effect": float(rng.normal(0.3 if kind == "point" else 0.0, 0.2))})
    return pd.DataFrame(rows)


def _summary(eff, **kw):
    return branching.summary(eff[eff.kind == "point"], eff[eff.kind == "control"], **kw)


def test_summary_equals_a_plain_recomputation():
    eff = _effects_frame()
    got = _summary(eff, n_boot=400, seed=3)
    assert set(got["group"]) == {"operand", "spikes", "result_correct", "all"}
    for row in got.itertuples():
        part = eff if row.group == "all" else eff[eff.rule == row.group]
        points, controls = part[part.kind == "point"], part[part.kind == "control"]
        key = (3, "ck", "top1", row.group)
        if row.estimate == "point - control":
            want = _plain_difference(points.effect.to_numpy(), points.problem_id.to_numpy(),
                                     controls.effect.to_numpy(), controls.problem_id.to_numpy(),
                                     400, 0.05, seed_from(*key, "diff"))
            assert row.branches == len(part)
        else:
            sel = points if row.estimate == "point" else controls
            assert row.mean == pytest.approx(sel.effect.mean(), abs=1e-12)
            assert row.branches == len(sel) and row.problems == sel.problem_id.nunique()
            assert row.rate_keep == pytest.approx(0.25) and row.rate_arm == pytest.approx(0.5)
            want = cluster_bootstrap_ci(sel.effect.to_numpy(), sel.problem_id.to_numpy(), 400,
                                        0.05, seed_from(*key, row.estimate))
        assert (row.mean, row.low, row.high) == pytest.approx(want, abs=1e-12)


def test_summary_sees_a_planted_difference():
    got = _summary(_effects_frame(), n_boot=1000, seed=0).set_index(["group", "estimate"])
    diff = got.loc[("all", "point - control")]
    assert diff["low"] > 0 and diff["mean"] == pytest.approx(0.3, abs=0.1)


def test_summary_without_controls_has_the_points_only():
    eff = _effects_frame()
    got = branching.summary(eff[eff.kind == "point"], None, n_boot=100)
    assert set(got.estimate) == {"point"} and (got.arm == "top1").all()

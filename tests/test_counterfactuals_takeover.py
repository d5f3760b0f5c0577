"""Takeover curves: where a curve drops, on curves with a known answer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.counterfactuals import takeover


def curve(points):
    return pd.DataFrame(points, columns=["prefix_len", "passes", "n"])


def test_a_step_drops_where_it_steps():
    found = takeover.find_drop(curve([(0, 7, 8), (4, 8, 8), (8, 8, 8), (9, 0, 8), (12, 0, 8)]))
    assert found["drop"] and (found["drop_after"], found["drop_at"]) == (8, 9)
    assert found["level"] == pytest.approx(23 / 24) and found["rate_at"] == 0.0


def test_the_level_is_the_best_so_far_not_the_start():
    """A curve that starts low, rises as the model inherits good reasoning, then falls:
    the fall is measured from the top of the rise."""
    c = curve([(0, 1, 8), (4, 2, 8), (8, 8, 8), (12, 8, 8), (16, 1, 8), (20, 0, 8)])
    found = takeover.find_drop(c)
    assert (found["drop_after"], found["drop_at"]) == (12, 16)
    assert found["level"] == pytest.approx(18 / 24) and found["rate_at"] == pytest.approx(1 / 16)
    # from the start's level (1/8) the same fall would not be a drop
    assert not takeover.find_drop(curve([(0, 1, 8), (16, 1, 8), (20, 0, 8)]))["drop"]


def test_one_low_point_between_high_ones_is_not_a_drop():
    c = curve([(0, 8, 8), (4, 8, 8), (8, 2, 8), (12, 8, 8), (16, 8, 8)])
    assert not takeover.find_drop(c)["drop"]
    # ... but a low last point counts (nothing after it to recover)
    assert takeover.find_drop(curve([(0, 8, 8), (4, 8, 8), (8, 0, 8)]))["drop_at"] == 8


def test_small_or_uncertain_falls_are_not_drops():
    assert not takeover.find_drop(curve([(0, 8, 8), (4, 6, 8), (8, 6, 8)]))["drop"]  # n.s.
    big = curve([(0, 800, 1000), (4, 700, 1000), (8, 700, 1000)])  # significant, but 0.1
    assert not takeover.find_drop(big, min_drop=0.3)["drop"]
    assert takeover.find_drop(big, min_drop=0.05)["drop_at"] == 4


def test_flat_curves_rarely_show_a_drop():
    """False drops on curves with no drop (20 points, n = 8, true rates 0.3-0.9), by
    simulation: the scan over positions is corrected, so few flat curves show one."""
    rng = np.random.default_rng(0)
    for p in (0.3, 0.5, 0.7, 0.9):
        false = sum(takeover.find_drop(curve([(k, rng.binomial(8, p), 8) for k in range(0, 80, 4)])
                                       )["drop"] for _ in range(400))
        assert false / 400 <= 0.05, (p, false)


def test_sharp_falls_are_found_where_they_are():
    """A fall from 0.9 to 0.05 at a known point of a 20-point curve (n = 8) is found
    within one point in at least 95% of simulated curves."""
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(300):
        edge = int(rng.integers(2, 18))
        found = takeover.find_drop(curve([(k, rng.binomial(8, 0.9 if k < edge else 0.05), 8)
                                          for k in range(20)]))
        hits += found["drop"] and abs(found["drop_at"] - edge) <= 1
    assert hits / 300 >= 0.95


def test_locate_drop_bisects_to_the_token():
    """A synthetic model: pass rate 0.9 up to k = 27, 0.05 from k = 28 on (token 27 breaks
    it), sampled with n = 8 per point; the grid of 8 then bisection finds it exactly."""
    rng = np.random.default_rng(3)
    calls = []

    def evaluate(ks):
        calls.extend(ks)
        return curve([(k, rng.binomial(8, 0.9 if k <= 27 else 0.05), 8) for k in ks])

    found, points = takeover.locate_drop(evaluate, 60, step=8)
    assert found["drop"] and found["drop_at"] - 1 == 27 and found["drop_after"] == 27
    assert len(calls) == len(set(calls)) == len(points) <= 9 + 3  # grid + log2(8) probes
    assert points.prefix_len.is_monotonic_increasing


def test_grids_and_body_length():
    assert takeover.grid(10, 4) == [0, 4, 8, 10]
    assert takeover.grid(0, 4) == [0]
    assert takeover.even_grid(10, 3) == [0, 5, 10]
    assert takeover.body_length([5, 6, 2], {2}) == 2
    assert takeover.body_length([5, 6, 7], {2}) == 3
    with pytest.raises(ValueError):
        takeover.grid(5, 0)
    with pytest.raises(ValueError, match="one point per prefix length"):
        takeover.find_drop(curve([(0, 1, 2), (0, 1, 2)]))


def test_locate_drop_looks_closer_at_a_short_low_stretch():
    """Text that breaks the answer at token 9 and repairs it at token 17 (the right answer
    written again later): the grid of 8 crosses the low stretch once (k = 16), which alone
    is not a drop; sampling around it finds the stretch and the drop at token 9."""
    rng = np.random.default_rng(4)

    def evaluate(ks):
        return curve([(k, rng.binomial(8, 0.05 if 10 <= k <= 17 else 0.9), 8) for k in ks])

    found, points = takeover.locate_drop(evaluate, 21, step=8)
    assert found["drop"] and found["drop_at"] - 1 == 9
    assert takeover.find_drop(points[points.prefix_len.isin(takeover.grid(21, 8))])["drop"] is False


def test_locate_drop_leaves_a_noise_dip_alone():
    rng = np.random.default_rng(5)
    seen = []

    def evaluate(ks):
        seen.extend(ks)
        return curve([(k, 1 if k == 16 else rng.binomial(8, 0.95), 8) for k in ks])

    found, points = takeover.locate_drop(evaluate, 40, step=8)
    assert not found["drop"] and {12, 20} <= set(seen)  # it looked, and found it high


def test_curve_drops_name_the_branch_points_inside_the_drop():
    rows = [{"model": "ck", "rollout_id": "r", "kind": "grid", "arm": "prefix", "pos": k,
             "prefix_len": k, "n": 20, "passes": 19 if k < 40 else 1} for k in range(0, 80, 10)]
    rows += [{"model": "ck", "rollout_id": "r", "kind": "point", "arm": "keep", "pos": 33,
              "prefix_len": 34, "n": 20, "passes": 1},
             {"model": "ck", "rollout_id": "r", "kind": "control", "arm": "keep", "pos": 5,
              "prefix_len": 6, "n": 20, "passes": 19}]
    branches = pd.DataFrame(rows).assign(pass_rate=lambda d: d.passes / d.n, wilson_low=0.0,
                                         wilson_high=1.0)
    got = takeover.curve_drops(branches, ["r"]).iloc[0]
    assert got["drop"] and (got.drop_after, got.drop_at) == (30, 34)
    assert got.points_inside == "point @ 33" and got.start == pytest.approx(0.95)

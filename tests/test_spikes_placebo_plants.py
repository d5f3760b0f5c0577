"""Plants in a placebo's own table (``spikes.placebo_plants``) on simulated runs: a
placebo made by the detector's simulation (reference logits plus entropy-scaled noise),
its problems halved, plants in one half, the other half as its null."""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.spikes import placebo_plants, simulate
from rlprobe_nb.spikes.placebo_plants import COLUMNS


def _placebo(contexts, seed, plants=None):
    return simulate.simulate_tables(contexts, [0.5], plants=plants, seed=seed).assign(
        checkpoint="placebo_step_100")


def test_plants_in_a_placebo_are_what_is_found():
    contexts = simulate.make_contexts(n_problems=40, rollouts=3, length=(30, 70), vocab=128, seed=71)
    check = placebo_plants.placebo_plant_check(_placebo(contexts, 1), sizes=(-3.0, -6.0), n=10,
                                               splits=2)
    print("\n" + check.to_string())
    assert list(check.columns) == COLUMNS and len(check) == 2
    assert (check.plants == 20).all() and check.recall.min() >= 0.5
    assert check.other_share.max() <= 0.1 and check.unplanted_per_split.max() <= 1


def test_a_placebo_with_real_departures_is_caught():
    """The check can fail: a "placebo" whose table holds a few real rejections (at 0.2% of
    its contexts, so in both halves) gives discoveries outside the plants, with or without
    them."""
    contexts = simulate.make_contexts(n_problems=40, rollouts=3, length=(30, 70), vocab=128, seed=72)
    real = simulate.choose_plants(contexts, 0.002, kls=(4.0,), kinds=("rejects",), seed=73).assign(step=0)
    check = placebo_plants.placebo_plant_check(_placebo(contexts, 2, real), sizes=(-3.0,), n=10,
                                               splits=2)
    print("\n" + check.to_string())
    assert check.other_share.iloc[0] > 0.5 and check.unplanted_per_split.iloc[0] >= 5


def test_no_placebo_or_too_few_problems_gives_an_empty_table(capsys):
    assert placebo_plants.placebo_plant_check(pd.DataFrame()).empty
    contexts = simulate.make_contexts(n_problems=3, rollouts=2, length=(20, 30), vocab=64, seed=74)
    out = placebo_plants.placebo_plant_check(_placebo(contexts, 3))
    assert out.empty and list(out.columns) == COLUMNS
    assert "3 problems, too few" in capsys.readouterr().out

"""Onsets by label (``spikes.onsets``): the departure (Δlogp, or its excess over the
placebo's at the same token), its interval over problems, the onset rule, and the step at
which accuracy separates from the reference's."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.spikes import onsets


def _tokens(shift_from: int, effect: float, steps=(100, 200, 400), n_problems: int = 12,
            seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows of every step; label "moved" tokens get ``effect`` nats from ``shift_from`` on
    (plus noise with a problem effect), "still" tokens only noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_problems):
        bias = rng.normal(0, 0.05)
        for pos in range(30):
            label = "moved" if pos % 3 == 0 else "still"
            for step in steps:
                d = bias + rng.normal(0, 0.1) + (effect if label == "moved" and step >= shift_from else 0)
                rows.append({"step": step, "checkpoint": f"rlvr_step_{step}", "group": "target",
                             "problem_id": f"p{p}", "rollout_id": f"p{p}#0", "pos": pos,
                             "first_token": pos == 0, "dlogp": d, "label": label})
    t = pd.DataFrame(rows)
    labels = pd.DataFrame({"ground_truth": t.label, "token_category": "word"}, index=t.index)
    return t, labels


def test_the_onset_is_the_first_lasting_step():
    t, labels = _tokens(shift_from=200, effect=-1.0)
    table = onsets.departure_table(onsets.departures(t), labels)
    got = onsets.onsets(table).set_index(["scheme", "category"])
    moved = got.loc[("ground_truth", "moved")]
    assert moved.status == "onset" and moved.onset_step == 200 and moved.direction == "rejects"
    assert got.loc[("ground_truth", "still"), "status"] == "no lasting change"
    assert "[" in moved.mean_departure  # an interval, read from 12 problems


def test_a_change_that_comes_and_goes_has_no_onset():
    t, labels = _tokens(shift_from=200, effect=-1.0)
    t.loc[(t.step == 400) & (t.label == "moved"), "dlogp"] *= -1  # the sign turns at the end
    got = onsets.onsets(onsets.departure_table(onsets.departures(t), labels))
    moved = got[(got.scheme == "ground_truth") & (got.category == "moved")].iloc[0]
    assert moved.status == "onset" and moved.onset_step == 400 and moved.direction == "endorses"


def test_too_few_problems_get_no_interval_and_no_onset():
    t, labels = _tokens(shift_from=100, effect=-2.0, n_problems=4)
    got = onsets.onsets(onsets.departure_table(onsets.departures(t), labels))
    assert (got.status == "too few problems").all()
    assert got.onset_step.isna().all()
    assert got.mean_departure.str.contains("too few for an interval").all()


def test_the_placebo_is_subtracted_token_by_token():
    t, labels = _tokens(shift_from=100, effect=-1.0)
    placebo = t.assign(checkpoint=t.checkpoint.str.replace("rlvr", "placebo"),
                       dlogp=np.where(t.label == "moved", -1.0, 0.0) + 0.0 * t.dlogp)
    placebo = placebo[placebo.step != 400]  # a step without a placebo keeps the reference
    rows = onsets.departures(t, placebo)
    at = rows.set_index(["step", "rollout_id", "pos"])
    raw = t.set_index(["step", "rollout_id", "pos"]).dlogp
    moved = t.set_index(["step", "rollout_id", "pos"]).label == "moved"
    idx = at.index[at.index.get_level_values("step") == 200]
    np.testing.assert_allclose(at.departure[idx], raw[idx] - np.where(moved[idx], -1.0, 0.0))
    assert set(at.loc[idx, "against"]) == {"placebo_step_200"}
    assert set(rows[rows.step == 400].against) == {"reference"}
    assert "placebo" in onsets.against_text(rows)
    # the run's effect equals the placebo's: no lasting excess where the placebo exists
    got = onsets.onsets(onsets.departure_table(rows[rows.step < 400], labels))
    moved = got[(got.scheme == "ground_truth") & (got.category == "moved")].iloc[0]
    assert moved.status == "no lasting change"


def test_a_placebo_forced_over_other_rollouts_is_refused():
    t, _ = _tokens(shift_from=100, effect=-1.0)
    placebo = t[t.rollout_id != "p3#0"].assign(checkpoint="placebo")
    with pytest.raises(ValueError, match="no row in the placebo table"):
        onsets.departures(t, placebo)


def test_accuracy_separation():
    acc = pd.DataFrame({"model": ["dpo", "a", "b", "c"], "step": [0, 100, 200, 400],
                        "rate": [0.0, 0.02, 0.2, 0.3], "low": [0.0, 0.01, 0.15, 0.25],
                        "high": [0.013, 0.05, 0.25, 0.35]})
    assert onsets.accuracy_separation(acc, "dpo") == 200
    assert onsets.accuracy_separation(acc[acc.model != "b"].assign(
        low=[0.0, 0.01, 0.0]), "dpo") is None

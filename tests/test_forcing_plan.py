"""What notebook 03 forces and which caches it keeps."""

import pandas as pd
import pytest

from rlprobe_nb import forcing_plan, params


def rollouts():
    return pd.DataFrame({"problem_id": ["a"] * 5 + ["b"] * 5 + ["c"] * 2,
                         "sample": list(range(5)) * 2 + [0, 1],
                         "correct": [False, True] * 6})


def test_limit_spreads_over_problems_in_table_order():
    chosen = forcing_plan.select_rollouts(rollouts(), "all", 5)
    assert chosen[["problem_id", "sample"]].values.tolist() == [
        ["a", 0], ["a", 1], ["b", 0], ["b", 1], ["c", 0]]


def test_wrong_right_all():
    df = rollouts()
    assert not forcing_plan.select_rollouts(df, "wrong").correct.any()
    assert forcing_plan.select_rollouts(df, "right").correct.all()
    assert len(forcing_plan.select_rollouts(df, "all")) == len(df)
    with pytest.raises(ValueError, match="no right rollouts"):
        forcing_plan.select_rollouts(df.assign(correct=False), "right")
    with pytest.raises(ValueError, match="'wrong', 'right' or 'all'"):
        forcing_plan.select_rollouts(df, "incorrect")


def test_only_checkpoints_in_a_pair_keep_their_hidden_states():
    P = params.load("demo", "rlvr_step_800")
    assert P.forcing.pairs == [["rlvr_step_1200", "rlvr_step_400"]]
    assert forcing_plan.needs_cache(P, "rlvr_step_400") and forcing_plan.needs_cache(P, "rlvr_step_1200")
    assert not forcing_plan.needs_cache(P, "rlvr_step_800")
    assert forcing_plan.extra_pairs(P) == []
    assert forcing_plan.extra_pairs(params.load("demo", "rlvr_step_1200")) == [
        ("rlvr_step_1200", "rlvr_step_400")]
    tulu = params.load("tulu3", "rlvr_step_400")
    assert ("dpo", "sft") in forcing_plan.extra_pairs(tulu)

"""What notebook 03 forces (groups, failure types, a stratified cap) and which caches it
keeps (issue 15: groups, stratified max_rollouts)."""

import pandas as pd
import pytest

from rlprobe_nb.forcing import plan as forcing_plan
from rlprobe_nb.suite import params


def rollouts():
    """3 selected problems (a, b, c) and a control one (d); 5 temperatures cycled."""
    rows = []
    types = ["boxed_wrong", "truncated", "correct", "no_box", "empty_box"]
    for p, n in (("a", 10), ("b", 10), ("c", 5), ("d", 5)):
        for s in range(n):
            rows.append({"problem_id": p, "sample": s, "rollout_id": f"{p}#{s}",
                         "temperature": [0.6, 0.7, 0.8, 0.9, 1.0][s % 5],
                         "failure_type": types[(s + len(p)) % 5]})
    df = pd.DataFrame(rows)
    return df.assign(correct=df.failure_type == "correct")


SELECTION = pd.DataFrame({"problem_id": list("abcd"),
                          "group": ["selected", "selected", "selected", "control"]})


def test_groups_follow_the_selection_and_the_failure_types():
    g = forcing_plan.assign_groups(rollouts(), SELECTION, ["boxed_wrong", "empty_box", "no_box"])
    by = g.set_index("rollout_id")
    assert set(by.loc[by.group == "target", "failure_type"]) == {"boxed_wrong", "empty_box", "no_box"}
    assert set(by.loc[by.group == "ref_right", "failure_type"]) == {"correct"}
    assert set(by.loc[by.group == "control", "problem_id"]) == {"d"}
    assert by.loc[(by.problem_id != "d") & (by.failure_type == "truncated"), "group"].isna().all()
    # truncated ones join only when the parameters say so
    g2 = forcing_plan.assign_groups(rollouts(), SELECTION, ["truncated"])
    assert set(g2.loc[g2.group == "target", "failure_type"]) == {"truncated"}


def test_stratified_cap_keeps_every_temperature_and_problem():
    df = rollouts()
    df = df[df.problem_id != "d"]
    for seed in range(20):
        got = forcing_plan.stratified(df, 6, seed)
        assert len(got) == 6
        assert set(got.temperature) == {0.6, 0.7, 0.8, 0.9, 1.0}, seed
        assert set(got.problem_id) == {"a", "b", "c"}, seed
    assert forcing_plan.stratified(df, 6, 1).equals(forcing_plan.stratified(df, 6, 1))
    assert not forcing_plan.stratified(df, 6, 1).equals(forcing_plan.stratified(df, 6, 2))
    assert forcing_plan.stratified(df, None, 0).equals(df)


def test_choose_caps_each_group_and_refuses_an_empty_target():
    P = params.load("demo")
    P.forcing.max_rollouts, P.forcing.group_max_rollouts = 3, {}
    chosen = forcing_plan.choose(rollouts(), SELECTION, P)
    assert chosen.groupby("group").size().to_dict() == {"control": 3, "ref_right": 3, "target": 3,
                                                        "t1_unselected": 3}
    # a group's own cap wins over max_rollouts; the other groups keep theirs
    P.forcing.group_max_rollouts = {"ref_right": 1, "t1_unselected": 2}
    chosen = forcing_plan.choose(rollouts(), SELECTION, P)
    assert chosen.groupby("group").size().to_dict() == {"control": 3, "ref_right": 1, "target": 3,
                                                        "t1_unselected": 2}
    P.forcing.failure_types = ["imported"]
    with pytest.raises(ValueError, match="no target rollouts.*truncated"):
        forcing_plan.choose(rollouts(), SELECTION, P)


def test_t1_unselected_draws_temperature_1_rollouts_blind_to_their_outcome():
    P = params.load("demo")
    assert "t1_unselected" in P.forcing.groups
    P.forcing.max_rollouts, P.forcing.group_max_rollouts = 4, {}
    df = rollouts()
    t1_rows = df.temperature == 1.0  # every outcome among the T = 1 rollouts
    kinds = ["truncated", "correct", "no_box", "boxed_wrong"]
    df.loc[t1_rows, "failure_type"] = [kinds[i % 4] for i in range(int(t1_rows.sum()))]
    chosen = forcing_plan.choose(df, SELECTION, P)
    t1 = chosen[chosen.group == "t1_unselected"]
    assert len(t1) == 4 and (t1.temperature == 1.0).all()
    assert set(t1.problem_id) == set("abcd"), "one per problem before any problem gets two"
    assert not chosen.rollout_id.duplicated().any(), "a rollout is forced in one group only"
    # outcome-blind: other outcomes for the same rollouts give the same draw
    shuffled = df.assign(failure_type=df.failure_type.sample(frac=1, random_state=3).to_numpy())
    again = forcing_plan.choose(shuffled, SELECTION, P)
    assert set(again[again.group == "t1_unselected"].rollout_id) == set(t1.rollout_id)
    # with no cap, every T = 1 rollout, whatever its outcome (truncated and right ones too)
    P.forcing.max_rollouts = None
    every = forcing_plan.choose(df, SELECTION, P)
    every_t1 = every[every.group == "t1_unselected"]
    assert set(every_t1.rollout_id) == set(df[df.temperature == 1.0].rollout_id)
    assert {"truncated", "correct"} <= set(every_t1.failure_type)
    assert (every[every.group != "t1_unselected"].temperature != 1.0).all()


def test_t1_unselected_needs_rollouts_at_temperature_1():
    P = params.load("demo")
    cold = rollouts().assign(temperature=0.7)
    with pytest.raises(ValueError, match="t1_unselected.*temperature 1.0.*rollouts.temperatures"):
        forcing_plan.choose(cold, SELECTION, P)
    P.forcing.groups = ["target", "ref_right", "control"]
    assert "t1_unselected" not in set(forcing_plan.choose(cold, SELECTION, P).group)


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

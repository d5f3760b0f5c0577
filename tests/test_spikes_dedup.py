"""Acceptance 5: rollouts that share a prefix share its contexts, and a shared context is
one test, however many rollouts pass through it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.spikes import detect, multiplicity, simulate


@pytest.fixture(scope="module")
def five_per_problem():
    ctx = simulate.make_contexts(n_problems=24, rollouts=5, length=(20, 40), vocab=64,
                                 prefix=(3, 6), seed=71)
    plants = simulate.choose_plants(ctx, 0.02, kls=(2.0,), seed=71).assign(step=0)
    table = simulate.simulate_tables(ctx, [0.5], plants=plants, seed=71)
    return ctx, table


def test_five_rollouts_sharing_a_prefix_give_one_test_per_context(five_per_problem):
    ctx, table = five_per_problem
    tests = detect(table)
    distinct = table.context_id.nunique()
    assert len(table) > distinct  # the prefixes are really shared
    assert (tests.n_tests == distinct).all()
    assert tests.context_id.nunique() == distinct
    prefix = table[table.shared_context & (table.pos < 3)]
    in_prefix = tests[tests.context_id.isin(prefix.context_id)]
    # positions inside a shared prefix: one row, five rollouts, one test
    assert in_prefix.groupby("context_id").size().eq(1).all()
    assert (in_prefix.n_rollouts == 5).all()
    # at the branching position the context is shared but the written tokens differ:
    # one test, a row per written token (its sign is its own)
    branch = tests[tests.context_id.duplicated(keep=False)]
    assert len(branch) > 0
    assert branch.groupby("context_id").p.nunique().eq(1).all()


def test_copies_of_rollouts_change_no_p_value(five_per_problem):
    _, table = five_per_problem
    copies = table.assign(rollout_id=table.rollout_id + "-copy")
    doubled = pd.concat([table, copies], ignore_index=True)
    once = detect(table).set_index(["context_id", "token_id"]).sort_index()
    twice = detect(doubled).set_index(["context_id", "token_id"]).sort_index()
    np.testing.assert_array_equal(once.p.to_numpy(), twice.p.to_numpy())
    np.testing.assert_array_equal(once.q.to_numpy(), twice.q.to_numpy())
    assert (twice.n_rollouts == 2 * once.n_rollouts).all()


def test_distinct_contexts_counts_rollouts():
    tokens = pd.DataFrame({"checkpoint": "c", "context_id": [1, 1, 1, 2, 3, 3],
                           "rollout_id": ["a", "b", "c", "a", "b", "c"], "pos": [0, 0, 0, 1, 1, 1]})
    out = multiplicity.distinct_contexts(tokens)
    assert out.context_id.tolist() == [1, 2, 3] and out.n_rollouts.tolist() == [3, 1, 2]
    assert out.rollout_id.tolist() == ["a", "a", "b"]


def test_bh_qvalues_match_the_step_up_rule():
    rng = np.random.default_rng(3)
    p = np.concatenate([rng.random(200), rng.random(20) * 1e-4])
    q = multiplicity.bh_qvalues(p)
    for level in (0.01, 0.05, 0.2):
        order = np.sort(p)
        below = np.nonzero(order <= level * np.arange(1, len(p) + 1) / len(p))[0]
        k = below.max() + 1 if len(below) else 0
        assert (q <= level).sum() == k


def test_spike_rates_per_group_count_contexts_once(five_per_problem):
    from rlprobe_nb.spikes import spike_rates

    _, table = five_per_problem
    grouped = table.assign(group=np.where(table.problem_id < "p012", "target", "control"))
    tests = detect(grouped)
    rates = spike_rates(tests, by="group")
    assert rates.contexts.sum() == table.context_id.nunique()
    spikes = tests[tests.significant].drop_duplicates("context_id")
    assert rates.spikes.sum() == len(spikes)
    shown = rates.low.notna()  # an interval only where reporting allows one
    assert ((rates.low[shown] <= rates.rate[shown]) & (rates.rate[shown] <= rates.high[shown])).all()
    assert rates["spike rate"].str.len().gt(0).all()
    assert not rates["spike rate"].str.contains(r"\[0(?:\.0*)?, 0(?:\.0*)?\]").any()

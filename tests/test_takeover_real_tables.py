"""Chapter 09's acceptance on the demo suite's own ``takeover`` table, as the demo book wrote
it (``make demo``; ``RLPROBE_OUT`` where it wrote it): without it, or with a table no longer
current, every test here skips, saying so.

Read with the chapter's own functions (``curves.curve_table``, ``curves.headline``): the
sweep's size (criteria, budgets, checkpoints, problems), the two ends (the reference alone
is one text per problem whatever the checkpoint; the checkpoint alone took over every
position), the share of positions at which Δlogp recovers half and nine tenths of the
target's gain, with random and the placebo at that share, against the known answer of the
demo: RLVR changes few positions, and they carry its gain; the placebo's do not.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlprobe_nb.suite import params
from rlprobe_nb.tables import lineage, storage
from rlprobe_nb.takeover import criteria, curves

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def take():
    P = params.load("demo")
    try:
        table = lineage.read_derived(P, "takeover")
    except (FileNotFoundError, storage.StaleTableError) as err:
        pytest.skip(f"the demo's takeover table is missing or not current ({err}); run make demo")
    return P, table


def test_the_sweep_has_the_size_the_issue_asks_for(take):
    P, t = take
    rules = t[~t.criterion.isin(criteria.ENDS)]
    per = rules.groupby("criterion").budget.nunique()
    assert len(per) >= 4 and (per >= 4).all() and "random" in per.index, per
    assert (t[t.run == "rlvr"].checkpoint.nunique() >= 3 and (t.run == "placebo").any())
    assert t.problem_id.nunique() >= 100


def test_the_ends_are_each_model_alone_from_the_same_seeds(take):
    _, t = take
    never = t[t.criterion == "never"]
    assert never.groupby(["problem_id", "sample"]).response.nunique().max() == 1
    assert (never.taken.map(len) == 0).all()
    always = t[t.criterion == "always"]
    assert (always.taken.map(len) == always.n_tokens).all()
    # a takeover changes a token only where it was taken over
    assert all(set(c) <= set(k) for c, k in zip(t.changed, t.taken))


def test_few_delta_logp_positions_carry_the_gain_and_random_and_the_placebo_do_not(take):
    P, t = take
    placebo = next(c for c in t.checkpoint.unique() if P.run_of(c) == "placebo")
    head = curves.headline(t, P.target, placebo, n_boot=curves.N_BOOT, seed=P.takeover.seed)
    half = head[head.level == 0.5].iloc[0]
    assert np.isfinite(half.share) and half.share_high < 0.05  # a few percent of positions
    assert half.random_high < 0.5 and half.placebo_recovered_high < 0.5
    table = curves.curve_table(t, P.target, n_boot=200, seed=0)
    own = table[(table.checkpoint == P.target) & (table.criterion == "always")].iloc[0]
    assert own.own_gain_low > 0  # the target's gain over the reference is there to recover

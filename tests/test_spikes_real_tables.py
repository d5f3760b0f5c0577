"""Chapter 05 on the demo suite's own token tables, not on simulations that share the
detector's assumptions.

The tables are the ones the demo book wrote (``make demo``; ``RLPROBE_OUT`` where it wrote
them): without them, or with tables no longer current, every test here skips, saying so.

On the shipped demo suite, whether or not a placebo run is used:

* plants at every checkpoint tested with the **internal** null (what a suite without a
  placebo gets): the recall at 1 and 3 nats is measured and printed; the plants must
  rank above most real contexts (the ordering is right), and a 3-nat recall of 0.8 is an
  expected failure, with the reason: the checkpoints' own departures are heavy-tailed (at
  step 1200 a 3-nat rejection is an ordinary departure), so a null read from them cannot
  call it a spike;
* the **external** null's code path end to end on real tables, with a *stand-in*
  placebo: rlvr_step_100's table as the null of plants in rlvr_step_200's. A stand-in, not
  the acceptance: step 100 is no placebo (it carries the reward's information);
* calibration on real null-vs-null data: the problems of one table split into halves,
  each half the external null of the other.

With the suite's placebo checkpoints, the placebo checks: recall with the placebo null;
false discoveries in planted placebo tables and the placebo tested as if it were the RLVR
run, each against a placebo (half of the placebo's problems against the other half:
``spikes.placebo_plants``); placebo-vs-placebo calibration; and the known answer (first
wrong result digits rejected, their onset at the accuracy separation).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.spikes import detect, external, onsets, placebo_plants, plants
from rlprobe_nb.suite import params
from rlprobe_nb.tables import storage, suite_tables

pytestmark = pytest.mark.slow
NO_PLACEBO = "the shipped demo suite has no placebo checkpoints"


@pytest.fixture(scope="module")
def suite():
    P = params.load("demo")
    try:
        tokens = suite_tables.read_tokens(P)
    except (suite_tables.NothingForcedError, storage.StaleTableError) as err:
        pytest.skip(f"the demo suite's token tables are missing or not current ({err}); "
                    "run the demo book first: make demo")
    missing = sorted(set(P.checkpoints) - set(tokens.checkpoint))
    if missing:
        pytest.skip(f"the demo book has not forced {missing} yet: run make demo")
    tokens = tokens[tokens.reference == P.reference].reset_index(drop=True)
    placebo, nulls, used = external.suite_nulls(P, P.checkpoints)
    return {"P": P, "tokens": tokens, "placebo": placebo, "nulls": nulls, "used": used}


@pytest.fixture(scope="module")
def internal_check(suite):
    check = plants.plant_check(suite["tokens"], None, sizes=(-1.0, -3.0), n=10, runs=3)
    ranks = plants.plant_ranks(suite["tokens"], None, sizes=(-1.0, -3.0), n=10)
    print("\nplants in the demo tables, internal null (3 runs of 10 per size and checkpoint):\n"
          + check.to_string() + "\n" + ranks.to_string())
    return check, ranks


def test_plants_rank_above_the_real_contexts_with_the_internal_null(internal_check):
    check, ranks = internal_check
    assert set(check.checkpoint) == set(ranks.checkpoint) and len(check) == 2 * 5
    assert (check.plants == 30).all()
    # the ordering is right: a 3-nat rejection ranks above most real contexts. Not above
    # nearly all: the trained run's own departures at the last steps are larger than 3 nats
    # at 15-20% of contexts (first wrong digits at -10). (The two sizes are planted at
    # different contexts, so their ranks are not compared with each other.)
    three = ranks[ranks.d == -3.0]
    assert (three.ranked_above >= 0.75).all(), three


@pytest.mark.xfail(strict=True, reason=(
    "with the internal null the demo's 3-nat plants are found at 0-3% per checkpoint: each "
    "checkpoint's own departures are heavy-tailed (|z| beyond 7 at 0.1% of contexts; at "
    "step 1200 1% of written tokens move their log-odds by 4 or more), so the null read "
    "from them puts a 3-nat rejection at p ~ 0.005-0.05 while BH over 1,423 contexts asks "
    "for p < 3.5e-5; the placebo null is what the acceptance needs"))
def test_internal_null_recall_at_three_nats(internal_check):
    check, _ = internal_check
    assert (check[check.d == -3.0].recall >= 0.8).all()


def test_external_null_code_path_with_a_stand_in_placebo(suite):
    """Stand-in, not the acceptance: rlvr_step_100's table plays the placebo of
    rlvr_step_200 (step 100 carries the reward's information; it is no placebo)."""
    tokens = suite["tokens"]
    tested = tokens[tokens.checkpoint == "rlvr_step_200"].reset_index(drop=True)
    stand_in = tokens[tokens.checkpoint == "rlvr_step_100"]
    nulls = {"rlvr_step_200": stand_in}
    check = plants.plant_check(tested, nulls, sizes=(-1.0, -3.0), n=10, runs=3)
    ranks = plants.plant_ranks(tested, nulls, sizes=(-3.0,), n=10)
    print("\nstand-in external null (rlvr_step_100 as the null of rlvr_step_200):\n"
          + check.to_string() + "\n" + ranks.to_string())
    assert (check.null == "rlvr_step_100").all() and (ranks.null == "rlvr_step_100").all()
    assert ranks.ranked_above.iloc[0] >= 0.9
    tests = detect(tested, nulls=nulls)
    assert tests.context_id.nunique() == tests.n_tests.iloc[0] == tested.context_id.nunique()
    assert tests.p.between(0, 1, inclusive="right").all() and np.isfinite(tests.statistic).all()


@pytest.mark.parametrize("step", [100, 400, 1200])
def test_real_null_against_null_p_values_are_calibrated(suite, step):
    tokens = suite["tokens"]
    one = tokens[tokens.checkpoint == f"rlvr_step_{step}"]
    p = external.halves_pvalues(one, splits=10)
    print(f"\nstep {step}, halves of the problems as null and tested: {len(p)} p-values, "
          f"share <= 0.01 {np.mean(p <= 0.01):.4f}, <= 0.05 {np.mean(p <= 0.05):.4f}, "
          f"<= 0.001 {np.mean(p <= 0.001):.5f}")
    assert np.mean(p <= 0.01) <= 0.02
    assert np.mean(p <= 0.05) <= 0.07


# ------------------------------------------------------------------ with placebo tables

@pytest.fixture(scope="module")
def placebo_suite(suite):
    if not suite["P"].placebos:
        pytest.skip(NO_PLACEBO)
    if not suite["nulls"]:
        pytest.skip("the suite declares placebo checkpoints but none is forced yet: run make demo")
    return suite


def test_placebo_null_finds_three_nat_plants_at_every_checkpoint(placebo_suite):
    s = placebo_suite
    tested = s["tokens"][s["tokens"].checkpoint.isin(s["nulls"])]
    check = plants.plant_check(tested, s["nulls"], sizes=(-1.0, -3.0), n=10, runs=3)
    print("\nplants, placebo null:\n" + check.to_string())
    assert (check.null != "internal").all()
    assert (check[check.d == -3.0].recall >= 0.8).all()


@pytest.fixture(scope="module")
def placebo_plants_check(placebo_suite):
    check = placebo_plants.placebo_plant_check(placebo_suite["placebo"], sizes=(-1.0, -3.0),
                                               n=10, splits=3)
    print("\nplants in the placebo tables, half of its problems against the other half:\n"
          + check.to_string())
    return check


def test_plants_in_placebo_tables_bring_few_false_discoveries(placebo_plants_check):
    """A placebo holds no information about correctness: planted in its table and tested
    against a placebo's departures (the other half of its problems), discoveries outside
    the plants are at most 10% of all discoveries, at every step."""
    per = placebo_plants_check.drop_duplicates("checkpoint")
    assert len(per) == 5 and (placebo_plants_check.found > 0).all()
    assert (per.other_share <= 0.1).all(), per


def test_the_placebo_tested_as_the_rlvr_run_finds_a_tenth_of_its_discoveries(
        placebo_suite, placebo_plants_check):
    """The placebo tested as the RLVR run is (against a placebo: the other half of its
    problems, both halves, every context once), beside the RLVR run's discoveries against
    its placebo at the same step: at most a tenth of them, at every step."""
    s = placebo_suite
    real = detect(s["tokens"], nulls=s["nulls"])
    real_n = real[real.significant].groupby("step").context_id.nunique()
    per = placebo_plants_check.drop_duplicates("checkpoint").set_index("step")
    real_n = real_n.reindex(per.index, fill_value=0)
    print(f"\ndiscoveries by step, real run (placebo null): {real_n.to_dict()}; placebo as if "
          f"RLVR (half against half, per split): {per.unplanted_per_split.to_dict()}")
    assert (per.unplanted_per_split <= 0.1 * real_n).all()
    assert real_n.iloc[-1] > 0


def test_placebo_against_placebo_p_values_are_calibrated(placebo_suite):
    s = placebo_suite
    for name, one in s["placebo"].groupby("checkpoint"):
        p = external.halves_pvalues(one, splits=10)
        print(f"\n{name}, halves: share p <= 0.01 {np.mean(p <= 0.01):.4f}")
        assert np.mean(p <= 0.01) <= 0.02


def test_the_known_answer(placebo_suite):
    """At the last checkpoint, at least half the contexts whose written token is the first
    wrong character of a wrong result are spikes that reject it; the onset of that label
    is the step at which accuracy separates from the reference's, give or take one
    checkpoint; the format tokens' onset is reported beside it."""
    s = placebo_suite
    P, tokens = s["P"], s["tokens"]
    tests = detect(tokens, nulls=s["nulls"])
    labels = onsets.labels(tokens)
    last = tokens.step.max()
    wrong = tokens[(tokens.step == last) & (labels.ground_truth == "result_first_wrong")
                   & (tokens.group == "target")]
    at = tests[tests.step == last].drop_duplicates(["context_id", "token_id"]).set_index(
        ["context_id", "token_id"])
    hit = at.reindex(pd.MultiIndex.from_frame(wrong[["context_id", "token_id"]]))
    significant = hit.significant.astype(bool)
    share, lowering = significant.mean(), (hit.dlogp[significant] < 0).mean()
    table = onsets.departure_table(onsets.departures(tokens, s["placebo"]), labels)
    found = onsets.onsets(table).query("scheme == 'ground_truth'").set_index("category")
    accuracy = suite_tables.accuracy_table(P)
    separation = onsets.accuracy_separation(accuracy[accuracy.model.isin([P.reference, *P.checkpoints])],
                                            P.reference)
    steps = [P.steps[c] for c in P.checkpoints]
    onset = found.onset_step.get("result_first_wrong")
    print(f"\nknown answer: {len(wrong)} first-wrong contexts at step {last}, {share:.2f} are "
          f"spikes, {lowering:.2f} of those lower the written token's probability "
          f"({(hit.sign[significant] == 'rejects').mean():.2f} reject it); result_first_wrong "
          f"onset {onset}, format onset "
          f"{found.onset_step.get('format')}, accuracy separates at {separation}")
    assert len(wrong) >= 10 and share >= 0.5 and lowering >= 0.75
    assert separation is not None and not pd.isna(onset)
    assert abs(steps.index(int(onset)) - steps.index(separation)) <= 1

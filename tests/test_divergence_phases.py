"""Content apart from format: ground-truth labels through chapter 04's tables, the onset
rule ("from step N"), and "most" only where the difference to the runner-up excludes 0,
on hand-built tables whose responses write arithmetic with a planted change per label."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from arithmetic_tokens import arithmetic_tokens

from rlprobe_nb import reporting
from rlprobe_nb.divergence import charts, ground_truth, narrative, phases, summary

PLANT = {"format": (100, -1.0), "result_first_wrong": (400, -2.5)}


@pytest.fixture(scope="module")
def planted():
    tokens, texts = arithmetic_tokens(n_problems=8, plant=PLANT)
    labels = ground_truth.label(tokens, texts)
    return tokens, labels, summary.category_table(tokens, labels)


def test_the_onsets_are_the_planted_steps(planted):
    _, _, table = planted
    on = phases.onsets(table).set_index("category")
    assert on.loc["format", "status"] == "onset" and on.loc["format", "onset_step"] == 100
    assert on.loc["result_first_wrong", "onset_step"] == 400
    assert (on.loc[["format", "result_first_wrong"], "direction"] == -1).all()
    for untouched in ("result_correct", "operand", "operator", "other"):
        assert on.loc[untouched, "status"] == "no lasting change", untouched
    assert on.loc["result_after_wrong", "status"] == "too few problems"  # one response has one
    text = narrative.say_phases(phases.onsets(table))
    assert "'format' changes first" in text and "then 'result_first_wrong' from step 400" in text
    assert phases.ONSET_RULE in text and "'result_after_wrong' (1)" in text


def _rows(estimates, lows, highs, problems=8, steps=(100, 200, 400, 800)):
    return pd.DataFrame({"group": "target", "statistic": "dlogp_mean", "category": "x",
                         "step": list(steps), "estimate": estimates, "low": lows,
                         "high": highs, "problems": problems})


@pytest.mark.parametrize("estimates, lows, highs, want", [
    ([-0.1, -0.5, -0.6, -0.7], [-0.3, -0.8, -0.9, -0.9], [0.1, -0.2, -0.3, -0.4], 200),
    # significant at 200, but the sign turns later: the change came and went, no onset
    ([-0.1, -0.5, 0.2, -0.7], [-0.3, -0.8, -0.1, -0.9], [0.1, -0.2, 0.5, -0.4], 800),
    ([0.0, -0.5, -0.1, 0.1], [-0.2, -0.8, -0.4, -0.1], [0.2, -0.2, 0.2, 0.3], None),
])
def test_onset_rule(estimates, lows, highs, want):
    got = phases.onsets(_rows(estimates, lows, highs)).iloc[0]
    if want is None:
        assert got.status == "no lasting change" and got.onset_step == -1
    else:
        assert got.status == "onset" and got.onset_step == want


def test_an_onset_needs_enough_problems():
    got = phases.onsets(_rows([-0.5] * 4, [-0.8] * 4, [-0.2] * 4, problems=4)).iloc[0]
    assert got.status == "too few problems"
    reporting.use_min_clusters(3)
    try:
        again = phases.onsets(_rows([-0.5] * 4, [-0.8] * 4, [-0.2] * 4, problems=4))
        assert again.iloc[0].status == "onset"
    finally:
        reporting.use_min_clusters(5)
    with pytest.raises(ValueError, match="integer >= 2"):
        reporting.use_min_clusters(1)


def test_most_only_when_the_runner_up_is_beaten(planted):
    tokens, labels, table = planted
    con = phases.contrasts(tokens, labels, "ground_truth")
    diff = con[(con.statistic == "dlogp: leader minus")]
    assert set(diff.category) == {"result_first_wrong"}
    versus = diff.set_index("versus").loc["format"]
    assert versus.high < 0  # -2.5 planted against -1.0
    text = narrative.say_categories(table, con, what="label")
    assert "'result_first_wrong' tokens most" in text and "runner-up 'format'" in text
    assert "'result_after_wrong' (1)" in text  # too few problems, not ranked


def test_tied_labels_are_named_not_ranked():
    """Format and operator tokens with the same distribution of Δlogp (a true tie)."""
    tokens, texts = arithmetic_tokens(n_problems=8, plant={"format": (100, -1.5)})
    labels = ground_truth.label(tokens, texts)
    tied = labels.isin(["format", "operator"]).to_numpy() & (tokens.step >= 100).to_numpy()
    rng = np.random.default_rng(5)
    tokens.loc[tied, "dlogp"] = rng.normal(-1.5, 1.0, size=int(tied.sum()))
    table = summary.category_table(tokens, labels)
    con = phases.contrasts(tokens, labels, "ground_truth")
    text = narrative.say_categories(table, con, what="label")
    assert "loses the most probability" in text and "tokens most" not in text
    assert "cannot be told apart" in text and "'format'" in text and "'operator'" in text


def test_kl_share_against_token_share(planted):
    tokens, labels, table = planted
    con = phases.contrasts(tokens, labels, "ground_truth")
    excess = con[con.statistic == "kl share minus token share"].set_index("category")
    assert excess.loc["result_first_wrong", "low"] > 0  # 1 token in ~50 carries much of all KL
    assert excess.loc["other", "high"] < 0  # unchanged: no KL at all
    total = (table[(table.statistic == "kl_ref_ckpt_share") & (table.step == 800)].estimate.sum())
    assert total == pytest.approx(1.0)


def test_difference_is_the_difference_of_the_two_means(planted):
    tokens, labels, _ = planted
    con = phases.contrasts(tokens, labels, "ground_truth")
    row = con[(con.statistic == "dlogp: leader minus") & (con.versus == "format")].iloc[0]
    last = tokens[(tokens.step == 800) & ~tokens.first_token].assign(label=labels.astype(str))
    means = last.groupby("label").dlogp.mean()
    assert row.estimate == pytest.approx(means["result_first_wrong"] - means["format"])


def test_charts_show_the_ground_truth_labels(planted):
    tokens, _, table = planted
    when = summary.when_table(tokens)
    chart = charts.when_chart(when, summary.per_problem_means(tokens), ground_truth=table)
    spec = chart.to_json()
    assert "ground-truth label" in spec and "result_first_wrong" in spec
    heat = charts.category_heatmap(table, ground_truth=table).to_json()
    assert heat.count("ground-truth label") >= 1 and "fewer than 5 problems" in heat


def test_kl_falling_while_accuracy_rises_is_said_with_the_labels_it_comes_from():
    """Format changes at 100 and half of it is undone at 200, so the mean KL falls while
    the (given) accuracy rises; the fall comes from the format tokens only."""
    tokens, texts = arithmetic_tokens(n_problems=8, plant={"format": (100, -2.0)},
                                      steps=(100, 200))
    late = (tokens.step == 200).to_numpy()
    tokens.loc[late, "kl_ref_ckpt"] *= 0.5
    labels = ground_truth.label(tokens, texts)
    changes = summary.step_changes(tokens)
    parts = phases.change_contributions(tokens, labels)
    fall = parts[(parts.step_from == 100)].set_index("category")
    total = changes[(changes.metric == "kl_ref_ckpt") & (changes.step_from == 100)].change.iloc[0]
    assert fall.estimate.sum() == pytest.approx(total)  # the contributions add up
    assert fall.loc["format", "high"] < 0 and fall.loc["result_correct", "estimate"] == 0
    accuracy = pd.DataFrame({"model": ["dpo", "a", "b"], "step": [0, 100, 200],
                             "rate": [0.0, 0.2, 0.4], "low": [0.0, 0.15, 0.34],
                             "high": [0.01, 0.25, 0.45], "n": 300})
    table = summary.category_table(tokens, labels)
    text = narrative.say_kl_and_accuracy(changes, accuracy, parts, table)
    assert "From step 100 to 200 the mean KL(ref‖ckpt) falls" in text
    assert "By ground-truth label" in text and "'format' -" in text and "'other'" not in text
    assert "format tokens carry" in text
    flat = accuracy.assign(rate=[0.0, 0.4, 0.2])
    text = narrative.say_kl_and_accuracy(changes, flat, parts, table)
    assert "does not fall" in text and np.isfinite(changes.change).all()

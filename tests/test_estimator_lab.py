"""The estimator lab in substance: what k1, k2, k3 target under tempered sampling (checked
by simulation from known distributions), the reweighted means' verdicts, the T = 1 check,
and temperature against problem."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from synthetic_tokens import _log_softmax, pair_metrics, synthetic_tokens

from rlprobe_nb.divergence import estimator_lab as el
from rlprobe_nb.divergence import narrative


def simulated_rows(temperatures=(0.6, 1.0), problems: int = 40, length: int = 60,
                   vocab: int = 8, seed: int = 0, group: str = "target"):
    """Tokens drawn at each temperature from known distributions (a reference and a
    checkpoint per position, a problem effect on both), scored exactly; the top-k holds
    the whole vocabulary, so the importance weights are exact. Returns (rows, per-row
    exact expectations of each estimator under the row's q_T)."""
    rng = np.random.default_rng(seed)
    frames, targets = [], []
    for t in temperatures:
        for g in range(problems):
            effect = rng.normal(0, 0.5)
            z_q = rng.normal(0, 1.5, size=(length, vocab)) + effect * np.arange(vocab) / vocab
            # the checkpoint sharpens the reference and moves at random: its tempered
            # targets then differ from KL(ref‖ckpt), as RL checkpoints do
            z_p = 1.5 * z_q + rng.normal(0, 0.7, size=(length, vocab)) * (1 + abs(effect))
            lq, lp = _log_softmax(z_q), _log_softmax(z_p)
            q_t = np.exp(_log_softmax(z_q / t))
            token = (q_t.cumsum(1) > rng.random((length, 1))).argmax(1)
            cols = pair_metrics(lp, lq, token, topk=vocab)
            frames.append(pd.DataFrame({
                **cols, "problem_id": f"p{g:02d}", "rollout_id": f"p{g:02d}#{t}",
                "pos": np.arange(length), "step": 100, "checkpoint": "rlvr_step_100",
                "reference": "dpo", "group": group, "temperature": np.float32(t),
                "first_token": np.arange(length) == 0}))
            targets.append(pd.DataFrame(el.tempered_targets(lp, lq, t)).assign(temperature=t))
    return pd.concat(frames, ignore_index=True), pd.concat(targets, ignore_index=True)


@pytest.fixture(scope="module")
def simulated():
    return simulated_rows()


def kl(a, b):
    return (a * np.log(a / b)).sum(1)


def test_tempered_targets_are_the_stated_formulas():
    rng = np.random.default_rng(1)
    lq, lp = _log_softmax(rng.normal(size=(5, 7))), _log_softmax(rng.normal(size=(5, 7)))
    for t in (0.6, 1.0, 1.3):
        got = el.tempered_targets(lp, lq, t)
        q, p = np.exp(lq), np.exp(lp)
        qt = q ** (1 / t) / (q ** (1 / t)).sum(1, keepdims=True)
        np.testing.assert_allclose(got["e_k1"], kl(qt, p) - kl(qt, q), atol=1e-12)
        np.testing.assert_allclose(got["e_k3"], (qt * p / q).sum(1) - 1 + kl(qt, p) - kl(qt, q),
                                   atol=1e-12)
        np.testing.assert_allclose(got["e_k2"], 0.5 * (qt * np.log(p / q) ** 2).sum(1), atol=1e-12)
        if t == 1.0:  # at T = 1 both k1 and k3 target KL(ref‖ckpt) exactly
            np.testing.assert_allclose(got["e_k1"], kl(q, p), atol=1e-12)
            np.testing.assert_allclose(got["e_k3"], kl(q, p), atol=1e-12)
            np.testing.assert_allclose(got["ratio_term"], 0, atol=1e-12)


@pytest.mark.parametrize("temperature", [0.6, 1.0])
@pytest.mark.parametrize("k", ["k1", "k2", "k3"])
def test_stated_target_matches_the_monte_carlo_mean(simulated, temperature, k):
    rows, targets = simulated
    at = (rows.temperature == np.float32(temperature)).to_numpy()
    error = rows[k].to_numpy()[at] - targets[f"e_{k}"].to_numpy()[at]
    se = error.std(ddof=1) / np.sqrt(at.sum())  # tokens are independent draws here
    assert abs(error.mean()) < 3 * se, (k, temperature, error.mean(), se)


def test_the_targets_differ_where_the_lab_says_they_do(simulated):
    """So the check above can fail: at T = 0.6 k1's target is not KL(ref‖ckpt), and k3's
    extra term E_{q_T}[ckpt/ref] − 1 is not 0, both by far more than the Monte Carlo error."""
    rows, targets = simulated
    at = (rows.temperature == np.float32(0.6)).to_numpy()
    n = at.sum()
    for k, other in (("k1", targets.kl_q_p), ("k3", targets.e_k1)):
        error = rows[k].to_numpy()[at] - other.to_numpy()[at]
        assert abs(error.mean()) > 6 * error.std(ddof=1) / np.sqrt(n), k


def test_reweighted_means_meet_the_exact_mean_at_both_temperatures(simulated):
    rows, _ = simulated
    table = el.reweighted_table(rows, seed=0)
    assert set(table.temperature_label) == {"T=0.6", "T=1"}
    assert (table.meets_exact == "yes").all(), table[["estimator", "temperature_label",
                                                      "error_mid", "low", "high"]]
    np.testing.assert_allclose(table.reweighted_low, table.reweighted_high)  # exact weights
    lab = el.estimator_table(rows, seed=0)
    plain = lab[(lab.level == "token") & (lab.target == "kl_ref_ckpt") & (lab.estimator == "k1")]
    verdict = plain.set_index("temperature_label").meets_exact
    assert verdict["T=1"] == "yes" and verdict["T=0.6"] == "no", verdict  # the bias is real


def test_selected_tokens_miss_and_the_t1_verdict_says_so():
    """Plain draws at T = 1 pass the check; keep only the tokens the checkpoint likes less
    than the reference did (a selection on what was written) and they fail it."""
    rows, _ = simulated_rows(temperatures=(1.0,), problems=40, length=30, seed=3)
    rows = rows.assign(group=el.UNSELECTED)
    assert (el.t1_check(rows).meets_exact == "yes").all()
    selected = rows[(rows.k1 > 0.5) | rows.first_token]
    assert (el.t1_check(selected).meets_exact == "no").all()


def test_t1_check_reads_the_unselected_group_only():
    tokens = synthetic_tokens(n_problems=6)
    assert el.t1_check(tokens).empty
    assert "forced no 't1_unselected' group" in narrative.say_t1_check(el.t1_check(tokens))
    unselected = tokens.assign(group=tokens.group.replace("target", el.UNSELECTED))
    check = el.t1_check(unselected)
    at_1 = unselected[(unselected.group == el.UNSELECTED) & (unselected.temperature == 1.0)
                      & ~unselected.first_token]
    assert set(check.estimator) == {"k1", "k3"} and len(check) == 2 * tokens.step.nunique()
    assert (check.rows == at_1.groupby("step").size().reindex(check.step).to_numpy()).all()
    got = check.set_index(["estimator", "step"]).bias
    for step, part in at_1.groupby("step"):
        assert got["k3", step] == pytest.approx((part.k3 - part.kl_ref_ckpt).mean())
    assert set(check.meets_exact) <= {"yes", "no"}
    assert check.level.iloc[0] == "99.2% (simultaneous over 6 rows)"
    text = narrative.say_t1_check(check)
    assert text.startswith("T = 1 check on unselected rollouts") and "nan" not in text.lower()


def test_a_t1_check_from_too_few_problems_cannot_be_judged():
    tokens = synthetic_tokens(n_problems=3)
    check = el.t1_check(tokens.assign(group=tokens.group.replace("target", el.UNSELECTED)))
    assert check.meets_exact.str.startswith("cannot tell").all()
    assert "cannot be judged" in narrative.say_t1_check(check)


def _t1_suite(seed: int, problems: int = 9, length: int = 120, vocab: int = 40):
    """Five checkpoints of growing distance, scored on one rollout per problem drawn from
    the reference at T = 1: a right check on a suite the size of the demo."""
    rng = np.random.default_rng(seed)
    frames = []
    for g in range(problems):
        z_q = rng.normal(0, 2.5, size=(length, vocab))
        direction = rng.normal(0, 1, size=(length, vocab))
        boost = (rng.random((length, vocab)) < 0.02) * rng.exponential(1.0, (length, vocab))
        lq = _log_softmax(z_q)
        token = (np.exp(lq).cumsum(1) > rng.random((length, 1))).argmax(1)
        for step in (100, 200, 400, 800, 1200):
            lp = _log_softmax(z_q + 0.4 * step / 400 * direction + step / 1200 * boost)
            frames.append(pd.DataFrame({
                **pair_metrics(lp, lq, token, topk=5), "problem_id": f"p{g}",
                "rollout_id": f"p{g}#4", "pos": np.arange(length), "step": step,
                "checkpoint": f"rlvr_step_{step}", "reference": "dpo", "group": el.UNSELECTED,
                "temperature": np.float32(1.0), "first_token": np.arange(length) == 0}))
    return pd.concat(frames, ignore_index=True)


def test_a_right_t1_check_passes_in_most_suites():
    """Its false alarm rate: on 30 simulated suites of 9 problems where k1 and k3 are
    unbiased by construction, the simultaneous check passes in at least 27."""
    passed = [(el.t1_check(_t1_suite(seed), seed=seed).meets_exact == "yes").all()
              for seed in range(30)]
    assert sum(passed) >= 27, sum(passed)


def test_largest_share_finds_a_bias_carried_by_one_token(simulated):
    rows, _ = simulated
    one = rows[rows.temperature == np.float32(1.0)].copy()
    at = one.index[5]
    one.loc[at, "k3"] = one.loc[at, "kl_ref_ckpt"] + 1e4
    lab = el.estimator_table(one)
    row = lab[(lab.level == "token") & (lab.estimator == "k3") & (lab.target == "kl_ref_ckpt")]
    assert row.largest_share.iloc[0] > 0.9


def test_temperature_against_problem():
    tokens = synthetic_tokens(n_problems=6)
    counts = el.temperature_problems(tokens)
    target = counts[counts.group == "target"]
    assert set(target.columns) >= {"T=0.6", "T=0.8", "T=1"}
    # drop one problem's T=0.6 rollout: that problem no longer counts as shared
    gone = tokens[~((tokens.problem_id == "p00") & (tokens.temperature == np.float32(0.6))
                    & (tokens.group == "target"))]
    same = el.same_problems(gone)
    assert "p00" not in set(same[same.group == "target"].problem_id)
    assert "p00" in set(same[same.group == "ref_right"].problem_id)
    text = narrative.say_temperature_problems(el.temperature_problems(gone))
    assert "5 of 6 problems have rollouts at every temperature" in text

"""Branching: controls matched on category and entropy from the point's own rollout, the
arms of the plan (keep, the checkpoint's top-1, the correct digit), effects with their
intervals, the cost, and the sentences a reader gets (no interval from fewer than five
problems), on hand-built token tables."""

from __future__ import annotations

import pandas as pd
import pytest
from counterfactual_tokens import EOS, Vocab, token_table, wrong_sums

from rlprobe_nb.counterfactuals import branching, narrative, plan, points
from rlprobe_nb.counterfactuals.intervals import newcombe_ci
from rlprobe_nb.reporting import MIN_CLUSTERS


@pytest.fixture()
def tok():
    vocab = Vocab()
    texts = wrong_sums(6, per_problem=2)
    return points.annotate(token_table(texts, vocab), texts, vocab.text_of, vocab.encode, {EOS})


NO_SPIKES = pd.DataFrame(columns=["checkpoint", "group", "rollout_id", "pos", "significant"])


def test_controls_come_from_the_points_rollout_matched_on_category_and_entropy(tok):
    main = points.select_points(tok, NO_SPIKES, checkpoint="ck", rule=["operand"], max_points=6)
    avoid = set(zip(main.rollout_id, main.pos))
    ctl = branching.match_controls(main, tok, avoid, caliper=5.0, gap=1, seed=0)
    assert len(ctl) == len(main) and not ctl.duplicated(["rollout_id", "pos"]).any()
    by_point = main.set_index(["rollout_id", "pos"])
    for c in ctl.itertuples():
        p = by_point.loc[(c.rollout_id, c.matched_pos)]  # the point is in the same rollout
        assert all(abs(c.pos - q) > 1 for r, q in avoid if r == c.rollout_id)
        assert c.ground_truth != "result_first_wrong" and not c.format and pd.notna(c.alt_id)
        assert c.rule == "operand" and c.entropy_gap == pytest.approx(abs(c.entropy_ref - p.entropy_ref))
        same = tok[(tok.rollout_id == c.rollout_id) & (tok.category == p.category)]
        if c.match == "category":  # the nearest entropy among the rollout's tokens of its kind
            assert c.category == p.category
            pool = branching.control_pool(same, avoid, gap=1)
            assert c.entropy_gap <= (pool.entropy_ref - p.entropy_ref).abs().min() + 1e-12 or \
                len(ctl[ctl.rollout_id == c.rollout_id]) > 1
    strict = branching.match_controls(main, tok, avoid, caliper=0.0, gap=1)
    assert len(strict) < len(main)  # none within 0 nats: the point goes without a control


def test_tokens_that_carry_arithmetic_are_never_controls(tok):
    """A digit, number, operand or operator decides the answer by construction (another
    one changes the calculation): a control is a token that decides nothing."""
    main = points.select_points(tok, NO_SPIKES, checkpoint="ck", rule=["result_after_wrong"],
                                max_points=12)
    ctl = branching.match_controls(main, tok, set(), caliper=10.0, gap=0)
    assert len(ctl) and not ctl.ground_truth.isin(points.CONTENT_LABELS).any()
    assert not ctl.category.astype(str).isin(branching.ARITHMETIC_CATEGORIES).any()
    arithmetic = tok.ground_truth.isin(points.CONTENT_LABELS) | tok.category.astype(str).isin(
        branching.ARITHMETIC_CATEGORIES)
    assert arithmetic.any() and not branching.control_pool(tok, set()).index.isin(
        tok.index[arithmetic]).any()


def test_a_control_stands_on_its_points_side_of_the_first_wrong_result(tok):
    """Kept text that already holds the wrong result can only gain passes from a swap, text
    that does not can only lose them: a point after the first wrong digit gets a control
    after it, a point before it one before it."""
    wrong = branching.wrong_so_far(tok)
    first = tok[tok.ground_truth == "result_first_wrong"].groupby("rollout_id").pos.min()
    assert (wrong == (tok.pos >= tok.rollout_id.map(first))).all() and wrong.any() and (~wrong).any()
    for rule in (["operand"], ["result_correct"]):  # "11 + 22" before, "2 * 3 = 6" after
        main = points.select_points(tok, NO_SPIKES, checkpoint="ck", rule=rule, max_points=12)
        ctl = branching.match_controls(main, tok, set(zip(main.rollout_id, main.pos)),
                                       caliper=10.0, gap=0)
        assert len(ctl)
        side = dict(zip(zip(tok.rollout_id, tok.pos), wrong))
        for c in ctl.itertuples():
            assert side[(c.rollout_id, c.pos)] == side[(c.rollout_id, c.matched_pos)], rule


def test_arms_of_points_controls_and_their_cost(tok):
    main = points.select_points(tok, NO_SPIKES, checkpoint="ck",
                                rule=["result_first_wrong", "operand"], max_points=10)
    positive = points.select_positive(tok, main, 16, seed=0)
    both = plan.combine(main, positive)  # 12 first wrong digits, 10 of them main points
    assert len(both) == 12 and both.main.sum() == 10 and both.positive.sum() == 12
    ctl = branching.match_controls(main, tok, set(zip(both.rollout_id, both.pos)), caliper=5.0)
    rollouts = pd.DataFrame([{"rollout_id": r, "problem_id": g.problem_id.iloc[0],
                              "response_ids": g.sort_values("pos").token_id.tolist()}
                             for r, g in tok.groupby("rollout_id")])
    built = plan.build(both, ctl, tok, rollouts, {"ck": None}, case_study_ids=[],
                       grid_points=3, special={EOS})
    arms = built.groupby(["kind", "rollout_id", "pos"]).arm.apply(lambda a: tuple(sorted(a)))
    at = tok.set_index(["rollout_id", "pos"])
    for r in both.itertuples():
        want = ("keep",) + (("correct",) if r.positive else ()) + (("top1",) if r.main else ())
        assert arms[("point", r.rollout_id, r.pos)] == tuple(sorted(want))
    for r in built[built.arm == "correct"].itertuples():
        assert r.substituted_id == at.loc[(r.rollout_id, r.pos), "correct_id"]
        assert r.ground_truth == "result_first_wrong"
    for r in built[built.arm == "top1"].itertuples():
        assert r.substituted_id == at.loc[(r.rollout_id, r.pos), "alt_id"] and r.substituted_rank == 2
    assert set(arms[("control",)]) == {("keep", "top1")}
    cost = plan.cost(built, 16, 40, continuation_tokens=8)
    assert cost.continuations.sum() == 16 * len(built)  # no two rows share a context here
    kept = built.pos + 1
    assert cost.max_new_tokens.sum() == 16 * (40 - kept).clip(lower=0, upper=8).sum()


def test_a_top1_that_is_the_correct_digit_is_one_context(tok):
    fw = tok[tok.ground_truth == "result_first_wrong"].head(1).copy()
    fw["alt_id"] = fw["correct_id"]
    both = plan.combine(fw.assign(rule="result_first_wrong"), fw.assign(rule="result_first_wrong"))
    built = plan.build(both, tok.iloc[:0].assign(matched_pos=[], match=[], rule=[]), tok,
                       pd.DataFrame(columns=["rollout_id", "problem_id", "response_ids"]),
                       {"ck": None}, case_study_ids=[], grid_points=2, special={EOS})
    assert sorted(built.arm) == ["correct", "keep", "top1"]
    assert plan.cost(built, 16).continuations.sum() == 2 * 16


def effect_rows(n_problems, passes_keep=1, passes_arm=12, n=16, arm="correct"):
    rows = []
    for p in range(n_problems):
        for k, kind in enumerate(("point", "point", "control")):
            rows += [{"model": "ck", "kind": kind, "rollout_id": f"p{p}#0", "pos": k,
                      "problem_id": f"p{p}", "rule": "result_first_wrong", "arm": a,
                      "passes": passes_keep if a == "keep" else (passes_arm if kind == "point" else 1),
                      "n": n, "written_token": "4", "substituted_token": "0",
                      "wilson_low": 0.0, "wilson_high": 0.5} for a in ("keep", arm)]
    return pd.DataFrame(rows)


def test_effects_carry_each_arms_wilson_interval_and_newcombes():
    eff = branching.effects(effect_rows(3), arm="correct")
    assert len(eff) == 9 and (eff.arm == "correct").all()
    pts = eff[eff.kind == "point"]
    assert list(pts.effect) == pytest.approx([11 / 16] * 6) and (pts.effect_low > 0).all()
    assert ((eff.effect_low <= eff.effect) & (eff.effect <= eff.effect_high)).all()
    assert {"keep_low", "keep_high", "arm_low", "arm_high"} <= set(eff.columns)
    assert branching.effects(effect_rows(3), arm="top1").empty
    table = narrative.point_table(eff)
    assert table["keep (Wilson)"].iloc[0] == "1/16 [0, 0.50]"


@pytest.mark.parametrize("problems", [MIN_CLUSTERS - 1, MIN_CLUSTERS])
def test_no_interval_from_fewer_than_five_problems(problems):
    rows = effect_rows(problems)
    pos = branching.effects(rows[rows.kind == "point"], arm="correct")
    line = narrative.positive_line(branching.summary(pos, None, n_boot=200), "ck")
    assert f"{2 * problems} first wrong digits in {problems} problems" in line
    assert "0.0625" in line and "0.75" in line  # the arms' pass rates, pooled
    top = effect_rows(problems, arm="top1")
    eff = branching.effects(top, arm="top1")
    lines = "\n".join(narrative.main_lines(branching.summary(
        eff[eff.kind == "point"], eff[eff.kind == "control"], n_boot=200), "ck"))
    if problems < MIN_CLUSTERS:
        assert "too few for an interval" in line and "[" not in line
        assert "detects a decisive token" not in line
        assert "[" not in lines and "not compared: too few problems" in lines
    else:  # every problem alike: resampling problems gives no width; each problem counted once
        summary = branching.summary(pos, None, n_boot=200)
        row = summary[summary.group == "all"].iloc[0]
        assert row["interval"] == branching.COUNTED_ONCE
        # Newcombe with 5 draws a side at the problems' mean pass rates: 12/16 -> 4 of 5, 1/16 -> 0
        assert (row["low"], row["high"]) == pytest.approx(newcombe_ci(4, problems, 0, problems)[1:])
        assert row["low"] < 11 / 16 < row["high"] and row["low"] > 0
        assert "each problem counted once" in line and "[" in line
        assert "detects a decisive token" in line


def test_a_shown_interval_and_its_verdicts():
    rows = effect_rows(8)
    rows.loc[(rows.problem_id == "p0") & (rows.arm == "correct"), "passes"] = 9  # some spread
    pos = branching.effects(rows[rows.kind == "point"], arm="correct")
    line = narrative.positive_line(branching.summary(pos, None, n_boot=500), "ck")
    assert "[" in line and "detects a decisive token" in line
    top = effect_rows(8, arm="top1")
    top.loc[(top.problem_id == "p1") & (top.arm == "top1"), "passes"] = 5
    eff = branching.effects(top, arm="top1")
    lines = narrative.main_lines(branching.summary(eff[eff.kind == "point"],
                                                   eff[eff.kind == "control"], n_boot=500), "ck")
    assert "larger at the points than at their controls" in lines[-1]
    assert lines[1].startswith("  at their 8 matched controls (same rollout")
    none = narrative.positive_line(branching.summary(pos.iloc[:0], None), "ck")
    assert "cannot show that the method sees a decisive token" in none


def test_the_grid_spans_a_case_study_without_its_eos_and_policies_keep_their_problems(tok):
    main = points.select_points(tok, NO_SPIKES, checkpoint="ck", rule=["operand"], max_points=4)
    both = plan.combine(main, main.iloc[:0])
    rollouts = pd.DataFrame([{"rollout_id": r, "problem_id": g.problem_id.iloc[0],
                              "response_ids": g.sort_values("pos").token_id.tolist()}
                             for r, g in tok.groupby("rollout_id")])
    case = plan.case_studies(both, 1)
    ids = rollouts.set_index("rollout_id").at[case[0], "response_ids"]
    assert ids[-1] == EOS
    some = {both.problem_id.iloc[0]}
    built = plan.build(both, main.iloc[:0].assign(matched_pos=[], match=[]), tok, rollouts,
                       {"ck": None, "ref": some}, case_study_ids=case, grid_points=4,
                       special={EOS})
    grid = built[(built.model == "ck") & (built.kind == "grid")]
    last = len(ids) - 1  # the prefix that keeps every token but EOS
    assert sorted(grid.pos) == sorted({round(i * last / 3) for i in range(4)})
    assert (grid.rollout_id == case[0]).all() and (grid.arm == "prefix").all()
    assert set(built[built.model == "ref"].problem_id) <= some
    assert len(built[built.model == "ck"]) > len(built[built.model == "ref"]) > 0


def test_the_placebo_policy_continues_the_same_points_with_the_same_draws(tok):
    """The placebo continues exactly the RLVR checkpoint's main points and controls (not
    the positive control's arms, not the grid), and every continuation of a context is
    seeded by the context alone: the same draws whichever model continues it."""
    from rlprobe_nb.counterfactuals.continuations import continuation_seed
    from rlprobe_nb.counterfactuals.passes import _context_key, with_prefix_len

    main = points.select_points(tok, NO_SPIKES, checkpoint="ck",
                                rule=["operand", "result_first_wrong"], max_points=8)
    positive = points.select_positive(tok, main, 16, seed=0)
    both = plan.combine(main, positive)
    ctl = branching.match_controls(main, tok, set(zip(both.rollout_id, both.pos)), caliper=5.0)
    rollouts = pd.DataFrame([{"rollout_id": r, "problem_id": g.problem_id.iloc[0],
                              "response_ids": g.sort_values("pos").token_id.tolist()}
                             for r, g in tok.groupby("rollout_id")])
    built = plan.build(both, ctl, tok, rollouts, {"ck": None, "placebo": None},
                       case_study_ids=plan.case_studies(both, 1), grid_points=3,
                       special={EOS}, grid_models={"ck"}, positive_models={"ck"})
    key = ["kind", "rollout_id", "pos", "arm", "substituted_id"]
    ck = built[(built.model == "ck") & (built.kind != "grid") & (built.arm != "correct")
               & (built.rule != "positive_control")]
    placebo = built[built.model == "placebo"]
    assert len(placebo) and set(placebo.kind) == {"point", "control"}
    assert set(map(tuple, placebo[key].astype(str).values)) == set(map(tuple, ck[key].astype(str).values))
    seeds = {m: [[continuation_seed(0, *_context_key(r), s) for s in range(4)]
                 for r in with_prefix_len(part.sort_values(key)).itertuples()]
             for m, part in (("ck", ck), ("placebo", placebo))}
    assert seeds["ck"] == seeds["placebo"]

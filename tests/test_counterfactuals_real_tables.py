"""Chapter 08's acceptance on the demo suite's own ``branches`` table, as the demo book
wrote it (``make demo``; ``RLPROBE_OUT`` where it wrote it): without it, or with a table no
longer current, every test here skips, saying so.

Read with the chapter's own functions (``branching.effects``, ``summary``,
``policy_contrast``): the positive control at first wrong digits, by the kind of wrong
statement; the main result and its controls for the checkpoint and for its placebo; the
placebo continuing the same contexts with the same draws; the main points are the
checkpoint's disagreements (its top-1 is the swapped token, the written one is not), read
against its token table, and the placebo branches at its own.
"""

from __future__ import annotations

import pytest

from rlprobe_nb.counterfactuals import branching, points
from rlprobe_nb.reporting import MIN_CLUSTERS, excludes_zero, interval_ok
from rlprobe_nb.suite import params
from rlprobe_nb.tables import lineage, storage, suite_tables

pytestmark = pytest.mark.slow
ANSWER = "its true value is the answer"  # the chapter's name for the kind of wrong statement


@pytest.fixture(scope="module")
def branches():
    P = params.load("demo")
    try:
        table = lineage.read_derived(P, "branches")
    except (FileNotFoundError, storage.StaleTableError) as err:
        pytest.skip(f"the demo's branches table is missing or not current ({err}); run make demo")
    return P, table


def _row(summary, model, group="all", estimate="point"):
    rows = summary[(summary.model == model) & (summary.group == group)
                   & (summary.estimate == estimate)]
    assert len(rows) == 1, (model, group, estimate)
    return rows.iloc[0]


def test_the_positive_control_lifts_first_wrong_digits(branches):
    P, table = branches
    ckpt = P.target
    points = table[(table.kind == "point") & (table.model == ckpt)]
    effects = branching.effects(points, arm="correct")
    effects["statement"] = effects.result_is_answer.map(
        {True: ANSWER, False: "another result"}).fillna("answer unknown")
    summary = branching.summary(effects, None, by="statement", seed=P.counterfactuals.seed)
    print("\n" + summary.to_string())
    every = _row(summary, ckpt)
    assert every.branches >= 20 and every.problems >= 10
    assert excludes_zero(every["mean"], every.low, every.high, int(every.problems)) and every.low > 0
    answer = _row(summary, ckpt, ANSWER)
    assert answer.problems >= MIN_CLUSTERS and answer["mean"] >= 0.8
    assert interval_ok(answer["mean"], answer.low, answer.high, int(answer.problems))


def test_the_main_result_and_its_controls_for_the_checkpoint_and_its_placebo(branches):
    P, table = branches
    ckpt, placebo = P.target, P.placebo_for(P.target)
    effects = branching.effects(table[table.kind.isin(["point", "control"])], arm="top1")
    summary = branching.summary(effects[effects.kind == "point"], effects[effects.kind == "control"],
                                seed=P.counterfactuals.seed)
    print("\n" + summary.to_string())
    for model in (ckpt, placebo):
        main = _row(summary, model)
        assert main.branches >= 20 and main.problems >= 10
        assert interval_ok(main["mean"], main.low, main.high, int(main.problems))
    # controls are swaps the checkpoint itself would make, at tokens without arithmetic;
    # on the demo few such tokens are not spikes, so there are few (the chapter says so)
    controls = table[(table.kind == "control") & (table.arm == "top1")]
    assert (controls.substituted_rank == 0).all()
    assert not controls.ground_truth.isin(points.CONTENT_LABELS).any()


def test_the_placebo_continues_the_same_contexts_with_the_same_draws(branches):
    P, table = branches
    ckpt, placebo = P.target, P.placebo_for(P.target)
    key = ["kind", "rollout_id", "pos", "arm", "prefix_len", "substituted_id"]
    mine = table[(table.model == placebo) & ~table.kind.str.startswith("own_")]
    theirs = table[(table.model == ckpt) & table.kind.isin(mine.kind.unique())]
    theirs = theirs[theirs.arm.isin(mine.arm.unique())]
    a = mine.assign(substituted_id=mine.substituted_id.fillna(-1)).set_index(key).sort_index()
    b = theirs.assign(substituted_id=theirs.substituted_id.fillna(-1)).set_index(key).sort_index()
    assert len(a) >= 20 and a.index.equals(b.loc[a.index].index)
    assert all(list(x) == list(y) for x, y in zip(a.seeds, b.loc[a.index].seeds))
    contrast = branching.policy_contrast(
        branching.effects(table[table.kind == "point"], arm="top1"), ckpt, placebo)
    print("\n" + contrast.to_string())
    assert contrast.points.iloc[0] >= 20 and contrast.problems.iloc[0] >= 10


def _top1_check(table, tokens, model, kind):
    """The main points of ``model`` (``kind``) with their token rows: each point's
    swapped token must be the model's rank-1 token and the written one must not."""
    rows = table[(table.model == model) & (table.kind == kind) & (table.arm == "top1")
                 & table.rule.isin(points.STRATA)]
    mine = tokens[tokens.checkpoint == model].set_index(["rollout_id", "pos"])
    for r in rows.itertuples():
        top = mine.at[(r.rollout_id, r.pos), "topk_ids_ckpt"]
        assert int(top[0]) == r.substituted_id and r.substituted_rank == 0, (model, r)
        assert int(mine.at[(r.rollout_id, r.pos), "token_id"]) == r.written_id != int(top[0])
    return rows


def test_the_main_points_are_disagreements_enough_of_them_first_wrong_digits(branches):
    P, table = branches
    ckpt = table.checkpoint.iloc[0]
    placebo = P.placebo_for(ckpt)
    tokens = suite_tables.read_tokens(P, [(c, P.reference) for c in P.forced])
    tokens = tokens[tokens.reference == P.reference]
    main = _top1_check(table, tokens, ckpt, "point")
    print(f"\n{len(main)} points in {main.problem_id.nunique()} problems: "
          f"{main.rule.value_counts().to_dict()}")
    assert len(main) >= 40 and main.problem_id.nunique() >= 20
    keep = table[(table.model == ckpt) & (table.kind == "point") & (table.arm == "keep")]
    keep = keep.set_index(["rollout_id", "pos"]).loc[list(zip(main.rollout_id, main.pos))]
    assert (main.n >= 16).all() and (keep.n >= 16).all()
    first = main[main.rule == points.FIRST_WRONG]
    assert len(first) >= 15 and first.problem_id.nunique() >= 10
    # the placebo, twice: at the same contexts with the same swap, and at its own points
    same = table[(table.model == placebo) & (table.kind == "point") & (table.arm == "top1")]
    assert set(zip(same.rollout_id, same.pos, same.substituted_id)) == set(
        zip(main.rollout_id, main.pos, main.substituted_id))
    own = _top1_check(table, tokens, placebo, "own_point")
    # as many as the suite asks (placebo_points), over enough problems for an interval at
    # every label (five turns of the strata)
    wanted = P.counterfactuals.placebo_points or P.counterfactuals.max_points
    assert len(own) == wanted and own.problem_id.nunique() >= 15
    assert (own.groupby("rule").problem_id.nunique() >= 5).all(), own.groupby("rule").size()

"""Chapter 08's main points are disagreements: contexts where the checkpoint's top-1 is a
real alternative to the written token. On hand-built token tables (no model): the rule
refuses a context whose written token is the checkpoint's top-1 (or the same text laid
out otherwise), even a spike; labels are drawn in turn; controls are disagreements too;
the placebo's own points follow the same rule and seeds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from counterfactual_tokens import EOS, Vocab, alternative, token_table, wrong_sums

from rlprobe_nb.counterfactuals import branching, points

NO_SPIKES = pd.DataFrame(columns=["checkpoint", "group", "rollout_id", "pos", "significant"])


def with_top1(tokens: pd.DataFrame, where: np.ndarray, vocab: Vocab,
              variant: bool = False) -> pd.DataFrame:
    """``tokens`` whose checkpoint top-1 at the rows ``where`` is another token: a real
    alternative, or (``variant``) the written token's text with a line break."""
    out = tokens.copy()
    tops = []
    for top, piece, hit in zip(out["topk_ids_ckpt"], out["token"], where):
        first = vocab.id(piece + "\n" if variant else alternative(piece))
        tops.append([first, top[0], vocab.id(alternative(piece))] if hit else list(top))
    out["topk_ids_ckpt"] = tops
    return out


def annotated(tokens, vocab, texts):
    return points.annotate(tokens, texts, vocab.text_of, vocab.encode, {EOS})


@pytest.fixture()
def base():
    vocab = Vocab()
    texts = wrong_sums(12, per_problem=2)
    return token_table(texts, vocab), vocab, texts


def spikes_at(rows, checkpoint="ck"):
    return rows.assign(checkpoint=checkpoint, significant=True)[
        ["checkpoint", "group", "rollout_id", "pos", "significant"]]


def test_the_rule_refuses_a_context_whose_written_token_is_the_checkpoints_top1(base):
    raw, vocab, texts = base
    rng = np.random.default_rng(1)
    hit = rng.random(len(raw)) < 0.3
    variant = ~hit & (rng.random(len(raw)) < 0.3)
    tok = annotated(with_top1(with_top1(raw, hit, vocab), variant, vocab, variant=True),
                    vocab, texts)
    assert tok["alt_id"].notna().sum() > hit.sum()  # agreeing tokens have a runner-up...
    spikes = spikes_at(tok[~hit & ~tok.first_token & ~tok.format])  # ...and many are spikes
    got = points.select_disagreements(tok, spikes, checkpoint="ck", max_points=1000)
    assert len(got) and hit[got.set_index(["rollout_id", "pos"]).index.map(
        tok.set_index(["rollout_id", "pos"]).index.get_loc)].all()
    assert not got["spike"].any()  # every spike agreed with the written token: none is a point
    for r in got.itertuples():
        top = tok.set_index(["rollout_id", "pos"]).at[(r.rollout_id, r.pos), "topk_ids_ckpt"]
        assert top[0] != r.token_id and r.alt_rank == 0 and r.alt_id == top[0]
        assert points.is_real_alternative(r.token, vocab.text_of(int(top[0])))
    # nothing disagrees: no point at all, even with every token a spike
    plain = annotated(raw, vocab, texts)
    assert points.select_disagreements(plain, spikes_at(plain), checkpoint="ck").empty


def test_labels_are_drawn_in_turn_and_an_exhausted_one_is_skipped(base):
    raw, vocab, texts = base
    tok = annotated(with_top1(raw, np.ones(len(raw), dtype=bool), vocab), vocab, texts)
    strata = ["result_first_wrong", "operand", "result_first_wrong", "operator", "other"]
    available = points.stratum(tok[points.eligible(tok) & points.disagrees(tok)]).value_counts()
    assert available["result_first_wrong"] == 24 and available.min() >= 24
    got = points.select_disagreements(tok, NO_SPIKES, checkpoint="ck", strata=strata,
                                      max_points=20)
    assert got.rule.value_counts().to_dict() == {"result_first_wrong": 8, "operand": 4,
                                                 "operator": 4, "other": 4}
    # the order of a turn: the first k points of a larger draw are the draw of k
    for k in (1, 2, 3, 4, 5, 7):
        head = points.select_disagreements(tok, NO_SPIKES, checkpoint="ck", strata=strata,
                                           max_points=k)
        assert sorted(head.rule) == sorted(strata[i % 5] for i in range(k))
    # the first wrong digits run out after 12 turns: the other labels fill the rest
    many = points.select_disagreements(tok, NO_SPIKES, checkpoint="ck", strata=strata,
                                       max_points=60)
    counts = many.rule.value_counts()
    assert counts["result_first_wrong"] == 24 and len(many) == 60
    assert many.problem_id.nunique() == 12
    with pytest.raises(ValueError, match="point strata"):
        points.select_disagreements(tok, NO_SPIKES, checkpoint="ck", strata=["digits"])


def test_within_a_label_spikes_come_first_and_problems_take_turns(base):
    raw, vocab, texts = base
    tok = annotated(with_top1(raw, np.ones(len(raw), dtype=bool), vocab), vocab, texts)
    ops = tok[(tok.ground_truth == "operand") & ~tok.first_token]
    spikes = spikes_at(ops[ops.problem_id.isin(["p3", "p7"])].groupby("problem_id").head(1))
    got = points.select_disagreements(tok, spikes, checkpoint="ck", strata=["operand"],
                                      max_points=2)
    assert got.spike.all() and set(got.problem_id) == {"p3", "p7"}
    twelve = points.select_disagreements(tok, spikes, checkpoint="ck", strata=["operand"],
                                         max_points=12)
    assert twelve.problem_id.nunique() == 12


def test_controls_are_disagreements_without_arithmetic(base):
    raw, vocab, texts = base
    rng = np.random.default_rng(2)
    tok = annotated(with_top1(raw, rng.random(len(raw)) < 0.6, vocab), vocab, texts)
    main = points.select_disagreements(tok, NO_SPIKES, checkpoint="ck", max_points=12)
    avoid = set(zip(main.rollout_id, main.pos))
    ctl = branching.match_controls(main, tok, avoid, caliper=5.0, gap=0, disagree_only=True)
    assert len(ctl) and (ctl.alt_rank == 0).all()
    assert not ctl.ground_truth.isin(points.CONTENT_LABELS).any()
    loose = branching.match_controls(main, tok, avoid, caliper=5.0, gap=0)
    assert (loose.alt_rank > 0).any()  # without the rule, runner-ups would serve


def test_the_placebos_own_points_follow_the_same_rule_and_seeds(base):
    raw, vocab, texts = base
    rng = np.random.default_rng(3)
    ck = annotated(with_top1(raw, rng.random(len(raw)) < 0.5, vocab), vocab, texts)
    same = ck.assign(checkpoint="placebo")
    kw = dict(strata=points.DEFAULT_STRATA, max_points=16, seed=5)
    mine = points.select_disagreements(ck, NO_SPIKES, checkpoint="ck", **kw)
    theirs = points.select_disagreements(same, NO_SPIKES, checkpoint="placebo", **kw)
    key = ["rollout_id", "pos", "rule", "alt_id"]
    pd.testing.assert_frame_equal(mine[key], theirs[key])  # same disagreements: same points
    other = annotated(with_top1(raw, rng.random(len(raw)) < 0.5, vocab), vocab, texts)
    own = points.select_disagreements(other.assign(checkpoint="placebo"), NO_SPIKES,
                                      checkpoint="placebo", **kw)
    assert len(own) == 16 and (own.alt_rank == 0).all()
    assert set(zip(own.rollout_id, own.pos)) != set(zip(mine.rollout_id, mine.pos))
    again = points.select_disagreements(other, NO_SPIKES, checkpoint="placebo", **kw)
    pd.testing.assert_frame_equal(own[key], again[key])
    reseeded = points.select_disagreements(other, NO_SPIKES, checkpoint="placebo",
                                           **{**kw, "seed": 6})
    assert set(zip(reseeded.rollout_id, reseeded.pos)) != set(zip(own.rollout_id, own.pos))

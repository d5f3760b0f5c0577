"""Branching at spikes: the alternative token, spike selection, entropy-matched controls,
the arms and effects, on synthetic frames with the token-table and spikes columns."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.counterfactuals import branching, plan

EOS = 2


def token_table(n_rollouts=4, length=30, seed=0):
    """Rows of a per-token table (the columns branching reads): 2 rollouts per problem."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n_rollouts):
        for pos in range(length):
            written = int(rng.integers(10, 99))
            alts = [int(a) for a in rng.choice(np.arange(100, 200), 4, replace=False)]
            top = [written] + alts if pos % 3 else alts[:1] + [written] + alts[1:]
            rows.append({"rollout_id": f"p{r // 2}#{r % 2}", "problem_id": f"p{r // 2}", "pos": pos,
                         "token_id": EOS if pos == length - 1 else written,
                         "first_token": pos == 0, "is_eos": pos == length - 1,
                         "entropy_ref": float(rng.uniform(0, 3)),
                         "topk_ids_ckpt": top[:5]})
    return pd.DataFrame(rows)


def spikes_table(tokens, picks, checkpoint="ck", category=None):
    rows = tokens.set_index(["rollout_id", "pos"]).loc[picks].reset_index()
    return rows.assign(checkpoint=checkpoint, group="target", significant=True,
                       category=category or [["number", "word"][i % 2] for i in range(len(rows))])


def test_the_alternative_is_the_checkpoints_best_other_token():
    assert branching.preferred_alternative([7, 5, 9], written_id=5) == 7
    assert branching.preferred_alternative([5, 7, 9], written_id=5) == 7
    assert branching.preferred_alternative([2, 5, 9], written_id=5, exclude={2}) == 9
    assert branching.preferred_alternative([5], written_id=5) is None


def test_select_spikes_filters_and_caps_by_category():
    tokens = token_table()
    picks = [("p0#0", p) for p in range(0, 20)] + [("p1#0", 3)]
    spikes = spikes_table(tokens, picks, category=["number"] * 20 + ["rare"])
    spikes.loc[spikes.pos == 5, "significant"] = False
    spikes = pd.concat([spikes, spikes_table(tokens, [("p1#1", 4)], checkpoint="other")])
    all_of_ck = branching.select_spikes(spikes, "ck")
    assert 0 not in set(all_of_ck.pos[all_of_ck.rollout_id == "p0#0"])  # first token
    assert 5 not in set(all_of_ck.pos) and "p1#1" not in set(all_of_ck.rollout_id)
    capped = branching.select_spikes(spikes, "ck", max_spikes=4, seed=1)
    assert len(capped) == 4 and "rare" in set(capped.category)  # categories take turns
    assert capped.equals(branching.select_spikes(spikes, "ck", max_spikes=4, seed=1))


def test_controls_are_entropy_matched_non_spikes_preferring_the_same_rollout():
    tokens = token_table()
    spikes = spikes_table(tokens, [("p0#0", 5), ("p0#0", 11), ("p1#1", 7)])
    controls = branching.match_controls(spikes, tokens, spikes, caliper=0.3, gap=2, seed=0)
    assert len(controls) == 3 and controls[["rollout_id", "pos"]].drop_duplicates().shape[0] == 3
    entropy = tokens.set_index(["rollout_id", "pos"]).entropy_ref
    spike_keys = set(zip(spikes.rollout_id, spikes.pos))
    for c in controls.itertuples():
        assert (c.rollout_id, c.pos) not in spike_keys
        assert all(abs(c.pos - p) > 2 for r, p in spike_keys if r == c.rollout_id)
        assert c.pos != 0 and c.pos != 29  # neither the first token nor EOS
        gap = abs(entropy[(c.rollout_id, c.pos)] - entropy[(c.spike_rollout_id, c.matched_pos)])
        assert gap == pytest.approx(c.entropy_gap) and gap <= 0.3
        assert c.match == "same_rollout" and c.rollout_id == c.spike_rollout_id
        # the closest candidate of its rollout that no other spike took
        cand = tokens[(tokens.rollout_id == c.rollout_id) & (tokens.pos > 0) & (tokens.pos < 29)]
        cand = cand[[all(abs(p - q) > 2 for r, q in spike_keys if r == c.rollout_id) for p in cand.pos]]
        best = (cand.entropy_ref - entropy[(c.spike_rollout_id, c.matched_pos)]).abs().min()
        assert c.entropy_gap <= best + 1e-12 or len(controls[controls.rollout_id == c.rollout_id]) > 1


def test_controls_fall_back_to_the_problem_then_to_any_problem():
    tokens = token_table(length=6)
    lone = tokens[(tokens.rollout_id == "p0#0") & (tokens.pos.isin([2, 3]))].copy()
    others = tokens[tokens.rollout_id != "p0#0"]
    spikes = spikes_table(tokens, [("p0#0", 2)])
    tokens_without_room = pd.concat([lone, others])
    controls = branching.match_controls(spikes, tokens_without_room, spikes, caliper=10, gap=1)
    assert controls.match.tolist() == ["same_problem"]
    far = tokens_without_room[tokens_without_room.problem_id != "p0"]
    controls = branching.match_controls(spikes, pd.concat([lone, far]), spikes, caliper=10, gap=1)
    assert controls.match.tolist() == ["other_problem"]
    assert branching.match_controls(spikes, pd.concat([lone, far]), spikes, caliper=0.0, gap=1).empty \
        or (far.entropy_ref == lone.entropy_ref.iloc[0]).any()


def test_arms_and_effects():
    tokens = token_table()
    pts = pd.DataFrame({"rollout_id": ["p0#0", "p0#0"], "problem_id": "p0", "pos": [4, 6],
                        "category": "number"})
    arms = branching.branch_arms(pts, tokens, "spike", exclude={EOS})
    assert arms.arm.tolist() == ["keep", "substitute"] * 2
    at = tokens.set_index(["rollout_id", "pos"])
    for a in arms[arms.arm == "substitute"].itertuples():
        t = at.loc[(a.rollout_id, a.pos)]
        assert a.substituted_id == [i for i in t.topk_ids_ckpt if i != t.token_id][0]
        assert a.written_id == t.token_id
    counted = arms.assign(model="ck", n=8, passes=[1, 6, 4, 4])
    eff = branching.effects(counted)
    assert eff.effect.tolist() == pytest.approx([5 / 8, 0.0])
    assert (eff.effect_low <= eff.effect).all() and (eff.effect <= eff.effect_high).all()
    assert eff.effect_low.iloc[0] > 0 and eff.effect_low.iloc[1] < 0 < eff.effect_high.iloc[1]


def test_plan_covers_spikes_controls_grid_and_policies():
    tokens = token_table()
    rollouts = pd.DataFrame([{"rollout_id": rid, "problem_id": g.problem_id.iloc[0],
                              "response_ids": g.sort_values("pos").token_id.tolist()}
                             for rid, g in tokens.groupby("rollout_id")])
    spikes = spikes_table(tokens, [("p0#0", 5), ("p1#1", 7)])
    controls = branching.match_controls(spikes, tokens, spikes)
    cases = plan.case_studies(spikes, 1)
    built = plan.build(spikes, controls, tokens, rollouts, {"ck": None, "ref": {"p1"}},
                       case_study_ids=cases, grid_points=4, special={EOS})
    ck, ref = built[built.model == "ck"], built[built.model == "ref"]
    assert len(ck[ck.kind == "spike"]) == 4 and len(ck[ck.kind == "control"]) == 4
    assert sorted(ck[ck.kind == "grid"].pos) == [0, 10, 19, 29]  # EOS (token 29) left out: k <= 29
    assert set(ref.problem_id) == {"p1"}
    assert plan.cost(built, 8).continuations.sum() == 8 * len(built)
    kept = built.pos + (built.arm != "prefix")
    assert plan.cost(built, 8, 40).max_new_tokens.sum() == 8 * (40 - kept).clip(lower=0).sum()


def test_departures_stand_in_for_spikes_one_per_rollout():
    tokens = token_table().assign(checkpoint="ck", group="target")
    rng = np.random.default_rng(1)
    tokens["kl_ref_ckpt"], tokens["kl_ckpt_ref"] = rng.exponential(size=(2, len(tokens)))
    tokens.loc[tokens.pos == 0, "kl_ref_ckpt"] = 99.0  # first tokens and EOS never count
    tokens.loc[tokens.is_eos, "kl_ckpt_ref"] = 99.0
    got = branching.select_departures(tokens, "ck", count=3)
    assert len(got) == 3 and got.rollout_id.is_unique
    assert not got.first_token.any() and not got.is_eos.any()
    eligible = tokens[~tokens.first_token & ~tokens.is_eos]
    best = (eligible.kl_ref_ckpt + eligible.kl_ckpt_ref).groupby(eligible.rollout_id).max()
    strength = (got.kl_ref_ckpt + got.kl_ckpt_ref).to_numpy()
    assert sorted(strength) == pytest.approx(sorted(best.nlargest(3)))
    assert set(got.category) == {"unclassified"}


def test_effects_of_departures_are_labelled_as_departures():
    rows = [{"model": "ck", "kind": kind, "rollout_id": f"r{i}", "pos": i, "problem_id": f"p{i % 4}",
             "category": "word", "effect": 0.1 * i} for i in range(8)
            for kind in (["departure"] if i % 2 else ["control"])]
    got = branching.by_category(pd.DataFrame(rows), n_boot=200)
    assert set(got.estimate) == {"departure", "control", "departure - control"}
    with pytest.raises(ValueError, match="one kind"):
        branching.by_category(pd.DataFrame(rows).assign(kind=["spike", "departure"] * 4))
    assert branching.by_category(pd.DataFrame(rows).iloc[:0]).empty

"""Acceptance 2 (power and precision by planted effect size) and 4a (sign classes).

Spikes are planted at 2% of the distinct contexts, as logit changes whose KL(ref‖ckpt)
alone is exactly 0.1, 0.25, 0.5, 1, 2 or 4 nats (rejections, endorsements and
redistributions in turn; the two smallest show where the recall curve bends); the
checkpoint's entropy-scaled noise is added on top. The detector runs with its
defaults (q = 0.05, min_effect = 0.1 nats).
"""

from __future__ import annotations

import pandas as pd
import pytest

from rlprobe_nb.spikes import detect, simulate

KLS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
DRIFT = 0.5


@pytest.fixture(scope="module")
def planted_runs():
    out = []
    for seed in (51, 52):
        ctx = simulate.make_contexts(n_problems=60, rollouts=3, length=(30, 70), vocab=128,
                                     seed=seed)
        plants = simulate.choose_plants(ctx, 0.02, kls=KLS, seed=seed).assign(step=0)
        table = simulate.simulate_tables(ctx, [DRIFT], plants=plants, seed=seed)
        tests = detect(table)
        per_ctx = tests.drop_duplicates("context_id").set_index("context_id")
        plants = plants.assign(context_id=ctx.context_id[plants.ctx])
        plants["found"] = per_ctx.significant.reindex(plants.context_id).to_numpy()
        plants["sign"] = per_ctx.sign.reindex(plants.context_id).to_numpy()
        discovered = set(per_ctx.index[per_ctx.significant])
        out.append((plants, discovered, len(per_ctx)))
    return out


def test_recall_and_precision_by_planted_kl(planted_runs):
    plants = pd.concat([p for p, _, _ in planted_runs])
    recall = plants.groupby("kl").found.mean()
    by_kind = plants.groupby(["kind", "kl"]).found.mean().unstack()
    # Precision at KL >= 1: discoveries that are not plants below 1 nat, and how many of
    # those are plants (a smaller plant found is neither false nor counted).
    small = {c for p, _, _ in planted_runs for c in p.context_id[p.kl < 1]}
    big = {c for p, _, _ in planted_runs for c in p.context_id[p.kl >= 1]}
    called = set().union(*(d for _, d, _ in planted_runs)) - small
    precision = len(called & big) / max(len(called), 1)
    print(f"\nplanted at 2% of {sum(n for _, _, n in planted_runs)} contexts "
          f"(2 tables), drift {DRIFT}: recall by KL(ref‖ckpt) of the plant")
    print(recall.to_string())
    print(by_kind.round(3).to_string())
    print(f"precision among discoveries of KL >= 1 (and unplanted): {precision:.3f} "
          f"({len(called & big)} of {len(called)})")
    assert (recall[recall.index >= 1] >= 0.9).all()
    assert precision >= 0.9


def test_planted_signs_are_classed_right(planted_runs):
    plants = pd.concat([p for p, _, _ in planted_runs])
    found = plants[plants.found & plants.kind.isin(["rejects", "endorses"])]
    right = (found.sign == found.kind).groupby(found.kind).mean()
    redistributed = plants[plants.found & (plants.kind == "redistributes")]
    print(f"\nsign right among found plants: {right.round(3).to_dict()}, redistributes "
          f"{(redistributed.sign == 'redistributes').mean():.3f}")
    assert len(found) > 100
    assert (right >= 0.95).all()

"""Acceptance 4b: onset, persistence and sign across training steps.

Unit cases of the onset rule on hand-built series, then spikes planted in 5 synthetic
checkpoints: persistent ones starting at step k, transients present at one step only,
and sign flips (a rejection that becomes an endorsement)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.spikes import across_steps, detect, simulate

STEPS = [100, 200, 300, 400, 500]


def _series(pattern: str) -> pd.DataFrame:
    """One (context, token) pair over STEPS: '.' not a spike, 'r'/'e'/'d' a spike that
    rejects / endorses / redistributes."""
    sign = {"r": "rejects", "e": "endorses", "d": "redistributes", ".": "redistributes"}
    return pd.DataFrame({"context_id": 1, "token_id": 2, "step": STEPS,
                         "significant": [c != "." for c in pattern],
                         "sign": [sign[c] for c in pattern]})


@pytest.mark.parametrize("pattern,onset,persistence", [
    ("..rrr", 300, "persistent"),
    ("r.rrr", 300, "persistent"),
    ("rr...", None, "transient"),
    ("..r..", None, "transient"),
    ("rreee", 300, "sign_flip"),
    ("rrrdd", 400, "persistent"),  # a change of sign class restarts the run
    ("....e", 500, "persistent"),
    ("eeeee", 100, "persistent"),
])
def test_onset_rule(pattern, onset, persistence):
    out = across_steps.onsets(_series(pattern)).iloc[0]
    assert (pd.isna(out.onset_step) if onset is None else out.onset_step == onset)
    assert out.persistence == persistence


@pytest.fixture(scope="module")
def five_checkpoints():
    ctx = simulate.make_contexts(n_problems=40, rollouts=3, length=(30, 70), vocab=128, seed=61)
    chosen = simulate.choose_plants(ctx, 0.03, kls=(2.0,), kinds=("rejects", "endorses"),
                                    seed=61)
    n = len(chosen)
    role = np.array(["persistent"] * (n - n // 4) + ["transient"] * (n // 8)
                    + ["flip"] * (n - (n - n // 4) - n // 8))
    rows = []
    for i, plant in chosen.reset_index(drop=True).iterrows():
        if role[i] == "persistent":
            k = i % len(STEPS)
            rows += [(plant.ctx, plant.kind, plant.kl, s, STEPS[k]) for s in range(k, len(STEPS))]
        elif role[i] == "transient":
            rows.append((plant.ctx, plant.kind, plant.kl, 2, None))
        elif plant.kind == "rejects":  # a flip needs a rejection-eligible token
            rows += [(plant.ctx, "rejects", plant.kl, s, 100) for s in (0, 1)]
            rows += [(plant.ctx, "endorses", plant.kl, s, 300) for s in (2, 3, 4)]
    plants = pd.DataFrame(rows, columns=["ctx", "kind", "kl", "step", "onset"])
    plants["role"] = plants.ctx.map(dict(zip(chosen.ctx, role)))
    table = simulate.simulate_tables(ctx, [0.3, 0.35, 0.4, 0.45, 0.5], STEPS, plants, seed=61)
    tests = detect(table)
    found = across_steps.onsets(across_steps.series(tests)).set_index("context_id")
    plants["context_id"] = ctx.context_id[plants.ctx]
    return plants, found, tests


def test_planted_onsets_are_found(five_checkpoints):
    plants, found, _ = five_checkpoints
    persistent = plants[plants.role == "persistent"].drop_duplicates("ctx")
    got = found.onset_step.reindex(persistent.context_id).to_numpy()
    right = np.array([g == k if not pd.isna(g) else False
                      for g, k in zip(got, persistent.onset)])
    by_onset = pd.Series(right).groupby(persistent.onset.to_numpy()).mean()
    print(f"\nonset right for {len(persistent)} persistent plants (KL 2 nats): "
          f"{right.mean():.3f}; by planted onset {by_onset.round(3).to_dict()}")
    assert len(persistent) >= 40
    assert right.mean() >= 0.95


def test_planted_transients_and_flips_are_classed(five_checkpoints):
    plants, found, _ = five_checkpoints
    for role, expected in (("transient", "transient"), ("flip", "sign_flip")):
        ids = plants[plants.role == role].drop_duplicates("ctx").context_id
        got = found.persistence.reindex(ids)
        print(f"{role}: {len(ids)} planted, classed {got.value_counts().to_dict()}")
        assert len(ids) >= 5
        assert (got == expected).mean() >= 0.95


def test_signs_are_right_at_every_step(five_checkpoints):
    plants, _, tests = five_checkpoints
    at = plants.merge(tests[["context_id", "step", "sign", "significant"]]
                      .assign(step_index=lambda d: d.step.map({s: i for i, s in enumerate(STEPS)})),
                      left_on=["context_id", "step"], right_on=["context_id", "step_index"])
    at = at[at.significant]
    assert len(at) > 200
    assert (at.sign == at.kind).mean() >= 0.95

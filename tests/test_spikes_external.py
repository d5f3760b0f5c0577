"""The external null (``spikes.external``) on simulated runs: a checkpoint and a placebo
made by the same mechanism over the same contexts (reference logits plus entropy-scaled
Gaussian noise, ``spikes.simulate``, independent noise for each run) — a mechanism the
null does not model (it standardises log-divergences and log-odds changes by robust
regressions and continues their statistic's tail exponentially)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.spikes import detect, simulate

DRIFT = 0.5


def _run(ctx, seed, plants=None, drift=DRIFT):
    return simulate.simulate_tables(ctx, [drift], plants=plants, seed=seed)


@pytest.fixture(scope="module")
def contexts():
    return simulate.make_contexts(n_problems=40, rollouts=3, length=(30, 70), vocab=128, seed=61)


def test_a_run_like_its_placebo_gets_uniform_p_values(contexts):
    shares, any_found = [], []
    for seed in range(4):
        tested, placebo = _run(contexts, 100 + seed), _run(contexts, 200 + seed)
        tests = detect(tested, nulls={"step_100": placebo}, min_effect=0.0)
        assert (tests.null == "step_100").all()
        p = tests.drop_duplicates("context_id").p.to_numpy()
        shares.append((np.mean(p <= 0.01), np.mean(p <= 0.05)))
        any_found.append(tests.significant.any())
    shares = np.array(shares)
    print(f"\nexternal null, run vs placebo, 4 pairs of ~{len(p)} contexts: share p <= 0.01 "
          f"{shares[:, 0].round(4)}, <= 0.05 {shares[:, 1].round(3)}, any BH discovery {any_found}")
    assert shares[:, 0].mean() <= 0.015 and shares[:, 1].mean() <= 0.065
    assert sum(any_found) <= 1


def test_plants_beyond_the_placebo_are_found_and_signed(contexts):
    chosen = simulate.choose_plants(contexts, 0.02, kls=(1.0, 2.0, 4.0), kinds=("rejects",),
                                    seed=62).assign(step=0)
    tested, placebo = _run(contexts, 301, chosen), _run(contexts, 302)
    tests = detect(tested, nulls={"step_100": placebo}).drop_duplicates("context_id")
    planted = set(contexts.context_id[chosen.ctx])
    found = tests[tests.context_id.isin(planted)]
    spikes = tests[tests.significant]
    precision = spikes.context_id.isin(planted).mean()
    by_kl = found.assign(kl=chosen.set_index(contexts.context_id[chosen.ctx]).kl.reindex(
        found.context_id).to_numpy()).groupby("kl").significant.mean()
    print(f"\nexternal null, rejections planted at 2% of {len(tests)} contexts: recall by KL "
          f"{by_kl.round(3).to_dict()}, precision {precision:.3f} of {len(spikes)}")
    assert (by_kl[by_kl.index >= 2] >= 0.9).all()
    assert precision >= 0.9
    assert (found[found.significant].sign == "rejects").mean() >= 0.95


def test_a_placebo_that_drifted_less_makes_the_run_spike_everywhere(contexts):
    """The assumption the null rests on, shown failing: a placebo that moved less than the
    run for reasons other than the reward (here: a smaller drift) calls ordinary drift a
    spike. The notebook says so; the placebo must be the same training."""
    tested, timid = _run(contexts, 401), _run(contexts, 402, drift=DRIFT / 4)
    many = detect(tested, nulls={"step_100": timid}).drop_duplicates("context_id")
    fair = detect(tested, nulls={"step_100": _run(contexts, 403)}).drop_duplicates("context_id")
    print(f"\nspike share against a placebo of a quarter of the drift: "
          f"{many.significant.mean():.3f}; against one of the same drift: {fair.significant.mean():.4f}")
    assert many.significant.mean() > 0.1 > 10 * fair.significant.mean()


def test_nulls_for_an_unknown_checkpoint_are_refused(contexts):
    tested = _run(contexts, 501)
    with pytest.raises(KeyError, match="step_999"):
        detect(tested, nulls={"step_999": tested})


def test_checkpoints_without_a_placebo_keep_the_internal_null(contexts):
    a = _run(contexts, 601).assign(checkpoint="with", step=100)
    b = _run(contexts, 602).assign(checkpoint="without", step=200)
    tests = detect(pd.concat([a, b], ignore_index=True), nulls={"with": _run(contexts, 603)})
    assert tests.groupby("checkpoint").null.first().to_dict() == {"with": "step_100",
                                                                  "without": "internal"}

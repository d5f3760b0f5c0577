"""The verdicts chapters 04 and 05 write under the comparisons they set up, and their
opening findings, read from small tables (issue 41): "higher" only where the intervals are
apart, every number from the table."""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.divergence import narrative
from rlprobe_nb.spikes import verdicts


def rates(target=(0.30, 0.25, 0.35), other=(0.10, 0.05, 0.15), problems=12):
    rows = [("target", *target), ("ref_right", *other), ("control", *other)]
    frame = pd.DataFrame([{"checkpoint": "c", "step": 800, "group": g, "contexts": 100,
                           "problems": problems, "spikes": 10, "rate": r, "low": lo, "high": hi}
                          for g, r, lo, hi in rows])
    return frame.assign(**{"spike rate": [f"{r:.3g} [{lo:.3g}, {hi:.3g}]" for _, r, lo, hi in rows]})


def test_the_spike_rate_verdict_says_higher_only_where_the_intervals_are_apart():
    apart = verdicts.say_group_rates(rates())
    assert "`ref_right` 0.1 [0.05, 0.15] (higher)" in apart and "about the reference's wrong" in apart
    overlap = verdicts.say_group_rates(rates(other=(0.2, 0.1, 0.3)))
    assert "(not told apart)" in overlap and "in general" in overlap
    few = verdicts.say_group_rates(rates(problems=2))
    assert "(not told apart)" in few, "no interval from too few problems, so no claim"


def onsets(rows):
    return pd.DataFrame([{"scheme": "ground_truth", "category": c, "status": s, "onset_step": o,
                          "direction": d, "step": o or 1200, "mean_departure": m, "problems": 30,
                          "rows": 99} for c, s, o, d, m in rows])


def test_the_finding_reads_the_onset_the_first_wrong_digits_and_the_placebo():
    rlvr = onsets([("result_first_wrong", "onset", 400, "rejects", "-1.23 [-1.9, -0.6]"),
                   ("format", "no lasting change", None, "", "+0.01 [-0.1, 0.1]")])
    placebo = onsets([("result_first_wrong", "onset", 100, "rejects", "-0.5 [-0.9, -0.1]"),
                      ("format", "onset", 100, "endorses", "+0.3 [0.1, 0.5]")])
    counts = {"step": 1200, "group": "target", "digits": 37, "problems": 20, "spikes": 30,
              "lowering": 28}
    text = verdicts.finding(rlvr, placebo, counts, separation=200)
    assert "From step 400 on, the RLVR run lowers" in text and "-1.23 [-1.9, -0.6]" in text
    assert "30 of the 37 first wrong digits" in text and "28 of them lowering" in text
    assert "(the placebo run) 2 of 2 ground-truth labels change lastingly too" in text
    assert "the first wrong digits' is, from step 400." in text
    verdict = verdicts.say_placebo_verdict(rlvr, placebo)
    assert "every kind of token (all 2 labels, from step 100)" in verdict and "from step 400" in verdict
    none = verdicts.finding(onsets([("result_first_wrong", "no lasting change", None, "", "0 [-1, 1]")]),
                            placebo, None, None)
    assert "no lasting change" in none and "the first wrong digits show none." in none
    assert "do not change beyond the placebo" in verdicts.say_placebo_verdict(
        onsets([("result_first_wrong", "no lasting change", None, "", "0 [-1, 1]")]), placebo)


def test_04s_group_verdict_and_finding_come_from_its_tables():
    when = pd.DataFrame([{"group": g, "metric": "kl_ref_ckpt", "step": 800, "checkpoint": "c",
                          "estimate": e, "low": lo, "high": hi, "problems": 12, "rows": 500}
                         for g, e, lo, hi in (("target", 0.5, 0.4, 0.6), ("ref_right", 0.45, 0.3, 0.55),
                                              ("control", 0.1, 0.05, 0.2))])
    said = narrative.say_group_verdict(when)
    assert "'ref_right'" in said and "'target' not told apart" in said and "'target' higher" in said
    assert "in general" in said
    phases = pd.DataFrame([{"group": "target", "category": c, "status": "onset", "onset_step": s,
                            "direction": -1, "step": s, "estimate": e, "low": e - 0.5,
                            "high": e + 0.4, "problems": 12, "most_problems": 12}
                           for c, s, e in (("result_first_wrong", 200, -2.0), ("format", 800, -0.6))])
    gt = pd.DataFrame([{"group": "target", "statistic": "dlogp_mean", "category": "result_first_wrong",
                        "step": s, "estimate": e, "low": e - 1, "high": e + 1, "problems": 12}
                       for s, e in ((200, -2.0), (800, -5.0))])
    finding = narrative.say_finding(when, phases, gt)
    assert "most are 'result_first_wrong': from step 200 on they lower" in finding
    assert "(Δlogp -2.00 [-2.50, -1.60] nats at step 200, -5.00 [-6.00, -4.00] nats at step 800)" in finding
    assert "1 other label changes lastingly too, by at most 0.600 nats" in finding
    assert "At step 800 the mean KL(ref‖ckpt) is 0.500 [0.400, 0.600] nats" in finding

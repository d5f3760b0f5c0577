"""Counterfactual branching: does a token decide the answer?

Divergence says where a checkpoint *would* write something else, not that it matters.
Here a model continues a reference rollout from a prefix many times, and the
continuations are graded:

    points            where to branch: the checkpoint's disagreements (its top-1 a real
                      alternative to the written token), labels drawn in turn, spikes
                      first (format tokens only on request), the checkpoint's real
                      alternative at each token, the correct digit at first wrong digits
    continuations     seeded continuations of prompt + response[:k] (+ a swapped token),
                      the prefix's key/value cache shared by its n samples; ended at EOS,
                      a limit, or (on request) the first box they close
    passes            a plan of contexts -> graded pass counts with Wilson intervals
    branching         keep vs top-1 alternative vs correct digit; entropy- and
                      category-matched controls from the same rollout; effects with
                      Newcombe intervals; means clustered by problem
    by_label          the answer by label: the checkpoint at its disagreement points, the
                      placebo at the same contexts and at its own, side by side
    narrative         the positive control's and the main result's sentences, through
                      ``reporting`` (no interval from fewer than five problems)
    takeover          takeover curves (pass rate by prefix length) and where they drop
    intervals         Newcombe's interval; bootstrap difference of two means by problem
    plan              what is sampled (points' arms, controls, takeover grids) and its cost
    table             the ``branches`` table: keyed on the token tables, resumable shards
    edits, positive_control   planted wrong results: a takeover curve must drop where
                      they are (a slow test of the takeover curves)
    charts            takeover curves, the positive control point by point, forest plot
"""

from rlprobe_nb.counterfactuals import (  # noqa: F401
    branching,
    by_label,
    charts,
    continuations,
    edits,
    intervals,
    narrative,
    passes,
    plan,
    points,
    positive_control,
    table,
    takeover,
)

"""Counterfactual branching: does the token where a checkpoint disagrees decide the answer?

Divergence says where a checkpoint *would* write something else, not that it matters.
Here a model continues a reference rollout from a prefix many times, and the
continuations are graded:

    continuations     seeded continuations of prompt + response[:k] (+ a swapped token),
                      the prefix's key/value cache shared by its n samples
    passes            a plan of contexts -> graded pass counts with Wilson intervals
    takeover          takeover curves (pass rate by prefix length) and where they drop
    branching         keep vs substitute at spikes (or, where none is significant, the
                      strongest departures, labelled so) and entropy-matched controls;
                      effects with Newcombe intervals, by category with a bootstrap over
                      problems
    intervals         Newcombe's interval; bootstrap difference of two means by problem
    plan              what is sampled (points, controls, takeover grids) and its cost
    table             the ``branches`` table: keyed on the token tables, resumable shards
    edits, positive_control   planted wrong results: the drop must be where they are
    charts            takeover curves with spikes marked; forest plot by category
"""

from rlprobe_nb.counterfactuals import (  # noqa: F401  # noqa: F401
    branching,
    charts,
    continuations,
    edits,
    intervals,
    passes,
    plan,
    positive_control,
    table,
    takeover,
)

"""The tokens other chapters' pages link to, so that the viewer's page holds them.

A link from chapter 05 or 06 (``viewer_links``) opens, in an exported page, the viewer's
page at ``#open=<rollout>:<pos>``. Without a kernel that page cannot open a rollout on
demand, so it holds the rollouts of every token those pages link to (``page_viewer``):
the cases chapter 06 picks with its default rule, and the strongest spikes and the
strongest departures chapter 05 lists with its default parameters (read from its
``spikes`` and ``spike_tests`` tables). A link to a token it does not hold (05 or 06 run
with other parameters, say) lands on a note at the viewer saying how to open it.
"""

from __future__ import annotations

import pandas as pd


def linked_targets(tokens: pd.DataFrame, spikes: pd.DataFrame | None,
                   tests: pd.DataFrame | None = None, n_top: int = 12) -> pd.DataFrame:
    """(rollout_id, pos, why) of every token the other chapters' pages link to by default:
    chapter 06's cases (its default rule), chapter 05's strongest spikes and strongest
    departures (``n_top`` each, its default; the departures from its tests, ``tests``)."""
    from rlprobe_nb.render import case_studies
    from rlprobe_nb.spikes.table import strongest_departures, top_spikes

    rows = []
    choices = case_studies.select_cases(tokens, spikes if spikes is not None else pd.DataFrame(
        columns=["checkpoint", "rollout_id", "pos", "significant"]), case_studies.CaseRule())
    for c in choices.itertuples(index=False):
        rows.append((c.rollout_id, int(c.pos), f"chapter 06, case {c.case}: {c.reason}"))
    if spikes is not None and len(spikes) and {"statistic", "divergence", "step", "significant"} <= set(spikes.columns):
        for r in top_spikes(spikes, n=n_top).itertuples(index=False):
            rows.append((r.rollout_id, int(r.pos), "chapter 05, one of the strongest spikes"))
    if tests is not None and len(tests):
        for r in strongest_departures(tests, n=n_top).itertuples(index=False):
            rows.append((r.rollout_id, int(r.pos), "chapter 05, one of the strongest departures"))
    out = pd.DataFrame(rows, columns=["rollout_id", "pos", "why"])
    return out.drop_duplicates(["rollout_id", "pos"]).reset_index(drop=True)

"""The tokens other chapters' pages link to, so that the viewer's page holds them.

A link from chapter 05 or 06 (``viewer_links``) opens, in an exported page, the viewer's
page at ``#open=<rollout>:<pos>``. Without a kernel that page cannot open a rollout on
demand, so it holds the rollouts of every token those pages link to (``page_viewer``):
the cases chapter 06 picks with its default rule, and the strongest spikes and the
strongest departures chapter 05 lists (the departures from its ``spike_departures``
table). A link to a token it does not hold (06 run with another rule, say) lands on a note
at the viewer saying how to open it.
"""

from __future__ import annotations

import pandas as pd


def linked_targets(tokens: pd.DataFrame, spikes: pd.DataFrame | None,
                   departures: pd.DataFrame | None = None, n_top: int = 12) -> pd.DataFrame:
    """(rollout_id, pos, why) of every token the other chapters' pages link to by default:
    chapter 06's cases (its default rule), chapter 05's strongest spikes (``n_top``, its
    default) and its strongest departures (``departures``, as chapter 05 wrote them)."""
    from rlprobe_nb.render import case_studies

    rows = []
    choices = case_studies.select_cases(tokens, spikes if spikes is not None else pd.DataFrame(
        columns=["checkpoint", "rollout_id", "pos", "significant"]), case_studies.CaseRule())
    for c in choices.itertuples(index=False):
        rows.append((c.rollout_id, int(c.pos), f"chapter 06, case {c.case}: {c.reason}"))
    if spikes is not None and len(spikes) and {"statistic", "divergence", "step", "significant"} <= set(spikes.columns):
        from rlprobe_nb.spikes.table import top_spikes

        for r in top_spikes(spikes, n=n_top).itertuples(index=False):
            rows.append((r.rollout_id, int(r.pos), "chapter 05, one of the strongest spikes"))
    for r in (departures if departures is not None else pd.DataFrame(columns=["rollout_id", "pos"])).itertuples():
        rows.append((r.rollout_id, int(r.pos), "chapter 05, one of the strongest departures"))
    out = pd.DataFrame(rows, columns=["rollout_id", "pos", "why"])
    return out.drop_duplicates(["rollout_id", "pos"]).reset_index(drop=True)

"""The detector on a placebo's own table, where the only departures it should call
spikes are the ones planted.

A placebo run holds no information about correctness, so a placebo checkpoint's table,
tested as an RLVR checkpoint is tested (against a placebo's departures), should give
(almost) no spikes; with rejections planted in it (``plants``), the spikes should be
the plants. The suite has one placebo run, so the placebo's null is the placebo itself on
other problems: its problems split at random into two halves, each half tested against
the other (``external.problem_halves``), the plants put in the tested half. Per
checkpoint and plant size: the plants found, and per split (both halves together, so
every context is tested once) the discoveries outside the plants, with and without
plants. BH at level q keeps false discoveries near q of all discoveries when the null's
p-values are right in their far tail; this check reads that share on real departures.
A placebo with a few real departures shows them as discoveries outside the plants; one
that departs at many contexts widens its own null, and the plants are lost instead (a low
recall): the chapter's onset tables show a placebo that changed everywhere.
"""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.spikes import external, plants
from rlprobe_nb.spikes.detector import detect
from rlprobe_nb.statistics import seed_from

COLUMNS = ["checkpoint", "step", "null", "d", "plants", "found", "recall", "other_per_split",
           "other_share", "unplanted_per_split"]


def placebo_plant_check(placebo: pd.DataFrame, sizes=(-1.0, -3.0), n: int = 10,
                        splits: int = 2, seed: int = 0, **detect_kw) -> pd.DataFrame:
    """Per placebo checkpoint and plant size (see the module docstring): ``splits``
    halvings of its problems, ``n // 2`` plants of each size in each half (``n`` per split,
    the density of ``plants.plant_check``'s tables). ``other_share``: the discoveries
    outside the plants over all discoveries of the planted halves, all sizes together;
    ``unplanted_per_split``: the placebo's spikes tested as if it were the RLVR run."""
    if placebo is None or placebo.empty:
        return pd.DataFrame(columns=COLUMNS)
    out = []
    for ckpt, rows in placebo.groupby("checkpoint", sort=False):
        rows = rows.reset_index(drop=True)
        if rows.problem_id.nunique() < 4:
            print(f"{ckpt}: {rows.problem_id.nunique()} problems, too few to split into two "
                  "halves: no plants in its table")
            continue
        for i, (tested, null) in enumerate(external.problem_halves(rows, splits, seed)):
            half = rows[tested].reset_index(drop=True)
            planted, where = plants.plant_sizes(half, sizes, n // 2, seed_from(seed, ckpt, i),
                                                strict=False)
            found = plants.recall(detect(planted, nulls={ckpt: rows[null]}, **detect_kw), where)
            unplanted = detect(half, nulls={ckpt: rows[null]}, **detect_kw)
            out.append(found.assign(checkpoint=ckpt, step=int(rows.step.iloc[0]),
                                    unplanted=unplanted[unplanted.significant].context_id.nunique()))
    if not out:
        return pd.DataFrame(columns=COLUMNS)
    per = pd.concat(out, ignore_index=True)
    # other_discoveries and unplanted are per half-test, repeated on each size's row
    per = per.groupby(["checkpoint", "d"], sort=False).agg(
        step=("step", "first"), plants=("plants", "sum"), found=("found", "sum"),
        other=("other_discoveries", "sum"), unplanted=("unplanted", "sum")).reset_index()
    per["recall"] = per.found / per.plants
    found_all = per.groupby("checkpoint").found.transform("sum")
    per["other_per_split"] = per.other / splits
    per["other_share"] = (per.other / (per.other + found_all)).fillna(0.0)
    per["unplanted_per_split"] = per.unplanted / splits
    per["null"] = "the other half of its problems"
    return per.sort_values(["step", "d"], ascending=[True, False]).reset_index(drop=True)[COLUMNS]

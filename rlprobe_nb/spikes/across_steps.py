"""A spike followed across training steps: its series, its onset, its persistence class.

The unit followed is a (context, written token) pair: the same forced text is compared
at every checkpoint, so its ``context_id`` is the same at every step. For every pair that
is a spike at one step or more, the series holds its row at *every* step (significant
or not): divergence, dlogp, rank of the written token, sign, and what it moved to.

- **onset**: the first step at which the pair is a spike and stays a spike with the same
  sign at every later step (none if it is not a spike at the last step);
- **persistence**: ``sign_flip`` if it was a rejection at some step and an endorsement at
  another; else ``persistent`` if it has an onset; else ``transient`` (a spike that
  does not last to the last step). A spike new at the last step is ``persistent`` by
  this definition: with no later step, nothing contradicts it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

KEY = ["context_id", "token_id"]
PERSISTENCE = ("persistent", "transient", "sign_flip")
_SIGN_CODE = {"rejects": 0, "endorses": 1, "redistributes": 2}


def series(tests: pd.DataFrame) -> pd.DataFrame:
    """Every row, at every step, of the (context, written token) pairs that are a spike at
    one step or more; sorted by pair and step."""
    if "step" not in tests:
        raise KeyError("tests need a 'step' column (suite_tables.read_tokens adds it)")
    ever = tests.groupby(KEY).significant.transform("any")
    return tests[ever.to_numpy()].sort_values(KEY + ["step"], kind="stable").reset_index(drop=True)


def onsets(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (context, written token): onset_step (<NA> when none), persistence,
    first_step (first step it is a spike), n_spike_steps. ``rows`` as ``series`` returns
    them; a pair missing at a step counts as not a spike there."""
    keys = rows[KEY].drop_duplicates().reset_index(drop=True)
    if rows.empty:  # nothing was a spike at any step
        return keys.assign(onset_step=pd.array([], dtype="Int64"), persistence=pd.Series([], dtype=object),
                           first_step=pd.Series([], dtype=rows.step.dtype), n_spike_steps=0)
    steps = np.sort(rows.step.unique())
    where = pd.MultiIndex.from_frame(keys)
    idx = where.get_indexer(pd.MultiIndex.from_frame(rows[KEY]))
    col = np.searchsorted(steps, rows.step.to_numpy())
    spike = np.zeros((len(keys), len(steps)), dtype=bool)
    sign = np.full((len(keys), len(steps)), -1)
    spike[idx, col] = rows.significant.to_numpy()
    sign[idx, col] = rows.sign.map(_SIGN_CODE).to_numpy()
    same_as_last = spike & (sign == sign[:, -1:])
    # run[i, t]: the pair is a spike with its last sign at every step from t on
    run = np.flip(np.cumprod(np.flip(same_as_last, 1), axis=1), 1).astype(bool)
    has_onset = run[:, -1]
    onset = pd.array(steps[np.argmax(run, axis=1)], dtype="Int64")
    onset[~has_onset] = pd.NA
    flip = ((spike & (sign == 0)).any(1)) & ((spike & (sign == 1)).any(1))
    return keys.assign(
        onset_step=onset,
        persistence=np.where(flip, "sign_flip", np.where(has_onset, "persistent", "transient")),
        first_step=steps[np.argmax(spike, axis=1)],
        n_spike_steps=spike.sum(1))


def with_onsets(tests: pd.DataFrame) -> pd.DataFrame:
    """``series(tests)`` with each pair's onset_step and persistence on every row."""
    rows = series(tests)
    return rows.merge(onsets(rows)[KEY + ["onset_step", "persistence"]], on=KEY, how="left",
                      validate="many_to_one")


def new_persistent_per_step(spikes: pd.DataFrame, by: str | None = "category") -> pd.DataFrame:
    """How many persistent spikes (distinct contexts) begin at each step, optionally by a
    column (a missing value counts as 'uncategorised')."""
    first = spikes[(spikes.persistence == "persistent") & (spikes.step == spikes.onset_step)]
    first = first.drop_duplicates(["context_id"])
    if by is None or by not in first:
        return first.groupby("step").size().rename("new_persistent").reset_index()
    label = first[by].astype(object).where(first[by].notna(), "uncategorised")
    return (first.assign(**{by: label}).groupby(["step", by]).size()
            .rename("new_persistent").reset_index())

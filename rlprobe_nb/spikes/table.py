"""The ``spikes`` table: every (context, written token) that is a spike at one step or
more, at every step, with its test, sign, onset, persistence, region and context text.

One row per (checkpoint, context, written token). ``significant`` says whether it is a
spike at that checkpoint; the rows where it is not are its series (what the divergence,
dlogp and rank did before it appeared or after it went away). A context shared by
several rollouts is one row (``n_rollouts`` counts them; ``rollout_id``/``pos`` name the
first in rollout order).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from rlprobe_nb import views
from rlprobe_nb.divergence import token_categories
from rlprobe_nb.spikes import across_steps, regions, statistic

CONTEXT_WIDTH = 12  # tokens either side in ``context``


def spikes_table(tokens: pd.DataFrame, tests: pd.DataFrame,
                 vocab: Mapping[int, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(spikes, regions) from the token tables and ``detector.detect``'s output.

    vocab: token id -> text for the moved-to tokens (e.g. from the tokenizer); without
    it, a moved-to token is named only when some row of ``tokens`` wrote it.
    """
    rows = across_steps.with_onsets(tests)
    positions = regions.spike_positions(tokens, tests)
    spans = regions.merge_regions(positions)
    positions["region_id"] = regions.region_of(positions, spans)
    rows = rows.merge(positions[["checkpoint", "rollout_id", "pos", "region_id"]],
                      on=["checkpoint", "rollout_id", "pos"], how="left")
    moved = statistic.moved_to(tokens.loc[rows.row.to_numpy()]).reset_index(drop=True)
    rows = pd.concat([rows, moved], axis=1)
    names = dict(vocab) if vocab is not None else _written_vocab(tokens)
    rows["moved_to_token"] = rows.moved_to_id.map(names).astype(object)
    rows["context"] = _contexts(tokens, rows)
    rows["category"] = token_category(tokens, rows)
    if not spans.empty:
        spans["text"] = regions.region_text(tokens, spans)
    return rows, spans


def token_category(tokens: pd.DataFrame, rows: pd.DataFrame) -> np.ndarray:
    """Chapter 04's token category of each row's written token (``rows.row`` indexes
    ``tokens``): the token tables' own ``category`` where they carry that column, else
    classified here (``token_categories.classify``) from the tokens of the rows' rollouts,
    every token of each (a token's category can depend on its neighbours)."""
    if "category" in tokens:
        return tokens.category.loc[rows.row.to_numpy()].astype(object).to_numpy()
    if rows.empty:
        return np.array([], dtype=object)
    held = tokens[tokens.rollout_id.isin(rows.rollout_id.unique())]
    categories = token_categories.classify(held).astype(str)
    return categories.loc[rows.row.to_numpy()].to_numpy(dtype=object)


def _written_vocab(tokens: pd.DataFrame) -> dict[int, str]:
    return tokens.drop_duplicates("token_id").set_index("token_id").token.to_dict()


def _contexts(tokens: pd.DataFrame, rows: pd.DataFrame) -> pd.Series:
    """± CONTEXT_WIDTH tokens of text around each row's token (the same at every step)."""
    where = rows[["rollout_id", "pos"]].drop_duplicates()
    one = tokens[tokens.rollout_id.isin(where.rollout_id)].drop_duplicates(["rollout_id", "pos"])
    text = views.with_context(one, where, CONTEXT_WIDTH)
    lookup = pd.Series(text.to_numpy(), index=pd.MultiIndex.from_frame(where))
    return pd.Series(lookup.reindex(pd.MultiIndex.from_frame(rows[["rollout_id", "pos"]])).to_numpy(),
                     index=rows.index, dtype=object)


def to_schema(rows: pd.DataFrame, schema_name: str = "spikes",
              suite: str | None = None) -> pd.DataFrame:
    """``rows`` with exactly the columns of ``schemas.SPIKES`` (or SPIKE_REGIONS for
    schema_name="spike_regions"), in order; a column the rows lack is null (e.g. group
    in a table that has no groups)."""
    from rlprobe_nb.tables.schemas import TABLES

    schema = TABLES[schema_name]
    out = rows.copy()
    if "suite" in schema.names and "suite" not in out:
        out["suite"] = suite
    for name in schema.names:
        if name not in out:
            out[name] = None
    if "onset_step" in out:
        out["onset_step"] = out.onset_step.astype("Int64")
    return out[schema.names].reset_index(drop=True)


# A row shown to a reader as a spike or a departure must show a change a reader sees: the
# written token's probability moved by at least this much, or the token became (or stopped
# being) the most likely one. A near-certain token at 0.987 -> 1.000 can carry a large
# divergence (the last 1.3% of the mass moved) and tells a reader nothing.
MIN_VISIBLE_CHANGE = 0.05


def visible_change(frame: pd.DataFrame, min_change: float = MIN_VISIBLE_CHANGE) -> pd.Series:
    """Whether each row's written token moved visibly (``MIN_VISIBLE_CHANGE``)."""
    moved = (np.exp(frame.logp_ckpt.astype(float)) - np.exp(frame.logp_ref.astype(float))).abs()
    top = (frame.rank_ref == 1) != (frame.rank_ckpt == 1)
    return (moved >= min_change) | top


def strongest_departures(tests: pd.DataFrame, n: int = 12, step: int | None = None,
                         group: str | None = "target", min_effect: float = 0.1) -> pd.DataFrame:
    """The ``n`` contexts with the smallest p-values at ``step`` (default: the last), of
    ``group`` where the tests carry groups, whether or not they are spikes: what the
    detector ranks highest, with the q-value that says how far each is from significance.
    Left out: first response tokens (they depend on the prompt alone) and departures
    smaller than ``min_effect`` nats of divergence (the spikes' own floor: a near-certain
    token whose log-odds moved while its probability barely did is no departure)."""
    step = tests.step.max() if step is None else step
    at = tests[tests.step == step]
    if group is not None and "group" in at and (at.group == group).any():
        at = at[at.group == group]
    if "first_token" in at:
        at = at[~at.first_token.astype(bool)]
    at = at[(at.divergence >= min_effect) & visible_change(at)]
    at = at.sort_values(["p", "statistic"], ascending=[True, False]).drop_duplicates("context_id")
    cols = ["problem_id", "rollout_id", "pos", "token", "sign", "dlogp", "divergence",
            "rank_ref", "rank_ckpt", "statistic", "p", "q", "significant"]
    return at[[c for c in cols if c in at]].head(n).reset_index(drop=True)


def top_spikes(spikes: pd.DataFrame, n: int = 12, step: int | None = None) -> pd.DataFrame:
    """The ``n`` strongest spikes at ``step`` (default: the last), with what each model
    wanted there; left out: first response tokens (they depend on the prompt alone) and
    spikes whose written token did not visibly move (``visible_change``)."""
    step = spikes.step.max() if step is None else step
    at = spikes[(spikes.step == step) & spikes.significant]
    if "first_token" in at:
        at = at[~at.first_token.astype(bool)]
    at = at[visible_change(at)]
    at = at.sort_values(["statistic", "divergence"], ascending=False).head(n)
    cols = ["problem_id", "rollout_id", "pos", "sign", "context", "dlogp", "divergence",
            "rank_ref", "rank_ckpt", "moved_to_token", "moved_to_p_ref", "moved_to_p_ckpt",
            "onset_step", "persistence", "q"]
    return at[[c for c in cols if c in at]].reset_index(drop=True)


def persistence_counts(spikes: pd.DataFrame):
    """Spike contexts per step and persistence class, or a sentence when there is none."""
    from IPython.display import Markdown

    if spikes.empty or not spikes.significant.any():
        return Markdown("No spike at any step: the spikes table holds no row.")
    return (spikes[spikes.significant].groupby(["step", "persistence"]).context_id.nunique()
            .unstack(fill_value=0))


def shown(frame: pd.DataFrame, message: str):
    """``frame``, or ``message`` as a sentence when it has no row (an empty table is not a
    result)."""
    from IPython.display import Markdown

    return Markdown(f"*{message}.*") if frame.empty else frame

"""When does a kind of token start to change? Onsets by token category and ground-truth
label, read from intervals over problems.

Single tokens are tested one context at a time, and with few problems few of them reach
significance; a whole category of tokens (chapter 04's token categories, and the
ground-truth labels of the written arithmetic: ``result_first_wrong``, ``result_correct``,
``format``, ...) pools every token of its kind, so "when" has an answer even where few
single tokens are spikes.

The *departure* of a token is what the checkpoint did to the written token's probability,
Δlogp = logp_ckpt − logp_ref (nats; negative: the checkpoint rejects what the reference
wrote). Where the suite has a placebo at the step, it is the *excess* departure, Δlogp of
the RLVR checkpoint minus Δlogp of the placebo at the same token (same rollout, same
position): what the reward's information did beyond what the optimisation does without it.

A category's mean departure at a step gets a 95% interval over problems (the paired
cluster bootstrap-t of ``divergence.clustered``: tokens of one problem are not independent
draws, and one count matrix resamples the same problems at every step). Its **onset** is
the first step whose interval excludes 0 (an interval needs ``reporting.MIN_CLUSTERS``
problems) and whose sign every later step's estimate keeps: a change that comes and goes
has none. First response tokens (predicted from the prompt alone) are left out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb import reporting
from rlprobe_nb.divergence import clustered, ground_truth, token_categories

ONSET_RULE = ("the first step whose 95% interval over problems excludes 0 and whose sign every "
              "later step's estimate keeps")
SCHEMES = {"ground_truth": "ground-truth label", "token_category": "token category"}


def labels(tokens: pd.DataFrame, texts=None) -> pd.DataFrame:
    """Both labellings of every row: ``ground_truth`` (the written arithmetic checked) and
    ``token_category`` (chapter 04's classifier), aligned with ``tokens.index``."""
    return pd.DataFrame({"ground_truth": ground_truth.label(tokens, texts).astype(str),
                         "token_category": token_categories.classify(tokens, texts).astype(str)},
                        index=tokens.index)


def departures(tokens: pd.DataFrame, placebo: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (step, rollout, position) of the RLVR tables, first response tokens left
    out: ``departure`` = Δlogp, or Δlogp minus the placebo's Δlogp at the same token where
    ``placebo`` (the placebo tables, with ``step``) holds that step (``against``: the
    placebo checkpoint, or "reference")."""
    rows = tokens if "first_token" not in tokens else tokens[~tokens.first_token.astype(bool)]
    out = rows[["step", "checkpoint", "group", "problem_id", "rollout_id", "pos"]].copy()
    out["departure"] = rows.dlogp.to_numpy(np.float64)
    out["against"] = "reference"
    if placebo is None or placebo.empty:
        return out
    key = ["step", "rollout_id", "pos"]
    null = placebo[key + ["dlogp", "checkpoint"]].rename(
        columns={"dlogp": "_null", "checkpoint": "_placebo"})
    out = out.reset_index().merge(null, on=key, how="left", validate="one_to_one").set_index("index")
    has = out._placebo.notna()
    stepped = out.step.isin(placebo.step.unique())
    if (stepped & ~has).any():
        raise ValueError(f"{int((stepped & ~has).sum())} tokens have no row in the placebo table of "
                         "their step: the placebo was forced over other rollouts")
    out.loc[has, "departure"] = out.departure[has] - out._null[has]
    out.loc[has, "against"] = out._placebo[has]
    return out.drop(columns=["_null", "_placebo"])


def against_text(rows: pd.DataFrame) -> str:
    """What the departures were measured against, in words."""
    placebos = sorted(set(rows.against) - {"reference"})
    if not placebos:
        return "of each checkpoint (against the reference; the suite has no placebo run)"
    if set(rows.against) == set(placebos):
        return "of each checkpoint minus the placebo's at the same token"
    return ("minus the placebo's at the same token where a placebo exists (" + ", ".join(placebos)
            + "), else against the reference")


DEPARTURE_COLUMNS = ["scheme", "category", "step", "against", "estimate", "low", "high",
                     "problems", "rows"]


def departure_table(rows: pd.DataFrame, labelled: pd.DataFrame, group: str | None = "target",
                    seed: int = 0) -> pd.DataFrame:
    """Per labelling scheme, label (``category``) and step: the mean departure with its
    interval over problems. ``rows`` from ``departures``; ``labelled`` from ``labels``
    (aligned by index). Columns scheme, category, step, against, estimate, low, high,
    problems, rows."""
    if group is not None and "group" in rows and (rows.group == group).any():
        rows = rows[rows.group == group]
    frames = [rows.assign(scheme=scheme, category=labelled.loc[rows.index, scheme].to_numpy())
              for scheme in SCHEMES]
    work = pd.concat(frames, ignore_index=True)
    table = clustered.ratio_table(work, ["step", "category"], "departure", paired_by=("scheme",),
                                  seed=seed)
    against = rows.groupby("step").against.first()
    table["against"] = table.step.map(against)
    return table[DEPARTURE_COLUMNS]


def onsets(table: pd.DataFrame, min_clusters: int = reporting.MIN_CLUSTERS) -> pd.DataFrame:
    """Per scheme and label: ``status`` ("onset", "no lasting change", "too few problems"),
    ``onset_step`` (<NA> without one), ``direction`` ("rejects": the checkpoint lowers the
    written tokens' probability, "endorses": raises it), the estimate with its interval
    text at the onset (else at the last step), the most problems and tokens at a step."""
    out = []
    for (scheme, label), part in table.groupby(["scheme", "category"], sort=True):
        part = part.sort_values("step")
        est = part.estimate.to_numpy(np.float64)
        shown = [reporting.excludes_zero(r.estimate, r.low, r.high, int(r.problems), min_clusters)
                 for r in part.itertuples()]
        onset = next((i for i in range(len(part))
                      if shown[i] and np.all(np.sign(est[i:]) == np.sign(est[i]))), None)
        most = int(part.problems.max())
        quoted = part.iloc[onset if onset is not None else -1]
        out.append({
            "scheme": scheme, "category": label,
            "status": ("onset" if onset is not None else
                       "too few problems" if most < min_clusters else "no lasting change"),
            "onset_step": int(quoted.step) if onset is not None else pd.NA,
            "direction": (("rejects" if est[onset] < 0 else "endorses")
                          if onset is not None else ""),
            "step": int(quoted.step),
            "mean_departure": reporting.interval_text(quoted.estimate, quoted.low, quoted.high,
                                                      int(quoted.problems), signed=True),
            "problems": most, "rows": int(part.rows.max())})
    columns = ["scheme", "category", "status", "onset_step", "direction", "step",
               "mean_departure", "problems", "rows"]
    frame = pd.DataFrame(out, columns=columns)
    frame["onset_step"] = frame.onset_step.astype("Int64")
    return frame


def accuracy_separation(accuracy: pd.DataFrame, reference: str) -> int | None:
    """The first step at which a checkpoint's accuracy interval lies wholly above (or
    below) the reference's: ``accuracy`` as ``suite_tables.accuracy_table`` gives it
    (model, step, rate, low, high). None when no checkpoint separates."""
    ref = accuracy[accuracy.model == reference]
    if ref.empty:
        return None
    lo, hi = float(ref.low.iloc[0]), float(ref.high.iloc[0])
    ckpts = accuracy[(accuracy.model != reference) & accuracy.step.notna()].sort_values("step")
    apart = ckpts[(ckpts.low > hi) | (ckpts.high < lo)]
    return int(apart.step.iloc[0]) if len(apart) else None

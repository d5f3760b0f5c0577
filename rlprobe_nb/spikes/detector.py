"""The spike detector: per checkpoint, one calibrated test per distinct context, BH, a
minimum effect, and the sign of every discovery relative to the token that was written.

``detect(tokens)`` takes per-token tables (one or several checkpoints against one
reference, as ``suite_tables.read_tokens`` returns them) and returns one row per
(checkpoint, context, written token): the context's test (statistic, p, q, significant)
and the row's own sign, written share, dlogp, KLs and ranks. A context shared by several
rollouts is tested once; if the rollouts wrote different tokens there (the position where
they branch), each written token gets its row with the same test.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from rlprobe_nb.spikes import external, multiplicity, statistic
from rlprobe_nb.spikes import null as null_model

# The columns a test row carries from the token table when present.
CARRIED = ("suite", "checkpoint", "step", "reference", "group", "failure_type", "problem_id",
           "rollout_id", "pos", "context_id", "token_id", "token", "char_start", "char_end",
           "first_token", "category", "logp_ref", "logp_ckpt", "dlogp", "kl_ref_ckpt",
           "kl_ckpt_ref", "js", "entropy_ref", "entropy_ckpt", "rank_ref", "rank_ckpt")

REQUIRED = ("checkpoint", "problem_id", "rollout_id", "pos", "context_id", "token_id",
            "logp_ref", "logp_ckpt", "entropy_ref", "kl_ref_ckpt", "kl_ckpt_ref", "topk_p_ref")


def detect(tokens: pd.DataFrame, q: float = 0.05, min_effect: float = 0.1,
           divergence: str = "jeffreys", share: float = 0.5, folds: int = 5, seed: int = 0,
           null=None, nulls: Mapping[str, pd.DataFrame] | None = None,
           confidence: float = 0.95) -> pd.DataFrame:
    """Every (checkpoint, context, written token) with its context's test and its sign.

    q: BH level per checkpoint; min_effect: smallest divergence (nats, in the tested
    ``divergence``) called a spike; share: written share at or above which a departure is
    a rejection / endorsement rather than a redistribution; folds, seed: the cross-fitting
    split of problems (internal null); null: the null model (see ``null.cross_fit``;
    default ``null.SpikeNull()``); nulls: checkpoint -> the token table of its external
    null (the placebo at the same step, ``external``), forced over the same contexts;
    a checkpoint not named gets the internal null; confidence: of the lower bound on the
    tail's rate (``tail.TailModel``). ``significant`` marks the spikes; ``n_tests`` is the
    number of distinct contexts of the checkpoint (BH's m); ``null`` names the null each
    checkpoint was tested against ("internal", or the placebo checkpoint).
    """
    if not tokens.index.is_unique:
        raise ValueError("the token table's index must be unique (``row`` refers to it): "
                         "use tokens.reset_index(drop=True)")
    missing = [c for c in REQUIRED if c not in tokens]
    if missing:
        raise KeyError(f"the token table lacks {missing}: detect needs the per-token table's "
                       "columns, context_id included")
    nulls = dict(nulls or {})
    unknown = sorted(set(nulls) - set(tokens.checkpoint.unique()))
    if unknown:
        raise KeyError(f"nulls are given for {unknown}, which the token table does not hold")
    out = [_detect_checkpoint(rows, divergence, share, folds, seed, null, nulls.get(ckpt),
                              confidence)
           for ckpt, rows in tokens.groupby("checkpoint", sort=False)]
    out = pd.concat(out, ignore_index=True)
    out["significant"] = multiplicity.significant(out.q, out.divergence, q, min_effect)
    return out


def frames(rows: pd.DataFrame, divergence: str = "jeffreys"):
    """(distinct written rows, context frame, written frame) of one checkpoint's rows."""
    written = _distinct_written(rows)
    if "dlogp" not in written:  # tables written before the column existed
        written = written.assign(dlogp=(written.logp_ckpt - written.logp_ref).astype("float32"))
    first = ~written.context_id.duplicated().to_numpy()
    contexts = written[first]
    ctx_of = pd.Series(np.arange(len(contexts)), index=contexts.context_id.to_numpy())
    c_frame = statistic.reference_covariates(contexts).assign(
        problem_id=contexts.problem_id.to_numpy(),
        divergence=statistic.divergence(contexts, divergence))
    w_frame = pd.concat([statistic.reference_covariates(written),
                         statistic.written_covariates(written)], axis=1).assign(
        logodds_change=statistic.written_logodds_change(written),
        ctx=ctx_of.loc[written.context_id.to_numpy()].to_numpy())
    return written, c_frame.reset_index(drop=True), w_frame.reset_index(drop=True)


def _detect_checkpoint(rows: pd.DataFrame, divergence: str, share: float, folds: int,
                       seed: int, null, null_rows: pd.DataFrame | None,
                       confidence: float) -> pd.DataFrame:
    written, c_frame, w_frame = frames(rows, divergence)
    if null_rows is None:
        tested, z_written = null_model.cross_fit(c_frame, w_frame, null, folds, seed,
                                                 confidence=confidence)
        source = "internal"
    else:
        _, nc_frame, nw_frame = frames(null_rows, divergence)
        tested, z_written, _ = external.external_test(c_frame, w_frame, nc_frame, nw_frame,
                                                      null, confidence=confidence)
        source = str(null_rows.checkpoint.iloc[0])
    tested = tested.assign(q=multiplicity.bh_qvalues(tested.p.to_numpy()),
                           divergence=c_frame.divergence.to_numpy(), n_tests=len(c_frame),
                           null=source)
    per_row = tested.iloc[w_frame.ctx.to_numpy()].reset_index(drop=True)
    out = written[[c for c in CARRIED if c in written]].reset_index(drop=True)
    out = pd.concat([out, per_row], axis=1)
    return out.assign(z_written=z_written, n_rollouts=written.n_written.to_numpy(),
                      row=written.index.to_numpy(),  # into ``tokens``, for the top-k lists
                      written_share=statistic.written_share(written, divergence),
                      sign=statistic.sign_class(written, share, divergence))


def _distinct_written(tokens: pd.DataFrame) -> pd.DataFrame:
    """One row per (checkpoint, context, written token), the first in (rollout, pos)
    order, with ``n_written``: how many rollouts wrote that token in that context."""
    key = ["checkpoint", "context_id", "token_id"]
    ordered = tokens.sort_values(key + ["rollout_id", "pos"], kind="stable")
    counts = ordered.groupby(key, sort=False).rollout_id.transform("nunique").to_numpy()
    first = ~ordered.duplicated(key).to_numpy()
    return ordered[first].assign(n_written=counts[first])


def summary(tests: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint: the null it was tested against, tests (distinct contexts), spikes
    (distinct contexts), by sign (every sign a column, 0 where none)."""
    per_ctx = tests.drop_duplicates(["checkpoint", "context_id"])
    spikes = tests[tests.significant]
    by_sign = (spikes.groupby(["checkpoint", "sign"]).context_id.nunique().unstack(fill_value=0)
               .reindex(columns=list(statistic.SIGNS), fill_value=0))
    out = pd.DataFrame({"tests": per_ctx.groupby("checkpoint", sort=False).size(),
                        "spike_contexts": spikes.groupby("checkpoint").context_id.nunique()})
    out = out.join(by_sign).fillna(0).astype(int)
    if "null" in tests:
        out.insert(0, "null", per_ctx.groupby("checkpoint", sort=False).null.first())
    if "step" in tests:
        out.insert(0, "step", per_ctx.groupby("checkpoint", sort=False).step.first())
        out = out.sort_values("step")
    return out


def spike_rates(tests: pd.DataFrame, by: str = "group", seed: int = 0) -> pd.DataFrame:
    """Per checkpoint and ``by`` (e.g. the contrast groups): the share of distinct
    contexts that are spikes, with a 95% interval from a bootstrap over problems (the
    contexts of one problem share a prompt and a prefix, so they are not independent)
    and its text (``reporting``: no interval from fewer than ``MIN_CLUSTERS`` problems or
    where every resample gave the same share, e.g. no spike at all). A context shared by
    rollouts of two groups (the prompt-only first token) counts in each."""
    from rlprobe_nb import reporting
    from rlprobe_nb.statistics import cluster_bootstrap_ci, seed_from

    per_ctx = tests.groupby(["checkpoint", by, "context_id"], sort=False).agg(
        step=("step", "first"), problem_id=("problem_id", "first"),
        spike=("significant", "any")).reset_index()
    rows = []
    for (ckpt, level), g in per_ctx.groupby(["checkpoint", by], sort=False):
        rate, low, high = cluster_bootstrap_ci(g.spike.astype(float).to_numpy(),
                                               g.problem_id.to_numpy(),
                                               seed=seed_from(seed, ckpt, level))
        rows.append({"checkpoint": ckpt, "step": g.step.iloc[0], by: level,
                     "contexts": len(g), "problems": g.problem_id.nunique(),
                     "spikes": int(g.spike.sum()), "rate": rate, "low": low, "high": high})
    out = pd.DataFrame(rows).sort_values(["step", by]).reset_index(drop=True)
    return reporting.with_interval_text(out, "rate", "low", "high", "problems",
                                        column="spike rate")

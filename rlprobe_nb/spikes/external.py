"""The external null: what the same training does to the same contexts when its reward
carries no information.

A placebo run is the RLVR run's optimisation with a reward permuted within each batch:
same data, same optimiser, same schedule, same KL to the reference, no information about
correctness. Its checkpoint at step s was forced over the same contexts as the RLVR
checkpoint at step s (notebook 03 forces every checkpoint over the reference's rollouts).
So the question "did this token change more than it would have without this reward?"
has a direct answer: compare the RLVR checkpoint's departure at a context with the
placebo's departures at comparable contexts.

The test, per distinct context c of the RLVR checkpoint:

1. **Comparable contexts.** The null model of ``null.SpikeNull`` (a robust location and
   scale of log D, D the tested divergence, given the reference's uncertainty there, and
   of the written token's log-odds change given the same and the reference's log-probability
   of the written token) is fitted on the *placebo's* departures at every context. It
   standardises a departure by what the placebo does at contexts where the reference was
   as sure, and as sure of the written token: z = (s - m(x)) / σ(x).
2. **One statistic**, T = max(z of log D, |z| of the written token's log-odds change)
   (``null.context_statistic``), for the RLVR checkpoint and for the placebo alike.
3. **One calibration.** The p-value of c is the placebo's survival function of T at the
   RLVR checkpoint's T(c): empirical where the placebo has values (1/(n+1) resolution),
   and beyond its ``anchor`` quantile an exponential tail fitted to the placebo's own
   values between the ``lower`` and ``anchor`` quantiles (``tail.TailModel``), so BH over
   thousands of contexts has p-values small enough to reject.
4. **Sign** of a spike: from the RLVR checkpoint's own row, relative to the written
   token (``statistic.sign_class``: rejects, endorses, redistributes).

Assumptions (each a claim about the data; the notebook and the tests check them):

* **Same contexts, exchangeable runs.** Without information in the reward, the RLVR
  checkpoint's departure at a context would be distributed like the placebo's at that
  context. Then T's of the RLVR checkpoint and of the placebo have the same distribution
  over the forced contexts, and the p-values are uniform over them. The standardisation
  (step 1) only makes comparable contexts comparable: it buys power and fairness between
  certain and uncertain positions, not validity.
* **A placebo at the same step.** Drift grows with training, so the placebo is matched
  by step (``Params.placebo_for``). A placebo that drifted less than the RLVR run for
  reasons other than the reward's information (a different learning rate, fewer updates)
  would make everything a spike; the placebo run differs only in its reward.
* **The tail.** Beyond the placebo's anchor quantile the null's T is continued by an
  exponential tail: exact for a Laplace-like |z|, conservative for a normal-like one,
  too small for a power-law |z| (the tests measure calibration down to 0.01 on real
  tables, two halves of the problems of one table as null and tested).
* **Dependence.** Contexts of one problem are positively dependent; BH keeps its level
  under positive dependence.

What is *not* assumed: sparsity. The null is fitted on another model's departures, so
every context of the RLVR checkpoint may be a spike — which is what an internal null,
fitted on the checkpoint's own departures, cannot allow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb.spikes.null import SpikeNull, context_statistic
from rlprobe_nb.spikes.tail import TailModel


def external_test(contexts: pd.DataFrame, written: pd.DataFrame, null_contexts: pd.DataFrame,
                  null_written: pd.DataFrame, null=None,
                  tail_from: tuple[float, float] = (0.8, 0.95),
                  confidence: float = 0.95) -> tuple[pd.DataFrame, np.ndarray, dict]:
    """Test the contexts of a checkpoint against the departures of a null checkpoint (a
    placebo at the same step), frames as ``null.cross_fit`` takes them.

    Returns (a frame aligned with ``contexts``: statistic, p, z_divergence; z_written
    aligned with ``written``; facts about the null: contexts, its T quantiles)."""
    null = null or SpikeNull()
    fitted = null.fit(null_contexts, null_written)
    z_div_null, z_w_null = fitted.scores(null_contexts, null_written)
    t_null = context_statistic(z_div_null, z_w_null, null_written["ctx"].to_numpy(),
                               len(null_contexts))
    z_div, z_w = fitted.scores(contexts, written)
    stat = context_statistic(z_div, z_w, written["ctx"].to_numpy(), len(contexts))
    tail = TailModel.from_null(t_null, *tail_from, confidence=confidence)
    facts = {"null_contexts": len(null_contexts),
             "null_t_median": float(np.median(t_null)),
             "null_t_99": float(np.quantile(t_null, 0.99)), "tail_rate": tail.rate}
    out = pd.DataFrame({"statistic": stat, "p": tail.sf(stat), "z_divergence": z_div},
                       index=contexts.index)
    return out, z_w, facts


def suite_nulls(P, checkpoints: list[str]) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """The placebo tables of a suite and which null each RLVR checkpoint gets: (the
    placebo token tables with ``step``, empty without placebos; checkpoint -> its
    placebo's rows, for ``detect(nulls=...)``; one row per checkpoint: step, null, why)."""
    from rlprobe_nb.suite import paths
    from rlprobe_nb.tables import storage, suite_tables

    pairs = [(p, P.reference) for p in P.placebos if storage.is_complete(
        paths.table_dir(P.suite, paths.token_table_name(p, P.reference)))]
    placebo = (suite_tables.read_tokens(P, pairs) if pairs else pd.DataFrame())
    if not placebo.empty:
        placebo = placebo[placebo.reference == P.reference].reset_index(drop=True)
    nulls, rows = {}, []
    for ckpt in checkpoints:
        name = P.placebo_for(ckpt)
        step = P.steps[ckpt]
        if name is not None and not placebo.empty and (placebo.checkpoint == name).any():
            nulls[ckpt] = placebo[placebo.checkpoint == name]
            why = f"the placebo run at step {step}"
        elif name is not None:
            why = f"{name} is declared but not forced yet (run notebook 03 for it)"
        else:
            why = f"the suite has no placebo checkpoint at step {step}"
        rows.append({"checkpoint": ckpt, "step": step,
                     "null": name if ckpt in nulls else "internal", "why": why})
    return placebo, nulls, pd.DataFrame(rows)


def problem_halves(tokens: pd.DataFrame, splits: int = 10, seed: int = 0):
    """``splits`` random halvings of a table's problems: yields (half, other half) and
    (other half, half) for each, as row masks of ``tokens``."""
    from rlprobe_nb.statistics import seed_from

    problems = np.array(sorted(tokens.problem_id.unique()))
    if len(problems) < 4:
        raise ValueError(f"{len(problems)} problems: too few to split into two halves of two or more")
    for k in range(splits):
        rng = np.random.default_rng(seed_from("halves", seed, k))
        half = tokens.problem_id.isin(rng.choice(problems, len(problems) // 2, replace=False))
        yield half.to_numpy(), ~half.to_numpy()
        yield ~half.to_numpy(), half.to_numpy()


def halves_pvalues(tokens: pd.DataFrame, splits: int = 10, seed: int = 0,
                   divergence: str = "jeffreys") -> np.ndarray:
    """p-values of a null tested against a null: the problems of one checkpoint's table
    split at random into two halves, each half tested against the other with
    ``external_test`` (``splits`` splits, both directions). Nothing differs between the
    halves but their problems, so the p-values should be uniform: this checks the
    external null's calibration on real departures (same contexts are not needed)."""
    from rlprobe_nb.spikes.detector import frames

    out = []
    for tested, null in problem_halves(tokens, splits, seed):
        (_, c, w), (_, nc, nw) = frames(tokens[tested], divergence), frames(tokens[null], divergence)
        out.append(external_test(c, w, nc, nw)[0].p.to_numpy())
    return np.concatenate(out)


def halves_by_label(tokens: pd.DataFrame, **kw) -> dict[str, np.ndarray]:
    """``{label: halves_pvalues(tokens)}`` for a calibration chart, or {} (with a line
    saying why) when the table has too few problems to split."""
    n = tokens.problem_id.nunique()
    if n < 4:
        print(f"{tokens.checkpoint.iloc[0]}: {n} problems, too few to split into two halves "
              "for the null-vs-null check")
        return {}
    return {f"{tokens.checkpoint.iloc[0]}, half vs half": halves_pvalues(tokens, **kw)}

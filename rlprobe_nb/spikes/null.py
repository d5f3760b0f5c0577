"""The null model: how far does a checkpoint move at a token for no RL-specific reason?

Two sources of null data use it. With a placebo checkpoint at the same step (the same
training with an uninformative reward), the *external* null fits it on the placebo's
departures (``external``: no sparsity needed). Without one, the *internal* null below fits
it on the checkpoint's own departures at other problems' contexts.

A checkpoint differs from the reference at every token; how much depends on things that
have nothing to do with a targeted change: how uncertain the reference was at that
position (a flat distribution moves more under the same perturbation than a peaked one)
and how far this checkpoint drifted overall. The null describes a context's departure
*given* those things, and a spike is a context far in the upper tail of that description.

Two components are scored at every context and combined into one test:

- the divergence D (``statistic.divergence``), as log D, upper tail;
- for each written token, the change of its log-odds (``statistic.
  written_logodds_change``), both tails: a rejection or an endorsement moves it far
  more than the divergence alone shows where the reference was unsure.

Each component is standardised, z = (s - m(x)) / σ(x); the context's statistic is T =
max(z of log D, |z| of the log-odds change) (``context_statistic``), and one calibration,
T's own null distribution, gives the context's p-value (uniform in the bulk, not merely a
conservative Bonferroni bound; there is no second, stacked calibration of the components).

Assumptions (each one is a claim about the data; the calibration plot checks them):

1. **Covariates.** What makes a departure large for no RL reason is captured by the
   reference's own uncertainty at the position (log entropy, log gap between its top two
   probabilities, log collision probability of its top-k; for the written token, log
   entropy and its reference log-probability) and by the checkpoint (each checkpoint is
   fitted separately, which absorbs its overall drift). Nothing computed from the
   checkpoint is a covariate: conditioning on it would explain the effect away.
2. **Shape.** Each component s has a conditional location m(x), additive linear splines
   in the covariates, and a conditional scale σ(x), log-linear splines in the covariates'
   ranks (stiffer: log |residual| is noisy, and a sparse extreme of a covariate must not
   carry the bulk's slope out to values seen a few times); z = (s - m(x)) / σ(x) has one
   distribution F for all contexts of a checkpoint. Fewer rows get fewer hinges, and
   predictions stay within the range fitted on the training rows.
3. **Tail.** T's null distribution is read empirically up to its 95th percentile and
   continued beyond by an exponential tail fitted between its 80th and 95th percentiles,
   at the lower 95% confidence bound of its rate. On log D an exponential tail is what a
   power-law tail of D looks like; for normal or chi-square-like components the hazard
   keeps rising, so the continued tail over-states the far tail (conservative). A null
   whose far tail is heavier than its upper bulk predicts (a hazard that falls beyond
   the 95th percentile) breaks this. On the demo suite's real tables the hazard of T
   beyond the 80th percentile is roughly constant (an exponential tail), and p-values
   from two halves of the problems of one table, one half the null of the other, put
   1-1.5% below 0.01.
4. **Sparsity.** Spikes are rare (a few percent of contexts) and lie in the tails:
   location and scale are fitted with a redescending (Tukey bisquare) loss that gives
   them zero weight, and the tail's rate counts values beyond the 95th percentile only as
   censored there, so spikes neither widen the null they are tested against nor set its
   tail (a per-sequence z-score fails exactly here: an outlier inflates the scale it is
   divided by). Spikes in the fitting data can only raise the quantiles the tail is read
   from: that costs power, never false positives. Where training changed the checkpoint
   everywhere, this is what limits the internal null: its null is the checkpoint's own,
   heavy-tailed departures, so a planted change is found only when it is far beyond them
   (chapter 05 measures it with plants in the suite's own tables, ``plants``).
5. **Independence of calibration.** Every model is fitted on other problems' contexts
   (cross-fitting over folds of problems), and each fold's statistics are calibrated
   against the other folds' out-of-fold statistics: a token never calibrates itself, and
   rollouts of one problem, which share contexts and style, never calibrate each other.

Size. On simulated nulls the per-token and family-wise error rates hold from about 10
problems and 500 distinct contexts per checkpoint (conservatively there: the tail bound
widens as data shrink); the bulk is uniform at any size.

What it is not: a model of the logits. With logits at hand, a null could apply logit
changes drawn from other problems' positions to this position's reference logits and
score a context by how rarely the null divergence reaches the observed one. Any object
with ``fit(contexts, written) -> fitted``, where ``fitted.scores(contexts, written)``
returns (a score per context, a signed score per written row), larger meaning more
surprising, can replace ``SpikeNull`` in ``cross_fit``, which calibrates whatever scores it
is given out of fold: that is the seam for a logit-based null.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pandas as pd

from rlprobe_nb.spikes.conditional import ConditionalNull, FittedComponent
from rlprobe_nb.spikes.tail import TailModel
from rlprobe_nb.statistics import seed_from

CONTEXT_COVARIATES = ("log_entropy_ref", "log_top_gap", "log_collision")
WRITTEN_COVARIATES = ("log_entropy_ref", "logp_ref")


Columns = Mapping[str, np.ndarray]  # column name -> 1-d array (a DataFrame will do)


def _matrix(frame: Columns, names: tuple[str, ...]) -> np.ndarray:
    return np.column_stack([np.asarray(frame[c], dtype=np.float64) for c in names])


@dataclass(frozen=True)
class FittedSpikeNull:
    divergence: FittedComponent
    written: FittedComponent

    def scores(self, contexts: Columns, written: Columns):
        """(z of the divergence per context, z of the log-odds change per written row)."""
        z_div = self.divergence.z(contexts["divergence"], _matrix(contexts, CONTEXT_COVARIATES))
        z_written = self.written.z(written["logodds_change"], _matrix(written, WRITTEN_COVARIATES))
        return z_div, z_written


@dataclass(frozen=True)
class SpikeNull:
    """Location and scale of the two components (the calibration of their tails and of
    their combination happens in ``cross_fit``, out of fold)."""

    divergence: ConditionalNull = field(default_factory=ConditionalNull)
    written: ConditionalNull = field(
        default_factory=lambda: ConditionalNull(transform="identity"))

    def fit(self, contexts: Columns, written: Columns) -> FittedSpikeNull:
        return FittedSpikeNull(
            self.divergence.fit(np.asarray(contexts["divergence"], dtype=np.float64),
                                _matrix(contexts, CONTEXT_COVARIATES)),
            self.written.fit(np.asarray(written["logodds_change"], dtype=np.float64),
                             _matrix(written, WRITTEN_COVARIATES)))


def problem_folds(problem_id: np.ndarray, folds: int = 5, seed: int = 0) -> np.ndarray:
    """Fold of each row: whole problems are assigned (by a hash of id and seed, dealt
    round-robin so folds have equal numbers of problems)."""
    uniq, codes = np.unique(np.asarray(problem_id).astype(str), return_inverse=True)
    if len(uniq) < 2:
        raise ValueError("cross-fitting needs at least two problems: with one, a problem "
                         "would calibrate itself")
    k = min(folds, len(uniq))
    order = np.argsort([seed_from("fold", seed, u) for u in uniq])
    fold_of_problem = np.empty(len(uniq), dtype=np.int64)
    fold_of_problem[order] = np.arange(len(uniq)) % k
    return fold_of_problem[codes]


def context_statistic(z_div: np.ndarray, z_written: np.ndarray, ctx: np.ndarray,
                      n: int) -> np.ndarray:
    """The tested statistic of each context: T = max(z of the divergence, the largest |z|
    of a written token's log-odds change there), in null scales. The divergence counts in
    its upper tail only (a distribution that moved less than usual is no spike), the
    written token's change in both directions (a rejection and an endorsement alike)."""
    worst = np.full(n, -np.inf)
    np.maximum.at(worst, ctx, np.abs(np.nan_to_num(z_written, nan=-np.inf)))
    return np.maximum(np.nan_to_num(z_div, nan=-np.inf), worst)


def cross_fit(contexts: pd.DataFrame, written: pd.DataFrame, null=None, folds: int = 5,
              seed: int = 0, tail_from: tuple[float, float] = (0.8, 0.95),
              confidence: float = 0.95) -> tuple[pd.DataFrame, np.ndarray]:
    """Test every context against a null that never saw its problem: the internal null.

    contexts: one row per distinct context: problem_id, divergence, CONTEXT_COVARIATES.
    written: one row per (context, written token): ctx (the context's position in
    ``contexts``), logodds_change, WRITTEN_COVARIATES. Returns a frame aligned with
    ``contexts`` (statistic, p, z_divergence) and z_written aligned with ``written``.

    1. Each fold's z-scores come from location/scale models fitted on the other folds.
    2. One calibration: each fold's statistic (``context_statistic``) gets its p-value
       from a TailModel of the *other folds'* out-of-fold statistics, so the values a
       context is compared with were produced the same way as its own and no problem
       calibrates itself.
    """
    null = null or SpikeNull()
    index = contexts.index
    contexts = {c: contexts[c].to_numpy() for c in contexts.columns}
    written = {c: written[c].to_numpy() for c in written.columns}
    fold = problem_folds(contexts["problem_id"], folds, seed)
    w_fold = fold[written["ctx"]]
    n = len(fold)
    z_div, z_written = np.empty(n), np.empty(len(w_fold))
    for k in np.unique(fold):
        fitted = null.fit(*_subset(contexts, written, fold != k, w_fold != k))
        z_div[fold == k], z_written[w_fold == k] = fitted.scores(
            *_subset(contexts, written, fold == k, w_fold == k))
    stat = context_statistic(z_div, z_written, written["ctx"], n)
    p = np.empty(n)
    for k in np.unique(fold):
        p[fold == k] = TailModel.from_training(stat[fold != k], *tail_from,
                                               confidence=confidence).sf(stat[fold == k])
    return pd.DataFrame({"statistic": stat, "p": p, "z_divergence": z_div},
                        index=index), z_written


def _subset(contexts: Columns, written: Columns, keep: np.ndarray,
            keep_written: np.ndarray) -> tuple[Columns, Columns]:
    """Contexts and written rows of some folds, with ``ctx`` renumbered to match."""
    renumber = np.cumsum(keep) - 1
    sub_w = {c: v[keep_written] for c, v in written.items()}
    sub_w["ctx"] = renumber[sub_w["ctx"]]
    return {c: v[keep] for c, v in contexts.items()}, sub_w

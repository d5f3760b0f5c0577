"""Chapter 05's statistic as a takeover criterion: how unusual the checkpoint's departure
at a position is for training that had no information in its reward.

Chapter 05 standardises two components of a departure by its null model
(``spikes.null.SpikeNull``) fitted on the placebo run's forced departures at the same
step (its external null): the divergence D (Jeffreys, KL both ways) as log D, given the
reference's uncertainty at the position (log entropy, log gap between its top two, log
collision probability of its top-k), and the written token's log-odds change, given the
reference's entropy and its log-probability of the token. Here the written token is the
reference's draw, and the criterion is

    T = max(z of log D, |z| of the draw's log-odds change)

at that one token (chapter 05 tests a context by the largest |z| over every token written
there; a decoder has one). No p-value: like every criterion, its threshold is a quantile
of its scores over the checkpoint's forced positions (``table_scores``), and the share it
actually takes over is measured. The placebo's own curve is scored against the placebo
itself (its departures standardised by their own null), so that its criterion ranks its
positions the same way.

The decoder scores a position from both models' log-softmaxes (``Scorer``); the table
path scores a token table's rows (``table_scores``) from the same quantities rounded to
the table's float32: the two agree to that rounding (``tests/test_takeover_calibrated.py``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from rlprobe_nb.spikes import detector, statistic
from rlprobe_nb.spikes.null import FittedSpikeNull, SpikeNull

DIVERGENCE = "jeffreys"  # chapter 05's default tested divergence


def fit_null(rows: pd.DataFrame) -> FittedSpikeNull:
    """Chapter 05's null model fitted on one checkpoint's token-table rows (every
    distinct context and written token, as its detector frames them)."""
    if rows.empty:
        raise ValueError("no token-table rows to fit the calibrated criterion's null on: "
                         "run notebook 03 for the placebo checkpoint first")
    _, contexts, written = detector.frames(rows, DIVERGENCE)
    return SpikeNull().fit(contexts, written)


def _t(fitted: FittedSpikeNull, rows: pd.DataFrame) -> np.ndarray:
    cov = statistic.reference_covariates(rows)
    contexts = cov.assign(divergence=statistic.divergence(rows, DIVERGENCE))
    written = pd.concat([cov, statistic.written_covariates(rows)], axis=1).assign(
        logodds_change=statistic.written_logodds_change(rows))
    z_div, z_written = fitted.scores(contexts, written)
    return np.maximum(np.nan_to_num(np.asarray(z_div, np.float64), nan=-np.inf),
                      np.abs(np.nan_to_num(np.asarray(z_written, np.float64), nan=-np.inf)))


def table_scores(rows: pd.DataFrame, fitted: FittedSpikeNull) -> np.ndarray:
    """T of every token-table row, its written token as the draw (float64)."""
    return _t(fitted, rows.reset_index(drop=True))


class Scorer:
    """T of decoder positions: ``scorer(lq, lp, x, entropy)`` with the reference's and the
    checkpoint's float64 log-softmaxes [B, V], the draws [B] and the reference's
    entropies [B] (``criteria.scores`` computes them); a float64 CPU tensor [B]."""

    def __init__(self, fitted: FittedSpikeNull, topk: int):
        if topk < 2:
            raise ValueError(f"the calibrated criterion needs the token tables' top-k of "
                             f"at least 2 (the gap between the top two), got {topk}")
        self.fitted, self.topk = fitted, int(topk)

    def __call__(self, lq: torch.Tensor, lp: torch.Tensor, x: torch.Tensor,
                 entropy: torch.Tensor) -> torch.Tensor:
        q, p = lq.exp(), lp.exp()
        zero = torch.zeros((), dtype=lq.dtype, device=lq.device)
        kl_qp = torch.where(q > 0, q * (lq - lp), zero).sum(-1).clamp(min=0)
        kl_pq = torch.where(p > 0, p * (lp - lq), zero).sum(-1).clamp(min=0)
        rows = torch.arange(len(x), device=x.device)
        top = q.topk(self.topk, dim=-1).values
        frame = pd.DataFrame({
            "entropy_ref": entropy.cpu().numpy(), "kl_ref_ckpt": kl_qp.cpu().numpy(),
            "kl_ckpt_ref": kl_pq.cpu().numpy(),
            "logp_ref": lq[rows, x].cpu().numpy(), "logp_ckpt": lp[rows, x].cpu().numpy(),
            "topk_p_ref": list(top.cpu().numpy())})
        return torch.from_numpy(_t(self.fitted, frame))


def null_for(P, checkpoint: str) -> str:
    """The checkpoint whose departures standardise ``checkpoint``'s: the placebo at its
    step, or (a placebo, or a suite without one at that step) itself."""
    if P.run_of(checkpoint) != "rlvr":
        return checkpoint
    return P.placebo_for(checkpoint) or checkpoint


def scorers(P, tokens: pd.DataFrame, checkpoints: list[str]) -> tuple[dict, pd.DataFrame]:
    """Per checkpoint, its ``Scorer`` (the null fitted on ``null_for``'s rows of
    ``tokens``, which must hold them); and one row per checkpoint naming its null."""
    topk = len(tokens.topk_p_ref.iloc[0])
    fitted: dict[str, FittedSpikeNull] = {}
    out, rows = {}, []
    for checkpoint in checkpoints:
        null = null_for(P, checkpoint)
        if null not in fitted:
            fitted[null] = fit_null(tokens[tokens.checkpoint == null])
        out[checkpoint] = Scorer(fitted[null], topk)
        rows.append({"checkpoint": checkpoint, "null": null,
                     "why": "itself (a placebo run)" if null == checkpoint and
                     P.run_of(checkpoint) == "placebo" else
                     "itself (no placebo at its step)" if null == checkpoint else
                     f"the placebo run at step {P.steps.get(checkpoint)}"})
    return out, pd.DataFrame(rows)

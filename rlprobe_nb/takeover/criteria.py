"""What a takeover rule scores at a position: the reference's draw x there, scored by the
two models' next-token distributions over the same prefix (both at T = 1, whatever the
sampling temperature). Higher scores are more reason to let the checkpoint choose.

  delta_logp   log p_ref(x) - log p_ckpt(x): how strongly the checkpoint rejects the
               reference's draw (the signed log-prob change of the token tables, negated)
  kl           KL(ref || ckpt) at the position (the token tables' ``kl_ref_ckpt``)
  entropy      the reference's entropy at the position (``entropy_ref``)
  random       a seeded coin: a uniform number in [0, 1) from the request's seed and the
               position, independent of the sampling noise (takeover at a matched rate)
  calibrated   chapter 05's statistic of the position with the draw as its written token,
               T = max(z of log D, |z| of the draw's log-odds change), standardised
               against the placebo run at the checkpoint's step (``calibrated``): how
               unusual the departure is for training without the reward's information

Two more rules are the ends of every curve: ``never`` (the reference alone) and
``always`` (the checkpoint alone). The sums run in float64 over log-softmax of the fp32
logits; ``tests/test_takeover_lockstep.py`` checks each against the token tables'
metrics for the same text and positions.
"""

from __future__ import annotations

from typing import Callable

import torch

from rlprobe_nb.generation import sampling

CRITERIA = ("delta_logp", "kl", "entropy", "random", "calibrated")
ENDS = ("never", "always")
COIN_SALT = 0x7A3C5F11  # the coin's stream is not the sampling noise's


def check_rule(rule) -> None:
    if rule.criterion not in CRITERIA + ENDS:
        raise ValueError(f"unknown takeover criterion {rule.criterion!r}: use one of "
                         f"{', '.join(CRITERIA + ENDS)}")


def coin(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """A uniform number in [0, 1) per (seed, step), float64 (CPU tensors)."""
    k1, _ = sampling.row_keys(seeds.to(torch.long) ^ COIN_SALT, steps.to(torch.long))
    return (k1.to(torch.float64) + 0.5) / 2.0 ** 32


def scores(ref_logits: torch.Tensor, ckpt_logits: torch.Tensor, x_ref: torch.Tensor,
           seeds: torch.Tensor, steps: torch.Tensor,
           calibrated: Callable | None = None) -> dict[str, torch.Tensor]:
    """Every criterion's score per row, float64 on the CPU (``calibrated``: a scorer of
    ``calibrated.Scorer``'s form, called with both log-softmaxes and the draws, where a
    rule needs it)."""
    lq = torch.log_softmax(ref_logits.to(torch.float64), dim=-1)
    lp = torch.log_softmax(ckpt_logits.to(torch.float64), dim=-1)
    q = lq.exp()
    rows = torch.arange(len(x_ref), device=x_ref.device)
    # terms where q underflows to 0 contribute 0 (and not 0 * inf)
    kl = torch.where(q > 0, q * (lq - lp), torch.zeros_like(q)).sum(-1)
    entropy = -torch.where(q > 0, q * lq, torch.zeros_like(q)).sum(-1)
    out = {"delta_logp": (lq[rows, x_ref] - lp[rows, x_ref]).cpu(),
           "kl": kl.clamp(min=0).cpu(), "entropy": entropy.clamp(min=0).cpu(),
           "random": coin(seeds.cpu(), steps.cpu())}
    if calibrated is not None:
        out["calibrated"] = calibrated(lq, lp, x_ref, entropy)
    return out


def passes(rule, scores_: dict[str, torch.Tensor], row: int) -> bool:
    if rule.criterion == "never":
        return False
    if rule.criterion == "always":
        return True
    return bool(scores_[rule.criterion][row] > rule.threshold)

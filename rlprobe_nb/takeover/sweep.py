"""What chapter 09 sweeps: which checkpoints take over, and each criterion's threshold for
each budget.

A *budget* b is a share of positions: the threshold of a criterion is its (1 - b)
quantile over the checkpoint's forced positions (chapter 03's token tables: the
reference's own rollouts, each position scored exactly as the decoder scores it), so at
budget b the rule would take over about b of the positions of a text like those. The
share it actually takes over on the texts it writes is measured, and is what the curves
are drawn against. The random criterion's threshold is 1 - b exactly (a uniform coin);
the calibrated one's is a quantile of chapter 05's statistic (``calibrated``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb.suite.params import Params, ParamsError
from rlprobe_nb.takeover import calibrated

# criterion -> the token-table columns that give its score at the written token
SCORE_OF = {
    "delta_logp": lambda t: t.logp_ref.to_numpy(np.float64) - t.logp_ckpt.to_numpy(np.float64),
    "kl": lambda t: t.kl_ref_ckpt.to_numpy(np.float64),
    "entropy": lambda t: t.entropy_ref.to_numpy(np.float64),
}
DEFAULT_STEPS = (100, 400)  # besides the target: an early and a middle step


def default_checkpoints(P: Params) -> list[str]:
    """RLVR steps 100 and 400 (else the run's first and middle checkpoints), the target,
    and the target's placebo where the suite has one."""
    runs = P.checkpoints
    if not runs:
        raise ParamsError(f"suite {P.suite!r} has no RLVR checkpoint to take over")
    by_step = {P.steps[c]: c for c in runs}
    early = [by_step[s] for s in DEFAULT_STEPS if s in by_step] or \
        [runs[0], runs[len(runs) // 2]]
    chosen = list(dict.fromkeys([c for c in early if c != P.target] + [P.target]))
    placebo = P.placebo_for(P.target) if P.target in runs else None
    return chosen + ([placebo] if placebo else [])


def check_checkpoints(P: Params, names: list[str]) -> list[str]:
    known = set(P.forced)
    bad = [n for n in names if n not in known]
    if bad:
        raise ParamsError(f"takeover.checkpoints: {bad} are not checkpoints of suite "
                          f"{P.suite!r}; valid: {P.forced}")
    return list(names)


def forced_scores(rows: pd.DataFrame, criterion: str, scorer=None) -> np.ndarray:
    """A criterion's score at every forced position of ``rows`` (one checkpoint's token
    table), its written token as the draw; ``scorer``: the checkpoint's
    ``calibrated.Scorer`` for "calibrated"."""
    if criterion == "calibrated":
        return calibrated.table_scores(rows, scorer.fitted)
    return SCORE_OF[criterion](rows)


def thresholds(tokens: pd.DataFrame, checkpoint: str, criteria: list[str],
               budgets: list[float], scorer=None) -> pd.DataFrame:
    """One row per (criterion, budget): the threshold, and the share of the checkpoint's
    forced positions above it (≈ the budget; ties can make it less). ``scorer``: the
    checkpoint's ``calibrated.Scorer`` where the criteria include "calibrated"."""
    rows = tokens[tokens.checkpoint == checkpoint]
    if rows.empty and any(c != "random" for c in criteria):
        raise ValueError(f"no forced tokens of {checkpoint!r}: run notebook 03 for it first")
    if "calibrated" in criteria and scorer is None:
        raise ValueError("the calibrated criterion needs its scorer (calibrated.scorers)")
    out = []
    for criterion in criteria:
        for budget in budgets:
            if criterion == "random":
                threshold, share = 1.0 - budget, budget
            else:
                score = forced_scores(rows, criterion, scorer)
                threshold = float(np.quantile(score, 1.0 - budget))
                share = float(np.mean(score > threshold))
            out.append({"checkpoint": checkpoint, "criterion": criterion,
                        "budget": float(budget), "threshold": threshold,
                        "forced_share": share, "forced_positions": len(rows)})
    return pd.DataFrame(out)


def all_thresholds(tokens: pd.DataFrame, checkpoints: list[str], criteria: list[str],
                   budgets: list[float], scorers: dict | None = None) -> pd.DataFrame:
    """``thresholds`` of every checkpoint, one frame (``scorers``: checkpoint -> its
    ``calibrated.Scorer``, where the criteria include "calibrated")."""
    return pd.concat([thresholds(tokens, c, criteria, budgets, (scorers or {}).get(c))
                      for c in checkpoints], ignore_index=True)


def budget_spent(tokens: pd.DataFrame, thresholds: pd.DataFrame, scorers: dict | None = None
                 ) -> pd.DataFrame:
    """Where each rule spends its budget on the checkpoint's forced positions: per
    (checkpoint, criterion, budget), the positions above the threshold, the share of
    them where the checkpoint's own top-1 is the written token (a takeover there changes
    nothing) and the share where it raised the written token's probability (an
    endorsement rather than a veto). The random criterion picks a uniform share."""
    out = []
    for (checkpoint, criterion), part in thresholds.groupby(["checkpoint", "criterion"],
                                                            sort=False):
        if criterion == "random":
            continue
        rows = tokens[tokens.checkpoint == checkpoint]
        score = forced_scores(rows, criterion, (scorers or {}).get(checkpoint))
        same = rows.rank_ckpt.to_numpy() == 1
        up = rows.logp_ckpt.to_numpy(np.float64) > rows.logp_ref.to_numpy(np.float64)
        for r in part.itertuples():
            picked = score > r.threshold
            n = int(picked.sum())
            out.append({"checkpoint": checkpoint, "criterion": criterion,
                        "budget": r.budget, "picked": n,
                        "top1_is_written": float(same[picked].mean()) if n else np.nan,
                        "endorsed": float(up[picked].mean()) if n else np.nan})
    return pd.DataFrame(out, columns=["checkpoint", "criterion", "budget", "picked",
                                      "top1_is_written", "endorsed"])

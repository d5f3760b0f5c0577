"""Chapter 09's sentences, every number read from its tables (``curves.curve_table``,
``curves.headline``, ``labels.label_shares``)."""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.reporting import fmt, interval_text
from rlprobe_nb.takeover.charts import NAMES


def _pct(x) -> str:
    return "n/a" if pd.isna(x) else f"{100 * x:.1f}%"


def _pct_interval(est, lo, hi) -> str:
    """A percentage with its interval (the interval's problems are said once per line)."""
    if pd.isna(est):
        return "not reached"
    if pd.isna(lo) or pd.isna(hi):
        return f"{_pct(est)} (no interval: too few resamples reach it)"
    return f"{_pct(est)} [{_pct(lo)}, {_pct(hi)}]"


def end_lines(curves: pd.DataFrame) -> list[str]:
    """Per checkpoint: the two ends and its own gain, or why there is none to recover."""
    out = []
    ends = curves[curves.criterion == "always"]
    ref = curves[curves.criterion == "never"].set_index("checkpoint")
    for r in ends.itertuples():
        gain = interval_text(r.own_gain, r.own_gain_low, r.own_gain_high, r.problems,
                             signed=True)
        line = (f"{r.checkpoint}: the reference alone {fmt(ref.acc[r.checkpoint])}, "
                f"{r.checkpoint} alone {fmt(r.acc)}; its gain {gain}")
        if not r.own_gain > 0:
            line += " — no gain to recover: its curves are read against the target's gain"
        out.append(line)
    return out


def _same_share(r) -> str:
    """What random and the placebo reach at the share where Δlogp reaches ``r.level``."""
    text = (f"at that share random recovers "
            f"{_pct_interval(r.random, r.random_low, r.random_high)}")
    if isinstance(r.placebo, str):
        text += (f", and {r.placebo}'s Δlogp takeover reaches "
                 f"{_pct_interval(r.placebo_recovered, r.placebo_recovered_low, r.placebo_recovered_high)}"
                 f" of {r.checkpoint}'s gain")
    return text


def headline_lines(head: pd.DataFrame) -> list[str]:
    """Per level of recovered gain: the share of positions Δlogp takeover needs, and what
    random and the placebo reach at that share."""
    return [f"{_pct(r.level)} of {r.checkpoint}'s gain: Δlogp takeover at "
            f"{_pct_interval(r.share, r.share_low, r.share_high)} of positions; "
            f"{_same_share(r)} (95% intervals over {r.problems} problems)"
            for r in head.itertuples()]


ARITHMETIC = ("operator", "operand", "result_correct", "result_after_wrong",
              "result_first_wrong", "final_answer")


def label_lines(shares: pd.DataFrame, target: str, placebo: str | None,
                base: pd.Series | None = None) -> list[str]:
    """Per criterion at its largest budget: the share of changed positions that are
    arithmetic (operands, operators, results, the final answer), RLVR beside placebo, and
    first the base rate: that share among every position the reference wrote alone."""
    if shares.empty:
        return ["no rule changed a token: nothing to label"]
    arithmetic = [c for c in ARITHMETIC if c in shares.columns]
    out = []
    if base is not None and len(base):
        out.append(f"base rate: arithmetic is {_pct(base.reindex(list(ARITHMETIC)).sum())} of "
                   "every position the reference writes alone (first wrong digits "
                   f"{_pct(base.get('result_first_wrong', 0.0))})")
    for crit in [c for c in NAMES if c in set(shares.criterion)]:
        part = shares[shares.criterion == crit]
        top = part[part.budget == part.budget.max()]
        bits = []
        for ckpt in (target, placebo):
            row = top[top.checkpoint == ckpt]
            if ckpt and len(row):
                r = row.iloc[0]
                bits.append(f"{ckpt} {_pct(r[arithmetic].sum())} of {int(r.changed)} "
                            f"changed positions in {int(r.problems)} problems")
        out.append(f"{NAMES[crit]} at budget {part.budget.max():g}: arithmetic (operands, "
                   f"operators, results) {'; '.join(bits)}")
    return out


def finding(head: pd.DataFrame, curves: pd.DataFrame, shares: pd.DataFrame, target: str,
            placebo: str | None) -> str:
    """The chapter's answer in a sentence, with its numbers."""
    own = curves[(curves.checkpoint == target) & (curves.criterion == "always")]
    if own.empty or not own.iloc[0].own_gain > 0:
        return (f"**{target} gains nothing over the reference on these problems**, so there "
                "is no gain for a takeover to recover.")
    half = head[head.level == head.level.min()].iloc[0]
    text = (f"**At {_pct(half.share)} of positions chosen by Δlogp, the reference reaches "
            f"{_pct(half.level)} of {target}'s gain** (share {_pct_interval(half.share, half.share_low, half.share_high)}); "
            f"{_same_share(half)}")
    full = head[head.level == head.level.max()].iloc[0]
    text += (f". Nine tenths takes {_pct_interval(full.share, full.share_low, full.share_high)} "
             f"of positions (95% intervals over {half.problems} problems, resampled).")
    return text

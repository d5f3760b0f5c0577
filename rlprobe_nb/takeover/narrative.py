"""Chapter 09's sentences, every number read from its tables (``curves.curve_table``,
``curves.headline``, ``labels.label_shares``)."""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.readable import counted
from rlprobe_nb.reporting import fmt, interval_text
from rlprobe_nb.takeover.charts import NAMES
from rlprobe_nb.takeover.labels import ARITHMETIC


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


def _arithmetic_share(r) -> str:
    share = (_pct_interval(r.share, r.low, r.high) if pd.notna(r.low)
             else f"{_pct(r.share)} (no interval: too few problems)")
    return (f"{share} of {counted(int(r.changed), 'changed position')} in "
            f"{counted(int(r.problems), 'problem')}")


def label_lines(arithmetic: pd.DataFrame, target: str, placebo: str | None,
                base: pd.Series | None = None) -> list[str]:
    """The share of changed positions that are arithmetic (operands, operators, results,
    the final answer; ``labels.arithmetic_share``), RLVR beside placebo: first the bases
    (every position the reference writes alone; every position where the checkpoint's draw
    differs, rule "always"), then each criterion at its smallest and largest budget."""
    if arithmetic.empty:
        return ["no rule changed a token: nothing to label"]
    out = []
    if base is not None and len(base):
        out.append(f"base: arithmetic is {_pct(base.reindex(list(ARITHMETIC)).sum())} of every "
                   "position the reference writes alone (first wrong digits "
                   f"{_pct(base.get('result_first_wrong', 0.0))})")
    for crit in ["always"] + [c for c in NAMES if c in set(arithmetic.criterion)]:
        part = arithmetic[arithmetic.criterion == crit]
        budgets = sorted(part.budget.dropna().unique())
        for budget in ([None] if crit == "always" else sorted({budgets[0], budgets[-1]})
                       if budgets else []):
            rows = part if budget is None else part[part.budget == budget]
            bits = [f"{ckpt} {_arithmetic_share(rows[rows.checkpoint == ckpt].iloc[0])}"
                    for ckpt in (target, placebo) if ckpt and (rows.checkpoint == ckpt).any()]
            what = ("wherever the checkpoint's draw differs (always)" if budget is None
                    else f"{NAMES[crit]} at budget {budget:g}")
            out.append(f"{what}: arithmetic {'; '.join(bits)}")
    return out


def finding(head: pd.DataFrame, curves: pd.DataFrame, arithmetic: pd.DataFrame, target: str,
            placebo: str | None, base: pd.Series | None = None) -> str:
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
    few = arithmetic[(arithmetic.checkpoint == target) & (arithmetic.criterion == "delta_logp")]
    if len(few) and base is not None and len(base):
        r = few.sort_values("budget").iloc[0]
        text += (f" The positions Δlogp changes at its smallest budget are arithmetic "
                 f"(operands, operators, results) at {_arithmetic_share(r)}, against "
                 f"{_pct(base.reindex(list(ARITHMETIC)).sum())} of all positions the "
                 "reference writes.")
    return text


def budget_lines(spent: pd.DataFrame, target: str) -> list[str]:
    """Per criterion, at the target's smallest budget: how much of what it picks on the
    forced positions the checkpoint would write anyway."""
    part = spent[spent.checkpoint == target]
    if part.empty:
        return []
    low = part[part.budget == part.budget.min()]
    bits = [f"{NAMES.get(r.criterion, r.criterion)} {_pct(r.top1_is_written)} "
            f"({_pct(r.endorsed)} endorsements, of {r.picked:,})" for r in low.itertuples()]
    return [f"{target}, budget {low.budget.iloc[0]:g}: of the forced positions each criterion "
            f"picks, the checkpoint's own top-1 is the written token at " + "; ".join(bits)]

"""Content apart from format: which kinds of token change, from which step, and which
change most, each claim read from an interval over problems.

``token_categories`` says what kind of token a row is (a step marker, a number after
"="...); ``ground_truth`` says whether the arithmetic it belongs to is right (the first
wrong digit of a wrong result, a right result, format...). A mean over all tokens mixes
them: a checkpoint that rejects wrong result digits and leaves right ones alone, while
rewriting the format, shows a mean KL that follows the format. So the chapter aggregates
by both (``summary.category_table`` with either labelling) and reads from those tables:

* ``onsets``: per label, the step from which it changes. The rule: the *first step whose
  95% interval over problems excludes 0, with every later step's estimate of the same
  sign* (a change that comes and goes has no onset). A label with fewer than
  ``reporting.MIN_CLUSTERS`` problems at every step is "too few problems", never placed.
* ``contrasts``: the tests behind comparative sentences, at one step. For the mean Δlogp,
  the most rejected label (lowest mean among labels with enough problems) minus every
  other such label; the sentence says "X most" only where X's difference to the
  runner-up excludes 0, and names the tied labels otherwise. For the shares, each
  label's share of all KL(ref‖ckpt) minus its share of the tokens. Both are paired
  differences over the same problems (``clustered.difference_interval``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb import reporting
from rlprobe_nb.divergence import clustered
from rlprobe_nb.divergence.summary import analysed_rows
from rlprobe_nb.statistics import seed_from

ONSET_RULE = ("the first step whose 95% interval over problems excludes 0, with every later "
              "step's estimate of the same sign")


def onsets(table: pd.DataFrame, statistic: str = "dlogp_mean",
           min_clusters: int | None = None) -> pd.DataFrame:
    """Per group and label (``category``) of a ``summary.category_table``: ``status``
    ("onset", "no lasting change", "too few problems"), ``onset_step``, ``direction``
    (-1: the checkpoint lowers the written tokens' probability, +1: raises it, 0), and the
    row the sentence quotes (at the onset, else at the last step): step, estimate, low,
    high, problems; ``most_problems`` over the steps."""
    least = reporting.fewest(min_clusters)
    rows = table[(table.statistic == statistic) & (table.step > 0)]
    out = []
    for (group, label), part in rows.groupby(["group", "category"], sort=True, observed=True):
        part = part.sort_values("step")
        signs = [reporting.sign_of(r.estimate, r.low, r.high, int(r.problems), least)
                 for r in part.itertuples()]
        est = part.estimate.to_numpy(np.float64)
        onset = next((i for i, s in enumerate(signs)
                      if s != 0 and np.all(np.sign(est[i:]) == s)), None)
        most = int(part.problems.max())
        status = ("onset" if onset is not None else
                  "too few problems" if most < least else "no lasting change")
        quoted = part.iloc[onset if onset is not None else -1]
        out.append({"group": group, "category": label, "status": status,
                    "onset_step": int(quoted.step) if onset is not None else -1,
                    "direction": signs[onset] if onset is not None else 0,
                    "step": int(quoted.step), "estimate": quoted.estimate, "low": quoted.low,
                    "high": quoted.high, "problems": int(quoted.problems),
                    "most_problems": most})
    columns = ["group", "category", "status", "onset_step", "direction", "step", "estimate",
               "low", "high", "problems", "most_problems"]
    return pd.DataFrame(out, columns=columns)


def _totals(rows: pd.DataFrame, codes: np.ndarray, g: int, mask, column: str | None):
    """Per-problem sum of ``column`` (a count when None) over the rows in ``mask``."""
    values = np.ones(int(mask.sum())) if column is None else rows[column].to_numpy(np.float64)[mask]
    return np.bincount(codes[mask], weights=values, minlength=g)


def contrasts(tokens: pd.DataFrame, labels: pd.Series, scheme: str, step: int | None = None,
              seed: int = 0, min_clusters: int | None = None) -> pd.DataFrame:
    """At ``step`` (default: the last), per group: the most rejected label's mean Δlogp
    minus each other label's (``statistic`` "dlogp: leader minus"), and each label's share
    of all KL(ref‖ckpt) minus its share of the tokens ("kl share minus token share"),
    with paired intervals over problems. Labels carried by fewer than ``min_clusters``
    problems take part in neither (they are listed with ``eligible`` False)."""
    least = reporting.fewest(min_clusters)
    rows = analysed_rows(tokens.assign(_label=labels.astype(str)))
    step = int(rows.step.max()) if step is None else step
    rows = rows[rows.step == step]
    out = []
    for group, part in rows.groupby("group", sort=True):
        codes, names = clustered.problem_codes(part.problem_id)
        g = len(names)
        counts = clustered.bootstrap_counts(g, clustered.N_BOOT, seed_from(seed, group, scheme))
        label = part._label.to_numpy()
        every = np.ones(len(part), bool)
        carried = {name: len(np.unique(codes[label == name])) for name in np.unique(label)}
        eligible = [n for n, c in carried.items() if c >= least]
        means = {n: part.dlogp[label == n].mean() for n in eligible}
        leader = min(means, key=means.get) if means else None
        for name in sorted(carried):
            mask = label == name
            base = {"group": group, "scheme": scheme, "step": step,
                    "checkpoint": part.checkpoint.iloc[0], "category": name,
                    "eligible": name in eligible}
            share = clustered.difference_interval(
                _totals(part, codes, g, mask, "kl_ref_ckpt"),
                _totals(part, codes, g, every, "kl_ref_ckpt"),
                _totals(part, codes, g, mask, None), _totals(part, codes, g, every, None), counts)
            out.append({**base, "statistic": "kl share minus token share", "versus": "",
                        **share, "problems": carried[name]})
            if leader is None or name == leader or name not in eligible:
                continue
            diff = clustered.difference_interval(
                _totals(part, codes, g, label == leader, "dlogp"),
                _totals(part, codes, g, label == leader, None),
                _totals(part, codes, g, mask, "dlogp"), _totals(part, codes, g, mask, None), counts)
            out.append({**base, "statistic": "dlogp: leader minus", "category": leader,
                        "versus": name, **diff,
                        "problems": min(carried[leader], carried[name])})
    columns = ["group", "scheme", "step", "checkpoint", "statistic", "category", "versus",
               "eligible", "estimate", "low", "high", "se", "problems"]
    return pd.DataFrame(out, columns=columns)


def contrast_table(tokens: pd.DataFrame, categories: pd.Series, labels: pd.Series,
                   seed: int = 0) -> pd.DataFrame:
    """``contrasts`` by token category and by ground-truth label in one table (``scheme``:
    "token_category" or "ground_truth")."""
    return pd.concat([contrasts(tokens, categories, "token_category", seed=seed),
                      contrasts(tokens, labels, "ground_truth", seed=seed)], ignore_index=True)


def change_contributions(tokens: pd.DataFrame, labels: pd.Series, metric: str = "kl_ref_ckpt",
                         seed: int = 0) -> pd.DataFrame:
    """How much each label contributes to the change of the mean ``metric`` from one step
    to the next: the sum of the per-token changes at the label's tokens over the number of
    all tokens forced at both steps, so the labels' contributions add up to the change of
    the mean (``summary.step_changes``), each with its paired interval over problems. Says
    which tokens a moving mean KL follows: format or content."""
    rows = analysed_rows(tokens.assign(_label=labels.astype(str)))
    steps = sorted(rows.step.unique())
    by_step = {s: g.set_index(["rollout_id", "pos"]) for s, g in rows.groupby("step")}
    diffs = []
    for a, b in zip(steps[:-1], steps[1:]):
        left, right = by_step[a], by_step[b]
        both = left.index.intersection(right.index)
        diffs.append(pd.DataFrame({
            "group": right.loc[both, "group"].to_numpy(),
            "problem_id": right.loc[both, "problem_id"].to_numpy(),
            "category": right.loc[both, "_label"].to_numpy(), "step_from": a, "step_to": b,
            "_change": (right.loc[both, metric] - left.loc[both, metric]).to_numpy(),
            "_one": 1.0}))
    columns = ["group", "metric", "step_from", "step_to", "category", "estimate", "low", "high",
               "se", "problems", "rows"]
    if not diffs:
        return pd.DataFrame(columns=columns)
    table = clustered.ratio_table(pd.concat(diffs, ignore_index=True),
                                  ["step_from", "step_to", "category"], "_change", "_one",
                                  den_keys=["step_from", "step_to"], seed=seed)
    return table.assign(metric=metric)[columns]

"""Chapter 04's sentences, built from its tables: no number is typed, every estimate is
printed through ``reporting`` (an interval only from enough problems, never NaN), and a
comparative or yes/no claim is made only where its interval allows it (``phases`` has the
tests behind "most" and "from step N")."""

from __future__ import annotations

import pandas as pd

from rlprobe_nb import reporting as rp
from rlprobe_nb.divergence import estimator_lab as lab_
from rlprobe_nb.divergence.phases import ONSET_RULE

WORDS = {"kl_ref_ckpt": "KL(ref‖ckpt) (how surprised the checkpoint is by what the reference "
                        "would write)",
         "kl_ckpt_ref": "KL(ckpt‖ref) (how surprised the reference is by what the checkpoint "
                        "would write)",
         "js": "Jensen–Shannon divergence", "dlogp": "Δlogp of the written token"}
NAMES = {"kl_ref_ckpt": "KL(ref‖ckpt)", "kl_ckpt_ref": "KL(ckpt‖ref)", "js": "Jensen–Shannon",
         "dlogp": "Δlogp"}


def _names(items) -> str:
    items = [f"'{i}'" for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def say_when(when: pd.DataFrame, changes: pd.DataFrame, group: str = "target",
             metric: str = "kl_ref_ckpt") -> str:
    """The last step's mean, and the step-to-step changes whose interval excludes 0."""
    rows = when[(when.group == group) & (when.metric == metric) & (when.step > 0)]
    if rows.empty:
        return f"No checkpoint rows in group {group!r}."
    last = rows.loc[rows.step.idxmax()]
    text = (f"At step {last.step} ({last.checkpoint}), the mean {WORDS[metric]} is "
            f"{rp.row_text(last, unit=' nats')} per token ({last.problems} problems, {last.rows} "
            "tokens; the reference is 0 by definition).")
    steps = changes[(changes.group == group) & (changes.metric == metric)]
    moved = [(r, rp.sign_of(r.change, r.low, r.high, int(r.problems))) for r in steps.itertuples()]
    moved = [(r, s) for r, s in moved if s != 0]
    if moved:
        parts = [f"{'rises' if s > 0 else 'falls'} from step {r.step_from} to {r.step_to} "
                 f"({rp.row_text(r, estimate='change', signed=True, unit=' nats')})"
                 for r, s in moved]
        text += " Between consecutive steps the mean " + "; ".join(parts) + "."
    else:
        text += (" No change between consecutive steps has an interval that excludes 0 "
                 f"(or enough problems, {rp.MIN_CLUSTERS}, for one).")
    return text


def say_kl_and_accuracy(changes: pd.DataFrame, accuracy: pd.DataFrame | None,
                        contributions: pd.DataFrame, ground_truth: pd.DataFrame,
                        group: str = "target", metric: str = "kl_ref_ckpt") -> str:
    """Whether the mean KL falls between two steps while accuracy rises, which
    ground-truth labels the change comes from (``phases.change_contributions``), and how
    much of all KL the format tokens carry at the last step."""
    text = []
    acc = None if accuracy is None else accuracy.dropna(subset=["step"]).set_index("step")
    steps = changes[(changes.group == group) & (changes.metric == metric) & (changes.step_from > 0)]
    for r in steps.itertuples():
        if acc is None or r.step_from not in acc.index or r.step_to not in acc.index:
            continue
        a, b = acc.loc[r.step_from], acc.loc[r.step_to]
        if rp.sign_of(r.change, r.low, r.high, int(r.problems)) < 0 and b.rate > a.rate:
            text.append(
                f"From step {r.step_from} to {r.step_to} the mean {NAMES[metric]} falls (change "
                f"{rp.row_text(r, estimate='change', signed=True, unit=' nats')}) while accuracy "
                f"goes from {_rate(a)} to {_rate(b)}: "
                "a falling mean KL is not a model getting worse, nor a rising one a model getting "
                "better. " + _say_contributions(contributions, group, r.step_from, r.step_to))
    if acc is not None and not text:
        text.append(f"The mean {NAMES[metric]} does not fall (interval below 0) between any two "
                    "consecutive steps at which accuracy rises.")
    gt = ground_truth[(ground_truth.group == group) & (ground_truth.category == "format")]
    last = gt[gt.step == gt.step.max()].set_index("statistic")
    if {f"{metric}_share", "token_share"} <= set(last.index):
        kl, tok = last.loc[f"{metric}_share"], last.loc["token_share"]
        text.append(f"At step {kl.step}, format tokens carry "
                    f"{rp.row_text(kl, scale=100, unit='%')} of all {NAMES[metric]} while being "
                    f"{rp.row_text(tok, scale=100, unit='%')} of the tokens.")
    return " ".join(text)


def _rate(row) -> str:
    return rp.interval_text(row.rate, row.low, row.high, int(row.n), scale=100, unit="%")


def _say_contributions(contributions: pd.DataFrame, group: str, a: int, b: int) -> str:
    rows = contributions[(contributions.group == group) & (contributions.step_from == a)
                         & (contributions.step_to == b)]
    moved = [r for r in rows.itertuples() if rp.sign_of(r.estimate, r.low, r.high,
                                                        int(r.problems)) != 0]
    if not moved:
        return ("No ground-truth label's contribution to the change has an interval that "
                "excludes 0.")
    parts = ", ".join(f"'{r.category}' {rp.row_text(r, signed=True, unit=' nats')}"
                      for r in sorted(moved, key=lambda r: r.estimate))
    return (f"By ground-truth label (contributions that add up to the change, those whose "
            f"interval excludes 0): {parts}.")


def say_tails(tails: pd.DataFrame, group: str = "target") -> str:
    """The last step's high quantile and share of tokens above the threshold."""
    rows = tails[(tails.group == group)]
    if rows.empty:
        return f"No checkpoint rows in group {group!r}."
    last = rows[rows.step == rows.step.max()].set_index("statistic")
    share = last.loc[next(s for s in last.index if s.startswith("share"))]
    quantile = last.loc[max(s for s in last.index if s.startswith("p"))]
    return (f"At step {share.step}, {rp.row_text(share, scale=100, unit='%')} of tokens have "
            f"{NAMES[share.metric]} {share.name.replace('share ', '')}, and its "
            f"{quantile.name} is {rp.row_text(quantile, unit=' nats')}.")


def say_categories(categories: pd.DataFrame, contrasts: pd.DataFrame, group: str = "target",
                   what: str = "token category") -> str:
    """At the contrasts' step: which label's tokens lose the most probability (said only
    when its paired difference to the runner-up, and to every other label with enough
    problems, excludes 0; else the labels it cannot be told from are named), the
    labels with too few problems to take part, and the labels that carry more of all
    KL(ref‖ckpt) than of the tokens."""
    con = contrasts[contrasts.group == group]
    if con.empty:
        return f"No labelled rows in group {group!r}."
    step = int(con.step.iloc[0])
    means = categories[(categories.group == group) & (categories.step == step)
                       & (categories.statistic == "dlogp_mean")].set_index("category")
    eligible = sorted(set(con[con.eligible].category) | set(con[con.eligible].versus) - {""})
    few = con[~con.eligible].drop_duplicates("category")
    text = []
    diffs = con[con.statistic == "dlogp: leader minus"]
    if len(diffs) or len(eligible) == 1:
        leader = diffs.category.iloc[0] if len(diffs) else eligible[0]
        lead = means.loc[leader]
        if rp.sign_of(lead.estimate, lead.low, lead.high, int(lead.problems)) >= 0:
            text.append(f"At step {step}, no {what} loses probability with an interval below 0: "
                        f"the lowest mean Δlogp, '{leader}', is "
                        f"{rp.row_text(lead, unit=' nats')}.")
        else:
            diffs = diffs.assign(_mean=diffs.versus.map(means.estimate)).sort_values("_mean")
            runner = diffs.iloc[0] if len(diffs) else None
            beaten = [rp.sign_of(d.estimate, d.low, d.high, int(d.problems)) < 0
                      for d in diffs.itertuples()]  # the runner-up and every other label
            if runner is None:  # the only label with enough problems: nothing to beat
                text.append(f"At step {step}, only '{leader}' has tokens in "
                            f"{rp.MIN_CLUSTERS} problems or more; its mean Δlogp is "
                            f"{rp.row_text(lead, unit=' nats')}, with no other {what} to "
                            "compare it with.")
            elif all(beaten):
                text.append(
                    f"At step {step}, the checkpoint lowers the probability of the reference's "
                    f"'{leader}' tokens most: mean Δlogp {rp.row_text(lead, unit=' nats')}; the "
                    f"runner-up '{runner.versus}' has {rp.row_text(means.loc[runner.versus])}, "
                    f"and the difference is {rp.row_text(runner, signed=True, unit=' nats')}.")
            else:
                tied = [leader] + [d.versus for d in diffs.itertuples() if rp.sign_of(
                    d.estimate, d.low, d.high, int(d.problems)) >= 0]
                listed = "; ".join(f"'{c}' {rp.row_text(means.loc[c], unit=' nats')}"
                                   for c in tied)
                text.append(f"At step {step}, no single {what} loses the most probability: the "
                            f"lowest mean Δlogp, '{leader}', cannot be told apart from "
                            f"{_names(tied[1:])} (their paired differences include 0 or have "
                            f"no interval). Their means: {listed}.")
    elif not eligible:
        text.append(f"At step {step}, no {what} has tokens in {rp.MIN_CLUSTERS} problems or "
                    "more: no comparison.")
    if len(few):
        text.append(f"Too few problems (fewer than {rp.MIN_CLUSTERS}) to compare: " + ", ".join(
            f"'{r.category}' ({r.problems})" for r in few.itertuples()) + ".")
    return " ".join(text + [_say_excess(con, categories, group, step, what)])


def _say_excess(con, categories, group, step, what) -> str:
    rows = con[(con.statistic == "kl share minus token share") & con.eligible]
    shares = categories[(categories.group == group) & (categories.step == step)]
    above = [r for r in rows.itertuples() if rp.sign_of(r.estimate, r.low, r.high,
                                                         int(r.problems)) > 0]
    if not above:
        return (f"No {what}'s share of all KL(ref‖ckpt) exceeds its share of the tokens "
                "with an interval that excludes 0.")
    parts = []
    for r in above:
        kl = shares[(shares.category == r.category) & (shares.statistic == "kl_ref_ckpt_share")]
        tok = shares[(shares.category == r.category) & (shares.statistic == "token_share")]
        parts.append(f"'{r.category}' tokens carry "
                     f"{rp.row_text(kl.iloc[0], scale=100, unit='%')} of all KL(ref‖ckpt) while "
                     f"being {rp.row_text(tok.iloc[0], scale=100, unit='%')} of the tokens "
                     f"(difference {rp.row_text(r, scale=100, signed=True, unit=' points')})")
    return "; ".join(parts) + "."


def say_phases(onsets: pd.DataFrame, group: str = "target") -> str:
    """Which ground-truth labels change from which step, in order, by the onset rule."""
    rows = onsets[onsets.group == group]
    if rows.empty:
        return f"No labelled rows in group {group!r}."
    placed = rows[rows.status == "onset"].sort_values(["onset_step", "category"])
    text = [(f"Phases (Δlogp of the written token by ground-truth label; a label changes "
             f"\"from step N\" at {ONSET_RULE}):")]
    if len(placed):
        waves = []
        for step, wave in placed.groupby("onset_step", sort=True):
            moves = ", ".join(f"'{r.category}' {'lowered' if r.direction < 0 else 'raised'} "
                              f"{rp.row_text(r, signed=True, unit=' nats')}"
                              for r in wave.itertuples())
            waves.append((list(wave.category), step, moves))
        names, step, moves = waves[0]
        verb = "changes" if len(names) == 1 else "change"
        first = (f"{_names(names)} {verb} first, from step {step} ({moves})" if len(waves) > 1
                 else f"{_names(names)} {verb} from step {step} ({moves})")
        text.append("; then ".join([first] + [f"{_names(n)} from step {s} ({m})"
                                              for n, s, m in waves[1:]]) + ".")
    else:
        text.append("no label changes lastingly at any step.")
    still = rows[rows.status == "no lasting change"]
    if len(still):
        text.append("No lasting change: " + "; ".join(
            f"'{r.category}' (step {r.step}: {rp.row_text(r, signed=True, unit=' nats')})"
            for r in still.itertuples()) + ".")
    few = rows[rows.status == "too few problems"]
    if len(few):
        text.append(f"Too few problems to place (fewer than {rp.MIN_CLUSTERS} at every step): "
                    + ", ".join(f"'{r.category}' ({r.most_problems})" for r in few.itertuples())
                    + ".")
    return " ".join(text)


def _span(low, high) -> str:
    """"a–b", or one number where both ends print alike (never "94.6–94.6")."""
    a, b = rp.fmt(low), rp.fmt(high)
    return a if a == b else f"{a}–{b}"


def say_concentration(share: pd.DataFrame, group: str = "target",
                      metric: str = "kl_ref_ckpt") -> str:
    """The last step's concentration against both baselines, and which it exceeds."""
    rows = share[(share.group == group) & (share.metric == metric)].dropna(subset=["estimate"])
    if rows.empty:
        return f"No {metric} to share out in group {group!r} (the checkpoints equal the reference)."
    r = rows.loc[rows.step.idxmax()]
    text = (f"At step {r.step}, the {100 * r.top:g}% highest-entropy positions carry "
            f"{rp.row_text(r, scale=100, unit='%')} of all {NAMES[metric]}. Shuffling the "
            f"values within problems gives {rp.fmt(100 * r.null_mean)}% "
            f"({_span(100 * r.null_low, 100 * r.null_high)}%); the same small nudge to every logit "
            f"everywhere would give {_span(100 * r.mechanical_low, 100 * r.mechanical_high)}%.")
    if not rp.interval_ok(r.estimate, r.low, r.high, int(r.problems)):
        return text + " With no interval for the observed share, neither baseline can be ruled out."
    verdicts = []
    for name, lo, hi in (("the shuffled null", r.null_low, r.null_high),
                         ("the mechanical share", r.mechanical_low, r.mechanical_high)):
        if not (rp.is_finite(lo) and rp.is_finite(hi)):
            verdicts.append(f"{name} is not defined here")
        elif r.low > hi:
            verdicts.append(f"exceeds {name}")
        elif r.high < lo:
            verdicts.append(f"falls below {name}")
        else:
            verdicts.append(f"does not exceed {name} (the intervals overlap)")
    text += " The observed share " + " and ".join(verdicts) + "."
    if r.low > r.null_high and not r.low > r.mechanical_high:
        text += (" So KL sits at uncertain positions more than chance puts it there, but no more "
                 "than uniform nudges would: that much concentration needs no targeting.")
    return text


def say_estimators(lab: pd.DataFrame, reweighted: pd.DataFrame, group: str = "target") -> str:
    """What the plain and the reweighted means do in ``group``: per estimator the rows
    that meet the exact mean, and the caveat that selected rollouts need not."""
    rows = lab[(lab.group == group) & (lab.level == "token") & (lab.target == "kl_ref_ckpt")
               & lab.estimator.isin(["k1", "k3"])]
    if rows.empty:
        return f"No rows in group {group!r}."
    rew = reweighted[reweighted.group == group]
    parts = []
    for k in ("k1", "k3"):
        for name, table in (("plain", rows[rows.estimator == k]),
                            ("reweighted", rew[rew.estimator == k])):
            verdicts = table.meets_exact.value_counts()
            undecided = int(len(table) - verdicts.get("yes", 0) - verdicts.get("no", 0))
            parts.append(f"{name} {k} meets it in {verdicts.get('yes', 0)} of {len(table)} rows"
                         + (f" ({undecided} cannot tell)" if undecided else ""))
    worst = rows.loc[rows.largest_share.idxmax()] if rows.largest_share.notna().any() else None
    text = (f"In group {group!r}, against the exact mean KL(ref‖ckpt) per (step, temperature): "
            + "; ".join(parts) + ".")
    if worst is not None:
        text += (f" The most concentrated error is {worst.estimator} at {worst.temperature_label},"
                 f" step {worst.step}: one token carries {rp.fmt(100 * worst.largest_share)}% of "
                 "its summed |k − exact|.")
    if group != lab_.UNSELECTED:
        text += (" These rollouts were selected (finished and wrong), not drawn from q_T, so "
                 "neither mean has to meet the exact one here, at any temperature: a miss "
                 "measures selection and temperature together.")
    return text


def say_t1_check(check: pd.DataFrame, group: str = lab_.UNSELECTED) -> str:
    """The verdict of the control on real tables: do k1 and k3 meet the exact KL(ref‖ckpt)
    on unselected T = 1 rollouts, every row within its simultaneous interval?"""
    if check.empty:
        return (f"This suite forced no {group!r} group, so the lab has no control on real "
                f"tables: add {group} to forcing.groups (and 1.0 to rollouts.temperatures).")
    verdicts = check.meets_exact.value_counts()
    yes, no = int(verdicts.get("yes", 0)), int(verdicts.get("no", 0))
    last = check[check.step == check.step.max()]
    parts = [f"{r.estimator} {rp.fmt(r.mean_estimate)} against {rp.fmt(r.mean_exact)} (bias "
             f"{rp.row_text(r, estimate='bias', signed=True, unit=' nats')}: {r.meets_exact})"
             for r in last.itertuples()]
    verdict = ("PASSES" if no == 0 and yes == len(check) else
               "FAILS" if no else "cannot be judged (too few problems for an interval)")
    return (f"T = 1 check on unselected rollouts (group {group!r}, {int(check.problems.max())} "
            f"problems, {int(check.rows.max())} tokens): k1 and k3 meet the exact KL(ref‖ckpt) "
            f"within their intervals ({check.level.iloc[0]}) in {yes} of {len(check)} "
            f"(estimator, step) rows, so the check {verdict}. At step "
            f"{int(last.step.iloc[0])}: " + "; ".join(parts) + ".")


def say_temperature_problems(counts: pd.DataFrame, group: str = "target") -> str:
    """Which problems each temperature's estimates come from, and how many are shared."""
    part = counts[counts.group == group].drop(columns="group").set_index("problem_id")
    part = part.loc[:, (part > 0).any()]
    if part.empty:
        return f"No rollouts in group {group!r}."
    per = ", ".join(f"{t}: {int((part[t] > 0).sum())}" for t in part.columns)
    shared = int((part > 0).all(axis=1).sum())
    text = (f"In group {group!r}, problems per temperature: {per}; {shared} of {len(part)} "
            "problems have rollouts at every temperature.")
    if part.shape[1] > 1 and shared < rp.MIN_CLUSTERS:
        text += (f" Too few ({rp.MIN_CLUSTERS} needed) to compare temperatures on the same "
                 "problems: a difference between temperatures here may be a difference between "
                 "problems.")
    return text


def say_finding(when: pd.DataFrame, onsets: pd.DataFrame, ground_truth: pd.DataFrame,
                group: str = "target", metric: str = "kl_ref_ckpt") -> str:
    """The chapter's answer in two or three sentences: the ground-truth label whose written
    tokens change most (of those with an onset, the largest mean Δlogp at its onset), from
    which step and how far by the last step; how much the other labels with an onset move;
    and the mean divergence per token at the last step."""
    rows = onsets[(onsets.group == group) & (onsets.status == "onset")]
    if len(rows):
        top = rows.loc[rows.estimate.abs().idxmax()]
        gt = ground_truth[(ground_truth.group == group) & (ground_truth.statistic == "dlogp_mean")
                          & (ground_truth.category == top.category)]
        end = gt.loc[gt.step.idxmax()] if len(gt) else None
        way = "lower" if top.direction < 0 else "raise"
        text = (f"**Finding.** The tokens the checkpoints change most are '{top.category}': from "
                f"step {int(top.onset_step)} on they {way} the written token's log-probability "
                f"(Δlogp {rp.row_text(top, signed=True, unit=' nats')} at step {int(top.onset_step)}")
        if end is not None and int(end.step) != int(top.onset_step):
            text += f", {rp.row_text(end, signed=True, unit=' nats')} at step {int(end.step)}"
        others = rows[rows.category != top.category]
        many = "1 other label changes" if len(others) == 1 else f"{len(others)} other labels change"
        text += ")" + (f"; {many} lastingly too, by at most "
                       f"{rp.fmt(others.estimate.abs().max())} nats at their onset ({_names(others.category)})."
                       if len(others) else "; no other label changes lastingly.")
    else:
        text = "**Finding.** No ground-truth label changes lastingly at any step."
    last = when[(when.group == group) & (when.metric == metric) & (when.step > 0)]
    if len(last):
        r = last.loc[last.step.idxmax()]
        text += (f" At step {r.step} the mean {NAMES[metric]} is {rp.row_text(r, unit=' nats')} "
                 "per token of the reference's wrong rollouts.")
    return text


def say_group_verdict(when: pd.DataFrame, group: str = "target",
                      metric: str = "kl_ref_ckpt") -> str:
    """The verdict under the contrast of groups: at the last step, is ``group``'s mean
    ``metric`` above each other group's (intervals apart), below, or not told apart."""
    rows = when[(when.metric == metric) & (when.step == when.step.max())].set_index("group")
    if group not in rows.index or len(rows) < 2:
        return f"*Only group {group!r} was forced at the last step: there is nothing to compare.*"
    mine, said, above = rows.loc[group], [], 0
    for other, r in rows.drop(index=group).iterrows():
        both = (rp.interval_ok(mine.estimate, mine.low, mine.high, int(mine.problems))
                and rp.interval_ok(r.estimate, r.low, r.high, int(r.problems)))
        verdict = ("lower" if both and mine.high < r.low else
                   "higher" if both and mine.low > r.high else "not told apart")
        above += verdict == "higher"
        said.append(f"'{other}' {rp.row_text(r, unit=' nats')} ({group!r} {verdict})")
    whole = ("so the change is specific to the reference's wrong reasoning" if above == len(said)
             else "so, by this mean, RL changed the reference's text in general, not only its wrong "
                  "reasoning")
    return (f"**Verdict.** At step {int(mine.step)} the mean {NAMES[metric]} of group {group!r} is "
            f"{rp.row_text(mine, unit=' nats')}, against " + "; ".join(said) + f": {whole}.")

"""Chapter 05's conclusions in words, each read from its tables: the chapter's finding (the
sentences it opens with), and the verdict under each comparison it sets up (the spike rate
of the target group against its contrast groups; the RLVR run's onsets against the
placebo run's). Numbers go through ``reporting``; "higher" only where the intervals do not
overlap."""

from __future__ import annotations

import pandas as pd

from rlprobe_nb import reporting
from rlprobe_nb.readable import counted

FIRST_WRONG = "result_first_wrong"


def first_wrong_spikes(tests: pd.DataFrame, tokens: pd.DataFrame, labels: pd.DataFrame,
                       group: str = "target") -> dict:
    """At the last checkpoint, the first wrong digits (label ``result_first_wrong``) of
    ``group``'s rollouts: how many (``digits``, over ``problems``), how many are spikes,
    how many of those lower the written digit's probability (``lowering``)."""
    last = int(tokens.step.max())
    rows = tokens[(tokens.step == last) & (labels.ground_truth == FIRST_WRONG)
                  & (tokens.group == group)]
    out = {"step": last, "group": group, "digits": len(rows), "problems": rows.problem_id.nunique(),
           "spikes": 0, "lowering": 0}
    if rows.empty:
        return out
    at = tests[tests.step == last].drop_duplicates(["context_id", "token_id"]).set_index(
        ["context_id", "token_id"])
    hit = at.reindex(pd.MultiIndex.from_frame(rows[["context_id", "token_id"]]))
    spikes = hit.significant.astype("boolean").fillna(False).to_numpy(bool)
    out.update(spikes=int(spikes.sum()), lowering=int((hit.dlogp.to_numpy()[spikes] < 0).sum()))
    return out


def say_first_wrong(counts: dict) -> str:
    """``first_wrong_spikes`` in one sentence."""
    if not counts["digits"]:
        return f"*No first wrong digit in the `{counts['group']}` rollouts at step {counts['step']}.*"
    share = reporting.fmt(100 * counts["spikes"] / counts["digits"])
    return (f"At step {counts['step']}, {counts['spikes']} of the {counts['digits']} first wrong "
            f"digits of the `{counts['group']}` rollouts ({counted(counts['problems'], 'problem')}) are "
            f"spikes ({share}%), {counts['lowering']} of them lowering the written digit's "
            "probability.")


def _onset_of(onsets: pd.DataFrame, label: str):
    rows = onsets[(onsets.scheme == "ground_truth") & (onsets.category == label)]
    return rows.iloc[0] if len(rows) else None


def _with_onset(onsets: pd.DataFrame, scheme: str = "ground_truth") -> pd.DataFrame:
    part = onsets[onsets.scheme == scheme] if len(onsets) else onsets
    return part[part.status == "onset"] if len(part) else part


def finding(onsets: pd.DataFrame, placebo_onsets: pd.DataFrame, counts: dict | None,
            separation: int | None) -> str:
    """The chapter's answer in two or three sentences: when the first wrong digits start to
    change and which way, how many of them are single spikes at the last step, and what the
    placebo run's own departures show beside it."""
    first = _onset_of(onsets, FIRST_WRONG)
    acc = (f"accuracy separates from the reference's at step {separation}" if separation is not None
           else "no checkpoint's accuracy separates from the reference's")
    if first is not None and first.status == "onset":
        way = "lowers" if first.direction == "rejects" else "raises"
        text = (f"**Finding.** From step {int(first.onset_step)} on, the RLVR run {way} the probability "
                f"of the first wrong digit of a wrong result (`{FIRST_WRONG}`: mean departure "
                f"{first.mean_departure} nats at step {int(first.onset_step)}), and keeps doing so at "
                f"every later step; {acc}.")
    elif first is not None:
        text = (f"**Finding.** The first wrong digits (`{FIRST_WRONG}`) show no lasting change in "
                f"the RLVR run ({first.status}; at step {int(first.step)}: {first.mean_departure} "
                f"nats); {acc}.")
    else:
        text = f"**Finding.** No first wrong digit is in the tested group; {acc}."
    if counts and counts["digits"]:
        text += " " + say_first_wrong(counts)
    if len(placebo_onsets):
        theirs = _with_onset(placebo_onsets)
        labels = int((placebo_onsets.scheme == "ground_truth").sum())
        kept = first is not None and first.status == "onset"
        text += (f" Without the reward's information (the placebo run) {len(theirs)} of {labels} "
                 "ground-truth labels change lastingly too, so only a change beyond the placebo's "
                 "is the reward's: " + (f"the first wrong digits' is, from step {int(first.onset_step)}."
                                        if kept else "the first wrong digits show none."))
    return text


def say_placebo_verdict(onsets: pd.DataFrame, placebo_onsets: pd.DataFrame) -> str:
    """What the placebo's onsets mean for the RLVR run's (the comparison under 05's
    "placebo run's own onsets")."""
    if not len(placebo_onsets):
        return "the suite has no placebo run, so nothing says which changes need the reward."
    theirs = _with_onset(placebo_onsets)
    labels = int((placebo_onsets.scheme == "ground_truth").sum())
    first = _onset_of(onsets, FIRST_WRONG)
    kept = first is not None and first.status == "onset"
    if len(theirs) == labels and labels:
        start = (f"optimisation without the reward's information moves every kind of token "
                 f"(all {labels} labels, from step {int(theirs.onset_step.min())})")
    elif len(theirs):
        start = ("optimisation without the reward's information moves some kinds of token ("
                 + ", ".join(f"`{c}`" for c in theirs.category) + ")")
    else:
        start = "optimisation without the reward's information moves no kind of token lastingly"
    end = (f"so an onset in a run's own departures says little; the first wrong digits still "
           f"change beyond the placebo, from step {int(first.onset_step)}." if kept else
           "and the first wrong digits do not change beyond the placebo.")
    return f"{start}, {end}"


def say_group_rates(rates: pd.DataFrame, target: str = "target") -> str:
    """The verdict under the spike rate per contrast group: at each step, is the target
    group's rate higher than each contrast's (intervals apart), lower, or not told apart."""
    if rates.empty or target not in set(rates.group):
        return f"*No `{target}` contexts were tested: there is no rate to compare.*"
    last = rates[rates.step == rates.step.max()].set_index("group")
    mine = last.loc[target]
    said, higher = [], 0
    for group, row in last.drop(index=target).iterrows():
        apart = (reporting.interval_ok(mine.rate, mine.low, mine.high, int(mine.problems))
                 and reporting.interval_ok(row.rate, row.low, row.high, int(row.problems)))
        if apart and mine.low > row.high:
            verdict, higher = "higher", higher + 1
        elif apart and mine.high < row.low:
            verdict = "lower"
        else:
            verdict = "not told apart"
        said.append(f"`{group}` {row['spike rate']} ({verdict})")
    if not said:
        return "*Only the target group was tested: there is no contrast to compare with.*"
    whole = (f"higher than in every contrast group: the spikes are about the reference's wrong "
             f"reasoning, not its text in general" if higher == len(said) else
             "not higher than in every contrast group: the spikes are, at least in part, a change "
             "to the reference's text in general")
    return (f"**Verdict.** At step {int(mine.step)} the spike rate of the `{target}` contexts is "
            f"{mine['spike rate']}, against " + "; ".join(said) + f". The rate is {whole}.")

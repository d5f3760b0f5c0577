"""Chapter 05's sentences, each read from a table: which null each checkpoint was tested
against, what the plant check says "no spike" means, how many spikes there are, and when
each kind of token starts to change. Numbers go through ``reporting``."""

from __future__ import annotations

import pandas as pd

from rlprobe_nb import reporting


def say_nulls(nulls: pd.DataFrame) -> str:
    """Which null each checkpoint was tested against, and why."""
    external = nulls[nulls.null != "internal"]
    internal = nulls[nulls.null == "internal"]
    parts = []
    if len(external):
        parts.append("**External null** (the placebo run: the same training with a reward that "
                     "carries no information) for " + ", ".join(
                         f"{c} (against {n})" for c, n in zip(external.checkpoint, external.null)) + ".")
    if len(internal):
        no_run = internal.why.str.startswith("the suite has no placebo")
        reasons = (["the suite has no placebo checkpoint at " + ("any of these steps" if len(internal) > 1
                                                                  else "this step")]
                   if no_run.any() else [])
        reasons += sorted(set(internal.why[~no_run]))
        parts.append("**Internal null** (the checkpoint's own departures at other problems' "
                     "contexts) for " + ", ".join(internal.checkpoint) + ": "
                     + "; ".join(reasons) + ".")
    return " ".join(parts)


def say_power(check: pd.DataFrame, tests: pd.DataFrame, q: float) -> str:
    """What the plant check says, per plant size, over the checkpoints."""
    lines = []
    m = tests.drop_duplicates("checkpoint").set_index("checkpoint").n_tests
    for d, part in check.groupby("d", sort=False):
        per = ", ".join(f"{int(r.step)}: {r.found}/{r.plants}" for r in part.itertuples())
        lines.append(f"- a rejection of {-d:g} nats (Δlogp = {d:+g}) "
                     f"is found at step {per} (recall {reporting.fmt(part.found.sum() / part.plants.sum())} "
                     "over all checkpoints)")
    bar = reporting.fmt(q / int(m.max()), 2)
    best = check[check.d == check.d.min()]
    weak = best[best.recall < 0.8]
    text = ("Plants in this suite's own tables (the written token's probability set to "
            "q(x)·e^d at contexts of one rollout, every metric recomputed), tested exactly as "
            "the checkpoint is:\n\n" + "\n".join(lines) + "\n\n")
    if len(weak):
        text += (f"So at steps {', '.join(str(int(s)) for s in weak.step)} a change of "
                 f"{-best.d.iloc[0]:g} nats at one token is mostly *not* called a "
                 f"spike: \"no spike\" there means no departure beyond what the null allows, not "
                 f"no change. BH over {int(m.max())} contexts asks for a smallest p-value below "
                 f"about {bar}.")
    else:
        text += (f"Every checkpoint finds 80% or more of the {-best.d.iloc[0]:g}-nat plants: \"no spike\" at a context means no "
                 "change of that size there.")
    return text


def say_spikes(summary: pd.DataFrame, n_shown: int, n_wanted: int) -> str:
    """How many spikes each checkpoint has, and why fewer are shown than wanted."""
    total = int(summary.spike_contexts.sum())
    if total == 0:
        return ("No context is a spike at any checkpoint (BH at the chosen level, against the "
                "null named above). The plant check says how large a change would have had to be; "
                "below, the strongest departures stand in, labelled as departures, not spikes.")
    per = ", ".join(f"{int(r.step)}: {int(r.spike_contexts)}" for r in summary.itertuples())
    text = f"Spike contexts per step: {per}."
    from rlprobe_nb.spikes.table import MIN_VISIBLE_CHANGE

    text += (" Shown below: the strongest at the last checkpoint whose written token visibly "
             f"moved (its probability by at least {MIN_VISIBLE_CHANGE:g}, or it became or "
             "stopped being the most likely token), the first response token left out.")
    if n_shown < n_wanted:
        text += f" There are {n_shown} such spikes, fewer than the {n_wanted} asked for: all are shown."
    return text


def say_onsets(onsets: pd.DataFrame, separation: int | None, against: str) -> str:
    """The onset of each label of the ground truth, beside the step where accuracy
    separates from the reference's."""
    gt = onsets[onsets.scheme == "ground_truth"].set_index("category")
    acc = (f"Accuracy first separates from the reference's at step {separation}"
           if separation is not None else "No checkpoint's accuracy interval separates from the "
           "reference's")
    parts = []
    for label in ("result_first_wrong", "result_correct", "format"):
        if label not in gt.index:
            parts.append(f"`{label}`: no token of this label in the tested group")
            continue
        r = gt.loc[label]
        if r.status == "onset":
            parts.append(f"`{label}`: onset at step {int(r.onset_step)} ({r.direction}, mean "
                         f"departure {r.mean_departure} nats there)")
        else:
            parts.append(f"`{label}`: {r.status} (at step {int(r.step)}: {r.mean_departure})")
    return (f"{acc}. Departure = Δlogp {against}. " + "; ".join(parts) + ".")


def say_run_onsets(rlvr: pd.DataFrame, placebo: pd.DataFrame) -> str:
    """How many labels and categories have an onset in the RLVR run and in the placebo
    run (its own departures from the reference), and which."""
    if placebo.empty:
        return ("The suite has no placebo run: the onsets above have no null run beside "
                "them.")
    parts = []
    for scheme, name in (("ground_truth", "ground-truth labels"),
                         ("token_category", "token categories")):
        said = []
        for run, frame in (("the RLVR run (its excess over the placebo)", rlvr),
                           ("the placebo run (its own departures from the reference)", placebo)):
            part = frame[frame.scheme == scheme]
            found = part[part.status == "onset"]
            which = ", ".join(f"`{c}` at {int(s)}" for c, s in zip(found.category, found.onset_step))
            said.append(f"{run}: {len(found)} of {len(part)}" + (f" ({which})" if which else ""))
        parts.append(f"{name[0].upper() + name[1:]} with an onset: " + "; ".join(said) + ".")
    return " ".join(parts)


def say_placebo_plants(check: pd.DataFrame, summary: pd.DataFrame, q: float) -> str:
    """What the plants in the placebo's own tables say: the share of discoveries outside
    the plants, and the placebo's spikes beside the RLVR run's at the same step."""
    if check.empty:
        return "*The suite has no placebo run: there is no table without a signal to plant in.*"
    per = check.drop_duplicates("checkpoint")
    worst = per.loc[per.other_share.idxmax()]
    real = summary.set_index("step").spike_contexts
    beside = ", ".join(
        f"step {int(r.step)}: {reporting.fmt(r.unplanted_per_split)} against "
        f"{int(real.get(r.step, 0))}" for r in per.itertuples())
    return (f"Planted in the placebo's own tables, {int(check.found.sum())} of {int(check.plants.sum())} "
            f"plants were found; the discoveries outside them are at most "
            f"{reporting.fmt(100 * worst.other_share)}% of all discoveries at a step "
            f"(step {int(worst.step)}), where BH at q = {q:g} keeps false discoveries to about "
            f"{100 * q:g}% of them. With nothing planted, the placebo tested as if it were the "
            f"RLVR run gives these spikes per split (both halves, every context once), beside "
            f"the RLVR run's spike contexts at the same step: {beside}.")

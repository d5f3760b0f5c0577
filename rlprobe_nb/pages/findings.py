"""The book's answer: the paragraph the index opens with, every number read from a chapter's
tables, tagged with its source (``headlines.tagged``: a test recomputes it) and linked to
the section of the chapter that prints it.

It says which tokens RLVR changes and from which step (chapter 05's onsets by ground-truth
label, the RLVR run's departures in excess of the placebo's), what the placebo run does on
its own (05's onsets of the placebo's own departures), and whether those tokens decide the
answer (chapter 08, through ``counterfactual_finding``: the one place that reads 08's
result); one sentence says why 05 and 08 do not disagree; then how few positions carry the
checkpoint's gain (chapter 09's takeover headline). A part whose tables are not
written yet is left out, and the paragraph says which chapter to run.
"""

from __future__ import annotations

import html

from rlprobe_nb.pages import headlines
from rlprobe_nb.pages.headlines import tagged

FIRST_WRONG = "result_first_wrong"
SPIKES_PAGE = "05_spikes.html"
ONSETS_AT = f"{SPIKES_PAGE}#When-each-kind-of-token-changes"
PLACEBO_AT = ONSETS_AT  # its subsection's anchor holds a quote, which a CSS selector cannot
BRANCHES_PAGE = "08_counterfactuals.html"
TAKEOVER_PAGE = "09_takeover.html"


def _a(href: str, inner: str) -> str:
    return f'<a class="rp-from" href="{html.escape(href, quote=True)}">{inner}</a>'


def _onsets(t: headlines.Tables, table: str):
    from rlprobe_nb.spikes import onsets

    return onsets.onsets(t(table))


def tokens_sentence(t: headlines.Tables) -> str:
    """Which tokens the RLVR run changes beyond the placebo, from which step, which way."""
    found = _onsets(t, "spike_label_departures")
    row = found[(found.scheme == "ground_truth") & (found.category == FIRST_WRONG)]
    if row.empty:
        return "The tested rollouts hold no first wrong digit of a wrong result."
    r = row.iloc[0]
    if r.status != "onset":
        return (f"The first wrong digits of wrong results show no lasting change beyond the placebo "
                f"run's ({html.escape(str(r.status))}; {_a(ONSETS_AT, 'chapter 05')}).")
    step = int(r.onset_step)
    where = {"scheme": "ground_truth", "category": FIRST_WRONG}
    at = {**where, "step": step}
    way = "lower" if r.direction == "rejects" else "raise"
    value = lambda col: tagged(found_value(t, at, col), "spike_label_departures", "value", col, at,  # noqa: E731
                               fmt="signed")
    others = found[(found.scheme == "ground_truth") & (found.status == "onset")
                   & (found.category != FIRST_WRONG)]
    text = (f"From RL step {_a(ONSETS_AT, tagged(step, 'spike_label_departures', 'onset_step', None, where))} on, "
            f"the RLVR checkpoints {way} the probability of the <b>first wrong digit of a wrong "
            f"result</b>, beyond what the placebo run does at the same token (mean change "
            f"{_a(ONSETS_AT, value('estimate'))} nats [{value('low')}, {value('high')}] at that step), "
            "and keep doing so at every later step.")
    if len(others):
        sizes = [(abs(found_value(t, {"scheme": "ground_truth", "category": c, "step": int(o)}, "estimate")),
                  c, int(o)) for c, o in zip(others.category, others.onset_step)]
        size, category, at_step = max(sizes)
        than = "less" if size < abs(found_value(t, at, "estimate")) else "more"
        there = {"scheme": "ground_truth", "category": category, "step": at_step}
        change = tagged(found_value(t, there, "estimate"), "spike_label_departures", "value",
                        "estimate", there, fmt="signed")
        text += (f" Other kinds of token change beyond the placebo too, by {than}: the largest, "
                 f"<code>{html.escape(str(category))}</code>, by {_a(ONSETS_AT, change)} nats at "
                 f"its onset (step {at_step}).")
    return text


def found_value(t: headlines.Tables, where: dict, column: str) -> float:
    rows = t("spike_label_departures")
    for col, value in where.items():
        rows = rows[rows[col] == value]
    return float(rows[column].iloc[0])


def placebo_sentence(t: headlines.Tables) -> str:
    """What the placebo run (the reward permuted) changes on its own."""
    found = _onsets(t, "spike_placebo_departures")
    gt = found[found.scheme == "ground_truth"]
    if gt.empty:
        return ""
    where = {"scheme": "ground_truth"}
    k = tagged(int((gt.status == "onset").sum()), "spike_placebo_departures", "onsets", None, where)
    n = tagged(gt.category.nunique(), "spike_placebo_departures", "nunique", "category", where)
    return (f"The placebo run, trained the same way with a reward that carries no information, "
            f"moves {_a(PLACEBO_AT, k)} of {n} ground-truth labels lastingly on its own: "
            "optimisation alone changes the text, so only a change beyond the placebo's is the "
            "reward's.")


def counterfactual_finding(t: headlines.Tables, P) -> list[str]:
    """Chapter 08's result, as the index states it: 08's index line (by label, the pass
    rate kept and with the checkpoint's choice swapped in, and the effect's interval; the
    placebo at the same contexts and at its own points)."""
    return headlines._branches(t, P)


RECONCILED = ("Chapters 05 and 08 answer different questions: 05 whether RLVR moves probability "
              "away from a token the reference wrote, 08 whether the token the checkpoint would "
              "write there instead changes whether the answer comes out right. 08 branches only "
              "where the checkpoint's first choice is another token, so a rejected token whose "
              "runner-up the checkpoint does not prefer is not tested there.")


def findings_html(t: headlines.Tables, P) -> str:
    """The index's opening paragraph (HTML), or a line naming what to run first."""
    parts, missing = [], []
    for chapter, make in (("05", tokens_sentence), ("05", placebo_sentence)):
        try:
            parts.append(make(t))
        except Exception:  # its tables are not written (or not readable) yet: never guess
            missing.append(chapter)
    try:
        eight = " ".join(counterfactual_finding(t, P))
        parts.append(f"Do these tokens decide the answer? {_a(BRANCHES_PAGE, 'Chapter 08')}: {eight}")
        parts.append(RECONCILED)
    except Exception:
        missing.append("08")
    try:
        nine = " ".join(headlines._takeover(t, P))
        parts.append(f"How few tokens carry the gain? {_a(TAKEOVER_PAGE, 'Chapter 09')}: the "
                     f"reference writes and the checkpoint takes over where it rejects the "
                     f"reference's draw most (Δlogp). {nine}")
    except Exception:
        missing.append("09")
    if missing:
        parts.append(f"<i>(Chapter {', '.join(sorted(set(missing)))}: tables not written yet; "
                     "run the book to complete this paragraph.)</i>")
    body = " ".join(p for p in parts if p)
    return f'<p class="rp-findings"><b>What the book finds.</b> {body}</p>'

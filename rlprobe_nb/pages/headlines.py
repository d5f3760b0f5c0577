"""Each chapter's headline numbers for the index page, read from the suite's tables.

Every number is wrapped in ``<span class="rp-num" data-src='{...}'>``: the table (a folder
under ``data/<suite>/``), the rows (``where``: column -> value), the column and the
aggregate (count, nunique, mean, max, value; for chapter 05's departures by label also
onset_step, a label's onset, and onsets, how many labels have one, by ``spikes.onsets``),
so a test can recompute it from the table and compare. Numbers are formatted by
``readable.number``, or as the chapters print estimates where ``format`` says so
(``FORMATS``). A chapter whose tables are not
written yet says so instead; 06 (cases read from 05's tables) and the appendix have none
of their own.
"""

from __future__ import annotations

import html
import json

import pandas as pd

from rlprobe_nb import reporting
from rlprobe_nb.readable import counted, number
from rlprobe_nb.reporting import fmt as estimate_text
from rlprobe_nb.tables import storage

NO_TABLES = "<i>its tables are not written yet</i>"


class Tables:
    """The suite's tables, read once each (only the columns asked for)."""

    def __init__(self, data_dir):
        self.data_dir, self._cache = data_dir, {}

    def __call__(self, name: str, columns: list[str] | None = None) -> pd.DataFrame:
        key = (name, tuple(columns or ()))
        if key not in self._cache:
            self._cache[key] = storage.read_table(self.data_dir / name, columns=columns)
        return self._cache[key]


# How a tagged number is written: ``number`` (the default), or as the chapters print an
# estimate (``reporting.fmt``: three significant digits, "signed" with its sign).
FORMATS = {"number": number, "fmt": estimate_text,
           "signed": lambda x: estimate_text(x, signed=True)}


def tagged(value, table: str, agg: str, column: str | None = None, where: dict | None = None,
           fmt: str = "number") -> str:
    src = {"table": table, "agg": agg, "column": column, "where": where or {}}
    if fmt != "number":
        src["format"] = fmt
    tag = html.escape(json.dumps(src, default=str), quote=True)
    return f'<span class="rp-num" data-src="{tag}">{html.escape(FORMATS[fmt](value))}</span>'


def _where(df: pd.DataFrame, where: dict) -> pd.DataFrame:
    for col, value in where.items():
        df = df[df[col] == value]
    return df


def _selection(t: Tables) -> list[str]:
    sel = t("selection", ["problem_id", "group"])
    parts = [f"{tagged(len(sel), 'selection', 'count')} problems"]
    for group in sorted(sel.group.unique()):
        n = int((sel.group == group).sum())
        parts.append(f"{tagged(n, 'selection', 'count', where={'group': group})} {html.escape(str(group))}")
    return [parts[0] + ": " + ", ".join(parts[1:]) + "."]


def _rollouts(t: Tables) -> list[str]:
    r = t("rollouts", ["rollout_id", "correct"])
    wrong = int((r.correct == False).sum())  # noqa: E712 (a missing grade is not wrong)
    return [f"{tagged(len(r), 'rollouts', 'count')} rollouts of the reference, "
            f"{tagged(wrong, 'rollouts', 'count', where={'correct': False})} of them wrong."]


def _forcing(t: Tables, checkpoint: str, reference: str) -> list[str]:
    name = f"tokens/{checkpoint}__vs__{reference}"
    rows = t(name, ["rollout_id", "kl_ref_ckpt"])
    return [f"{tagged(len(rows), name, 'count')} token rows over "
            f"{tagged(rows.rollout_id.nunique(), name, 'nunique', 'rollout_id')} rollouts; mean KL(ref‖ckpt) "
            f"{tagged(rows.kl_ref_ckpt.astype(float).mean(), name, 'mean', 'kl_ref_ckpt')} nats per token."]


def _divergence(t: Tables) -> list[str]:
    when = t("divergence_when")
    group = "target" if (when.group == "target").any() else when.group.iloc[0]
    rows = when[(when.group == group) & (when.metric == "kl_ref_ckpt")]
    last = rows[rows.step == rows.step.max()].iloc[0]
    where = {"group": group, "metric": "kl_ref_ckpt", "step": int(last.step)}
    value = lambda col: tagged(float(last[col]), "divergence_when", "value", col, where)  # noqa: E731
    interval = (f" [{value('low')}, {value('high')}] (95%, over problems)"
                if pd.notna(last.low) and pd.notna(last.high) else " (no interval: too few problems)")
    return [f"mean KL(ref‖ckpt) per token at step {tagged(int(last.step), 'divergence_when', 'value', 'step', where)}, "
            f"group {html.escape(str(group))}: {value('estimate')} nats{interval}."]


def _spikes(t: Tables) -> list[str]:
    sp = t("spikes", ["step", "context_id", "significant"])
    every = sp[sp.significant.astype(bool)]
    if every.empty:
        return [f"{tagged(0, 'spikes', 'nunique', 'context_id', {'significant': True})} contexts reached "
                "significance at any step."]
    last = int(sp.step.max())
    final = every[every.step == last].context_id.nunique()
    return [f"{tagged(every.context_id.nunique(), 'spikes', 'nunique', 'context_id', {'significant': True})} "
            f"contexts are spikes at one step or more, "
            f"{tagged(final, 'spikes', 'nunique', 'context_id', {'significant': True, 'step': last})} "
            f"at the last step ({tagged(last, 'spikes', 'max', 'step')})."]


def _viewer(t: Tables, checkpoints: list[str], reference: str) -> list[str]:
    name = f"tokens/{checkpoints[-1]}__vs__{reference}"
    rows = t(name, ["rollout_id", "kl_ref_ckpt"])
    return [f"{tagged(rows.rollout_id.nunique(), name, 'nunique', 'rollout_id')} rollouts "
            f"({tagged(len(rows), name, 'count')} tokens) at each of the suite's {len(checkpoints)} checkpoints."]


def _branches(t: Tables, P) -> list[str]:
    """08's answer: where the checkpoint would write another token, the labels at which
    its choice swapped in decides the answer and those where it is not shown to (each
    with the pass rate kept and swapped, tagged means of ``pass_rate``, and the mean
    effect's interval over problems, ``counterfactuals.by_label``); then the placebo: its
    choice at the same contexts, the paired difference from the checkpoint's (same
    draws), and its own disagreement points."""
    from rlprobe_nb.counterfactuals import branching, by_label, narrative

    b = t("branches")
    ckpt, seed = str(b.checkpoint.iloc[0]), int(b.seed.iloc[0])
    placebo = P.placebo_for(ckpt) if ckpt in P.steps and P.run_of(ckpt) == "rlvr" else None
    found = by_label.experiments(b, ckpt, placebo, seed=seed)
    names = list(found)

    def said(model, kind, group, r):
        where = {"model": model, "kind": kind, **({} if group == "all" else {"rule": group})}
        keep, top1 = [tagged(_where(b, {**where, "arm": arm}).pass_rate.astype(float).mean(),
                             "branches", "mean", "pass_rate", {**where, "arm": arm}, fmt="fmt")
                      for arm in ("keep", "top1")]  # as 08's table prints them
        return (f"{keep} → {top1}, effect {html.escape(by_label._text(r, reporting.MIN_CLUSTERS))}, "
                f"{counted(r.branches, 'point')} in {counted(r.problems, 'problem')}")

    def overall(name, model, kind):
        r = by_label._get(found[name], "all", "point")
        return "no point" if r is None else said(model, kind, "all", r)

    decides, others = by_label.by_verdict(found[names[0]])
    if not decides and not others:
        return [f"{html.escape(ckpt)}: no disagreement point was branched at."]
    listed = [[f"{by_label.NAMES[g]} ({said(ckpt, 'point', g, r)})" for g, r in part]
              for part in (decides, others)]
    out = [f"Where {html.escape(ckpt)} would write another token than the one written, its "
           "choice swapped in (pass rate kept → swapped) "
           + (f"decides the answer at {'; '.join(listed[0])}" if decides else
              "is not shown to decide the answer at any label")
           + (f"; it is not shown to at {'; '.join(listed[1])} (the interval holds 0, or too few "
              "problems)" if others and decides else "") + "."]
    if len(names) > 1:
        same = overall(names[1], placebo, "point")
        effects = branching.effects(b[b["kind"] == "point"], arm="top1")
        contrast = branching.policy_contrast(effects, ckpt, placebo, seed=seed)
        out.append(f"The placebo's choice at the same contexts: {same}; "
                   f"{html.escape(narrative.contrast_line(contrast))}.")
    if len(names) > 2:
        own = overall(names[2], placebo, "own_point")
        out.append(f"At the placebo's own disagreement points: {own}.")
    return out


def _takeover(t: Tables, P) -> list[str]:
    """09's answer: the two ends of the target (tagged mean correctness of the reference
    alone and of the checkpoint alone, same seeds), then the share of positions at which
    its Δlogp takeover recovers half and nine tenths of its gain, with random and the
    placebo at that share (``takeover.curves.headline``, as 09 prints it)."""
    from rlprobe_nb.takeover import curves, narrative

    take = t("takeover")
    names = list(dict.fromkeys(take.checkpoint))
    target = P.target if P.target in names else \
        [c for c in names if P.run_of(c) == "rlvr"][-1]
    placebo = next((c for c in names if P.run_of(c) == "placebo"), None)

    def acc(criterion: str) -> str:
        where = {"checkpoint": target, "criterion": criterion}
        return tagged(_where(take, where).correct.astype(float).mean(), "takeover", "mean",
                      "correct", where, fmt="fmt")

    head = curves.headline(take, target, placebo, n_boot=curves.N_BOOT, seed=P.takeover.seed)
    lines = narrative.headline_lines(head)
    return [f"Accuracy: the reference alone {acc('never')}, {html.escape(target)} alone "
            f"{acc('always')} (same seeds). " + " ".join(html.escape(x) + "." for x in lines)]


def headlines(P, pages, data_dir) -> dict[str, list[str]]:
    """Page stem -> its headline sentences (see the module doc)."""
    t = Tables(data_dir)
    out: dict[str, list[str]] = {}
    for page in pages:
        chapter = page.chapter
        jobs = {"01": lambda: _selection(t), "02": lambda: _rollouts(t), "04": lambda: _divergence(t),
                "05": lambda: _spikes(t), "07": lambda: _viewer(t, P.checkpoints, P.reference),
                "08": lambda: _branches(t, P), "09": lambda: _takeover(t, P)}
        if chapter == "03" and page.detail:
            jobs["03"] = lambda: _forcing(t, page.detail.split()[-1], P.reference)
        if chapter not in jobs:
            continue
        try:
            out[page.stem] = jobs[chapter]()
        except Exception:  # a table not written (or not readable) yet: say so, never guess
            out[page.stem] = [NO_TABLES]
    return out

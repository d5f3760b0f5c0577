"""What was taken over: chapter 04's ground-truth label of each position where a rule
changed the token (the checkpoint's draw written instead of the reference's), read on
the final text.

A token's label is the highest label of its characters (``ground_truth.label_text`` on
the response, each token's characters found by decoding the ids up to it), as the token
tables label theirs.
"""

from __future__ import annotations

import pandas as pd

from rlprobe_nb import reporting, statistics

from rlprobe_nb.divergence import ground_truth

ARITHMETIC = ("operator", "operand", "result_correct", "result_after_wrong",
              "result_first_wrong", "final_answer")

LABELS = ground_truth.LABELS


def token_labels(ids: list[int], tokenizer) -> list[str]:
    """The label of every token of a response."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    codes = ground_truth.label_text(text)
    out, start = [], 0
    for i in range(len(ids)):
        end = len(tokenizer.decode(ids[:i + 1], skip_special_tokens=True))
        span = codes[start:min(end, len(codes))]
        out.append(LABELS[int(span.max())] if len(span) else "other")
        start = max(start, end)
    return out


def changed_labels(take: pd.DataFrame, tokenizer, which: str = "changed") -> pd.DataFrame:
    """One row per (row of ``take``, position in its ``which`` list): checkpoint, run,
    criterion, budget, problem_id and the position's label. Each distinct response is
    labelled once."""
    rows = take[take[which].map(len) > 0]
    cache: dict[tuple, list[str]] = {}
    out = []
    for r in rows.itertuples():
        key = tuple(r.response_ids)
        if key not in cache:
            cache[key] = token_labels(list(key), tokenizer)
        labels = cache[key]
        for pos in getattr(r, which):
            out.append((r.checkpoint, r.run, r.step, r.criterion, r.budget, r.problem_id,
                        int(pos), labels[pos] if pos < len(labels) else "other"))
    return pd.DataFrame(out, columns=["checkpoint", "run", "step", "criterion", "budget",
                                      "problem_id", "pos", "label"])


def label_shares(labelled: pd.DataFrame) -> pd.DataFrame:
    """Per (checkpoint, criterion, budget): positions changed, problems, and the share of
    each label among them ("always", budget empty, is every position where the
    checkpoint's draw differs from the reference's: the base the criteria pick from)."""
    if labelled.empty:
        return pd.DataFrame()
    keys = ["checkpoint", "run", "step", "criterion", "budget"]
    counts = labelled.groupby(keys + ["label"], dropna=False).size().unstack("label",
                                                                            fill_value=0)
    counts = counts.reindex(columns=[c for c in LABELS if c in counts.columns])
    total = counts.sum(axis=1)
    shares = counts.div(total, axis=0)
    meta = labelled.groupby(keys, dropna=False).agg(changed=("pos", "size"),
                                                    problems=("problem_id", "nunique"))
    return meta.join(shares).reset_index()


def position_shares(take: pd.DataFrame, tokenizer) -> pd.Series:
    """The share of each label among every position of ``take``'s distinct responses (the
    base rate a takeover's labels are read against)."""
    texts = {tuple(ids) for ids in take.response_ids}
    counts = pd.Series([lab for ids in texts for lab in token_labels(list(ids), tokenizer)],
                       dtype=object).value_counts()
    return (counts / counts.sum()).reindex([c for c in LABELS if c in counts.index])


def arithmetic_share(labelled: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per (checkpoint, criterion, budget): the share of changed positions that are
    arithmetic (``ARITHMETIC``), with a 95% interval resampling problems (none from fewer
    than ``reporting.fewest()`` problems)."""
    keys = ["checkpoint", "run", "step", "criterion", "budget"]
    rows = []
    for key, part in labelled.groupby(keys, dropna=False):
        est, lo, hi = statistics.cluster_bootstrap_ci(
            part.label.isin(ARITHMETIC).to_numpy(float), part.problem_id.to_numpy(),
            n_boot=1000, seed=seed)
        problems = part.problem_id.nunique()
        if problems < reporting.fewest():  # the book's rule: no interval from fewer problems
            lo = hi = float("nan")
        rows.append({**dict(zip(keys, key)), "share": est, "low": lo, "high": hi,
                     "changed": len(part), "problems": problems})
    return pd.DataFrame(rows)


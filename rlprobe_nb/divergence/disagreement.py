"""The disagreement map: at which tokens, and when, a checkpoint would write another token.

At every forced position (the first response token left out) the checkpoint *disagrees*
where its most probable token (``topk_ids_ckpt[0]``) is a real alternative to the token
the reference wrote: not that token, and not the same text up to whitespace and case
(``is_real_alternative``, the rule chapter 08 branches by: "\\n" -> "\\n\\n" is
no disagreement, "4" -> "0" is). Chapter 08 branches at exactly these contexts.

``map_table`` gives, for every checkpoint (RLVR and placebo, by RL step) and label stratum
(chapter 08's ``STRATA``: first wrong digits, operands, operators, other tokens; and all):

    share           the share of positions where the checkpoint disagrees, with a 95%
                    interval that resamples problems (a problem's positions are not
                    independent draws)
    share_new       the share where it disagrees *and* its choice is not the reference's
                    own top-1 (RL promoted a token the reference did not prefer either)
    ref_rank_*      among the disagreements, where the checkpoint's choice ranks in the
                    reference's top-k: 1, 2, 3, 4..k, or beyond the top-k

``rank_table`` gives the last as a long table for a chart.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from rlprobe_nb.statistics import cluster_bootstrap_ci, seed_from

# the label strata of chapter 08's points and of this map: ground-truth labels, the rest
# "other" (words, correct results, final answers)
STRATA = ("result_first_wrong", "operand", "operator", "other")


def _plain(text: str) -> str:
    return text.strip().casefold()


def is_real_alternative(written: str, alternative: str) -> bool:
    """Whether ``alternative`` says something else than ``written``: its text, whitespace
    stripped and case ignored, is neither empty nor the written token's (chapter 08 swaps
    in only such a token)."""
    return bool(_plain(alternative)) and _plain(alternative) != _plain(written)

RANKS = ("1", "2", "3", "4..k", "beyond k")
NAMES = {"all": "all tokens", "result_first_wrong": "first wrong digits", "operand": "operands",
         "operator": "operators", "other": "other tokens"}
COLUMNS = ["checkpoint", "run", "step", "label", "positions", "problems", "disagreements",
           "share", "low", "high", "share_new", "new_low", "new_high"] + \
          [f"ref_rank_{r}" for r in RANKS]


TOKEN_COLUMNS = ["checkpoint", "reference", "group", "rollout_id", "problem_id", "pos",
                 "first_token", "token_id", "topk_ids_ckpt", "topk_ids_ref"]


def labels_for(rows: pd.DataFrame, labelled: pd.DataFrame, labels: pd.Series) -> pd.Series:
    """The ground-truth label of each of ``rows`` (any checkpoint's token rows), read from
    ``labels`` of ``labelled`` (token rows of the same rollouts, same index): the label
    depends on the written text alone, so every checkpoint's row of a position has the
    same one. A position ``labelled`` lacks is "other"."""
    by_key = pd.Series(labels.to_numpy(), index=pd.MultiIndex.from_arrays(
        [labelled["rollout_id"], labelled["pos"]])).astype(str)
    by_key = by_key[~by_key.index.duplicated()]
    keys = pd.MultiIndex.from_arrays([rows["rollout_id"], rows["pos"]])
    return pd.Series(by_key.reindex(keys).fillna("other").to_numpy(), index=rows.index)


def _top1(topk) -> int:
    return int(topk[0]) if isinstance(topk, (list, tuple, np.ndarray)) and len(topk) else -1


def _ref_rank(choice: int, topk_ref) -> str:
    ids = [int(t) for t in topk_ref] if isinstance(topk_ref, (list, tuple, np.ndarray)) else []
    if choice not in ids:
        return RANKS[-1]
    rank = ids.index(choice) + 1
    return str(rank) if rank <= 3 else RANKS[3]


def annotate(tokens: pd.DataFrame, labels: pd.Series, text_of: Callable[[int], str],
             special: set[int] = frozenset(), reference: str | None = None) -> pd.DataFrame:
    """The positions the map reads (first response tokens left out), each with its label
    stratum (``stratum``), ``disagrees``, ``new`` (disagrees, and the choice is not the
    reference's top-1) and ``ref_rank`` (where the choice ranks in the reference's
    top-k). ``labels``: the ground-truth label of each row of ``tokens`` (same index).
    With ``reference`` (its name), the reference itself is added at step 0, its own
    top-1 read as the choice: the written tokens were sampled from it, so it too
    "disagrees" where it drew another token than its first choice (the baseline)."""
    rows = tokens[~tokens["first_token"].to_numpy(bool)]
    label = labels.loc[rows.index].astype(str)
    if reference is not None:
        itself = ~rows.duplicated(["rollout_id", "pos"]).to_numpy()
        own = rows[itself].assign(checkpoint=reference, step=0,
                                  topk_ids_ckpt=rows["topk_ids_ref"][itself])
        label = pd.concat([label, label[itself]], ignore_index=True)
        rows = pd.concat([rows, own], ignore_index=True)
        label.index = rows.index
    texts: dict[int, str] = {}

    def text(i: int) -> str:
        if i not in texts:
            texts[i] = text_of(i)
        return texts[i]

    choice = np.array([_top1(t) for t in rows["topk_ids_ckpt"]])
    ref_top = np.array([_top1(t) for t in rows["topk_ids_ref"]])
    disagree = np.array([c >= 0 and c not in special and is_real_alternative(text(w), text(c))
                         for c, w in zip(choice, rows["token_id"].astype(int))], dtype=bool)
    return pd.DataFrame({
        "checkpoint": rows["checkpoint"], "step": rows["step"], "problem_id": rows["problem_id"],
        "stratum": label.where(label.isin(STRATA[:-1]), "other"), "disagrees": disagree,
        "new": disagree & (choice != ref_top),
        "ref_rank": [_ref_rank(c, t) if d else None
                     for c, t, d in zip(choice, rows["topk_ids_ref"], disagree)]},
        index=rows.index)


def _share(values: np.ndarray, problems: np.ndarray, n_boot: int, seed: int):
    if len(values) == 0:
        return np.nan, np.nan, np.nan
    return cluster_bootstrap_ci(values.astype(float), problems, n_boot, 0.05, seed)


def map_table(marked: pd.DataFrame, run_of: Callable[[str], str], n_boot: int = 1000,
              seed: int = 0) -> pd.DataFrame:
    """One row per (checkpoint, label stratum and "all"): see the module doc.
    ``marked``: ``annotate``'s rows; ``run_of``: "rlvr", "placebo" (or "reference") for
    a checkpoint."""
    rows = []
    for (ckpt, step), part in marked.groupby(["checkpoint", "step"], sort=True):
        for label in ("all",) + STRATA:
            mine = part if label == "all" else part[part["stratum"] == label]
            problems = mine["problem_id"].to_numpy()
            key = seed_from(seed, ckpt, label)
            share = _share(mine["disagrees"].to_numpy(), problems, n_boot, key)
            new = _share(mine["new"].to_numpy(), problems, n_boot, key + 1)
            ranks = mine.loc[mine["disagrees"], "ref_rank"].value_counts()
            total = int(mine["disagrees"].sum())
            rows.append({"checkpoint": ckpt, "run": run_of(ckpt), "step": int(step),
                         "label": NAMES[label], "positions": len(mine),
                         "problems": int(mine["problem_id"].nunique()), "disagreements": total,
                         "share": share[0], "low": share[1], "high": share[2],
                         "share_new": new[0], "new_low": new[1], "new_high": new[2],
                         **{f"ref_rank_{r}": (int(ranks.get(r, 0)) / total if total else np.nan)
                            for r in RANKS}})
    return pd.DataFrame(rows, columns=COLUMNS)


def display_frame(table: pd.DataFrame, interval: Callable) -> pd.DataFrame:
    """The map for reading: one row per (label, step), the share of each run with its
    interval as text (``interval(estimate, low, high, problems)``), and the share where
    the choice is not the reference's top-1 either."""
    out = []
    for (label, step), part in table.groupby(["label", "step"], sort=False):
        row = {"label": label, "step": int(step)}
        for r in part.itertuples():
            row[f"{r.run}: share"] = interval(r.share, r.low, r.high, int(r.problems))
            if r.run != "reference":
                row[f"{r.run}: not the reference's top-1"] = interval(
                    r.share_new, r.new_low, r.new_high, int(r.problems))
        out.append(row)
    order = {name: i for i, name in enumerate(NAMES.values())}
    frame = pd.DataFrame(out).fillna("–")
    return frame.sort_values(["label", "step"], key=lambda c: c.map(order) if c.name == "label"
                             else c).reset_index(drop=True)


def rank_table(table: pd.DataFrame) -> pd.DataFrame:
    """The share of each reference rank among the disagreements, long: checkpoint, run,
    step, label, rank, share."""
    long = table[["checkpoint", "run", "step", "label", "disagreements"]
                 + [f"ref_rank_{r}" for r in RANKS]].melt(
        ["checkpoint", "run", "step", "label", "disagreements"],
                      [f"ref_rank_{r}" for r in RANKS], var_name="rank", value_name="share")
    long["rank"] = long["rank"].str.removeprefix("ref_rank_")
    return long[(long["disagreements"] > 0) & (long["run"] != "reference")].reset_index(drop=True)


def sentence(table: pd.DataFrame, fmt: Callable, interval: Callable) -> str:
    """What the map says at the last step, RLVR against placebo, read from ``table``:
    the share of all positions where each disagrees, and where the RLVR checkpoint's
    choice sits in the reference's top-k."""
    last = table[table["step"] == table["step"].max()]
    parts = []
    for run in ("rlvr", "placebo"):
        rows = last[(last["run"] == run) & (last["label"] == NAMES["all"])]
        if len(rows):
            r = rows.iloc[0]
            parts.append(f"{r['checkpoint']} disagrees with the written token at "
                         f"{r['disagreements']} of {r['positions']} positions, a share of "
                         f"{interval(r['share'], r['low'], r['high'], int(r['problems']))}")
    base = table[(table["run"] == "reference") & (table["label"] == NAMES["all"])]
    if len(base):
        r = base.iloc[0]
        parts.append(f"the reference itself (its first choice against the token it drew) at "
                     f"{r['disagreements']}, "
                     f"{interval(r['share'], r['low'], r['high'], int(r['problems']))}")
    rl = last[(last["run"] == "rlvr") & (last["label"] == NAMES["all"])]
    if len(rl) and rl.iloc[0]["disagreements"]:
        r = rl.iloc[0]
        top3 = sum(r[f"ref_rank_{k}"] for k in RANKS[:3])
        parts.append(f"{r['checkpoint']}'s choice is the reference's own top-1 at "
                     f"{fmt(r['ref_rank_1'])} of its disagreements and in the reference's top 3 "
                     f"at {fmt(top3)}")
    return "At the last step: " + "; ".join(parts) + "." if parts else "No checkpoint to map."

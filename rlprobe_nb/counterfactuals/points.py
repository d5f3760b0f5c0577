"""Where chapter 08 branches, and what it swaps in there.

**Branch points, chosen by content.** ``select_points`` ranks tokens by an ordered
*rule*, a list of sources (a token counts for the first source that claims it):
``"spikes"`` (the checkpoint's significant spikes, chapter 05) and ground-truth labels
(``ground_truth.LABELS``: the labeller's verdict on each token's arithmetic), by default

    spikes, result_first_wrong, result_after_wrong, final_answer, result_correct,
    operand, operator

so spikes come first where there are any, and the tokens that carry the arithmetic fill
the rest, the first wrong digit of a wrong result first. Points are drawn in rounds over
problems (the mean effect is estimated over problems, so twenty points from three
problems say less than twenty from ten): each round takes from every problem that has
tokens left its best-ranked one by the rule, problems with better-ranked tokens first,
ties and the order of problems drawn with the seed. Format tokens (labelled
``format`` by the labeller: ``\\boxed{``, ``$``, step markers; or whitespace and Markdown,
category ``format``) are never chosen unless ``include_format``: swapping a line break
for a space tests the layout, not the reasoning. Neither are first response tokens (they
depend on the prompt alone) nor EOS. Every point records the source that picked it
(``rule``).

**A real alternative.** The substitute arm swaps in the checkpoint's most probable token
that is a *real alternative* to the written one: after stripping whitespace and ignoring
case, its text is not empty and not the written token's text. So "\\n" -> "\\n\\n",
" the" -> "the" and "." -> ".\\n" are no alternatives (the same text laid out otherwise),
while "4" -> "0" and "it" -> "the" are. Special tokens (EOS) never are. Points and
controls without a real alternative in the checkpoint's top-k are not branched at.

**The correct digit.** At a first wrong digit (label ``result_first_wrong``) the
labeller's statement knows the true result; the correct character at that position is
the digit that, written there, makes the labeller accept the position
(``correct_character``): in ``50 + 59 = 149`` the "4" becomes "0". Where the result
stopped too early (``= 10`` for 105) the first wrong character is the one that ended the
number (a space, ``}``, ``.``), and the missing digit is *inserted* before it: the
context ends ``= 10`` + "5". A result too long (``= 1050`` for 105), a truth that goes on
with a decimal point, or a digit that is not one token of the tokenizer gives no correct
digit (the reason is kept).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from rlprobe_nb.divergence import ground_truth, token_categories
from rlprobe_nb.divergence.disagreement import STRATA, is_real_alternative  # noqa: F401 (the rule)
from rlprobe_nb.forcing.spans import token_spans
from rlprobe_nb.statistics import seed_from

CONTENT_LABELS = ("result_first_wrong", "result_after_wrong", "final_answer", "result_correct",
                  "operand", "operator")
DEFAULT_RULE = ("spikes",) + CONTENT_LABELS
SOURCES = ("spikes",) + ground_truth.LABELS
FIRST_WRONG = "result_first_wrong"
POSITIVE_RULE = "positive_control"  # a first wrong digit taken for the positive control only
DIGITS = "0123456789"


# --- real alternatives ----------------------------------------------------------------

def real_alternative(topk_ids: Iterable[int], written: str, text_of: Callable[[int], str],
                     exclude: set[int] = frozenset()) -> tuple[int, int] | None:
    """(token id, rank in the top-k from 0) of the checkpoint's most probable real
    alternative to the written token, or None when its top-k holds none."""
    for rank, t in enumerate(topk_ids):
        if int(t) not in exclude and is_real_alternative(written, text_of(int(t))):
            return int(t), rank
    return None


# --- the correct digit ----------------------------------------------------------------

def correct_character(text: str, at: int) -> tuple[str | None, str]:
    """(digit, how) for the first wrong character ``text[at]`` of a wrong result: the one
    digit that, written there, makes the labeller stop charging that position (``how``:
    "replace" a wrong digit, or "insert" the digit a too-short result lacks before the
    character that ended it). (None, why) where no single digit does."""
    before = ground_truth.statements(text)
    if not any(s.first_wrong_char == at for s in before):
        return None, "the labeller marks no first wrong character there"
    how = "replace" if text[at] in DIGITS else "insert"
    fits = []
    for c in DIGITS:
        if how == "replace" and c == text[at]:
            continue
        new = text[:at] + c + (text[at + 1:] if how == "replace" else text[at:])
        after = ground_truth.statements(new)
        if len(after) == len(before) and not any(s.first_wrong_char == at for s in after):
            fits.append(c)
    if len(fits) != 1:
        return None, ("no digit makes the result right there (too long, or a decimal point "
                      "or sign is missing)" if not fits else f"several digits fit: {fits}")
    return fits[0], how


def correct_token(token_text: str, offset: int, char: str,
                  encode: Callable[[str], list[int]]) -> int | None:
    """The token that replaces the one holding the wrong character: its text up to the
    character (``offset`` into it), then the correct digit; None unless that is one
    token."""
    ids = encode(token_text[:offset] + char)
    return int(ids[0]) if len(ids) == 1 else None


# --- annotation -----------------------------------------------------------------------

def rollout_pool(rollouts: pd.DataFrame, reference: str, forced: pd.DataFrame,
                 pool: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The reference's rollouts chapter 08 reads: the forced ones (the rollout ids of the
    token rows ``forced``) and, with ``pool == "problems"``, its other wrong rollouts of
    the same problems (a correct digit needs no forcing). Returns (both, the others)."""
    ids = set(forced["rollout_id"])
    mine = rollouts[(rollouts["model"] == reference)
                    & rollouts["problem_id"].isin(set(forced["problem_id"]))]
    others = mine[~mine["rollout_id"].isin(ids) & ~mine["correct"].astype(bool)] \
        if pool == "problems" else mine.iloc[:0]
    return mine[mine["rollout_id"].isin(ids | set(others["rollout_id"]))], others


def branch_tokens(forced: pd.DataFrame, others: pd.DataFrame, texts: dict[str, str],
                  tokenizer, gold: dict[str, str]) -> pd.DataFrame:
    """Every token chapter 08 may branch at, annotated (``annotate``): the forced token
    rows and the tokens of the ``others`` rollouts, with chapter 04's category and
    ``result_is_answer`` (is the wrong statement's true value the problem's answer)."""
    special = {int(i) for i in tokenizer.all_special_ids}
    rows = pd.concat([forced, rollout_tokens(others, tokenizer)], ignore_index=True) \
        if len(others) else forced.reset_index(drop=True)
    rows["category"] = token_categories.classify(rows, texts).astype(str)
    out = annotate(rows, texts, text_of=lambda i: tokenizer.decode([i]),
                   encode=lambda s: tokenizer.encode(s, add_special_tokens=False),
                   special=special)
    out["result_is_answer"] = [is_answer(v, gold[p])
                               for v, p in zip(out["statement_value"], out["problem_id"])]
    return out


def rollout_tokens(rollouts: pd.DataFrame, tokenizer) -> pd.DataFrame:
    """Token rows (rollout_id, problem_id, pos, token_id, token, char_start, char_end,
    first_token, is_eos) of rollouts that were not forced, their spans in the response
    text as chapter 03 computes them: enough for the labeller and the correct digit (the
    checkpoint's top-k and the reference's entropy stay missing, so such a token is never
    a main point or a control)."""
    special = {int(i) for i in tokenizer.all_special_ids}
    rows = []
    for r in rollouts.itertuples():
        pieces, starts, ends, _ = token_spans(tokenizer, r.response_ids)
        for pos, (tid, piece, a, b) in enumerate(zip(r.response_ids, pieces, starts, ends)):
            rows.append({"rollout_id": r.rollout_id, "problem_id": r.problem_id, "pos": pos,
                         "token_id": int(tid), "token": piece, "char_start": a, "char_end": b,
                         "first_token": pos == 0, "is_eos": int(tid) in special})
    return pd.DataFrame(rows, columns=["rollout_id", "problem_id", "pos", "token_id", "token",
                                       "char_start", "char_end", "first_token", "is_eos"])


def annotate(tokens: pd.DataFrame, texts: dict[str, str], text_of: Callable[[int], str],
             encode: Callable[[str], list[int]], special: set[int] = frozenset()
             ) -> pd.DataFrame:
    """One checkpoint's token rows with what branching needs: ``ground_truth`` (the
    labeller's label), ``format`` (a format token: label or category ``format``, or
    whitespace only), the checkpoint's real alternative (``alt_id``, ``alt_rank``,
    ``alt_token``) and, at first wrong digits, the correct digit (``correct_char``,
    ``correct_id``, ``correct_how``: how, or why there is none) and the wrong
    statement's true value (``statement_value``). ``tokens`` needs
    ``category`` (chapter 04's), ``token``, ``token_id``, ``topk_ids_ckpt``, spans;
    ``texts`` maps rollout_id to the response text the spans index."""
    out = tokens.reset_index(drop=True).copy()
    out["ground_truth"] = ground_truth.label(out, texts).astype(str).to_numpy()
    out["format"] = ((out["ground_truth"] == "format") | (out["category"].astype(str) == "format")
                     | (out["token"].astype(str).str.strip() == ""))
    tops = out["topk_ids_ckpt"] if "topk_ids_ckpt" in out else [None] * len(out)
    alts = [real_alternative(top, w, text_of, special)
            if isinstance(top, (list, tuple, np.ndarray)) else None
            for top, w in zip(tops, out["token"].astype(str))]
    out["alt_id"] = pd.array([a[0] if a else None for a in alts], dtype="Int64")
    out["alt_rank"] = pd.array([a[1] if a else None for a in alts], dtype="Int64")
    out["alt_token"] = [text_of(a[0]) if a else None for a in alts]
    return out.join(_correct_digits(out, texts, encode))


def _correct_digits(rows: pd.DataFrame, texts: dict[str, str],
                    encode: Callable[[str], list[int]]) -> pd.DataFrame:
    """At the first wrong digits among ``rows``: the correct digit (``correct_char``,
    ``correct_id``, ``correct_how``: how, or why there is none) and ``statement_value``,
    the wrong statement's true value (its left side as written)."""
    cols = {c: [None] * len(rows) for c in ("correct_char", "correct_how", "correct_id",
                                            "statement_value")}
    for i in np.flatnonzero((rows["ground_truth"] == FIRST_WRONG).to_numpy()):
        r = rows.iloc[i]
        text = texts[r["rollout_id"]]
        st = _first_wrong_in(text, int(r["char_start"]), int(r["char_end"]))
        if st is None:
            cols["correct_how"][i] = "the labeller marks no first wrong character in the token"
            continue
        cols["statement_value"][i] = str(st.true_value)
        char, cols["correct_how"][i] = correct_character(text, st.first_wrong_char)
        if char is not None:
            cols["correct_char"][i] = char
            cols["correct_id"][i] = correct_token(
                str(r["token"]), st.first_wrong_char - int(r["char_start"]), char, encode)
            if cols["correct_id"][i] is None:
                cols["correct_how"][i] = "the corrected piece is not one token"
    out = pd.DataFrame(cols, index=rows.index)
    out["correct_id"] = pd.array(cols["correct_id"], dtype="Int64")
    return out


def _first_wrong_in(text: str, start: int, end: int):
    """The statement whose first wrong character lies inside ``text[start:end]``, if any."""
    hits = [s for s in ground_truth.statements(text)
            if s.first_wrong_char is not None and start <= s.first_wrong_char < end]
    return min(hits, key=lambda s: s.first_wrong_char) if hits else None


def is_answer(value: str | None, gold: str) -> bool | None:
    """Whether a statement's true value (``statement_value``) is the problem's answer,
    compared as exact numbers; None without a value or a numeric answer."""
    if value is None or pd.isna(value):
        return None
    try:
        return Fraction(str(value)) == Fraction(str(gold).strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


# --- selection ------------------------------------------------------------------------

def spread_order(rows: pd.DataFrame, *key, rank: str | None = None) -> pd.DataFrame:
    """``rows`` in a seeded order that takes problems in turn: rounds, each taking one row
    of every problem that has rows left, so the first k rows come from as many problems as
    possible. With ``rank`` (a column, lower first) a problem gives its best-ranked rows
    first and, within a round, problems whose row ranks better come first; ties and the
    order of problems are drawn with the seed from ``key``."""
    if rows.empty:
        return rows
    rng = np.random.default_rng(seed_from("points", *key))
    problems = sorted(rows["problem_id"].unique())
    problem_rank = dict(zip(rng.permutation(problems), range(len(problems))))
    shuffled = rows.iloc[rng.permutation(len(rows))]
    ranks = shuffled[rank].to_numpy() if rank else np.zeros(len(shuffled))
    shuffled = shuffled.iloc[np.argsort(ranks, kind="stable")]
    ranks = np.sort(ranks, kind="stable")
    turn = shuffled.groupby("problem_id", sort=False).cumcount().to_numpy()
    problem = shuffled["problem_id"].map(problem_rank).to_numpy()
    return shuffled.iloc[np.lexsort((problem, ranks, turn))]


def eligible(tokens: pd.DataFrame, include_format: bool = False) -> pd.Series:
    """Tokens that may be branched at: not the first response token, not EOS, not a
    format token unless ``include_format``, with a real alternative."""
    ok = ~tokens["first_token"].astype(bool) & ~tokens["is_eos"].astype(bool)
    ok &= tokens["alt_id"].notna()
    return ok if include_format else ok & ~tokens["format"].astype(bool)


def spike_keys(spikes: pd.DataFrame, checkpoint: str, groups: Sequence[str] | None) -> set:
    """(rollout_id, pos) of the significant spikes of ``checkpoint`` in ``groups``."""
    rows = spikes[spikes["checkpoint"] == checkpoint]
    if "significant" in rows:
        rows = rows[rows["significant"].astype(bool)]
    if groups is not None and "group" in rows:
        rows = rows[rows["group"].isin(list(groups))]
    return set(zip(rows["rollout_id"], rows["pos"].astype(int)))


def select_points(tokens: pd.DataFrame, spikes: pd.DataFrame, *, checkpoint: str,
                  rule: Sequence[str] = DEFAULT_RULE, max_points: int = 24, seed: int = 0,
                  groups: Sequence[str] | None = ("target",), include_format: bool = False
                  ) -> pd.DataFrame:
    """The branch points: ``tokens`` (``annotate``d, one checkpoint) claimed by the sources
    of ``rule`` (a token by the first source that has it), at most ``max_points``, drawn
    in rounds over problems, each problem's best-ranked tokens first (see the module doc),
    each with the source that picked it in ``rule``. Sorted by rollout and position."""
    unknown = [s for s in rule if s not in SOURCES]
    if unknown:
        raise ValueError(f"unknown point sources {unknown}; choose from {list(SOURCES)}")
    if "format" in rule and not include_format:
        raise ValueError("the rule lists format tokens: pass include_format=True to branch at "
                         "them")
    pool = tokens[eligible(tokens, include_format)]
    keys = pd.Series(list(zip(pool["rollout_id"], pool["pos"].astype(int))), index=pool.index)
    spiked = spike_keys(spikes, checkpoint, groups)
    rank = pd.Series(len(rule), index=pool.index)
    for r, source in reversed(list(enumerate(rule))):  # the earliest source claims a token
        claims = keys.isin(spiked) if source == "spikes" else pool["ground_truth"] == source
        rank[claims.to_numpy()] = r
    claimed = pool.assign(source_rank=rank)[rank < len(rule)]
    order = spread_order(claimed, seed, checkpoint, "points", rank="source_rank")
    out = order.head(int(max_points))
    out = out.assign(rule=[rule[r] for r in out["source_rank"]]).drop(columns="source_rank")
    return out.sort_values(["rollout_id", "pos"]).reset_index(drop=True)


# --- disagreements: where the checkpoint would write another token ----------------------

DEFAULT_STRATA = ("result_first_wrong", "operand", "result_first_wrong", "operator", "other")


def disagrees(tokens: pd.DataFrame) -> pd.Series:
    """Whether the checkpoint's most probable token (``topk_ids_ckpt[0]``) is a real
    alternative to the written one: the written token is not its top-1, nor the same
    text up to whitespace and case (``annotate``'s real alternative has rank 0)."""
    return pd.Series(tokens["alt_rank"].astype("Int64").fillna(-1).to_numpy(int) == 0,
                     index=tokens.index)


def stratum(tokens: pd.DataFrame) -> pd.Series:
    """The label stratum of each token: its ground-truth label where that is one of
    ``STRATA``, else "other" (words, correct results, final answers)."""
    gt = tokens["ground_truth"].astype(str)
    return gt.where(gt.isin(STRATA[:-1]), "other")


def _check_strata(strata: Sequence[str]) -> None:
    unknown = [s for s in strata if s not in STRATA]
    if not strata or unknown:
        raise ValueError(f"point strata {list(strata)}: give one or more of {list(STRATA)} "
                         "(a label listed twice gets two points per turn)")


def select_disagreements(tokens: pd.DataFrame, spikes: pd.DataFrame, *, checkpoint: str,
                         strata: Sequence[str] = DEFAULT_STRATA,
                         rule: Sequence[str] = DEFAULT_RULE, max_points: int = 40,
                         seed: int = 0, groups: Sequence[str] | None = ("target",),
                         include_format: bool = False) -> pd.DataFrame:
    """The main branch points: contexts where ``checkpoint`` would write another token
    (``disagrees``), eligible as any point (``eligible``), at most ``max_points``.
    Labels are drawn in turn: each turn takes the next point of every entry of
    ``strata`` in order (a label listed twice gives two per turn; an exhausted one is
    skipped). Within a stratum, tokens rank by ``rule`` (its spikes first, then its
    labels in order, then the rest) and are drawn in rounds over problems
    (``spread_order``, seeded by ``seed`` and the stratum alone: another checkpoint, e.g.
    the placebo, with the same disagreements gets the same points). Each point's
    ``rule`` is its stratum and ``spike`` says whether it is one of the checkpoint's
    significant spikes. Sorted by rollout and position."""
    _check_strata(strata)
    unknown = [s for s in rule if s not in SOURCES]
    if unknown:
        raise ValueError(f"unknown point sources {unknown}; choose from {list(SOURCES)}")
    pool = tokens[eligible(tokens, include_format) & disagrees(tokens)]
    keys = pd.Series(list(zip(pool["rollout_id"], pool["pos"].astype(int))), index=pool.index)
    spiked = keys.isin(spike_keys(spikes, checkpoint, groups)).to_numpy()
    rank = pd.Series(len(rule), index=pool.index)
    for r, source in reversed(list(enumerate(rule))):  # the earliest source claims a token
        claims = spiked if source == "spikes" else (pool["ground_truth"] == source).to_numpy()
        rank[claims] = r
    pool = pool.assign(source_rank=rank, spike=spiked, rule=stratum(pool))
    queues = {s: spread_order(pool[pool["rule"] == s], seed, "disagreements", s,
                              rank="source_rank") for s in dict.fromkeys(strata)}
    taken = {s: 0 for s in queues}
    chosen = []
    while len(chosen) < int(max_points) and any(taken[s] < len(queues[s]) for s in queues):
        for s in strata:
            if len(chosen) < int(max_points) and taken[s] < len(queues[s]):
                chosen.append(queues[s].index[taken[s]])
                taken[s] += 1
    out = pool.loc[chosen].drop(columns="source_rank")
    return out.sort_values(["rollout_id", "pos"]).reset_index(drop=True)


def select_positive(tokens: pd.DataFrame, points: pd.DataFrame, count: int, seed: int = 0
                    ) -> pd.DataFrame:
    """First wrong digits with a correct digit for the positive control, at most
    ``count``: those among ``points`` first (their rule kept), then each rollout's
    earliest one (the error the rest of the rollout inherits: correcting a later one
    leaves it standing), then later ones (rule "positive_control"). Each of these rounds
    takes in turn from the two kinds of wrong statement, the ones whose true value is the
    answer (``result_is_answer``) and the others, each kind in a seeded order spread over
    problems: the control is read by kind, and each kind needs problems of its own for an
    interval."""
    pool = tokens[(tokens["ground_truth"] == FIRST_WRONG) & tokens["correct_id"].notna()
                  & ~tokens["first_token"].astype(bool) & ~tokens["is_eos"].astype(bool)]
    pool = pool.assign(nth=pool.groupby("rollout_id")["pos"].rank(method="first").astype(int))
    chosen = set(zip(points["rollout_id"], points["pos"].astype(int)))
    inside = np.array([k in chosen for k in zip(pool["rollout_id"], pool["pos"].astype(int))],
                      dtype=bool)
    rule = points.set_index(["rollout_id", "pos"])["rule"].to_dict() if len(points) else {}
    first = _by_kind_in_turn(pool[inside], seed, "chosen")
    first = first.assign(rule=[rule[(r, p)] for r, p in zip(first.rollout_id, first.pos)])
    rest = pool[~inside]
    later = [_by_kind_in_turn(rest[rest["nth"] == k], seed, POSITIVE_RULE, k)
             for k in sorted(rest["nth"].unique())]
    out = pd.concat([first] + [x.assign(rule=POSITIVE_RULE) for x in later]).head(int(count))
    return out.drop(columns="nth").sort_values(["rollout_id", "pos"]).reset_index(drop=True)


def _by_kind_in_turn(rows: pd.DataFrame, *key) -> pd.DataFrame:
    """``rows`` with the two kinds of wrong statement taken in turn (the answer's value
    first), each kind in ``spread_order``."""
    if rows.empty:
        return rows
    answer = (rows["result_is_answer"].fillna(False).astype(bool).to_numpy()
              if "result_is_answer" in rows else np.zeros(len(rows), dtype=bool))
    kinds = [spread_order(rows[answer == kind], *key, kind) for kind in (True, False)]
    turn = np.concatenate([np.arange(len(k)) for k in kinds])
    kind = np.concatenate([np.full(len(k), i) for i, k in enumerate(kinds)])
    return pd.concat(kinds).iloc[np.lexsort((kind, turn))]

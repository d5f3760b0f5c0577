"""What kind of token each row of a per-token table is, read from its place in the text.

A token's string alone says little: " 4" may be an operand, the result of a written
operation or part of the final answer; "Let" is a reasoning move in "Let me check" and
plain prose in "Let $x$ be". So the classifier works on the response text, not on token
strings. Each rollout's text is rebuilt from its tokens' spans (``char_start`` /
``char_end`` tile the text; pass the rollouts' own texts to be exact where a token ends
inside a multi-byte character), every *character* gets a category (from its own class
and its neighbours, then from a few regular expressions for context), and a token takes
the highest-ranked category among its characters. A sub-word therefore belongs to its
word ("there" + "fore" are both a connective), a number split into digit tokens keeps
the number's role, and whitespace only decides when a token holds nothing else.

Categories, from the highest rank to the lowest (``CATEGORIES``):

  eos              the end-of-sequence token the model wrote (``is_eos``)
  boxed_answer     inside the braces of the text's last ``\\boxed{...}`` (nested braces
                   matched; an unclosed box runs to the end of the text)
  step_marker      a marker at the start of a line: "Step 2:", "**Step 2:**", "1." or
                   "2)" before a space, a bullet "-", "*" or "•", "(a)"
  number_result    a number written right after "=" or "≈" (a sign and "$" allowed
                   between), or both numbers of a ``\\frac{}{}`` written right after it:
                   the result of a written operation
  number_operand   a number beside an operator or relation (e.g. "12 + 7", "x^2",
                   "3 <"), a coefficient against a variable (the 2 of "2x"), or an
                   argument of ``\\frac{}{}`` or ``\\sqrt{}``
  number_other     any other number ("in 3 days", "Step 2" mid-sentence)
  operator         + - * / × ÷ · ^ = < > ≤ ≥ ≠ ≈ ±, the LaTeX operators and relations
                   (``\\times``, ``\\cdot``, ``\\div``, ``\\pm``, ``\\le``, ...), factorial "!"
  latex            other LaTeX: commands (``\\frac``, ``\\boxed``, ``\\text``...), "$",
                   braces, "_", "&", ``\\(``, ``\\[``, escaped characters
  connective       reasoning connectives: so, therefore, thus, hence, because, since,
                   but, however, wait, hmm, actually, alternatively, instead, otherwise,
                   although, though, consequently, moreover, furthermore, similarly,
                   indeed, recall, note, notice, check, verify, "let me", "let's",
                   "let us", "this/that/which means", "in other words"; and at the start
                   of a clause (line start or after . ! ? : ; ,) first, second, third,
                   next, then, finally, now, also, ok, okay, and "no," (a self-correction)
  word             any other word (letters of any script, with inner hyphens or
                   apostrophes)
  punctuation      . , : ; ! ? ( ) [ ] " ' and dashes
  other            anything else (°, %, #, emoji, a byte of an unfinished character)
  format           whitespace, newlines and Markdown emphasis or headings ("**", "#")

A token with an empty span that is not EOS is a byte of a character that a later token
completes: it takes that token's category. Letters of variables ("x") count as words:
math mode is not tracked, since model text often leaves its "$" unbalanced.

Speed: character classes are numpy masks and the context expressions run once over all
rollouts' texts joined together; each token's category is a ``np.maximum.reduceat`` over
its span. A million rows take about 10 s on a shared 2-core machine; rows repeated
across checkpoints are classified once.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

CATEGORIES = ("format", "other", "punctuation", "word", "connective", "latex", "operator",
              "number_other", "number_operand", "number_result", "step_marker",
              "boxed_answer", "eos")  # lowest rank first
CODE = {name: code for code, name in enumerate(CATEGORIES)}

_SEP = "\n\x00\n"  # between rollouts: a line break for "^", matched by no pattern
_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
_OP_COMMANDS = r"\\(?:times|cdot|div|pm|mp|leq?|geq?|neq?|lt|gt|approx|equiv|ne)(?![a-zA-Z])"
# As a regex: a hyphen between letters belongs to its word; "**" is Markdown emphasis.
_OPERATOR = (r"(?:[+/×÷·^=<>≤≥≠≈±]|(?<!\*)\*(?!\*)|(?<![^\W\d_])-|-(?![^\W\d_])|"
             + _OP_COMMANDS + ")")
_CONNECTIVES = ("so therefore thus hence because since but however wait actually alternatively "
                "instead otherwise although though consequently moreover furthermore "
                "similarly indeed recall note notice check checking verify verifying "
                "double-check re-check recheck let_me let's let_us this_means that_means "
                "which_means in_other_words").split()
_CLAUSE_OPENERS = "first|firstly|second|secondly|third|next|then|finally|now|also|ok|okay"
_RESULT_AFTER = r"(?:=|≈|\\approx)\s*(?:\$|\\[(\[])?\s*-?\s*"


def _alternation(phrases: list[str]) -> str:
    """A regex alternation grouped by first letter ("_" = a space): the same matches as
    a flat one, tried ~5x faster over long texts."""
    groups: dict[str, list[str]] = {}
    for phrase in sorted(phrases, key=len, reverse=True):
        groups.setdefault(phrase[0], []).append(re.escape(phrase[1:].replace("_", " ")))
    return "|".join(f"{first}(?:{'|'.join(rest)})" for first, rest in groups.items())


# Single characters, classified without context (numpy masks over the code points).
_PUNCTUATION = set(".,:;!?()[]\"'—–")
_LATEX_CHARS = set("$&{}_")
_OPERATOR_CHARS = set("+/×÷·^=<>≤≥≠≈±")

# A marker opening a line (also used by ground_truth, which labels it ``format``).
STEP_MARKER = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]*)?(?:\*\*)?(?:[Ss]tep\s*\d+\s*[:.)]?|\d+[.)](?=\s)|"
    r"[-*•](?=\s)|\([a-z0-9]\)(?=\s))(?:\*\*)?:?(?:\*\*)?", re.M)

# Context rules (category, pattern, groups), applied in order after the character
# classes; the groups' spans get the category and later rules override earlier ones.
_RULES = [
    ("format", re.compile(r"^[ \t]*#{1,6}", re.M), (0,)),
    ("connective", re.compile(
        rf"(?i)(?<![^\W\d_])(?=[a-z])(?:{_alternation(_CONNECTIVES)}|hmm+)\b"), (0,)),
    ("connective", re.compile(rf"(?im)(?:^|[.!?:;,])[ \t*#]*\b({_CLAUSE_OPENERS})\b"), (1,)),
    ("connective", re.compile(r"(?im)(?:^|[.!?:;,])[ \t*#]*\b(no)(?=,)"), (1,)),
    ("latex", re.compile(r"\\[a-zA-Z]+|\\[^a-zA-Z\s]"), (0,)),
    ("operator", re.compile(_OP_COMMANDS), (0,)),
    ("number_other", re.compile(_NUMBER), (0,)),
    ("number_operand", re.compile(rf"({_NUMBER})(?=\s*[)}}]*\s*{_OPERATOR})"), (1,)),
    ("number_operand", re.compile(rf"{_OPERATOR}\s*[({{]*\s*({_NUMBER})"), (1,)),
    ("number_operand", re.compile(rf"\\[dt]?frac\s*\{{\s*({_NUMBER})"), (1,)),
    ("number_operand", re.compile(rf"\}}\s*\{{\s*({_NUMBER})\s*\}}"), (1,)),
    ("number_operand", re.compile(rf"\\sqrt\s*\{{\s*({_NUMBER})"), (1,)),
    ("number_operand", re.compile(rf"({_NUMBER})(?=[a-zA-Z](?![a-zA-Z]))"), (1,)),
    ("number_result", re.compile(rf"{_RESULT_AFTER}({_NUMBER})"), (1,)),
    ("number_result", re.compile(
        rf"{_RESULT_AFTER}\\[dt]?frac\s*\{{\s*({_NUMBER})\s*\}}\s*\{{\s*({_NUMBER})"), (1, 2)),
    ("step_marker", STEP_MARKER, (0,)),
]


def character_codes(text: str) -> np.ndarray:
    """The category code (``CODE``) of every character of ``text``."""
    cp = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    codes = np.full(len(cp), CODE["other"], dtype=np.int8)
    for name, mask in _character_classes(cp):
        codes[mask] = CODE[name]
    for name, pattern, groups in _RULES:
        spans = np.array([m.span(g) for m in pattern.finditer(text) for g in groups
                          if m.start(g) >= 0], dtype=np.int64).reshape(-1, 2)
        codes[_covered(spans, len(cp))] = CODE[name]
    for start, end in _last_boxes(text):
        codes[start:end] = CODE["boxed_answer"]
    return codes


def _character_classes(cp: np.ndarray):
    """(category, mask) of the classes a character has on its own or from its immediate
    neighbours, in the order they are applied."""
    def isin(chars):
        return np.isin(cp, np.array([ord(c) for c in chars], dtype=np.uint32))

    before = np.concatenate([[0], cp[:-1]])
    after = np.concatenate([cp[1:], [0]])
    star = cp == ord("*")
    double_star = star & ((before == ord("*")) | (after == ord("*")))
    letter = _letters(cp)
    joiner = isin("-'’") & np.concatenate([[False], letter[:-1]]) & np.concatenate(
        [letter[1:], [False]])  # the hyphen of "re-check", the apostrophe of "let's"
    digit_before = np.concatenate([[False], (cp[:-1] >= ord("0")) & (cp[:-1] <= ord("9"))])
    yield "format", isin(" \t\n\r\x0b\x0c`") | double_star
    yield "punctuation", isin(_PUNCTUATION)
    yield "word", letter | joiner
    yield "latex", isin(_LATEX_CHARS)
    yield "operator", (isin(_OPERATOR_CHARS) | (star & ~double_star)
                       | ((cp == ord("-")) & ~joiner) | ((cp == ord("!")) & digit_before))


def _letters(cp: np.ndarray) -> np.ndarray:
    """Letters of any script (what the regex class [^\\W\\d_] matches)."""
    ascii_letter = ((cp >= 65) & (cp <= 90)) | ((cp >= 97) & (cp <= 122))
    wide = np.unique(cp[cp > 127])
    alpha = np.array([chr(c).isalpha() for c in wide], dtype=bool)
    return ascii_letter | np.isin(cp, wide[alpha])


def _covered(spans: np.ndarray, n: int) -> np.ndarray:
    """Boolean mask of the characters inside any [start, end) span."""
    edges = np.zeros(n + 1, dtype=np.int64)
    np.add.at(edges, spans[:, 0], 1)
    np.add.at(edges, spans[:, 1], -1)
    return np.cumsum(edges[:-1]) > 0


def _last_boxes(text: str):
    """[start, end) of the contents of the last ``\\boxed{`` of each rollout in ``text``
    (rollouts joined by the separator), braces matched; unclosed: to the rollout's end."""
    bounds, start = [], 0
    for piece in text.split(_SEP):
        at = piece.rfind("\\boxed{")
        if at >= 0:
            first = at + len("\\boxed{")
            depth, end = 1, len(piece)
            for k in range(first, len(piece)):
                depth += {"{": 1, "}": -1}.get(piece[k], 0)
                if depth == 0:
                    end = k
                    break
            bounds.append((start + first, start + end))
        start += len(piece) + len(_SEP)
    return bounds


def rollout_texts(tokens: pd.DataFrame) -> pd.Series:
    """Each rollout's response text rebuilt from its rows (one checkpoint's rows suffice):
    a token whose string is as long as its span is its text; a span that a single token
    cannot spell (a character completed across byte tokens) is filled with U+FFFD."""
    rows = tokens.drop_duplicates(["rollout_id", "pos"]).sort_values(["rollout_id", "pos"])
    lengths = (rows.char_end - rows.char_start).to_numpy().tolist()
    pieces = [tok if len(tok) == n else "\ufffd" * n
              for tok, n in zip(rows.token.to_numpy(dtype=object).tolist(), lengths)]
    ids = rows.rollout_id.to_numpy()
    bounds = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1], [True]]))
    return pd.Series(["".join(pieces[a:b]) for a, b in zip(bounds[:-1], bounds[1:])],
                     index=ids[bounds[:-1]], dtype=object)


def classify(tokens: pd.DataFrame, texts=None) -> pd.Series:
    """The category of every row of a per-token table (a categorical Series in
    ``CATEGORIES`` order, aligned with ``tokens.index``).

    ``tokens`` needs rollout_id, pos, token, char_start, char_end (and is_eos when
    present); ``texts`` optionally maps rollout_id -> response text (the rollouts table's
    ``response``), else the text is rebuilt from the tokens (``rollout_texts``).
    """
    unique = tokens.drop_duplicates(["rollout_id", "pos"]).sort_values(["rollout_id", "pos"])
    built = rollout_texts(unique)
    if texts is not None:
        given = pd.Series(texts).reindex(built.index)
        built = given.where(given.notna(), built)
    _check_spans(unique, built)
    offsets = pd.Series(np.concatenate([[0], np.cumsum(built.str.len() + len(_SEP))[:-1]]),
                        index=built.index)
    chars = character_codes(_SEP.join(built) + _SEP)
    base = offsets.reindex(unique.rollout_id).to_numpy()
    return per_token(tokens, unique, chars, base + unique.char_start.to_numpy(),
                     base + unique.char_end.to_numpy(), CATEGORIES, "category",
                     eos_code=CODE["eos"], other_code=CODE["other"])


def per_token(tokens: pd.DataFrame, unique: pd.DataFrame, chars: np.ndarray, start, end,
              names, name: str, *, eos_code: int, other_code: int) -> pd.Series:
    """A categorical Series over ``names`` aligned with ``tokens.index``: each token of
    ``unique`` (its rows once, sorted by rollout and position) takes the largest code of
    ``chars`` over its span [start, end). ``chars`` must end past the last span (a
    sentinel), since ``reduceat`` reads one edge beyond it. An EOS row takes
    ``eos_code``; another empty span (a byte of a character a later token completes) takes
    the code of the next filled row of its rollout, else ``other_code``."""
    codes = np.full(len(unique), -1, dtype=np.int8)
    filled = end > start
    if filled.any():  # the max over each [start, end): reduceat's even entries
        edges = np.column_stack([start[filled], end[filled]]).ravel()
        codes[filled] = np.maximum.reduceat(chars, edges)[::2]
    eos = unique.is_eos.to_numpy(bool) if "is_eos" in unique else (
        (unique.char_end == unique.char_start) & ~unique.token.str.contains("\ufffd")).to_numpy()
    codes = np.where(eos, eos_code, codes)
    later = pd.Series(np.where(codes < 0, np.nan, codes)).groupby(
        unique.rollout_id.to_numpy()).bfill()
    codes = later.fillna(other_code).to_numpy().astype(np.int8)
    where = pd.MultiIndex.from_frame(unique[["rollout_id", "pos"]]).get_indexer(
        pd.MultiIndex.from_frame(tokens[["rollout_id", "pos"]]))
    return pd.Series(pd.Categorical.from_codes(codes[where], names), index=tokens.index,
                     name=name)


def _check_spans(rows: pd.DataFrame, texts: pd.Series) -> None:
    too_long = rows.groupby("rollout_id").char_end.max() > texts.str.len().reindex(
        rows.rollout_id.unique())
    if too_long.any():
        bad = too_long[too_long].index[:3].tolist()
        raise ValueError(f"token spans run past the response text of rollouts {bad}: the "
                         "texts given are not the ones the table's spans index")

"""Ground truth from the text: every arithmetic statement a response writes, found and
verified with exact arithmetic, and a label for each token from it.

Where ``token_categories`` says what *kind* of token a row is, this module says whether
the arithmetic it belongs to is right, so that a chapter can ask: does RLVR reject the
first wrong digit of a wrong result, and leave correct results alone?

  statements(text, problem=None)   the statement records of one text
  label_text(text)                 a label code per character
  label(tokens, texts=None)        a label per row of a per-token table
  statement_table(texts, ...)      one row per statement of many texts
  rollout_summary(tokens, ...)     per rollout: statements, wrong ones, a first wrong token?

**Statements.** A statement is an expression with at least one operator, then ``=`` and
what the text writes after it: ``47 + 38 = 85``, ``a + b + c = d``, with ``+ - * / x × ·
÷ \\times \\cdot \\div``, parentheses, the usual precedence, thousands commas, decimals
and signs (``-3 + 5 = 2``, ``5 - 8 = -3``; a sign is a ``-`` written against its number,
so a bullet "- " is none). ``$``, ``\\(``, ``\\)``, ``\\[``, ``\\]``, ``**``, ``&`` and
``\\boxed{``...``}`` are see-through, so LaTeX and plain text read alike and
``= \\boxed{54}`` is a result. A line break ends a statement unless the line ends with an
operator or ``=``, or the next line starts with ``=``. A number glued to a letter, ``^``,
``_``, ``{``, ``!`` or ``%`` (``x^2``, ``2x``, ``\\frac{1}{2}``, ``50%``) is not arithmetic
and stops a statement, as words do: units ("5 apples + 3 apples") are not read. Values
are exact (an int when whole, else a ``Fraction``): the text is parsed by a small
precedence parser (``written_arithmetic``), never evaluated.

**Chains.** ``E0 = E1 = E2`` gives one statement per ``=``: ``E1`` is checked against the
value of ``E0`` as written, ``E2`` against the value of ``E1`` as written, so an error is
charged to the step that made it, and a later step that carries it is right. In an
expression after ``=``, a number that replaces a piece of the expression before it is
that piece's result (``3 \\times 4 + 2 = 12 + 2``: 12 is the result of ``3 \\times 4``),
found from the lexemes both sides share at their ends, or term by term. A right side
that neither equals the left nor evaluates a piece of it is a running total:
``3 + 4 = 7 + 1 = 8`` reads ``3 + 4 = 7`` and ``7 + 1 = 8``. Sides before the first one
with an operator are skipped (``12 = 3 \\times 4 = 12`` starts at ``3``).

**Verification, as written.** A statement is checked with the operands it writes: an
operand mis-copied from the problem (``48 \\times 8 = 384`` for 47 x 8) gives a correct
result; ``operands_seen`` records per operand whether its value (sign aside) is in the
optional problem text, earlier in the response, or the result of an earlier statement.
A wrong result is compared with the true value left-aligned as written (sign, digits,
decimal point; commas skipped): the first character that differs is the first wrong one,
and a result longer than the truth is first wrong at its first extra digit. A result
that is a strict prefix of the truth (``= 10`` for 105, ``7 / 2 = 3`` for 3.5) stopped too
early: the character right after it, the one that ended the number (a space, ``}``, ``.``),
is the first wrong one; where the text ends there instead, the statement is unfinished
(``correct`` None). A decimal for a value with no finite decimal is right rounded or
truncated at its own places; ``17 / 5 = 3 R 2`` (``R``, ``r``, ``rem``, ``remainder``) is a
quotient and remainder of a division of two whole numbers. A step can be wrong without
a wrong digit (``2 + 3 \\times 4 = 5 \\times 4``: the 5 is right, the order of operations
is not): ``correct`` False, ``first_wrong_char`` None. ``=`` at the very end of the text
gives an unfinished statement without a result; division by zero gives no statement.

**Labels** (``LABELS``, lowest priority first; a character takes the highest that
applies, a token the highest among its characters):

  other               anything else: prose, numbers and "=" outside statements ("Step 2"
                      mid-sentence, "in 3 days", "x = 5"), whitespace
  format              ``\\boxed{`` and its ``}``, ``$``, ``\\(`` ``\\)`` ``\\[`` ``\\]``, ``**``,
                      headings' ``#``, step markers at a line start ("Step 2:", "1.", "- ",
                      ``token_categories.STEP_MARKER``)
  operator            a statement's operators, parentheses, ``=`` and remainder ``R``
  operand             the numbers of a statement's expressions (a sign included)
  final_answer        inside the last ``\\boxed{}`` (operands and operators there too)
  result_correct      a right result; a wrong one's characters before its first wrong one
  result_after_wrong  a wrong result's characters after its first wrong one
  result_first_wrong  the first wrong character of a wrong result

So a result inside the box keeps its result label, and a result used again as an operand
stays a result. Whitespace is ``other`` (a token's label comes from its other characters),
except where it ended a too-short result. In a table, an EOS row is ``other`` and a byte
whose character a later token completes (an empty span) takes that token's label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping, Optional

import numpy as np
import pandas as pd

from rlprobe_nb.divergence import token_categories as tc
from rlprobe_nb.divergence import written_arithmetic as wa

LABELS = ("other", "format", "operator", "operand", "final_answer", "result_correct",
          "result_after_wrong", "result_first_wrong")  # lowest priority first
CODE = {name: code for code, name in enumerate(LABELS)}

Number = wa.Number
_FORMAT = re.compile(r"\$+|\\[()\[\]]|\*\*|^[ \t]*#{1,6}", re.M)


@dataclass(frozen=True)
class Statement:
    """One ``=`` of a written chain: ``lhs = rhs``, with character spans into the text."""
    start: int
    end: int
    text: str
    operands: tuple  # (start, end) of each number of the left side, its sign included
    operators: tuple  # (start, end) of the left side's operators and parentheses, and "="
    result: Optional[tuple]  # (start, end) of the right side; None: the text ended at "="
    true_value: Number  # the left side's value as written (exact: an int when whole)
    written_value: Optional[Number]  # the right side's value as written
    correct: Optional[bool]  # None: unfinished (the text stops inside or at the result)
    first_wrong_char: Optional[int]  # text index of the first wrong result character
    operands_seen: tuple  # per operand: in the problem, earlier in the text, or a result
    result_spans: tuple = field(default=(), repr=False)  # the numbers judged as results
    marks: tuple = field(default=(), repr=False)  # (start, end, label code) per piece


# --- verification ---------------------------------------------------------------------

def _truth_string(value: Fraction, decimals: int) -> str:
    """The true value as the text would write it: exact when the decimal terminates,
    else truncated at the written precision (one place at least)."""
    sign, value = ("-" if value < 0 else ""), abs(value)
    d, twos, fives = value.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    places = max(twos, fives) if d == 1 else max(decimals, 1)
    digits = str(value.numerator * 10 ** places // value.denominator).rjust(places + 1, "0")
    return sign + (digits[:-places] + "." + digits[-places:] if places else digits)


def _approximates(written: Fraction, truth: Fraction, decimals: int) -> bool:
    """A decimal of a value with no finite decimal, rounded or truncated at its places."""
    d = truth.denominator
    for prime in (2, 5):
        while d % prime == 0:
            d //= prime
    scale = 10 ** decimals
    return decimals > 0 and d > 1 and written in (
        round(truth, decimals), Fraction(int(truth * scale), scale))


def _judge(text: str, start: int, end: int, truth: Fraction):
    """("correct" | "wrong" | "unfinished", first wrong character or None, label marks)
    of the result text[start:end] against its true value, compared left-aligned."""
    written = text[start:end].replace("−", "-")
    value = wa.number_value(written)
    decimals = len(written.split(".")[1]) if "." in written else 0
    ok, first = CODE["result_correct"], CODE["result_first_wrong"]
    after = CODE["result_after_wrong"]
    if value == truth or _approximates(value, truth, decimals):
        return "correct", None, [(start, end, ok)]
    expected = _truth_string(truth, decimals)
    chars = [start + k for k, c in enumerate(written) if c != ","]
    for i, at in enumerate(chars):
        if i >= len(expected) or written[at - start] != expected[i]:
            return "wrong", at, [(start, at, ok), (at, at + 1, first), (at + 1, end, after)]
    if end >= len(text):  # a strict prefix where the text stops: it may have gone on
        return "unfinished", None, [(start, end, ok)]
    return "wrong", end, [(start, end, ok), (end, end + 1, first)]


# --- statements -----------------------------------------------------------------------

def statements(text: str, problem: Optional[str] = None) -> list[Statement]:
    """Every arithmetic statement of ``text``, one per written ``=``, in text order.
    ``problem`` (the question's text) only informs ``operands_seen``."""
    p = wa.Parser(wa.lexemes(text))
    chains = wa.chains(p)
    if not chains:
        return []
    known = {abs(wa.number_value(m.group())) for m in wa.NUMBER.finditer(problem or "")}
    written = [(m.start(), abs(wa.number_value(m.group()))) for m in wa.NUMBER.finditer(text)]
    derived: set = set()  # spans of earlier statements' results: seen, being worked out
    out = []
    for chain, pending in chains:
        steps = list(zip(chain[:-1], chain[1:])) + ([(chain[-1], None)] if pending else [])
        for lhs, rhs in steps:
            if lhs.value is None or (rhs is None and not lhs.n_ops):
                continue
            start = p.lx[lhs.first].start
            seen = known | {value for at, value in written if at < start}
            out.append(_statement(text, p, lhs, rhs, seen, derived))
            derived.update(out[-1].result_spans)
    return out


def _statement(text: str, p: wa.Parser, lhs: wa.Expr, rhs: Optional[wa.Expr], seen: set,
               derived: set) -> Statement:
    """The statement ``lhs = rhs`` (rhs None: the text ended at "="), verified."""
    numbers, operators = p.numbers_and_operators(lhs)
    operators.append((p.lx[lhs.end].start, p.lx[lhs.end].end))  # "="
    flags = tuple(span in derived or abs(wa.number_value(text[span[0]:span[1]])) in seen
                  for span in numbers)
    marks = [(a, b, CODE["operand"]) for a, b in numbers]
    marks += [(a, b, CODE["operator"]) for a, b in operators]
    start = p.lx[lhs.first].start
    if rhs is None:
        end = operators[-1][1]
        return Statement(start, end, text[start:end], tuple(numbers), tuple(operators), None,
                         lhs.value, None, None, None, flags, (), tuple(marks))
    rhs_numbers, rhs_operators = p.numbers_and_operators(rhs)
    marks += [(a, b, CODE["operand"]) for a, b in rhs_numbers]
    marks += [(a, b, CODE["operator"]) for a, b in rhs_operators]
    judged, written_value, equal = _judge_right_side(text, p, lhs, rhs, rhs_numbers)
    statuses = [status for _, status, _, _ in judged]
    wrongs = [at for _, _, at, _ in judged if at is not None]
    marks += [m for _, _, _, pieces in judged for m in pieces]
    correct = None if "unfinished" in statuses else (
        equal and all(status == "correct" for status in statuses))
    end = p.lx[rhs.end - 1].end
    return Statement(start, end, text[start:end], tuple(numbers), tuple(operators),
                     (p.lx[rhs.first].start, end), lhs.value, written_value, correct,
                     min(wrongs) if wrongs else None, flags,
                     tuple(span for span, _, _, _ in judged), tuple(marks))


def _judge_right_side(text, p, lhs, rhs, rhs_numbers):
    """[(span, status, first wrong, marks)] of the right side's results, its written
    value, and whether that value is the left side's (a single number's approximation
    and a remainder are judged by ``_judge`` alone)."""
    if rhs.remainder is not None:
        a, b = (int(p.lx[k].key) for k in (lhs.first, lhs.first + 2))
        quotient, remainder = rhs_numbers
        judged = [(span, *_judge(text, *span, Fraction(truth)))
                  for span, truth in ((quotient, a // b), (remainder, a % b))]
        written = rhs.value + Fraction(p.lx[rhs.end - 1].key, b)
        return judged, written, True
    if p.single_number(rhs.first, rhs.end):
        span = rhs_numbers[0]
        return [(span, *_judge(text, *span, lhs.value))], rhs.value, True
    judged = []
    for first, end, truth in wa.sub_results(p, lhs, rhs):
        span = (p.lx[first].start, p.lx[end - 1].end)
        judged.append((span, *_judge(text, *span, truth)))
    return judged, rhs.value, rhs.value == lhs.value


# --- labels ---------------------------------------------------------------------------

def label_text(text: str) -> np.ndarray:
    """The label code (index into ``LABELS``) of every character of ``text``."""
    marks = [(*m.span(), CODE["format"]) for pattern in (_FORMAT, tc.STEP_MARKER)
             for m in pattern.finditer(text)]
    boxes = wa.boxes(text)
    for command, content, end in boxes:
        marks += [(command, content, CODE["format"]), (end, end + 1, CODE["format"])]
    if boxes:
        marks.append((boxes[-1][1], boxes[-1][2], CODE["final_answer"]))
    marks += [m for st in statements(text) for m in st.marks]
    codes = [0] * len(text)  # a list: marks are short, and numpy per mark costs more
    for a, b, code in marks:
        for k in range(a, min(b, len(text))):
            if code > codes[k] and (code == CODE["result_first_wrong"] or not text[k].isspace()):
                codes[k] = code  # whitespace stays "other", but where a number stopped
    return np.array(codes, dtype=np.int8)


def _rollout_rows(tokens: pd.DataFrame, texts) -> tuple[pd.DataFrame, pd.Series]:
    """Each (rollout, pos) once, sorted, and each rollout's text (given, else rebuilt
    from the tokens as ``token_categories`` does), checked against the spans."""
    unique = tokens.drop_duplicates(["rollout_id", "pos"]).sort_values(["rollout_id", "pos"])
    built = tc.rollout_texts(unique)
    if texts is not None:
        given = pd.Series(texts, dtype=object).reindex(built.index)
        built = given.where(given.notna(), built)
    tc._check_spans(unique, built)
    return unique, built


def label(tokens: pd.DataFrame, texts=None) -> pd.Series:
    """The label of every row of a per-token table: a categorical Series in ``LABELS``
    order, aligned with ``tokens.index``.

    ``tokens`` needs rollout_id (one id per rollout, as the tables write
    ``<problem_id>#<sample>``), pos, token, char_start, char_end, and is_eos when
    present; ``texts`` optionally maps rollout_id -> response text (exact where a token
    ends inside a multi-byte character). Rows repeated across checkpoints are labelled
    once. A token takes the highest label of its characters; an EOS row is ``other``; a
    byte whose character a later token completes (an empty span) takes that token's
    label.
    """
    if tokens.empty:
        return pd.Series(pd.Categorical([], categories=LABELS), index=tokens.index,
                         name="ground_truth")
    unique, built = _rollout_rows(tokens, texts)
    lengths = built.str.len().to_numpy()
    offsets = pd.Series(np.concatenate([[0], np.cumsum(lengths)[:-1]]), index=built.index)
    chars = np.concatenate([label_text(t) for t in built] + [np.zeros(1, np.int8)])
    base = offsets.reindex(unique.rollout_id).to_numpy()
    return tc.per_token(tokens, unique, chars, base + unique.char_start.to_numpy(),
                        base + unique.char_end.to_numpy(), LABELS, "ground_truth",
                        eos_code=CODE["other"], other_code=CODE["other"])


# --- tables for the chapters ----------------------------------------------------------

def statement_table(texts: Mapping, problems: Optional[Mapping] = None) -> pd.DataFrame:
    """One row per statement of each text (``texts``: rollout_id -> response text;
    ``problems``: rollout_id -> the problem's text, for ``all_operands_seen``)."""
    rows = []
    for rollout_id, text in texts.items():
        problem = None if problems is None else problems.get(rollout_id)
        for st in statements(text, problem):
            rows.append({"rollout_id": rollout_id, "start": st.start, "end": st.end,
                         "statement": st.text, "true_value": st.true_value,
                         "written_value": st.written_value, "correct": st.correct,
                         "first_wrong_char": st.first_wrong_char,
                         "all_operands_seen": all(st.operands_seen)})
    columns = ["rollout_id", "start", "end", "statement", "true_value", "written_value",
               "correct", "first_wrong_char", "all_operands_seen"]
    return pd.DataFrame(rows, columns=columns)


def rollout_summary(tokens: pd.DataFrame, texts=None, problems: Optional[Mapping] = None,
                    labels: Optional[pd.Series] = None) -> pd.DataFrame:
    """Per rollout: ``n_statements``, ``n_wrong`` (correct is False), ``n_unfinished``,
    ``n_unseen_operands`` (statements with an operand found neither in the problem nor
    earlier), and ``has_result_first_wrong`` (a token labelled so). ``problems`` maps
    problem_id -> problem text (``tokens`` then needs problem_id); ``labels`` are
    ``label(tokens, texts)`` when already computed."""
    unique, built = _rollout_rows(tokens, texts)
    by_rollout = None
    if problems is not None:
        if "problem_id" not in unique:
            raise ValueError("problems are keyed by problem_id: the token table needs it")
        by_rollout = unique.groupby("rollout_id").problem_id.first().map(problems).to_dict()
    table = statement_table(built.to_dict(), by_rollout)
    grouped = table.groupby("rollout_id")
    labels = label(tokens, texts) if labels is None else labels
    first_wrong = (labels == "result_first_wrong").groupby(tokens.rollout_id.to_numpy()).any()
    out = pd.DataFrame({
        "n_statements": grouped.size(),
        "n_wrong": grouped.correct.apply(lambda c: int((c == False).sum())),  # noqa: E712
        "n_unfinished": grouped.correct.apply(lambda c: int(c.isna().sum())),
        "n_unseen_operands": grouped.all_operands_seen.apply(lambda s: int((~s).sum())),
    }).reindex(built.index).fillna(0).astype(int)
    out["has_result_first_wrong"] = first_wrong.reindex(built.index).fillna(False).astype(bool)
    out.index.name = "rollout_id"
    return out

"""Reading the arithmetic a text writes: lexemes, a small precedence parser and the
chains ``E0 = E1 = ...`` (for ``ground_truth``, whose docstring gives the rules).

Model text is data: it is lexed and parsed here, never evaluated.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import NamedTuple, Optional, Union

Number = Union[int, Fraction]  # whole values are ints: faster, and just as exact

# Alternatives are tried in order at each place: "x" as a product comes before spaces so
# that its look-behind still sees the digit before "3 x 4"'s spaces; a run of words (not
# a lone x or r, which may be a product or a remainder) is one lexeme, for speed. "3 x -4"
# is a product, "2x -4" algebra.
_LEXEME = re.compile(r"""
    (?P<num>\d{1,3}(?:,\d{3})+(?![\d])(?:\.\d+)?|\d+(?:\.\d+)?)
  | (?P<times>(?<=[\d)])(?:[ \t]*[xX](?=[ \t]*[\d(])|[ \t]+[xX](?=[ \t]+[-−][\d(])))
  | (?P<newline>[ \t]*(?:\n|\\\\)\s*)
  | (?P<space>[ \t]+)
  | (?P<box>\\boxed[ \t]*\{)
  | (?P<skip>\$|\\[()\[\]]|\*\*|&|\\left(?=\()|\\right(?=\)))
  | (?P<eq>=)
  | (?P<op>[-+*/×÷·−]|\\(?:times|cdot|div|ast)(?![a-zA-Z]))
  | (?P<lp>\() | (?P<rp>\))
  | (?P<rem>(?<![a-zA-Z])(?:remainder(?:[ \t]+of)?|rem\.?|R|r)(?![a-zA-Z]))
  | (?P<close>\})
  | (?P<words>(?:(?![xXrR](?![^\W\d_]))[^\W\d_]+[ \t.,:;!?'"]*)+)
""", re.X)
_CANONICAL_OP = {"+": "+", "-": "-", "−": "-", "*": "*", "×": "*", "·": "*", "x": "*",
                 "X": "*", "\\times": "*", "\\cdot": "*", "\\ast": "*", "/": "/", "÷": "/",
                 "\\div": "/"}
_TIMES_BEFORE = re.compile(r"[\d)][ \t]*[xX]\Z")  # "3x" before the 4 of "3x4"
_GLUE_BEFORE = set("^_.{\\")  # with letters: a number after these is not arithmetic
_GLUE_AFTER = set("^_!%{}°")  # nor one before these
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?")
_BOX = re.compile(r"\\boxed[ \t]*\{")


class Lexeme(NamedTuple):
    kind: str  # num, op, eq, lp, rp, rem, newline or stop (anything else)
    start: int
    end: int
    key: object = None  # a number's value, an operator's canonical character


class Expr(NamedTuple):
    first: int  # lexeme range [first, end)
    end: int
    value: Optional[Number]  # exact; None: undefined (division by zero)
    n_ops: int  # binary operators
    terms: tuple  # top-level terms of a sum, as lexeme ranges
    remainder: Optional[int] = None  # lexeme index of "R 2"'s number


# --- lexing ---------------------------------------------------------------------------

def boxes(text: str) -> list[tuple[int, int, int]]:
    """(command start, content start, content end) of every ``\\boxed{``, braces matched;
    an unclosed box runs to the end of the text (content end = len(text))."""
    out = []
    for m in _BOX.finditer(text):
        depth, end = 1, len(text)
        for k in range(m.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                end = k
                break
        out.append((m.start(), m.end(), end))
    return out


def _glued(text: str, start: int, end: int, opens: set, closes: set) -> bool:
    """Is the number text[start:end] part of something else ("x^2", "2x", "{1}", "50%")?
    A box's own braces and the "x" of "3 x 4" do not glue."""
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    if before.isalpha() and not _TIMES_BEFORE.search(text, max(0, start - 16), start):
        return True
    if before in _GLUE_BEFORE and start - 1 not in opens:
        return True
    if after.isalpha():
        times = _LEXEME.match(text, end)
        return times is None or times.lastgroup != "times"
    return after in _GLUE_AFTER and end not in closes


def lexemes(text: str) -> list[Lexeme]:
    """The arithmetic lexemes of the text; anything else becomes a ``stop``."""
    found = boxes(text)
    opens, closes = {content - 1 for _, content, _ in found}, {end for _, _, end in found}
    out, at = [], 0
    for m in _LEXEME.finditer(text):
        if m.start() > at:
            out.append(Lexeme("stop", at, m.start()))
        at, kind, start, end = m.end(), m.lastgroup, m.start(), m.end()
        if kind in ("space", "skip", "box") or (kind == "close" and start in closes):
            continue
        if kind == "num":
            stop = _glued(text, start, end, opens, closes)
            out.append(Lexeme("stop", start, end) if stop else
                       Lexeme("num", start, end, number_value(m.group())))
        elif kind in ("op", "times"):
            start = end - len(m.group().strip())
            out.append(Lexeme("op", start, end, _CANONICAL_OP[text[start:end]]))
        elif not (kind in ("close", "words") and out and out[-1].kind == "stop"):
            out.append(Lexeme("stop" if kind in ("close", "words") else kind, start, end))
    if at < len(text):
        out.append(Lexeme("stop", at, len(text)))
    return _resolve_newlines(out)


def number_value(written: str) -> Number:
    """The value of a number as written ("1,234", "0.75", "-3")."""
    written = written.replace(",", "").replace("−", "-")
    if "." not in written:
        return int(written)
    value = Fraction(written)
    return value.numerator if value.denominator == 1 else value


def _resolve_newlines(lx: list[Lexeme]) -> list[Lexeme]:
    """A line break is crossed after an operator or "=", or before "="; else it stops."""
    out = []
    for k, lexeme in enumerate(lx):
        if lexeme.kind != "newline":
            out.append(lexeme)
        elif not ((out and out[-1].kind in ("op", "eq"))
                  or (k + 1 < len(lx) and lx[k + 1].kind == "eq")):
            out.append(lexeme._replace(kind="stop"))
    return out


# --- parsing --------------------------------------------------------------------------

def _apply(a: Optional[Number], op: str, b: Optional[Number]) -> Optional[Number]:
    if a is None or b is None or (op == "/" and b == 0):
        return None
    if op == "/":
        quotient = Fraction(a, b)
        return quotient.numerator if quotient.denominator == 1 else quotient
    return {"+": a + b, "-": a - b, "*": a * b}[op]


class Parser:
    """Longest-match precedence parsing over a lexeme list: an operator whose operand does
    not follow is left unconsumed, so an expression ends where the arithmetic does."""

    def __init__(self, lx: list[Lexeme]):
        self.lx = lx
        self.kinds = [lexeme.kind for lexeme in lx] + [None]

    def kind(self, i: int):
        return self.kinds[i] if 0 <= i < len(self.kinds) else None

    def is_sign(self, i: int) -> bool:
        """A "-" written against the number or "(" after it, where an operand starts."""
        lx = self.lx
        return (self.kind(i) == "op" and lx[i].key == "-" and self.kind(i + 1) in ("num", "lp")
                and lx[i + 1].start == lx[i].end)

    def expr(self, i: int) -> Optional[Expr]:
        term = self._chain(i, "+-", self._term)
        if term is None:
            return None
        value, end, n_ops, terms = term
        return Expr(i, end, value, n_ops, terms)

    def _term(self, i: int):
        found = self._chain(i, "*/", self._factor)
        return None if found is None else found[:3]

    def _chain(self, i, ops, operand):
        first = operand(i)
        if first is None:
            return None
        value, end, n_ops = first
        terms = [(i, end)]
        while self.kind(end) == "op" and self.lx[end].key in ops:
            nxt = operand(end + 1)
            if nxt is None:
                break
            value = _apply(value, self.lx[end].key, nxt[0])
            terms.append((end + 1, nxt[1]))
            end, n_ops = nxt[1], n_ops + nxt[2] + 1
        return value, end, n_ops, tuple(terms)

    def _factor(self, i: int):
        sign = 1
        if self.is_sign(i):
            sign, i = -1, i + 1
        if self.kind(i) == "num":
            return sign * self.lx[i].key, i + 1, 0
        if self.kind(i) == "lp":
            inner = self.expr(i + 1)
            if inner is not None and self.kind(inner.end) == "rp":
                value = None if inner.value is None else sign * inner.value
                return value, inner.end + 1, inner.n_ops
        return None

    def numbers_and_operators(self, e: Expr) -> tuple[list, list]:
        """Character spans of an expression's numbers (a sign joined to its number) and of
        its operators and parentheses."""
        numbers, operators = [], []
        for k in range(e.first, e.end):
            lexeme = self.lx[k]
            if self.kind(k) == "num":
                signed = k > e.first and self._number_sign(k - 1, e.first)
                numbers.append((self.lx[k - 1].start if signed else lexeme.start, lexeme.end))
            elif self.kind(k) in ("lp", "rp", "rem") or (
                    self.kind(k) == "op" and not self._number_sign(k, e.first)):
                operators.append((lexeme.start, lexeme.end))
        return numbers, operators

    def _number_sign(self, k: int, first: int) -> bool:
        """Is lexeme k the sign of the number after it (where ``_factor`` reads one)?"""
        return self.is_sign(k) and self.kind(k + 1) == "num" and (
            k == first or self.kind(k - 1) in ("op", "lp"))

    def keys(self, a: int, b: int) -> list:
        return [(self.lx[k].kind, self.lx[k].key) for k in range(a, b)]

    def single_number(self, a: int, b: int) -> bool:
        return (b - a == 1 and self.kind(a) == "num") or (
            b - a == 2 and self.is_sign(a) and self.kind(a + 1) == "num")


def chains(p: Parser) -> list[tuple[list[Expr], bool]]:
    """Every chain ``E0 = E1 = ...`` whose first expression has an operator, and whether
    the text stops right after a last "=" (an unfinished statement)."""
    out, i, n = [], 0, len(p.lx)
    while i < n:
        chain = [p.expr(i)]
        if chain[0] is None:
            i += 1
            continue
        j, pending, restart = chain[0].end, False, None
        while p.kind(j) == "eq":
            rhs = p.expr(j + 1)
            if rhs is None:
                pending = j + 1 == n
                break
            rhs = _with_remainder(p, chain[-1], rhs)
            running = _running_total(p, chain[-1], rhs)
            chain.append(running or rhs)
            j = chain[-1].end
            if running:
                restart = running.first  # the total starts the next statement
                break
        while len(chain) > 1 and not chain[0].n_ops:
            chain.pop(0)
        if chain[0].n_ops and (len(chain) > 1 or pending):
            out.append((chain, pending))
        i = restart if restart is not None else max(j, i + 1)
    return out


def _with_remainder(p: Parser, lhs: Expr, rhs: Expr) -> Expr:
    """``17 / 5 = 3 R 2``: a whole-number division's quotient followed by a remainder."""
    division = (lhs.end - lhs.first == 3 and p.keys(lhs.first, lhs.end)[1] == ("op", "/")
                and all(p.kind(k) == "num" and p.lx[k].key.denominator == 1
                        for k in (lhs.first, lhs.first + 2)) and p.lx[lhs.first + 2].key > 0)
    if (division and p.single_number(rhs.first, rhs.end) and p.kind(rhs.end) == "rem"
            and p.kind(rhs.end + 1) == "num"):
        return rhs._replace(end=rhs.end + 2, remainder=rhs.end + 1)
    return rhs


def _running_total(p: Parser, lhs: Expr, rhs: Expr) -> Optional[Expr]:
    """``3 + 4 = 7 + 1``: a right side that neither equals the left nor evaluates a piece
    of it, and starts with a number, is that number and then a new statement."""
    if (not rhs.n_ops or rhs.value == lhs.value or sub_results(p, lhs, rhs)
            or p.kind(rhs.first) != "num"):
        return None
    return Expr(rhs.first, rhs.first + 1, p.lx[rhs.first].key, 0, ((rhs.first, rhs.first + 1),))


def sub_results(p: Parser, lhs: Expr, rhs: Expr) -> list[tuple[int, int, Number]]:
    """The numbers of ``rhs`` that are the result of a piece of ``lhs``, as (first, end)
    lexeme ranges with the piece's value: the one piece between the lexemes both sides
    share at their ends (``3 x 4 + 2 = 12 + 2``), else piece by piece over terms joined
    by the same operators (``3 x 4 + 2 x 5 = 12 + 10``)."""
    left, right = p.keys(lhs.first, lhs.end), p.keys(rhs.first, rhs.end)
    a = 0
    while a < min(len(left), len(right)) and left[a] == right[a]:
        a += 1
    b = 0
    while b < min(len(left), len(right)) - a and left[-1 - b] == right[-1 - b]:
        b += 1
    found = _piece_result(p, (lhs.first + a, lhs.end - b), (rhs.first + a, rhs.end - b))
    if found:
        return [found]
    joins = [[p.keys(t[0] - 1, t[0])[0] for t in e.terms[1:]] for e in (lhs, rhs)]
    if len(lhs.terms) == len(rhs.terms) > 1 and joins[0] == joins[1]:
        pieces = [_piece_result(p, piece, written)
                  for piece, written in zip(lhs.terms, rhs.terms)]
        return [x for x in pieces if x]
    return []


def _piece_result(p: Parser, piece: tuple, written: tuple):
    if not p.single_number(*written):
        return None
    sub = Parser(p.lx[piece[0]:piece[1]]).expr(0)
    if sub is None or sub.end != piece[1] - piece[0] or not sub.n_ops or sub.value is None:
        return None
    return written[0], written[1], sub.value

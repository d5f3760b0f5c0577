"""Grading a model's answer against the gold answer with math-verify, safely.

Policy (what counts as the model's answer):
- Only ``\\boxed{...}`` / ``\\fbox{...}`` contents count, found by matching braces so
  nested braces survive (``\\boxed{\\frac{14}{3}}`` -> ``\\frac{14}{3}``). The prompt asks
  for a box; a response without a closed box is wrong (method ``"no_box"``), and we never
  fall back to "the last number in the text".
- With several boxes the LAST one counts (a model that corrects itself is graded on its
  correction). An empty last box is wrong (``"empty_box"``), again with no fallback.
- An unclosed box (a response cut off at the token limit) is not a box.
- A box wrapping only another box counts as that box (``\\boxed{\\boxed{4}}`` -> ``4``).
- A last box nesting braces deeper than ``MAX_BOX_DEPTH`` is wrong (``"too_deep"``) and one
  longer than ``MAX_ANSWER_CHARS`` is wrong (``"too_long"``): MATH answers are short and
  shallow, and such a box is a degenerate generation, not an answer worth parsing. Both
  are decided in the parent by one linear scan, before any worker sees the text.

Safety: model text is data. math-verify is used with ``LatexExtractionConfig`` only (its
``ExprExtractionConfig`` runs sympy's ``parse_expr``, i.e. ``eval``). Parsing runs in worker
processes in which sympy's string-evaluation hook (``sympy_parser.eval_expr``) refuses,
and ``Number("...")`` (latex2sympy's call on digit tokens such as ``14``, ``0.5``, ``1E5``,
which would go through ``sympify``/``eval``) is served by a converter that builds what
sympify would (``Integer`` for digits, ``Float(text)`` with a point or exponent) without
evaluating anything; any other string is refused. (sympy also ``exec``s code it generates
from integers, e.g. for polynomial rings; no text reaches it, and it is left alone.)

The guard goes in after a warm-up, because sympy evaluates its own text in code it loads
lazily: ``simplify`` imports ``sympy.physics.units`` on first use, which builds its unit
prefixes with ``sympify("yotta")``, ... Guarded from the start, that import failed in every
``simplify``, math-verify swallowed the error and answered "not equal", and ``(x+1)^2`` vs
``x^2+2x+1`` or ``\\frac{89.6}{3125}`` vs ``\\frac{448}{15625}`` were graded wrong under
method ``math_verify``. Warming beats a guard that tries to tell model text from sympy's
own (by call stack or string provenance): the guard stays total (after warming nothing
evaluates text, whatever its origin) and easy to audit. Warming (1) imports that module
(importing every sympy 1.14 module found it the only one that evaluates text at import,
besides two that build documentation) and (2) grades a few answers of our own, loading
what comparisons load lazily, so that cost is not charged to a first answer's time limit.
``tests/test_grading_differential.py`` grades over 500 generated benign pairs against
plain, unguarded math-verify and requires identical verdicts.

A guard that trips is never a plain "wrong": it records each refusal, so even where
math-verify catches the exception the grade says ``"refused"`` (and is graded wrong).
math-verify also turns any exception at the top of ``parse``/``verify`` into "no parse" or
False, logging it at DEBUG; the worker collects those records, and a False verdict that
followed one reads ``"error:<ExceptionType>"``, not ``math_verify``. Not detectable:
exceptions caught inside math-verify's comparison strategies (string, numeric, symbolic
equality; one that raises means "not equal by this strategy" and is not logged), and
latex2sympy failures that make a side "not LaTeX" (method ``"string"``).

Timeouts: each answer gets ``timeout_s`` of wall time in a worker; a worker that overruns
(e.g. ``10^{10^{10}}`` sends sympy into a huge integer power, which no signal interrupts)
is killed and the answer is graded wrong with method ``"timeout"``. A warm spare worker
takes over at once and the replacement starts in the background, so a hung answer costs
its limit and no more.

``GRADER_VERSION`` changes whenever a verdict can change; caches of grades key on it.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import asdict, dataclass
from importlib import metadata

GRADER_VERSION = "2"  # 2: benign verdicts no longer broken by the guard; refused, too_deep
MAX_ANSWER_CHARS = 2000
MAX_BOX_DEPTH = 20  # brace nesting inside the last box; MATH answers stay below ~8, and
#                     math-verify already needs seconds to parse 20 nested plain braces
GRADER_NAME = "rlprobe_nb.problems.grading (math-verify, LaTeX extraction only, last box)"

# Methods a Grade can carry, for tables and docs.
METHODS = (
    "math_verify",  # both sides parsed, math-verify compared them
    "string",  # one side did not parse; exact match of whitespace-stripped strings
    "no_box",
    "empty_box",
    "too_deep",
    "too_long",
    "timeout",
    "refused",  # sympy tried to evaluate text and the guard refused
    "error",  # "error:<ExceptionType>": the comparison raised, or math-verify swallowed it
)


@dataclass(frozen=True)
class Grade:
    correct: bool
    extracted: str | None  # content of the last box of the response, None without a box
    method: str
    n_boxes: int
    gold_extracted: str  # the gold answer as compared
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- extraction

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\b")
_WRAPPER_RE = re.compile(r"\s*\\(?:boxed|fbox)\b\s*\{")


def _box_spans(text: str) -> list[tuple[int, int, int]]:
    """(start, end, depth) of every closed box's content: ``text[start:end]``, and the
    deepest brace nesting inside it. One pass over the text."""
    out: list[tuple[int, int, int]] = []
    pos, n = 0, len(text)
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return out
        i = m.end()
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] == "{":
            depth, deepest, j = 1, 1, i + 1
            while j < n and depth:
                c = text[j]
                if c == "\\":  # an escaped brace \{ or \} does not open or close
                    j += 2
                    continue
                if c == "{":
                    depth += 1
                    deepest = max(deepest, depth)
                elif c == "}":
                    depth -= 1
                j += 1
            if depth:  # unclosed: cut off at the token limit, not an answer
                return out
            out.append((i + 1, j - 1, deepest - 1))
            pos = j
        elif i > m.end() and i < n:  # "\boxed 5"
            j = i
            while j < n and not text[j].isspace() and text[j] != "$":
                j += 1
            out.append((i, j, 0))
            pos = j
        else:
            pos = m.end()


def extract_boxed(text: str | None) -> list[str]:
    """Contents of every closed ``\\boxed{...}``/``\\fbox{...}`` in order, braces matched.

    ``\\boxed 5`` (MATH's brace-less form) yields the token up to whitespace or ``$``.
    Linear in the length of the text.
    """
    return [text[a:b].strip() for a, b, _ in _box_spans(text)] if text else []


def last_boxed(text: str | None) -> str | None:
    boxes = extract_boxed(text)
    return boxes[-1] if boxes else None


def _innermost(box: str) -> str:
    """``\\boxed{ \\fbox{4} }`` -> ``4``: strip boxes that wrap the whole content, in one pass
    (a brace-matching table built once, then O(1) per level)."""
    close, stack, j = {}, [], 0
    while j < len(box):
        c = box[j]
        if c == "\\":
            j += 2
            continue
        if c == "{":
            stack.append(j)
        elif c == "}" and stack:
            close[stack.pop()] = j
        j += 1
    lo, hi = 0, len(box)
    while (m := _WRAPPER_RE.match(box, lo, hi)) is not None:
        end = close.get(m.end() - 1)
        if end is None or box[end + 1:hi].strip():  # not one box around everything
            break
        lo, hi = m.end(), end
    return box[lo:hi].strip()


def gold_answer(answer: str | None, solution: str | None) -> str:
    """The gold answer: the ``answer`` field, else the last box of ``solution``."""
    if answer is not None and str(answer).strip():
        return str(answer).strip()
    boxed = last_boxed(solution)
    if boxed:
        return boxed
    raise ValueError(
        "problem has no gold answer: `answer` is empty and `solution` has no \\boxed{...}; "
        "fix the problem file (give an `answer` field)"
    )


# --------------------------------------------------------------------------- worker side

# A numeric literal as latex2sympy hands it to Number(); Python's rule for integer literals
# (no leading zeros), which sympify follows because it evaluates the literal.
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_PY_INT_RE = re.compile(r"[+-]?(?:0+|[1-9]\d*)", re.ASCII)

# Our own answers, one of each kind that loads part of sympy on first use, graded once
# before the guard goes in (see module doc).
_WARM_UP = (
    (r"\frac{89.6}{3125}", r"\frac{448}{15625}"), ("(x+1)^2", "x^2+2x+1"),
    (r"\sin^2x+\cos^2x", "1"), (r"\frac{\pi}{3}", r"\pi/3"), (r"72^\circ", "72"),
    ("[0,1)", "(0,1)"), (r"(1,\frac12)", "(1,0.5)"),
)

_REFUSED: list[str] = []  # what the guard refused while grading the current answer
_SWALLOWED: list[str] = []  # exception types math-verify logged and swallowed, ditto


class TextEvaluationRefused(RuntimeError):
    pass


def _refuse(text: str):
    _REFUSED.append(text[:80])
    raise TextEvaluationRefused(f"refused to evaluate text ({text[:40]!r}...)")


def _number_from_literal(text: str):
    """What ``sympify`` makes of a numeric literal (sympy's ``auto_number`` rule: ``Float``
    of the text when it has a point or an exponent, else ``Integer``), without ``eval``."""
    import sympy

    s = text.strip()
    if not _NUMBER_RE.fullmatch(s):
        _refuse(s)
    if any(c in s for c in ".eE"):
        return sympy.Float(s)
    if not _PY_INT_RE.fullmatch(s):  # "007" is no Python literal: sympify fails on it too
        raise sympy.SympifyError(s)
    return sympy.Integer(int(s))


def _install_guards() -> None:
    """Make every sympy string-evaluation path in this process refuse (see module doc)."""
    import sympy.core.numbers as numbers
    import sympy.parsing.sympy_parser as sympy_parser

    def refuse_eval(code, *args, **kwargs):
        _refuse(str(code))

    sympy_parser.eval_expr = refuse_eval
    original_sympify = numbers.sympify

    def numbers_only(a, *args, **kwargs):  # Number("14") in latex2sympy
        if isinstance(a, str):
            return _number_from_literal(a)
        return original_sympify(a, *args, **kwargs)

    numbers.sympify = numbers_only


class _SwallowedErrors(logging.Handler):
    """Notes the exceptions math-verify logs (at DEBUG, with traceback) and then swallows."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[0] is not None:
            _SWALLOWED.append(record.exc_info[0].__name__)


def _watch_math_verify_log() -> None:
    log = logging.getLogger("math_verify")
    log.setLevel(logging.DEBUG)
    log.propagate = False  # its warnings (e.g. "timeout is disabled") are not ours to print
    log.handlers = [_SwallowedErrors()]


def _warm_up() -> None:
    import sympy.physics.units  # noqa: F401  (evaluates its own text at import: module doc)

    for pred, gold in _WARM_UP:
        _compare(pred, gold)


def _parse_latex(latex: str):
    from math_verify import LatexExtractionConfig, parse

    return parse(
        "\\boxed{" + latex + "}",
        extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
        fallback_mode="no_fallback",
        parsing_timeout=None,  # the parent enforces wall time by killing this process
    )


def _compare(pred: str, gold: str) -> tuple[bool, str]:
    from math_verify import verify

    gold_parsed = _parse_latex(gold)
    pred_parsed = _parse_latex(pred)
    if gold_parsed and pred_parsed:
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None)), "math_verify"
    # One side is not LaTeX math (e.g. a word answer): exact string match only.
    return _norm_str(pred) == _norm_str(gold) and bool(_norm_str(gold)), "string"


def _norm_str(s: str) -> str:
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    return re.sub(r"\s+", "", s).strip("$.").lower()


def _grade_one(pred: str, gold: str) -> tuple[bool, str]:
    """``_compare`` plus what it may hide: a refusal, or an error math-verify swallowed."""
    _REFUSED.clear()
    _SWALLOWED.clear()
    try:
        correct, method = _compare(pred, gold)
    except BaseException as e:  # noqa: BLE001  (reported, graded wrong)
        correct, method = False, f"error:{type(e).__name__}"
    if _REFUSED:
        _forget_cached_results()
        return False, "refused"
    if _SWALLOWED and not correct:
        return False, f"error:{_SWALLOWED[0]}"
    return correct, method


def _forget_cached_results() -> None:
    # A parse that got past a refusal (math-verify retries) must not be served from cache
    # next time without the refusal being seen again.
    from math_verify.parser import parse_latex_cached
    from sympy.core.cache import clear_cache

    parse_latex_cached.cache_clear()
    clear_cache()


def _worker_stdio() -> None:
    """Worker loop: one JSON request per stdin line, one JSON reply per stdout line."""
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the protocol
    _watch_math_verify_log()
    _warm_up()
    _install_guards()
    out.write('"ready"\n')
    out.flush()
    for line in sys.stdin:
        task_id, pred, gold = json.loads(line)
        correct, method = _grade_one(pred, gold)
        out.write(json.dumps([task_id, correct, method]) + "\n")
        out.flush()


from rlprobe_nb.problems.grading_pool import GraderPool, _pool, shutdown  # noqa: E402,F401 (the parent side)

# --------------------------------------------------------------------------- public API


def _pre_grade(response: str | None, gold: str) -> tuple[Grade | None, str | None, int]:
    """The verdicts decided without a worker (no box, empty, too deep, too long), in time
    linear in the response; else (None, the innermost last box, number of boxes)."""
    spans = _box_spans(response or "")
    n = len(spans)
    if not spans:
        return Grade(False, None, "no_box", 0, gold), None, 0
    start, end, depth = spans[-1]
    if depth > MAX_BOX_DEPTH:
        return Grade(False, response[start:end][:200].strip(), "too_deep", n, gold), None, n
    last = _innermost(response[start:end].strip())
    if not last:
        return Grade(False, last, "empty_box", n, gold), last, n
    if len(last) > MAX_ANSWER_CHARS:
        return Grade(False, last[:200], "too_long", n, gold), last, n
    return None, last, n


def grade_many(responses: list[str], golds: list[str], timeout_s: float = 5.0,
               workers: int = 2) -> list[Grade]:
    """Grade each response against its gold answer (see the module doc for the policy)."""
    if len(responses) != len(golds):
        raise ValueError(f"grade_many: {len(responses)} responses but {len(golds)} gold answers")
    if not 0 < timeout_s < float("inf"):  # NaN too: it would never expire
        raise ValueError(f"grading timeout must be a finite number of seconds > 0, got {timeout_s}")
    golds = [str(g).strip() for g in golds]
    for i, g in enumerate(golds):
        if not g:
            raise ValueError(f"gold answer #{i} is empty; every problem needs a gold answer")
    out: list[Grade | None] = [None] * len(responses)
    todo, tasks = [], []
    for i, (r, g) in enumerate(zip(responses, golds)):
        early, last, n_boxes = _pre_grade(r, g)
        if early is not None:
            out[i] = early
        else:
            todo.append((i, last, n_boxes))
            tasks.append((last, g))
    for (i, last, n_boxes), (correct, method, secs) in zip(
            todo, _pool(workers).map(tasks, timeout_s)):
        out[i] = Grade(bool(correct), last, method, n_boxes, golds[i], round(secs, 4))
    return out  # type: ignore[return-value]


def grade(response: str, gold: str, timeout_s: float = 5.0) -> Grade:
    return grade_many([response], [gold], timeout_s=timeout_s, workers=1)[0]


def grader_info() -> dict:
    """Name and versions of the grader, for manifests."""
    def version(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    return {
        "name": GRADER_NAME,
        "version": GRADER_VERSION,
        "math_verify": version("math-verify"),
        "latex2sympy2_extended": version("latex2sympy2_extended"),
        "sympy": version("sympy"),
        "policy": "last closed \\boxed{} only; no box or empty box = wrong; "
                  f"box nesting > {MAX_BOX_DEPTH} or > {MAX_ANSWER_CHARS} chars = wrong; "
                  "per-answer wall timeout",
    }

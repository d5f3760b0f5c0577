"""Grading a model's answer against the gold answer with math-verify, safely.

Policy (what counts as the model's answer):
- Only ``\\boxed{...}`` / ``\\fbox{...}`` contents count, found by matching braces so
  nested braces survive (``\\boxed{\\frac{14}{3}}`` -> ``\\frac{14}{3}``). The prompt asks
  for a box; a response without a closed box is wrong (method ``"no_box"``), and we never
  fall back to "the last number in the text".
- With several boxes the LAST one counts (a model that corrects itself is graded on its
  correction). An empty last box is wrong (``"empty_box"``), again with no fallback.
- An unclosed box (a response cut off at the token limit) is not a box.
- A box longer than ``MAX_ANSWER_CHARS`` is wrong (``"too_long"``): MATH answers are short
  and a huge box is a degenerate generation, not an answer worth parsing.

Safety: model text is data. math-verify is used with ``LatexExtractionConfig`` only (its
``ExprExtractionConfig`` runs sympy's ``parse_expr``, i.e. ``eval``). Parsing runs in worker
processes in which sympy's string-evaluation hook (``sympy_parser.eval_expr``) is replaced
by one that refuses, and sympy's ``Number("...")`` (which latex2sympy uses for digit
tokens and which would go through ``sympify``/``eval``) is served by a strict digits-only
converter. So any path that would evaluate text fails loudly (method ``"error"``) instead
of executing it; tests check that the guard is never hit on ordinary answers.

Timeouts: each answer gets ``timeout_s`` of wall time in a worker; a worker that overruns
(e.g. ``10^{10^{10}}`` sends sympy into a huge integer power, which no signal interrupts)
is killed and replaced, and the answer is graded wrong with method ``"timeout"``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

MAX_ANSWER_CHARS = 2000
GRADER_NAME = "rlprobe_nb.grading (math-verify, LaTeX extraction only, last box)"

# Methods a Grade can carry, for tables and docs.
METHODS = (
    "math_verify",  # both sides parsed, math-verify compared them
    "string",  # one side did not parse; exact match of whitespace-stripped strings
    "no_box",
    "empty_box",
    "too_long",
    "timeout",
    "error",  # the worker raised (includes a refused attempt to evaluate text)
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


def extract_boxed(text: str | None) -> list[str]:
    """Contents of every closed ``\\boxed{...}``/``\\fbox{...}`` in order, braces matched.

    ``\\boxed 5`` (MATH's brace-less form) yields the token up to whitespace or ``$``.
    Linear in the length of the text.
    """
    if not text:
        return []
    out: list[str] = []
    pos = 0
    n = len(text)
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return out
        i = m.end()
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] == "{":
            depth, j = 1, i + 1
            while j < n and depth:
                c = text[j]
                if c == "\\":  # an escaped brace \{ or \} does not open or close
                    j += 2
                    continue
                if c == "{":
                    depth += 1
                elif c == "}":
                    depth -= 1
                j += 1
            if depth:  # unclosed: cut off at the token limit, not an answer
                return out
            out.append(text[i + 1 : j - 1].strip())
            pos = j
        elif i > m.end() and i < n:  # "\boxed 5"
            j = i
            while j < n and not text[j].isspace() and text[j] != "$":
                j += 1
            out.append(text[i:j].strip())
            pos = j
        else:
            pos = m.end()


def last_boxed(text: str | None) -> str | None:
    boxes = extract_boxed(text)
    return boxes[-1] if boxes else None


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

_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)\Z")
_INT_RE = re.compile(r"[+-]?\d+\Z")


class TextEvaluationRefused(RuntimeError):
    pass


def _install_guards() -> None:
    """Make every sympy string-evaluation path in this process refuse (see module doc)."""
    import sympy
    import sympy.core.numbers as numbers
    import sympy.parsing.sympy_parser as sympy_parser

    def refuse_eval(code, *args, **kwargs):
        raise TextEvaluationRefused(f"refused to evaluate text ({str(code)[:40]!r}...)")

    sympy_parser.eval_expr = refuse_eval
    original_sympify = numbers.sympify

    def digits_only(a, *args, **kwargs):
        # Number("14") in latex2sympy: convert digit strings without the parser.
        if isinstance(a, str):
            s = a.strip()
            if _INT_RE.match(s):
                return sympy.Integer(int(s))
            if _NUMBER_RE.match(s):
                return sympy.Float(s)
            raise TextEvaluationRefused(f"refused to sympify {s[:40]!r}")
        return original_sympify(a, *args, **kwargs)

    numbers.sympify = digits_only


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


def _worker_stdio() -> None:
    """Worker loop: one JSON request per stdin line, one JSON reply per stdout line."""
    import json
    import sys

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _install_guards()
    import math_verify  # noqa: F401  (import before "ready" so timeouts exclude it)

    _compare("1", "1")  # warm the parser
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the protocol
    out.write('"ready"\n')
    out.flush()
    for line in sys.stdin:
        task_id, pred, gold = json.loads(line)
        try:
            correct, method = _compare(pred, gold)
        except BaseException as e:  # noqa: BLE001  (reported, graded wrong)
            correct, method = False, f"error:{type(e).__name__}"
        out.write(json.dumps([task_id, correct, method]) + "\n")
        out.flush()


# --------------------------------------------------------------------------- parent side

_STARTUP_TIMEOUT_S = 120.0


class _Worker:
    """A grading subprocess (``python -c``, not multiprocessing: no pickling, and no
    re-import of the caller's ``__main__``, so unguarded scripts and notebooks work)."""

    def __init__(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")] if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from rlprobe_nb.grading import _worker_stdio; _worker_stdio()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, text=True, bufsize=1)
        self.ready = False
        self.task = None  # (task_id, start_time)

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def send(self, obj) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float | None = None):
        if timeout is not None and not select.select([self], [], [], timeout)[0]:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError("grading worker exited")
        return json.loads(line)

    def wait_ready(self) -> None:
        if self.recv(_STARTUP_TIMEOUT_S) != "ready":
            self.kill()
            raise RuntimeError(
                f"a grading worker did not start within {_STARTUP_TIMEOUT_S:.0f}s; check "
                "that math-verify imports: python -c 'import math_verify'")
        self.ready = True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # EOF ends the worker loop
            self.proc.wait(2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class GraderPool:
    """Worker processes with a per-answer wall-clock timeout; overrunning workers are
    killed and replaced, so one pathological answer costs at most ``timeout_s``."""

    def __init__(self, workers: int = 2):
        if workers < 1:
            raise ValueError(f"grading workers must be >= 1, got {workers}")
        self._size = workers
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    def _ensure(self) -> None:
        for w in self._workers:
            if not w.alive():
                w.kill()
        self._workers = [w for w in self._workers if w.alive()]
        while len(self._workers) < self._size:
            self._workers.append(_Worker())
        for w in self._workers:
            if not w.ready:
                w.wait_ready()

    def map(self, tasks: list[tuple[str, str]], timeout_s: float) -> list[tuple[bool, str, float]]:
        """Run (pred, gold) comparisons; returns (correct, method, seconds) per task."""
        with self._lock:
            return self._map(tasks, timeout_s)

    def _map(self, tasks, timeout_s):
        results: list = [None] * len(tasks)
        if not tasks:
            return results
        self._ensure()
        pending = list(range(len(tasks)))[::-1]
        idle = list(self._workers)
        busy: list[_Worker] = []
        while pending or busy:
            while pending and idle:
                w = idle.pop()
                k = pending.pop()
                w.task = (k, time.monotonic())
                try:
                    w.send([k, tasks[k][0], tasks[k][1]])
                except OSError:
                    w = self._replace(w)
                    w.task = (k, time.monotonic())
                    w.send([k, tasks[k][0], tasks[k][1]])
                busy.append(w)
            next_deadline = min(w.task[1] + timeout_s for w in busy)
            ready, _, _ = select.select(busy, [], [], max(0.0, next_deadline - time.monotonic()))
            for w in ready:
                busy.remove(w)
                k, start = w.task
                try:
                    task_id, correct, method = w.recv()
                    if task_id != k:
                        raise EOFError("grading worker answered out of order")
                except (EOFError, OSError, ValueError):  # the worker died (e.g. out of memory)
                    correct, method = False, "error:worker_died"
                    w = self._replace(w)
                results[k] = (bool(correct), method, time.monotonic() - start)
                w.task = None
                idle.append(w)
            now = time.monotonic()
            for w in list(busy):
                k, start = w.task
                if now - start >= timeout_s:
                    busy.remove(w)
                    results[k] = (False, "timeout", now - start)
                    idle.append(self._replace(w))
        return results

    def _replace(self, w: _Worker) -> _Worker:
        w.kill()
        fresh = _Worker()
        self._workers[self._workers.index(w)] = fresh
        fresh.wait_ready()
        return fresh

    def close(self) -> None:
        for w in self._workers:
            w.close()
        self._workers = []


_POOLS: dict[int, GraderPool] = {}


def _pool(workers: int) -> GraderPool:
    if workers not in _POOLS:
        _POOLS[workers] = GraderPool(workers)
    return _POOLS[workers]


@atexit.register
def shutdown() -> None:
    """Stop the cached worker processes (also runs at interpreter exit)."""
    for p in _POOLS.values():
        p.close()
    _POOLS.clear()


# --------------------------------------------------------------------------- public API


def _pre_grade(response: str | None, gold: str) -> tuple[Grade | None, str | None, int]:
    boxes = extract_boxed(response or "")
    if not boxes:
        return Grade(False, None, "no_box", 0, gold), None, 0
    last = boxes[-1]
    while True:  # \boxed{\boxed{4}}: grade the innermost box
        inner = extract_boxed(last)
        if len(inner) == 1 and re.fullmatch(
                r"\\(?:boxed|fbox)\s*\{\s*" + re.escape(inner[0]) + r"\s*\}", last):
            last = inner[0]
        else:
            break
    if not last.strip():
        return Grade(False, last, "empty_box", len(boxes), gold), last, len(boxes)
    if len(last) > MAX_ANSWER_CHARS:
        return Grade(False, last[:200], "too_long", len(boxes), gold), last, len(boxes)
    return None, last, len(boxes)


def grade_many(responses: list[str], golds: list[str], timeout_s: float = 5.0,
               workers: int = 2) -> list[Grade]:
    """Grade each response against its gold answer (see the module doc for the policy)."""
    if len(responses) != len(golds):
        raise ValueError(f"grade_many: {len(responses)} responses but {len(golds)} gold answers")
    if timeout_s <= 0:
        raise ValueError(f"grading timeout must be > 0 seconds, got {timeout_s}")
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
        "math_verify": version("math-verify"),
        "latex2sympy2_extended": version("latex2sympy2_extended"),
        "sympy": version("sympy"),
        "policy": "last closed \\boxed{} only; no box or empty box = wrong; "
                  f"box > {MAX_ANSWER_CHARS} chars = wrong; per-answer wall timeout",
    }

"""Seeded arithmetic problems in MATH's schema, for the embedded demo suite.

Each problem is a dict with MATH's fields: ``problem``, ``solution`` (ending in
``\\boxed{answer}``), ``answer``, ``subject``, ``level`` (1-5 by difficulty) and
``unique_id`` (``demo/<split>/<index>``).

The solution is written step by step, one arithmetic statement per line, in the way a
person does it on paper: tens and ones apart, partial products, then their sum::

    40 × 8 = 320
    7 × 8 = 56
    320 + 56 = 376
    The answer is $\\boxed{376}$.

The demo suite's reference model learns this format in a short supervised stage, so its
wrong answers are wrong digits inside well-formed statements, which a verifier can find.

Train and test are disjoint by construction: a problem's split is decided by the sha256
of its canonical arithmetic (operation and operands, commutative operands sorted), not by
the random draw. So ``23 + 45`` in a word problem and ``45 + 23`` as a bare sum share one
split, and no seed or size can put the same arithmetic in both.

Levels span what the 135M demo model sometimes solves: one-digit sums (level 1) up to
two-digit products and multiplication word problems (level 5).
"""

from __future__ import annotations

import hashlib
import random
import re

# Bump when the generator changes the problems it draws (recorded by the demo training run;
# tables key on this module's source itself).
GENERATOR_VERSION = 2  # 2: step-by-step solutions
SPLITS = ("train", "test")
TEST_FRACTION = 0.25

NAMES = ["Maya", "Liam", "Ava", "Noah", "Zoe", "Omar", "Lena", "Ravi", "Sara", "Tom"]
ITEMS = ["apples", "stickers", "marbles", "books", "pencils", "cookies", "stamps", "shells"]
CONTAINERS = ["boxes", "bags", "baskets", "jars", "shelves", "trays"]

# (kind, level, weight): the weights put most problems where a 135M model fine-tuned on
# these solutions is right some of the time and wrong some of the time (two-digit sums and
# differences, products of a two-digit number and a digit), so both a supervised stage and
# RL have something to learn and the wrong answers are arithmetic slips.
KINDS = [
    ("add_1d", 1, 1),
    ("sub_1d", 1, 1),
    ("mul_1d", 2, 2),
    ("add_2d1d", 2, 1),
    ("add_2d", 3, 3),
    ("sub_2d", 3, 3),
    ("word_add", 3, 2),
    ("word_sub", 4, 2),
    ("mul_2d1d", 4, 3),
    ("word_mul", 5, 2),
    ("mul_2d", 5, 1),
]


_PLAIN_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")


def is_plain_number(answer: str | None) -> bool:
    """True for a final answer written as a number (``1080``, ``-3``, ``2.5``), with
    optional ``$`` and spaces around it.

    Every demo answer is an integer, and the question asks for its value. math-verify
    rightly judges ``54 \\times 20`` equal to ``1080``, but a box that restates the
    question is not an answer to it: the first GPU run learned exactly that (see the
    appendix notebook), so the demo reward and accuracy require a plain number too.
    """
    if not isinstance(answer, str):  # None (no box) or a missing value from a table
        return False
    return _PLAIN_NUMBER.fullmatch(answer.strip().strip("$").strip().replace(",", "")) is not None


def canonical_key(op: str, a: int, b: int) -> str:
    if op in ("add", "mul"):
        a, b = sorted((a, b))
    return f"{op}:{a}:{b}"


def split_of(key: str) -> str:
    """The split a canonical problem belongs to, fixed by its hash."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "test" if h / 2**64 < TEST_FRACTION else "train"


def _operands(kind: str, rng: random.Random) -> tuple[str, int, int]:
    d1 = lambda: rng.randint(1, 9)  # noqa: E731
    d2 = lambda: rng.randint(10, 99)  # noqa: E731
    if kind == "add_1d":
        return "add", d1(), d1()
    if kind == "sub_1d":
        a, b = sorted((d1(), d1()), reverse=True)
        return "sub", a, b
    if kind == "mul_1d":
        return "mul", rng.randint(2, 9), rng.randint(2, 9)
    if kind == "add_2d1d":
        return "add", d2(), d1()
    if kind in ("add_2d", "word_add"):
        return "add", d2(), d2()
    if kind in ("sub_2d", "word_sub"):
        a, b = sorted((d2(), d2()), reverse=True)
        return "sub", a, b
    if kind == "mul_2d1d":
        return "mul", d2(), rng.randint(2, 9)
    if kind == "word_mul":
        return "mul", rng.randint(3, 19), rng.randint(3, 12)
    if kind == "mul_2d":
        return "mul", d2(), d2()
    raise ValueError(f"unknown problem kind {kind!r}")


def _problem_text(kind: str, op: str, a: int, b: int, rng: random.Random) -> str:
    sign = {"add": "+", "sub": "-", "mul": "\\times"}[op]
    if not kind.startswith("word_"):
        return f"What is ${a} {sign} {b}$?"
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if op == "add":
        return (f"{name} has {a} {item}. A friend gives {name} {b} more {item}. "
                f"How many {item} does {name} have now?")
    if op == "sub":
        return (f"{name} had {a} {item} and gave away {b} of them. "
                f"How many {item} does {name} have left?")
    box = rng.choice(CONTAINERS)
    return (f"{name} has {a} {box} with {b} {item} in each. "
            f"How many {item} does {name} have in total?")


def _split_tens(n: int) -> list[int]:
    """47 -> [40, 7]; 40 -> [40]; 7 -> [7]: the parts a person adds or multiplies apart."""
    tens, ones = n - n % 10, n % 10
    return [p for p in (tens, ones) if p] or [0]


def working_lines(op: str, a: int, b: int) -> list[str]:
    """The solution's arithmetic, one statement per line (without the answer line)."""
    if op == "add":
        if a < 10 and b < 10:
            return [f"{a} + {b} = {a + b}"]
        if a < 10 or b < 10:  # a two-digit number and a digit: add the digit to the ones
            big, small = (a, b) if a >= 10 else (b, a)
            if big % 10 == 0:
                return [f"{big} + {small} = {big + small}"]
            return [f"{big % 10} + {small} = {big % 10 + small}",
                    f"{big - big % 10} + {big % 10 + small} = {big + small}"]
        ones = [x for x in (a % 10, b % 10) if x]
        lines = [f"{a - a % 10} + {b - b % 10} = {a - a % 10 + b - b % 10}"]
        if len(ones) == 2:
            lines.append(f"{ones[0]} + {ones[1]} = {sum(ones)}")
        if ones:
            lines.append(f"{a - a % 10 + b - b % 10} + {sum(ones)} = {a + b}")
        return lines
    if op == "sub":
        if b < 10 or b % 10 == 0:
            return [f"{a} - {b} = {a - b}"]
        return [f"{a} - {b - b % 10} = {a - (b - b % 10)}",
                f"{a - (b - b % 10)} - {b % 10} = {a - b}"]
    # multiplication: the larger factor split into tens and ones, times the smaller; a
    # two-digit smaller factor is split too, one partial product per line
    big, small = max(a, b), min(a, b)
    if big < 10 or (big % 10 == 0 and small < 10):
        return [f"{big} × {small} = {big * small}"]
    partials = [(x, y) for x in _split_tens(big) for y in _split_tens(small)]
    lines = [f"{x} × {y} = {x * y}" for x, y in partials]
    if len(partials) > 1:
        lines.append(" + ".join(str(x * y) for x, y in partials) + f" = {big * small}")
    return lines


def solution_text(kind: str, op: str, a: int, b: int) -> str:
    """The step-by-step solution: a sentence naming the operation for word problems, the
    working, then the boxed answer."""
    value = {"add": a + b, "sub": a - b, "mul": a * b}[op]
    lead = {"add": f"We add {a} and {b}.", "sub": f"We subtract {b} from {a}.",
            "mul": f"We multiply {a} by {b}."}[op]
    lines = ([lead] if kind.startswith("word_") else []) + working_lines(op, a, b)
    return "\n".join(lines + [f"The answer is $\\boxed{{{value}}}$."])


def generate_problems(split: str, n: int, seed: int) -> list[dict]:
    """``n`` distinct problems of one split, drawn reproducibly from ``seed``.

    The draw is sequential, so a larger ``n`` with the same seed extends the list
    without changing its beginning.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    rng = random.Random(f"rlprobe-demo:{seed}:{split}")
    kinds = [k for k, _, _ in KINDS]
    weights = [w for _, _, w in KINDS]
    levels = {k: lvl for k, lvl, _ in KINDS}
    seen: set[str] = set()
    out: list[dict] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n + 1000:
            raise RuntimeError(f"could not draw {n} distinct {split} problems; ask for fewer")
        kind = rng.choices(kinds, weights)[0]
        op, a, b = _operands(kind, rng)
        key = canonical_key(op, a, b)
        if key in seen or split_of(key) != split:
            continue
        seen.add(key)
        problem = _problem_text(kind, op, a, b, rng)
        answer = str({"add": a + b, "sub": a - b, "mul": a * b}[op])
        out.append({
            "problem": problem,
            "solution": solution_text(kind, op, a, b),
            "answer": answer,
            "subject": "Word problems" if kind.startswith("word_") else "Arithmetic",
            "level": levels[kind],
            "unique_id": f"demo/{split}/{len(out):06d}",
            "kind": kind,
            "canonical": key,
        })
    return out

"""The guarded grader agrees with plain math-verify on benign answers (issue 9, item 6).

The grader's workers refuse any attempt by sympy to evaluate text. That guard must never
change a verdict on an ordinary answer. This test grades a seeded set of generated benign
answer pairs (equal and unequal, across the kinds of answers MATH has) through
``grade_many`` in one batch, grades the same pairs with plain math-verify (``parse`` and
``verify`` with the same extraction config, no guard) in a throwaway process, and requires
zero disagreements in verdict, with every guarded grade made by math-verify itself.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import pytest

from rlprobe_nb.problems import grading

REPO = Path(__file__).resolve().parents[1]
SEED = 20261126

# Plain math-verify, as a user would call it: the same extraction config as the grader
# (LaTeX only, boxed first, no fallback), no guard, in a process of its own.
_PLAIN_MATH_VERIFY = r"""
import json, logging, sys
logging.disable(logging.WARNING)
from math_verify import LatexExtractionConfig, parse, verify
config = [LatexExtractionConfig(boxed_match_priority=0)]
def parsed(latex):
    return parse("\\boxed{" + latex + "}", extraction_config=config,
                 fallback_mode="no_fallback", parsing_timeout=None)
out = []
for pred, gold in json.load(sys.stdin):
    g, p = parsed(gold), parsed(pred)
    out.append(bool(verify(g, p, timeout_seconds=None)) if g and p else None)
json.dump(out, sys.stdout)
"""


# --------------------------------------------------------------------------- generator


def _frac(q: Fraction) -> str:
    sign = "-" if q < 0 else ""
    return f"{sign}\\frac{{{abs(q.numerator)}}}{{{q.denominator}}}"


def _decimal(q: Fraction, places: int) -> str:
    return f"{float(q):.{places}f}"


def _fractions(r: random.Random, equal: bool) -> tuple[str, str]:
    q = Fraction(r.randint(1, 40), r.randint(2, 40))
    k = r.randint(2, 9)
    pred = r.choice([
        f"\\frac{{{q.numerator * k}}}{{{q.denominator * k}}}",
        f"\\dfrac{{{q.numerator}}}{{{q.denominator}}}",
        f"{q.numerator * k}/{q.denominator * k}",
    ])
    return pred, _frac(q if equal else q + Fraction(1, q.denominator + 1))


def _decimals(r: random.Random, equal: bool) -> tuple[str, str]:
    q = Fraction(r.randint(1, 999), r.choice([2, 4, 5, 8, 10, 20, 25, 100]))
    gold = r.choice([_frac(q), _decimal(q, 3)])
    pred = _decimal(q if equal else q + Fraction(1, 10), r.choice([3, 4]))
    return pred, gold


def _decimals_in_fractions(r: random.Random, equal: bool) -> tuple[str, str]:
    num, den = r.randint(11, 999), r.choice([5, 8, 25, 125, 625, 3125])
    tenths = Fraction(num, 10)
    pred = f"\\frac{{{float(tenths):.1f}}}{{{den}}}"
    q = tenths / den if equal else (tenths + 1) / den
    return pred, r.choice([_frac(q), f"{q.numerator}/{q.denominator}"])


def _scientific(r: random.Random, equal: bool) -> tuple[str, str]:
    mantissa, exponent = r.randint(1, 9), r.randint(2, 7)
    value = mantissa * 10**exponent
    pred = r.choice([f"{mantissa}E{exponent}", f"{mantissa}e{exponent}",
                     f"{mantissa}\\times10^{{{exponent}}}",
                     f"{mantissa} \\times 10^{exponent}"])
    return pred, str(value if equal else value * 10)


def _radicals(r: random.Random, equal: bool) -> tuple[str, str]:
    a, b = r.randint(2, 9), r.choice([2, 3, 5, 6, 7])
    pred = r.choice([f"\\sqrt{{{a * a * b}}}", f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{b}}}\\cdot {a}"])
    gold = f"{a}\\sqrt{{{b}}}" if equal else f"{a + 1}\\sqrt{{{b}}}"
    if r.random() < 0.3:
        pred, gold = f"\\frac{{\\sqrt{{{b}}}}}{{{b}}}", (
            f"\\frac{{1}}{{\\sqrt{{{b}}}}}" if equal else f"\\frac{{1}}{{\\sqrt{{{b + 1}}}}}")
    return pred, gold


def _pi(r: random.Random, equal: bool) -> tuple[str, str]:
    q = Fraction(r.randint(1, 11), r.choice([1, 2, 3, 4, 6, 12]))
    pred = r.choice([f"\\frac{{{q.numerator}\\pi}}{{{q.denominator}}}",
                     f"{q.numerator}\\pi/{q.denominator}",
                     f"\\frac{{{q.numerator}}}{{{q.denominator}}}\\pi"])
    g = q if equal else q + 1
    return pred, f"\\frac{{{g.numerator}\\pi}}{{{g.denominator}}}"


def _degrees(r: random.Random, equal: bool) -> tuple[str, str]:
    d = r.randint(1, 359)
    pred = r.choice([f"{d}^\\circ", f"{d}^{{\\circ}}", f"{d}^\\circ"])
    return pred, str(d if equal else d + r.randint(1, 9))


def _percents(r: random.Random, equal: bool) -> tuple[str, str]:
    p = r.randint(1, 99)
    pred = r.choice([f"{p}\\%", f"{p}\\%", f"{p}"])
    return pred, str(p if equal else p + 1)


def _intervals(r: random.Random, equal: bool) -> tuple[str, str]:
    a = r.randint(-9, 5)
    b = a + r.randint(1, 9)
    lo, hi = r.choice("[("), r.choice("])")
    gold = r.choice([f"{lo}{a},{b}{hi}", f"(-\\infty,{a}]\\cup[{b},\\infty)"])
    if equal:
        pred = gold.replace(",", ", ")
    else:
        pred = gold.replace(str(b), str(b + 1), 1) if "infty" not in gold else gold.replace(
            f"{a}]", f"{a})")
    return pred, gold


def _tuples(r: random.Random, equal: bool) -> tuple[str, str]:
    x, y = r.randint(-9, 9), Fraction(r.randint(1, 9), r.choice([2, 4, 5]))
    gold = f"({x}, {_frac(y)})"
    pred = f"({x},{_decimal(y, 2)})" if equal else f"({_frac(y)}, {x})"
    if x == y:  # a swapped tuple of two equal entries is the same tuple
        pred = f"({x + 1}, {_frac(y)})"
    return pred, gold


def _matrices(r: random.Random, equal: bool) -> tuple[str, str]:
    entries = [r.randint(-9, 9) for _ in range(4)]
    env = r.choice(["pmatrix", "bmatrix"])

    def matrix(vals, env):
        return (f"\\begin{{{env}}} {vals[0]} & {vals[1]} \\\\ {vals[2]} & {vals[3]} "
                f"\\end{{{env}}}")

    other = list(entries) if equal else entries[:3] + [entries[3] + 1]
    if r.random() < 0.5:  # a column vector with a fraction entry
        q = Fraction(entries[0], 2)
        return (f"\\begin{{{env}}} {_decimal(q, 1)} \\\\ {entries[1]} \\end{{{env}}}",
                f"\\begin{{pmatrix}} {_frac(q)} \\\\ {entries[1] + (0 if equal else 2)} "
                f"\\end{{pmatrix}}")
    return matrix(other, env), matrix(entries, "pmatrix")


def _polynomials(r: random.Random, equal: bool) -> tuple[str, str]:
    a, b = r.randint(1, 9), r.randint(-9, 9) or 1
    if r.random() < 0.5:
        pred = f"(x+{a})^2"
        gold = f"x^2+{2 * a if equal else 2 * a + 1}x+{a * a}"
    else:
        pred = f"(x+{a})(x{b:+d})"
        gold = f"x^2{a + b:+d}x{a * b + (0 if equal else 1):+d}"
    return (pred, gold) if r.random() < 0.5 else (gold, pred)


def _trig(r: random.Random, equal: bool) -> tuple[str, str]:
    equal_pairs = [
        ("\\sin^2x+\\cos^2x", "1"),
        ("2\\sin x\\cos x", "\\sin 2x"),
        ("\\cos^2x-\\sin^2x", "\\cos 2x"),
        ("\\frac{\\sin x}{\\cos x}", "\\tan x"),
        ("1-2\\sin^2x", "\\cos(2x)"),
        ("\\sin(\\frac{\\pi}{6})", "\\frac12"),
        ("\\cos\\frac{\\pi}{3}", "\\frac{1}{2}"),
        ("\\tan\\frac{\\pi}{4}", "1"),
    ]
    unequal_pairs = [
        ("2\\sin x", "\\sin 2x"),
        ("\\sin^2x-\\cos^2x", "1"),
        ("\\cos x", "\\sin x"),
        ("\\sin(\\frac{\\pi}{3})", "\\frac12"),
        ("\\tan x", "\\frac{\\cos x}{\\sin x}"),
        ("1+2\\sin^2x", "\\cos 2x"),
    ]
    pred, gold = r.choice(equal_pairs if equal else unequal_pairs)
    if "x" in pred + gold and r.random() < 0.5:
        var = r.choice("yz")
        pred, gold = pred.replace("x", var), gold.replace("x", var)
    return pred, gold


# Other answer forms MATH has, written out: (pred, gold), equal and unequal.
OTHER = [
    ("x^2y+xy^2", "xy(x+y)"), ("x^2y+xy^2", "xy(x-y)"), ("(a+b+c)^2", "a^2+b^2+c^2+2ab+2bc+2ca"),
    (r"\frac{x^2-1}{x-1}", "x+1"), (r"\frac{x^2-1}{x-1}", "x-1"), (r"\int_0^1 x\,dx", r"\frac12"),
    (r"\int_0^1 x\,dx", "1"), (r"\sum_{k=1}^{n} k", r"\frac{n(n+1)}{2}"), (r"\log_2 8", "3"),
    (r"\log_2 8", "2"), (r"\binom{5}{2}", "10"), ("5!", "120"), ("5!", "24"),
    (r"\lfloor 2.5 \rfloor", "2"), ("|{-3}|", "3"), (r"x \in [0,1]", "[0,1]"),
    (r"\{1,2,3\}", r"\{3,2,1\}"), (r"\{1,2,3\}", r"\{1,2\}"), ("2+3i", "3i+2"),
    ("2+3i", "2-3i"), (r"\sqrt[3]{27}", "3"), (r"\frac{1}{1+\frac{1}{1+\frac{1}{2}}}", r"\frac35"),
    (r"\frac{1}{1+\frac{1}{1+\frac{1}{2}}}", r"\frac58"), ("x=2", "2"), ("x=2, y=3", "(2,3)"),
    (r"\text{Monday}", r"\text{Monday}"), ("1,000", "1000"), (r"\$5.00", "5"),
    (r"-\frac{3}{4}", "-0.75"), (r"\infty", r"\infty"), (r"-\infty", r"\infty"),
]


# kind -> (generator, pairs). Kinds that send math-verify into simplify (tuples, trig,
# intervals, polynomials: 0.07-0.2 s a pair) get fewer pairs to keep the test near 30 s.
KINDS = {
    "fraction": (_fractions, 50), "decimal": (_decimals, 50),
    "decimal_in_fraction": (_decimals_in_fractions, 50), "scientific": (_scientific, 50),
    "radical": (_radicals, 50), "pi": (_pi, 50), "degrees": (_degrees, 50),
    "percent": (_percents, 50), "matrix": (_matrices, 50), "interval": (_intervals, 16),
    "tuple": (_tuples, 16), "polynomial": (_polynomials, 16), "trig": (_trig, 16),
}


def benign_pairs(seed: int = SEED) -> list[tuple[str, str, str]]:
    """(pred, gold, kind) triples: per generated kind half meant equal, half unequal; then
    the written-out ``OTHER`` pairs."""
    r = random.Random(seed)
    out = []
    for kind, (make, n) in KINDS.items():
        for i in range(n):
            pred, gold = make(r, equal=i % 2 == 0)
            out.append((pred, gold, kind))
    return out + [(pred, gold, "other") for pred, gold in OTHER]


def plain_math_verify(pairs: list[tuple[str, str]]) -> list[bool | None]:
    """Verdicts of unguarded math-verify in a throwaway process (None: a side did not parse)."""
    out = subprocess.run([sys.executable, "-c", _PLAIN_MATH_VERIFY], input=json.dumps(pairs),
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


# --------------------------------------------------------------------------- the test


@pytest.fixture(scope="module", autouse=True)
def _stop_workers():
    yield
    grading.shutdown()


def test_generator_is_seeded_and_covers_every_kind():
    pairs = benign_pairs()
    assert pairs == benign_pairs() and len(pairs) >= 500
    assert set(Counter(k for _, _, k in pairs)) == set(KINDS) | {"other"}


def test_guarded_grader_agrees_with_plain_math_verify():
    triples = benign_pairs()
    pairs = [(p, g) for p, g, _ in triples]
    t0 = time.monotonic()
    with ThreadPoolExecutor(1) as background:  # both graders at once: the test's wall time
        plain_future = background.submit(plain_math_verify, pairs)
        grades = grading.grade_many([f"\\boxed{{{p}}}" for p, _ in pairs],
                                    [g for _, g in pairs], timeout_s=20, workers=2)
        t1 = time.monotonic()
        plain = plain_future.result()
    print(f"\n{len(pairs)} pairs: guarded grade_many {t1 - t0:.1f}s (2 workers), "
          f"both done {time.monotonic() - t0:.1f}s")

    unparsed = [(p, g) for (p, g), v in zip(pairs, plain) if v is None]
    assert not unparsed, f"the generator made pairs plain math-verify cannot parse: {unparsed}"
    disagreements = [(kind, p, gold, v, g.correct, g.method)
                     for (p, gold, kind), v, g in zip(triples, plain, grades)
                     if (g.correct, g.method) != (v, "math_verify")]
    assert not disagreements, "\n".join(map(str, disagreements))
    # Both verdicts occur in every kind, so the comparison is not vacuous.
    seen = Counter((kind, v) for (_, _, kind), v in zip(triples, plain))
    print(sorted(seen.items()))
    for kind in [*KINDS, "other"]:
        assert seen[(kind, True)] and seen[(kind, False)], (kind, seen)

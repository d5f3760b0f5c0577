"""The demo problem generator: MATH's schema, reproducible, disjoint splits."""

import re

import pytest

from rlprobe_nb.problems import arithmetic as dp
from rlprobe_nb.problems.grading import last_boxed

FIELDS = {"problem", "solution", "answer", "subject", "level", "unique_id"}


def true_value(key: str) -> int:
    op, a, b = key.split(":")
    a, b = int(a), int(b)
    return {"add": a + b, "sub": a - b, "mul": a * b}[op]


@pytest.mark.parametrize("split", dp.SPLITS)
def test_schema_and_answers(split):
    problems = dp.generate_problems(split, 400, seed=0)
    assert len(problems) == 400
    for i, p in enumerate(problems):
        assert FIELDS <= set(p)
        assert p["unique_id"] == f"demo/{split}/{i:06d}"
        assert 1 <= p["level"] <= 5
        assert p["solution"].rstrip("$.").endswith(f"\\boxed{{{p['answer']}}}")
        assert last_boxed(p["solution"]) == p["answer"]
        assert int(p["answer"]) == true_value(p["canonical"])
        assert dp.split_of(p["canonical"]) == split
    assert len({p["canonical"] for p in problems}) == 400
    assert {p["level"] for p in problems} == {1, 2, 3, 4, 5}
    assert {"Arithmetic", "Word problems"} == {p["subject"] for p in problems}


def test_splits_disjoint_for_any_seed():
    train = {p["canonical"] for s in (0, 1) for p in dp.generate_problems("train", 3000, s)}
    test = {p["canonical"] for s in (0, 1) for p in dp.generate_problems("test", 1000, s)}
    assert not train & test
    train_text = {p["problem"] for p in dp.generate_problems("train", 3000, 0)}
    assert not train_text & {p["problem"] for p in dp.generate_problems("test", 1000, 0)}


def test_commutative_operands_share_a_split():
    assert dp.canonical_key("add", 45, 23) == dp.canonical_key("add", 23, 45)
    assert dp.canonical_key("mul", 7, 12) == dp.canonical_key("mul", 12, 7)
    assert dp.canonical_key("sub", 45, 23) != dp.canonical_key("sub", 23, 45)


def test_reproducible_and_prefix_stable():
    a = dp.generate_problems("test", 50, seed=3)
    assert a == dp.generate_problems("test", 50, seed=3)
    assert dp.generate_problems("test", 80, seed=3)[:50] == a
    assert a != dp.generate_problems("test", 50, seed=4)


def test_easy_problems_present():
    problems = dp.generate_problems("test", 300, seed=0)
    one_digit = [p for p in problems if p["level"] == 1]
    assert len(one_digit) >= 10
    assert all(re.fullmatch(r"What is \$\d [+-] \d\$\?", p["problem"]) for p in one_digit)


def test_bad_input():
    with pytest.raises(ValueError, match="split must be one of"):
        dp.generate_problems("validation", 5, 0)
    with pytest.raises(ValueError, match="non-negative"):
        dp.generate_problems("test", -1, 0)


@pytest.mark.parametrize("answer,plain", [
    ("1080", True), ("$1080$", True), (" -3 ", True), ("1,080", True), ("2.5", True),
    ("54 \\times 20", False), ("10+4", False), ("\\frac{1}{2}", False), ("", False),
    (None, False), ("40 apples", False),
])
def test_is_plain_number(answer, plain):
    assert dp.is_plain_number(answer) is plain


_STATEMENT = re.compile(r"^(\d+(?: [-+×] \d+)+) = (\d+)$")


def _value(expr: str) -> int:
    """Left-to-right value of 'a op b op c' with × before + and - (no eval)."""
    tokens = expr.split(" ")
    terms, sign, product = [], 1, int(tokens[0])
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "×":
            product *= int(num)
        else:
            terms.append(sign * product)
            sign, product = (1 if op == "+" else -1), int(num)
    return sum(terms) + sign * product


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_solution_line_is_true_and_ends_in_the_boxed_answer(split):
    problems = dp.generate_problems(split, 400, 3)
    kinds = set()
    for p in problems:
        *lines, last = p["solution"].split("\n")
        assert last == f"The answer is $\\boxed{{{p['answer']}}}$."
        statements = [ln for ln in lines if not ln.startswith("We ")]
        assert statements, p
        for line in statements:
            m = _STATEMENT.match(line)
            assert m, line
            assert _value(m.group(1)) == int(m.group(2)), (p["problem"], line)
        assert int(_STATEMENT.match(statements[-1]).group(2)) == int(p["answer"])
        kinds.add(p["kind"])
    assert len(kinds) == len(dp.KINDS)

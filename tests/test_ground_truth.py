"""The ground-truth labeller: hand-written statements and labels (each case one situation),
statement records, token tables split in several ways (the demo tokenizer's included),
and the per-rollout summary."""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.divergence import ground_truth as gt

EOS = "<|im_end|>"


def _marked(case: str) -> tuple[str, range]:
    """A text with its characters under test between ⟦ and ⟧, and their indices."""
    start = case.index("⟦")
    end = case.index("⟧") - 1
    return case.replace("⟦", "").replace("⟧", ""), range(start, end)


def _char_labels(text: str) -> list[str]:
    return [gt.LABELS[c] for c in gt.label_text(text)]


CHARACTER_CASES = [
    # (text with ⟦characters under test⟧, their label, the situation)
    ("47 + 38 = ⟦8⟧5", "result_correct", "a correct sum with a carry"),
    ("47 + 38 = ⟦7⟧5", "result_first_wrong", "a dropped carry: 75 for 85, first digit"),
    ("47 + 38 = 7⟦5⟧", "result_after_wrong", "after the first wrong digit, though 5 is 85's"),
    ("50 + 59 = 1⟦4⟧9", "result_first_wrong", "the issue's 1[4]9 for 109"),
    ("50 + 59 = ⟦1⟧49", "result_correct", "a right digit before the first wrong one"),
    ("$9 \\times 7 = ⟦5⟧4$", "result_first_wrong", "the issue's [5]4 for 63, LaTeX"),
    ("⟦47⟧ + 38 = 85", "operand", "a two-digit operand"),
    ("47 ⟦+⟧ 38 = 85", "operator", "plus"),
    ("47 + 38 ⟦=⟧ 85", "operator", "the equals sign"),
    ("3 ⟦\\times⟧ 4 = 12", "operator", "every character of \\times"),
    ("$3 \\cdot 4 = 1⟦3⟧$", "result_first_wrong", "\\cdot"),
    ("3 ⟦x⟧ 4 = 12", "operator", "x as a product"),
    ("3x4 = 1⟦3⟧", "result_first_wrong", "x as a product without spaces"),
    ("3 x -4 = ⟦-12⟧", "result_correct", "x before a negative operand"),
    ("6 * 7 = 4⟦3⟧", "result_first_wrong", "a star"),
    ("6 · 7 = ⟦42⟧", "result_correct", "a middle dot"),
    ("12 ÷ 4 = ⟦4⟧", "result_first_wrong", "÷"),
    ("$12 \\div 4 = ⟦3⟧$", "result_correct", "\\div"),
    ("12 / 4 = ⟦3⟧", "result_correct", "a slash"),
    ("2 + 3 + 4 = ⟦9⟧", "result_correct", "a chain of sums a + b + c = d"),
    ("2 + 3 + 4 = ⟦8⟧", "result_first_wrong", "a wrong chain of sums"),
    ("2 + 3 × 4 = 1⟦4⟧", "result_correct", "precedence: product first"),
    ("2 + 3 × 4 = ⟦2⟧0", "result_first_wrong", "left to right is wrong"),
    ("(2 + 3) × 4 = ⟦20⟧", "result_correct", "parentheses"),
    ("⟦(⟧2 + 3) × 4 = 20", "operator", "a parenthesis"),
    ("-3 + 5 = ⟦2⟧", "result_correct", "a negative operand"),
    ("⟦-3⟧ + 5 = 2", "operand", "the sign belongs to its operand"),
    ("5 - 8 = ⟦-3⟧", "result_correct", "a negative result, sign included"),
    ("5 - 8 = ⟦3⟧", "result_first_wrong", "a dropped sign: 3 against -3's sign"),
    ("8 - 5 = ⟦-⟧3", "result_first_wrong", "a sign that should not be there"),
    ("5 ⟦-⟧ 8 = -3", "operator", "a binary minus"),
    ("9 × 7 = 63⟦3⟧", "result_first_wrong", "longer than the truth: the first extra digit"),
    ("47 + 38 = 8⟦ ⟧apples", "result_first_wrong", "a strict prefix: what ended the number"),
    ("47 + 38 = ⟦8⟧ apples", "result_correct", "a strict prefix's digits"),
    ("So 47 + 38 = \\boxed{8⟦}⟧.", "result_first_wrong", "a box closed too early"),
    ("47 + 38 = ⟦8⟧", "result_correct", "a prefix where the text ends: unfinished"),
    ("47 + 38 = \\boxed{⟦85⟧}", "result_correct", "a result in the box: result wins"),
    ("47 + 38 = \\boxed{⟦7⟧5}", "result_first_wrong", "a wrong result in the box"),
    ("The answer is $\\boxed{⟦85⟧}$.", "final_answer", "the boxed answer"),
    ("The answer is ⟦$⟧\\boxed{85}$.", "format", "a dollar"),
    ("The answer is $⟦\\boxed{⟧85}$.", "format", "the \\boxed{ command"),
    ("The answer is $\\boxed{85⟦}⟧$.", "format", "the box's closing brace"),
    ("\\boxed{⟦3⟧} or \\boxed{5}", "other", "an earlier box is not the answer"),
    ("The answer is \\boxed{⟦3⟧ + 4 = 7}", "final_answer", "an operand in the last box"),
    ("The answer is \\boxed{3 + 4 ⟦=⟧ 7}", "final_answer", "an operator in the last box"),
    ("Step ⟦2:⟧ add the apples", "format", "a step marker's number at a line start"),
    ("In Step ⟦2⟧ we add them", "other", "'Step 2' mid-sentence"),
    ("It takes ⟦3⟧ days.", "other", "a number in prose"),
    ("so x ⟦=⟧ 5", "other", "an '=' outside arithmetic"),
    ("1,234 + 5,678 = ⟦6,912⟧", "result_correct", "thousands separators"),
    ("1,234 + 5,678 = 6,9⟦0⟧2", "result_first_wrong", "commas skipped in the comparison"),
    ("1,234 + 5,678 = 6,90⟦2⟧", "result_after_wrong", "after the first wrong, past a comma"),
    ("⟦1,234⟧ + 1 = 1,235", "operand", "an operand with a comma"),
    ("3 × 4 + 2 = 1⟦3⟧ + 2 = 15", "result_first_wrong", "a wrong intermediate result"),
    ("3 × 4 + 2 = 13 + 2 = 1⟦5⟧", "result_correct", "a later step right as written"),
    ("3 × 4 + 2 = 12 + ⟦2⟧ = 14", "operand", "a carried operand in a chain"),
    ("$3 \\times 4 + 2 = 12 + 2 = ⟦14⟧$", "result_correct", "a multi-equals chain in LaTeX"),
    ("3 \\times 4 + 2 \\times 5 = 1⟦3⟧ + 10 = 23", "result_first_wrong", "term-wise results"),
    ("2 + 3 \\cdot 4 = ⟦5⟧ \\cdot 4 = 20", "result_correct", "a right piece, wrong order"),
    ("3 + 4 = ⟦8⟧ + 1 = 9", "result_first_wrong", "a running total's wrong first part"),
    ("3 + 4 = 8 + 1 = ⟦9⟧", "result_correct", "a running total's second part"),
    ("40 + 7 = 47 = ⟦47⟧", "result_correct", "a result restated"),
    ("47 + 38 =\n⟦7⟧5", "result_first_wrong", "a line break after '='"),
    ("47 + 38\n= ⟦85⟧", "result_correct", "a line break before '='"),
    ("47 + 38 = 85\n⟦12⟧ + 3 = 15", "operand", "a new line starts a new statement"),
    ("Step 1: 47 + 38 = 85\nStep 2: 85 - 5 = ⟦8⟧0", "result_correct", "steps on lines"),
    ("2 + 2 = 4 and 3 + 3 = ⟦7⟧", "result_first_wrong", "two statements on a line"),
    ("2 + 2 = 4, 3 + 3 = 6, 4 + 4 = ⟦8⟧", "result_correct", "three on a line"),
    ("x^2 + ⟦3⟧ = 7", "other", "an exponent: algebra, not arithmetic"),
    ("2x + ⟦3⟧ = 7", "other", "a coefficient: algebra"),
    ("\\frac{12}{4} + ⟦1⟧ = 4", "other", "after a fraction's arguments"),
    ("17 ÷ 5 = ⟦3⟧ R 2", "result_correct", "a quotient with a remainder"),
    ("17 ÷ 5 = 3 R ⟦1⟧", "result_first_wrong", "a wrong remainder"),
    ("7 / 2 = ⟦3.5⟧", "result_correct", "a non-integer truth, written exactly"),
    ("7 ÷ 2 = 3⟦.⟧", "result_first_wrong", "a whole number for 3.5: the full stop"),
    ("10 / 3 = ⟦3.33⟧", "result_correct", "a non-terminating truth, truncated"),
    ("10 / 3 = 3.⟦4⟧", "result_first_wrong", "a non-terminating truth, wrong decimal"),
    ("0.5 + 0.25 = ⟦0.75⟧", "result_correct", "decimals"),
    ("47 + 38 ⟦=⟧", "operator", "'=' with no result yet (truncated text)"),
    ("**3 + 4 = ⟦7⟧**", "result_correct", "bold around a statement"),
    ("⟦**⟧3 + 4 = 7**", "format", "the bold markers"),
    ("Add:\n- 3 + 4 = ⟦7⟧", "result_correct", "a bullet is not a sign"),
    ("Add:\n⟦-⟧ 3 + 4 = 7", "format", "the bullet"),
    ("\\(3 + 4 = ⟦7⟧\\)", "result_correct", "inline \\( \\) math"),
    ("$3 + 4$ = $⟦7⟧$", "result_correct", "dollars inside a statement"),
    ("⟦12⟧ = 3 × 4 = 12", "other", "a number before the first operator-bearing side"),
    ("6 / 0 = ⟦0⟧", "other", "division by zero: no statement"),
    ("47 + 38 = 85 ⟦ ⟧apples", "other", "whitespace after a right result"),
]


@pytest.mark.parametrize("case,expected,why", CHARACTER_CASES, ids=[c[2] for c in CHARACTER_CASES])
def test_character_label(case, expected, why):
    text, where = _marked(case)
    labels = _char_labels(text)
    got = [labels[k] for k in where]
    assert got == [expected] * len(where), f"{why}: {text!r} {list(zip(text, labels))}"


def test_cases_are_distinct_and_enough():
    texts = [case for case, _, _ in CHARACTER_CASES]
    assert len(set(texts)) == len(texts)
    assert len(CHARACTER_CASES) >= 60


# --- statement records ----------------------------------------------------------------

def test_a_wrong_sum_as_a_record():
    (st,) = gt.statements("So 47 + 38 = 75 apples.")
    assert st.text == "47 + 38 = 75"
    assert (st.operands, st.operators, st.result) == (((3, 5), (8, 10)), ((6, 7), (11, 12)),
                                                      (13, 15))
    assert (st.true_value, st.written_value, st.correct, st.first_wrong_char) == (85, 75, False, 13)


def test_a_multi_equals_chain_is_one_statement_per_equals():
    first, second = gt.statements("$3 \\times 4 + 2 = 13 + 2 = 15$")
    assert first.text == "3 \\times 4 + 2 = 13 + 2"
    assert (first.true_value, first.written_value) == (14, 15)
    assert (first.correct, first.first_wrong_char) == (False, 19)  # the 3 of 13
    assert (second.text, second.correct, second.first_wrong_char) == ("13 + 2 = 15", True, None)


def test_a_wrong_step_without_a_wrong_digit():
    first, second = gt.statements("2 + 3 × 4 = 5 × 4 = 20")
    assert (first.correct, first.first_wrong_char, first.written_value) == (False, None, 20)
    assert second.correct is True


def test_an_operand_miscopied_from_the_problem_is_verified_as_written():
    problem = "Maya has 47 boxes with 8 apples in each. How many apples does Maya have?"
    text = "Maya has 48 × 8 = 384 apples."
    (st,) = gt.statements(text, problem)
    assert (st.correct, st.true_value, st.operands_seen) == (True, 384, (False, True))
    assert set(_char_labels(text)[18:21]) == {"result_correct"}
    # Without the problem neither operand was seen; with the right operand both are.
    assert gt.statements(text)[0].operands_seen == (False, False)
    assert gt.statements("47 × 8 = 376", problem)[0].operands_seen == (True, True)


def test_operands_seen_earlier_in_the_response_or_as_a_result():
    text = "She has 12 apples and buys 5. 3 + 4 = 7 + 1 = 8. 12 + 5 = 17"
    sts = gt.statements(text)
    assert [s.text for s in sts] == ["3 + 4 = 7", "7 + 1 = 8", "12 + 5 = 17"]
    assert [s.operands_seen for s in sts] == [(False, False), (True, False), (True, True)]


def test_negative_results_keep_their_sign():
    st = gt.statements("5 - 8 = -3")[0]
    assert (st.true_value, st.written_value, st.correct, st.result) == (-3, -3, True, (8, 10))


@pytest.mark.parametrize("text,correct,first_wrong", [
    ("47 + 38 =", None, None),  # the text stops at "=": no result yet
    ("47 + 38 = 8", None, None),  # stops inside the result: it may have gone on
    ("47 + 38 = 8.", False, 11),  # stopped: the full stop is the first wrong character
    ("17 ÷ 5 = 3 R 2", True, None),
    ("7 ÷ 2 = 3 R 1", True, None),
    ("2 / 3 = 0.67", True, None),  # rounded
    ("2 / 3 = 0.66", True, None),  # truncated
    ("2 / 3 = 0.68", False, 11),
    ("1.5 + 1.5 = 3.0", True, None),  # trailing zeros: the same value
])
def test_verdicts(text, correct, first_wrong):
    (st,) = gt.statements(text)
    assert (st.correct, st.first_wrong_char) == (correct, first_wrong), st


def test_a_truncated_statement_has_no_result():
    (st,) = gt.statements("so 47 + 38 = ")
    assert (st.result, st.written_value, st.true_value) == (None, None, 85)


def test_remainder_values_are_exact_fractions():
    (st,) = gt.statements("17 ÷ 5 = 3 R 1")
    assert (st.true_value, st.written_value) == (Fraction(17, 5), Fraction(16, 5))
    assert st.correct is False


@pytest.mark.parametrize("text", ["", "In 3 days, Step 2 of 5.", "x = 5", "x^2 + 3 = 7",
                                  "2 apples + 3 apples = 5 apples", "3 + 4", "12 = 12",
                                  "2x -4 = 0"])
def test_texts_without_statements(text):
    assert gt.statements(text) == []


def _generated_statement(rng):
    """A random statement a op b (op c ...) = r in one of several notations, with its
    true value computed from the numbers and operators drawn (not from the text), and
    whether r was made wrong."""
    symbols = {"+": ["+"], "-": ["-", "−"], "*": ["*", "×", "\\times", "\\cdot", "x", "·"],
               "/": ["/", "÷", "\\div"]}
    n = int(rng.integers(2, 5))
    ops = [str(rng.choice(list("+-*/"))) for _ in range(n - 1)]
    nums = [int(rng.integers(-20, 1000)) for _ in range(n)]
    nums = [1 if k and ops[k - 1] == "/" and v == 0 else v for k, v in enumerate(nums)]
    terms, joins = [Fraction(nums[0])], []
    for op, v in zip(ops, nums[1:]):
        if op in "*/":
            terms[-1] = terms[-1] * v if op == "*" else terms[-1] / v
        else:
            terms.append(Fraction(v))
            joins.append(op)
    truth = terms[0] + sum(t if op == "+" else -t for op, t in zip(joins, terms[1:]))
    space = str(rng.choice([" ", ""]))
    written = [str(nums[0])]
    for op, v in zip(ops, nums[1:]):
        symbol = str(rng.choice(symbols[op]))
        gap = " " if symbol == "x" or symbol.startswith("\\") else space
        written.append(f"{gap}{symbol}{gap}{v}")
    wrong = bool(rng.random() < 0.5)
    result = int(truth) + int(rng.choice([-10, -1, 1, 9, 100])) * wrong if truth.denominator == 1 \
        else None
    return "".join(written), truth, result, wrong


def test_generated_statements_against_their_construction():
    rng = np.random.default_rng(0)
    checked = 0
    while checked < 1500:
        expression, truth, result, wrong = _generated_statement(rng)
        if result is None:
            continue
        template = str(rng.choice(["{}", "${}$", "So {} apples.", "Step 1: {}\n", "\\({}\\)"]))
        box = str(rng.choice(["{}", "\\boxed{{{}}}"]))
        text = template.format(f"{expression} = {box.format(result)}")
        (st,) = gt.statements(text)
        assert (st.true_value, st.correct) == (truth, not wrong), text
        if wrong:  # left-aligned: the first differing character, else the one after
            w, t = str(result), str(int(truth))
            k = next((k for k, (a, b) in enumerate(zip(w, t)) if a != b), min(len(w), len(t)))
            assert st.first_wrong_char == text.index(w, st.result[0]) + k, text
        checked += 1


# --- token tables ---------------------------------------------------------------------

def _table(pieces: list, rollout_id: str = "p0#0") -> pd.DataFrame:
    """A per-token table from token pieces: a string is a token spelling its span; a
    (token, span_text) pair spells it differently (bytes of one character); EOS an
    end-of-sequence token with an empty span."""
    rows, at = [], 0
    for pos, piece in enumerate(pieces):
        token, span = piece if isinstance(piece, tuple) else (piece, "" if piece == EOS else piece)
        rows.append({"problem_id": rollout_id.split("#")[0], "rollout_id": rollout_id,
                     "pos": pos, "token": token, "char_start": at, "char_end": at + len(span),
                     "is_eos": piece == EOS})
        at += len(span)
    return pd.DataFrame(rows)


def test_single_digit_tokens_as_the_demo_tokenizer_writes_them():
    pieces = ["Step", " ", "1", ":", " ", "4", "7", " +", " ", "3", "8", " =", " ", "7", "5",
              "\n", "\\", "box", "ed", "{", "7", "5", "}", EOS]
    got = gt.label(_table(pieces)).tolist()
    assert got[:5] == ["format", "other", "format", "format", "other"]  # spaces are other
    assert got[5:11] == ["operand", "operand", "operator", "other", "operand", "operand"]
    assert got[11:15] == ["operator", "other", "result_first_wrong", "result_after_wrong"]
    assert got[16:] == ["format"] * 4 + ["final_answer"] * 2 + ["format", "other"]


def test_tokens_with_several_digits_or_a_leading_space():
    pieces = ["47", " +", " 38", " =", " 75", ".", EOS]
    assert gt.label(_table(pieces)).tolist() == [
        "operand", "operator", "operand", "operator", "result_first_wrong", "other", "other"]
    # A token holding a right and a wrong digit takes the higher label; one holding
    # only digits after the first wrong one is after_wrong.
    pieces = ["50", " +", " 59", " =", " 14", "9"]
    assert gt.label(_table(pieces)).tolist()[4:] == ["result_first_wrong", "result_after_wrong"]


def test_a_token_spanning_the_equals_and_the_result():
    pieces = ["9", " ×", " 7", " = 5", "4", " apples"]
    assert gt.label(_table(pieces)).tolist() == [
        "operand", "operator", "operand", "result_first_wrong", "result_after_wrong", "other"]


def test_a_whitespace_token_that_ended_a_short_number():
    pieces = ["4", "7", " +", " ", "3", "8", " =", " ", "8", " ", "apples"]
    got = gt.label(_table(pieces)).tolist()
    assert got[8:] == ["result_correct", "result_first_wrong", "other"]


def test_empty_response_and_eos_only():
    assert gt.label(_table([EOS])).tolist() == ["other"]
    empty = _table([])
    assert gt.label(empty).empty and list(gt.label(empty).cat.categories) == list(gt.LABELS)


def test_bytes_of_one_character_take_its_label():
    pieces = ["12", " ", ("\ufffd", ""), ("\ufffd", "÷"), " 4", " =", " 4"]
    got = gt.label(_table(pieces), texts={"p0#0": "12 ÷ 4 = 4"}).tolist()
    assert got == ["operand", "other", "operator", "operator", "operand", "operator",
                   "result_first_wrong"]


def test_rows_of_several_checkpoints_are_labelled_alike_and_in_place():
    one = _table(["4", "7", " +", " ", "3", "8", " =", " ", "7", "5", EOS])
    many = pd.concat([one.assign(checkpoint=c) for c in ("a", "b", "c")], ignore_index=True)
    many = many.sample(frac=1.0, random_state=0)
    got = gt.label(many)
    expected = dict(zip(one.pos, gt.label(one)))
    assert got.index.equals(many.index)
    assert got.tolist() == [expected[p] for p in many.pos]


def test_rollouts_do_not_leak_into_each_other():
    first = _table(["3", " +", " 4", " ="], "a#0")  # ends at "=": unfinished
    second = _table(["7", " apples", " and", " 2", " +", " 2", " =", " 4"], "b#0")
    got = gt.label(pd.concat([first, second], ignore_index=True)).tolist()
    assert got[4] == "other" and got[-1] == "result_correct"


def test_given_texts_are_checked_against_the_spans():
    with pytest.raises(ValueError, match="run past the response text"):
        gt.label(_table(["3", " +", " 4"]), texts={"p0#0": "3 +"})


@pytest.fixture(scope="module")
def demo_tokenizer():
    from rlprobe_nb.suite import models, params

    P = params.load("demo")
    return models.load_tokenizer(P.reference, P)


def test_demo_tokenizer_table(demo_tokenizer):
    """Real token spans: the demo tokenizer writes one digit per token, puts the space
    of " =" and " -" in the operator's token but a space before a digit alone, and
    splits ÷ into two byte tokens."""
    from rlprobe_nb.forcing.spans import token_spans

    text = "Step 1: $47 \\times 8 = 386$\nStep 2: 12 ÷ 4 = 3, 5 - 8 = -3. \\boxed{386}"
    ids = demo_tokenizer(text, add_special_tokens=False)["input_ids"]
    tokens, starts, ends, decoded = token_spans(demo_tokenizer, ids)
    assert decoded == text
    table = pd.DataFrame({"rollout_id": "p0#0", "pos": range(len(ids)), "token": tokens,
                          "char_start": starts, "char_end": ends})
    table["label"] = gt.label(table, texts={"p0#0": text}).astype(str)
    digits = table[table.token.str.fullmatch(r"\d")]
    assert len(digits) == sum(c.isdigit() for c in text)  # one digit per token
    assert set(table[table.token == " ="].label) == {"operator"}
    minus, sign = table[table.token == " -"].label
    assert (minus, sign) == ("operator", "result_correct")  # "5 - 8" and "= -3"
    result = table[(table.char_start >= text.index("386")) & (table.char_end <= text.index("$\n"))]
    assert result.label.tolist() == ["result_correct", "result_first_wrong", "result_after_wrong"]
    bytes_of_divide = table[table.token.str.contains("\ufffd")]
    assert len(bytes_of_divide) == 2 and set(bytes_of_divide.label) == {"operator"}
    boxed = table[table.char_start >= text.index("{386}") + 1].label.tolist()
    assert boxed == ["final_answer"] * 3 + ["format"]


# --- summary --------------------------------------------------------------------------

def test_rollout_summary():
    right = _table(["3", " +", " 4", " =", " 7", EOS], "p0#0")
    wrong = _table(["4", "8", " ×", " 8", " =", " 3", "9", "4", ",", " 2", " +", " 2", " =",
                    " 4", EOS], "p1#0")
    prose = _table(["No", " sums", EOS], "p2#0")
    tokens = pd.concat([right, wrong, prose], ignore_index=True)
    problems = {"p0": "What is 3 + 4?", "p1": "What is 47 × 8?", "p2": "Hi"}
    got = gt.rollout_summary(tokens, problems=problems)
    assert got.loc["p0#0"].tolist() == [1, 0, 0, 0, False]
    assert got.loc["p1#0"].tolist() == [2, 1, 0, 2, True]  # 48 unseen; 2 + 2 unseen too
    assert got.loc["p2#0"].tolist() == [0, 0, 0, 0, False]
    assert gt.rollout_summary(prose).loc["p2#0"].tolist() == [0, 0, 0, 0, False]  # no statements
    with pytest.raises(ValueError, match="problem_id"):
        gt.rollout_summary(prose.drop(columns="problem_id"), problems=problems)
    assert list(got.columns) == ["n_statements", "n_wrong", "n_unfinished",
                                 "n_unseen_operands", "has_result_first_wrong"]


def test_statement_table():
    table = gt.statement_table({"a#0": "3 + 4 = 8, so 8 - 1 = 7", "b#0": "none"})
    assert table.statement.tolist() == ["3 + 4 = 8", "8 - 1 = 7"]
    assert table.correct.tolist() == [False, True]
    assert table.all_operands_seen.tolist() == [False, False]


def test_speed_benchmark():
    """A benchmark, not a timed assertion: a million rows (8 checkpoints of 125,000
    response tokens) on this machine."""
    texts = ["Step 1: $47 \\times 8 = 386$.\nStep 2: 12 + 3 + 4 = 19, and 5 - 8 = -3.\n"
             f"So {k} + 1 = {k + 1}. The answer is $\\boxed{{{k}}}$." for k in range(2500)]
    rows = []
    for r, text in enumerate(texts):
        cuts = np.unique(np.r_[0, np.random.default_rng(r).integers(1, len(text), 50), len(text)])
        spans = zip(cuts[:-1], cuts[1:])
        rows += [(f"p{r}#0", pos, text[a:b], a, b) for pos, (a, b) in enumerate(spans)]
    one = pd.DataFrame(rows, columns=["rollout_id", "pos", "token", "char_start", "char_end"])
    table = pd.concat([one] * max(1, 1_000_000 // len(one)), ignore_index=True)
    start = time.perf_counter()
    labels = gt.label(table)
    print(f"\nlabelled {len(table):,} rows ({len(one):,} distinct) in "
          f"{time.perf_counter() - start:.1f} s")
    assert (labels == "result_first_wrong").sum() > 0

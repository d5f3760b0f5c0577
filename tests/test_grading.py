"""Grading: the acceptance verdicts of issue #5, the box policy, safety and timeouts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlprobe_nb import grading
from rlprobe_nb.grading import extract_boxed, gold_answer, grade, grade_many, grader_info

REPO = Path(__file__).resolve().parents[1]

# (response, gold, expected correct, expected method, expected extracted)
CASES = [
    (r"So $x = \boxed{\frac{14}{3}}$.", r"\frac{14}{3}", True, "math_verify", r"\frac{14}{3}"),
    (r"\boxed{\dfrac{14}{3}}", r"\frac{14}{3}", True, "math_verify", r"\dfrac{14}{3}"),
    (r"\boxed{14/3}", r"\frac{14}{3}", True, "math_verify", "14/3"),
    (r"\boxed{\frac{1}{6}}", r"\frac{1}{3}", False, "math_verify", r"\frac{1}{6}"),
    (r"\boxed{72^\circ}", "72", True, "math_verify", r"72^\circ"),
    (r"\boxed{10\%}", "10", True, "math_verify", r"10\%"),
    (r"\boxed{(0,1)}", "[0,1)", False, "math_verify", "(0,1)"),
    (r"\boxed{[0,1)}", "[0,1)", True, "math_verify", "[0,1)"),
    (r"First \boxed{3} ... actually \boxed{5}", "5", True, "math_verify", "5"),
    (r"First \boxed{5} ... actually \boxed{3}", "5", False, "math_verify", "3"),
    (r"\boxed{\boxed{4}}", "4", True, "math_verify", "4"),
    (r"\fbox{2}", "2", True, "math_verify", "2"),
    (r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt2}{2}", True, "math_verify", r"\sqrt{2}/2"),
    (r"\boxed{x^2+1}", "1+x^2", True, "math_verify", "x^2+1"),
    (r"\boxed{\text{Monday}}", r"\text{Monday}", True, "math_verify", r"\text{Monday}"),
    (r"\boxed{0.3333}", r"\frac13", False, "math_verify", "0.3333"),
    (r"The answer is 5. \boxed{}", "5", False, "empty_box", ""),
    ("The answer is 5.", "5", False, "no_box", None),
    (r"cut off at the limit: \boxed{5", "5", False, "no_box", None),
]


@pytest.fixture(scope="module", autouse=True)
def _stop_workers():
    yield
    grading.shutdown()


def test_acceptance_verdicts():
    grades = grade_many([c[0] for c in CASES], [c[1] for c in CASES], timeout_s=10)
    for (resp, gold, correct, method, extracted), g in zip(CASES, grades):
        assert (g.correct, g.method, g.extracted) == (correct, method, extracted), (resp, gold, g)
        assert g.gold_extracted == gold


def test_rows_record_boxes():
    g = grade(r"\boxed{3} then \boxed{4} and finally \boxed{5}", "5")
    assert (g.correct, g.extracted, g.n_boxes) == (True, "5", 3)
    assert grade("no box", "5").n_boxes == 0


def test_empty_box_has_no_fallback_to_numbers_in_text():
    g = grade(r"Clearly the answer is 5, so \boxed{ }", "5")
    assert not g.correct and g.method == "empty_box"


def test_extract_boxed_keeps_nested_braces():
    assert extract_boxed(r"\boxed{\frac{14}{3}}") == [r"\frac{14}{3}"]
    assert extract_boxed(r"a \boxed{1} b \fbox{\{2\}} c \boxed 7$ d \boxed{x") == [
        "1", r"\{2\}", "7"]
    assert extract_boxed(r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}") == [
        r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"]
    assert extract_boxed("") == [] and extract_boxed(None) == []


def test_gold_answer_prefers_answer_field_then_last_box():
    assert gold_answer(" 7 ", r"\boxed{8}") == "7"
    assert gold_answer(None, r"so \boxed{1} or rather \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert gold_answer("", r"\boxed{3}") == "3"
    with pytest.raises(ValueError, match="no gold answer"):
        gold_answer(None, "no box here")


def test_model_text_is_never_executed(tmp_path, monkeypatch):
    # Fresh workers whose cwd is tmp_path, so a relative `touch PWNED` would land here.
    grading.shutdown()
    monkeypatch.chdir(tmp_path)
    payloads = [
        r"\boxed{__import__('os').system('touch PWNED')}",
        r"\boxed{eval(\"__import__('os').system('touch PWNED')\")}",
        r"\boxed{\text{__import__('os').system('touch PWNED')}}",
        "__import__('os').system('touch PWNED') \\boxed{__import__('os').system('touch PWNED')}",
    ]
    grades = grade_many(payloads, ["5"] * len(payloads), timeout_s=10)
    grading.shutdown()
    assert all(not g.correct for g in grades), grades
    for where in (tmp_path, REPO, Path.home()):
        assert not (where / "PWNED").exists(), where


def test_eval_guard_refuses_text_but_parses_numbers():
    # The guard the workers install: sympy's string evaluation refuses, digits still parse.
    code = (
        "from rlprobe_nb.grading import _install_guards, TextEvaluationRefused\n"
        "_install_guards()\n"
        "import sympy\n"
        "assert sympy.Number('14') == 14 and float(sympy.Number('0.5')) == 0.5\n"
        "for bad in ['__import__(\"os\")', 'x+1']:\n"
        "    try:\n"
        "        sympy.parse_expr(bad)\n"
        "    except TextEvaluationRefused:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit('parse_expr evaluated ' + bad)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_no_guard_hits_on_ordinary_answers():
    # Ordinary answers never need string evaluation: no method reports a refusal.
    grades = grade_many([r"\boxed{3.25}", r"\boxed{-12}", r"\boxed{2^{10}}", r"\boxed{1,000}"],
                        ["3.25", "-12", "1024", "1000"], timeout_s=10)
    assert [g.method for g in grades] == ["math_verify"] * 4
    assert all(g.correct for g in grades)


def test_long_response_graded_within_timeout():
    response = ("Let me think. " * 15000)[:199_990] + r"\boxed{7}"
    assert len(response) >= 200_000 - 10
    t = time.monotonic()
    g = grade(response, "7", timeout_s=5)
    assert g.correct and g.method == "math_verify"
    assert time.monotonic() - t < 5


def test_huge_box_is_refused_quickly():
    g = grade(r"\boxed{" + "1+" * 100_000 + "1}", "100001", timeout_s=5)
    assert not g.correct and g.method == "too_long"


def test_hung_parse_is_killed_and_pool_recovers():
    t = time.monotonic()
    grades = grade_many([r"\boxed{10^{10^{10}}}", r"\boxed{2}"], ["1", "2"], timeout_s=2,
                        workers=2)
    elapsed = time.monotonic() - t
    assert grades[0].method == "timeout" and not grades[0].correct
    assert grades[1].correct
    assert elapsed < 2 + 15  # the timeout plus starting one replacement worker
    after = grade_many([r"\boxed{3}"] * 3, ["3"] * 3, timeout_s=5, workers=2)
    assert all(g.correct for g in after)


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="2 responses but 1"):
        grade_many(["a", "b"], ["1"])
    with pytest.raises(ValueError, match="gold answer #0 is empty"):
        grade_many([r"\boxed{1}"], [" "])


def test_grader_info_names_versions():
    info = grader_info()
    assert info["math_verify"] and info["name"].startswith("rlprobe_nb.grading")

from __future__ import annotations

import pandas as pd
import pytest
from scipy import stats

from rlprobe_nb.problems import filtering
from rlprobe_nb.tables import schemas, storage

RULE = dict(ref_max_pass=0.5, target_min_pass=0.5, control_ref_min_pass=0.5,
            control_target_max_pass=0.5)


def answers(table: dict[str, dict[str, list[int]]]) -> pd.DataFrame:
    """{model: {problem: [verdict of sample 0 (greedy), 1, ...]}} -> an answers frame."""
    rows = [{"model": m, "problem_id": p, "sample": s, "correct": bool(v)}
            for m, per in table.items() for p, vs in per.items() for s, v in enumerate(vs)]
    return pd.DataFrame(rows)


def test_groups_and_reasons():
    a = answers({
        "ref": {"p1": [0, 0, 1, 0], "p2": [1, 1, 1, 0], "p3": [0, 0, 0, 0], "p4": [1, 0, 1, 0]},
        "tgt": {"p1": [1, 1, 0, 1], "p2": [0, 0, 1, 0], "p3": [0, 0, 0, 0], "p4": [1, 1, 1, 1]},
    })
    sel = filtering.select(a, "ref", "tgt", **RULE).set_index("problem_id")
    assert sel["group"].to_dict() == {"p1": "selected", "p2": "control", "p3": "excluded",
                                      "p4": "selected"}
    assert sel.loc["p1", "pass_ref"] == 0.25 and sel.loc["p1", "pass_target"] == 0.75
    assert sel.loc["p1", "reason"].startswith("ref 1/4, target 3/4")
    assert sel.loc["p2", "greedy_ref_correct"] and not sel.loc["p2", "greedy_target_correct"]
    storage.to_arrow(sel.reset_index(), schemas.SELECTION)
    c = filtering.counts(sel.reset_index()).set_index("group")["problems"].to_dict()
    assert c == {"selected": 2, "control": 1, "excluded": 1}


def test_stricter_rule_selects_fewer():
    a = answers({"ref": {"p1": [0, 1, 0, 0]}, "tgt": {"p1": [1, 1, 1, 0]}})
    strict = dict(RULE, ref_max_pass=0.0)
    assert filtering.select(a, "ref", "tgt", **strict)["group"].tolist() == ["excluded"]


def test_pass_rates_ci():
    pr = filtering.pass_rates(answers({"m": {"p": [1, 0, 1, 1]}}))
    ref = stats.binomtest(3, 4).proportion_ci(method="wilson")
    assert pr.loc[0, "low"] == pytest.approx(ref.low) and pr.loc[0, "high"] == pytest.approx(ref.high)


def test_mcnemar_on_greedy_pairs():
    table = {"ref": {}, "tgt": {}}
    # 6 target-only wins, 1 reference-only, 2 both right, 3 both wrong
    for i, (r, t) in enumerate([(0, 1)] * 6 + [(1, 0)] + [(1, 1)] * 2 + [(0, 0)] * 3):
        table["ref"][f"p{i:02d}"], table["tgt"][f"p{i:02d}"] = [r], [t]
    sel = filtering.select(answers(table), "ref", "tgt", **RULE)
    test = filtering.greedy_mcnemar(sel)
    assert (test["target_only"], test["reference_only"], test["both_right"],
            test["both_wrong"]) == (6, 1, 2, 3)
    assert test["p_value"] == pytest.approx(stats.binomtest(1, 7, 0.5).pvalue)


def test_missing_model_is_a_clear_error():
    with pytest.raises(ValueError, match="target model 'rlvr'"):
        filtering.select(answers({"ref": {"p": [1]}}), "ref", "rlvr", **RULE)

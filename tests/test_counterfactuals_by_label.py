"""Chapter 08's answer by label, on a hand-built branches table: the three experiments
(the checkpoint at its points, the placebo at the same contexts, the placebo at its own),
a verdict per label read from its interval, none from fewer than five problems."""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.counterfactuals import by_label


def rows(model, kind, rule, problems, keep, top1, n=16):
    out = []
    for p in range(problems):
        for arm, passes in (("keep", keep), ("top1", top1)):
            out.append({"model": model, "kind": kind, "rollout_id": f"p{p}#0",
                        "pos": hash((kind, rule)) % 1000, "problem_id": f"p{p}", "rule": rule,
                        "arm": arm, "passes": passes, "n": n, "written_token": "4",
                        "substituted_token": "0", "wilson_low": 0.0, "wilson_high": 1.0})
    return out


def test_each_label_gets_a_verdict_from_its_interval_and_the_placebo_beside_it():
    table = pd.DataFrame(
        rows("ck", "point", "result_first_wrong", 8, 0, 14)   # decides: +0.875
        + rows("ck", "point", "operand", 8, 8, 8)              # no effect
        + rows("ck", "point", "operator", 3, 0, 16)            # too few problems
        + rows("ck", "control", "operand", 6, 8, 8)
        + rows("pl", "point", "result_first_wrong", 8, 0, 1)
        + rows("pl", "own_point", "other", 7, 4, 4))
    found = by_label.experiments(table, "ck", "pl", n_boot=300)
    assert list(found) == ["ck at its points", "pl at the same contexts", "pl at its own points"]
    shown = by_label.table(found).set_index(["experiment", "label"])
    fw = shown.loc[("ck at its points", "first wrong digits")]
    assert fw.points == 8 and fw.problems == 8 and fw["mean effect"].startswith("+0.875 [")
    assert "too few for an interval" in shown.loc[("ck at its points", "operators"), "mean effect"]
    assert shown.loc[("ck at its points", "operands"), "controls"].startswith("6: ")
    assert shown.loc[("ck at its points", "first wrong digits"), "controls"] == "none matched"
    said = "\n".join(by_label.conclusion(found))
    lines = dict(line.split(" (", 1) for line in said.splitlines())
    assert "raises the pass rate" in lines["first wrong digits"]
    assert "are not shown to decide it" in lines["operands"]
    assert "cannot tell" in lines["operators"]
    assert "other tokens" not in lines  # the checkpoint has no point there
    assert "pl at its own points: no point" in lines["first wrong digits"]
    assert "pl at the same contexts: 8 points" in lines["first wrong digits"]

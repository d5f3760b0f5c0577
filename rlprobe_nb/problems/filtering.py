"""Which problems to study: pass rates per (model, problem), the selection rule, a control
group, and a paired test of target vs reference on the greedy answers.

The rule (thresholds from params): a problem is *selected* when the reference is wrong
on most samples and the target right on most (pass_ref <= ref_max_pass and
pass_target >= target_min_pass); it is *control* when the reference is right and the
target wrong (pass_ref >= control_ref_min_pass and pass_target <= control_target_max_pass);
everything else is *excluded*. Every problem gets its group and a reason with its numbers,
so the table says exactly what was analysed.
"""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.statistics import mcnemar_exact, wilson_ci
from rlprobe_nb.tables import schemas


def pass_rates(answers: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, problem): samples, correct, pass rate (all samples incl. greedy),
    the greedy verdict and a Wilson CI."""
    if answers.empty:
        raise ValueError("no answers to compute pass rates from")
    g = answers.groupby(["model", "problem_id"], sort=True)
    out = g.agg(n=("correct", "size"), correct=("correct", "sum")).reset_index()
    greedy = answers[answers["sample"] == 0].set_index(["model", "problem_id"])["correct"]
    out["greedy_correct"] = [bool(greedy.get((m, p), False)) for m, p in
                             zip(out["model"], out["problem_id"])]
    out["pass_rate"] = out["correct"] / out["n"]
    ci = [wilson_ci(int(k), int(n)) for k, n in zip(out["correct"], out["n"])]
    out["low"], out["high"] = [c[0] for c in ci], [c[1] for c in ci]
    return out


def select(answers: pd.DataFrame, reference: str, target: str, *, ref_max_pass: float,
           target_min_pass: float, control_ref_min_pass: float,
           control_target_max_pass: float) -> pd.DataFrame:
    """Group every problem (schemas.SELECTION)."""
    models = set(answers["model"])
    for name, role in ((reference, "reference"), (target, "target")):
        if name not in models:
            raise ValueError(f"no answers from the {role} model {name!r}; answers hold {sorted(models)}")
    rates = pass_rates(answers).set_index(["model", "problem_id"])
    ref, tgt = rates.loc[reference], rates.loc[target]
    missing = sorted(set(ref.index) ^ set(tgt.index))
    if missing:
        raise ValueError(f"reference and target answered different problems, e.g. {missing[:3]}")
    rows = []
    for pid in sorted(ref.index):
        r, t = ref.loc[pid], tgt.loc[pid]
        pr, pt = float(r["pass_rate"]), float(t["pass_rate"])
        nums = f"ref {int(r['correct'])}/{int(r['n'])}, target {int(t['correct'])}/{int(t['n'])}"
        if pr <= ref_max_pass and pt >= target_min_pass:
            group, why = "selected", f"{nums}: ref <= {ref_max_pass}, target >= {target_min_pass}"
        elif pr >= control_ref_min_pass and pt <= control_target_max_pass:
            group, why = "control", (f"{nums}: ref >= {control_ref_min_pass}, "
                                     f"target <= {control_target_max_pass}")
        else:
            group, why = "excluded", f"{nums}: neither rule holds"
        rows.append({"problem_id": pid, "n_ref": int(r["n"]), "pass_ref": pr,
                     "n_target": int(t["n"]), "pass_target": pt,
                     "greedy_ref_correct": bool(r["greedy_correct"]),
                     "greedy_target_correct": bool(t["greedy_correct"]),
                     "group": group, "reason": why})
    return pd.DataFrame(rows, columns=schemas.SELECTION.names)


def greedy_mcnemar(selection: pd.DataFrame) -> dict:
    """Exact McNemar test of target vs reference on the paired greedy verdicts.

    b = target right & reference wrong, c = reference right & target wrong.
    """
    ref = selection["greedy_ref_correct"].astype(bool)
    tgt = selection["greedy_target_correct"].astype(bool)
    b, c = int((tgt & ~ref).sum()), int((ref & ~tgt).sum())
    return {"n_problems": int(len(selection)), "both_right": int((ref & tgt).sum()),
            "both_wrong": int((~ref & ~tgt).sum()), "target_only": b, "reference_only": c,
            "p_value": mcnemar_exact(b, c)}


def counts(selection: pd.DataFrame) -> pd.DataFrame:
    c = selection["group"].value_counts().reindex(["selected", "control", "excluded"],
                                                    fill_value=0)
    return c.rename_axis("group").reset_index(name="problems")

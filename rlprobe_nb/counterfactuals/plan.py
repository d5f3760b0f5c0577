"""What chapter 08 samples: one row per (policy model, context), from the selected branch
points (spikes, or departures where no spike is significant), their matched controls and
the takeover-curve grid of a few case-study rollouts.

The cost is the number of rows times n continuations (each up to the response limit
minus its prefix), so the notebook prints it before anything is sampled.
"""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.counterfactuals.branching import branch_arms
from rlprobe_nb.counterfactuals.takeover import body_length, even_grid

COLUMNS = ["model", "rollout_id", "problem_id", "kind", "pos", "arm", "substituted_id",
           "written_id", "category", "matched_pos", "spike_rollout_id", "match", "entropy_ref"]


def case_studies(selected: pd.DataFrame, count: int) -> list[str]:
    """The ``count`` rollouts with the most selected points (ties: by id)."""
    per = selected.groupby("rollout_id").size().reset_index(name="spikes")
    per = per.sort_values(["spikes", "rollout_id"], ascending=[False, True])
    return per["rollout_id"].head(count).tolist()


def grid_rows(rollouts: pd.DataFrame, tokens: pd.DataFrame, rollout_ids: list[str],
              points: int, special: set[int]) -> pd.DataFrame:
    """Takeover-curve points of each rollout: ``points`` prefix lengths spread evenly over
    its response (EOS left out)."""
    by_id = rollouts.set_index("rollout_id")
    entropy = tokens.set_index(["rollout_id", "pos"])["entropy_ref"]
    rows = []
    for rid in rollout_ids:
        ids = list(by_id.at[rid, "response_ids"])
        for k in even_grid(body_length(ids, special), points):
            rows.append({"rollout_id": rid, "problem_id": by_id.at[rid, "problem_id"],
                         "kind": "grid", "pos": k, "arm": "prefix", "substituted_id": None,
                         "written_id": ids[k] if k < len(ids) else None,
                         "entropy_ref": float(entropy.get((rid, k), float("nan")))})
    return pd.DataFrame(rows)


def build(selected: pd.DataFrame, controls: pd.DataFrame, tokens: pd.DataFrame,
          rollouts: pd.DataFrame, policies: dict[str, set[str] | None], *,
          case_study_ids: list[str], grid_points: int, special: set[int],
          point_kind: str = "spike") -> pd.DataFrame:
    """The plan: keep/substitute arms at every selected point (of kind ``point_kind``:
    "spike" or "departure") and matched control, and the grid of the case studies, for
    each policy model. ``policies`` maps a model to the problem ids it continues (None:
    all)."""
    spikes = selected[["rollout_id", "problem_id", "pos", "category"]]
    parts = [branch_arms(spikes, tokens, point_kind, exclude=special),
             branch_arms(controls.drop(columns=["entropy_ref", "entropy_gap"]), tokens,
                         "control", exclude=special),
             grid_rows(rollouts, tokens, case_study_ids, grid_points, special)]
    one = pd.concat([p for p in parts if len(p)], ignore_index=True).reindex(columns=COLUMNS[1:])
    out = []
    for model, problems in policies.items():
        rows = one if problems is None else one[one["problem_id"].isin(list(problems))]
        out.append(rows.assign(model=model))
    plan = pd.concat(out, ignore_index=True)[COLUMNS]
    return plan.drop_duplicates(["model", "rollout_id", "kind", "pos", "arm"]).reset_index(drop=True)


def cost(plan: pd.DataFrame, n: int, max_new_tokens: int | None = None) -> pd.DataFrame:
    """Contexts and continuations to sample, by policy and kind of row; with
    ``max_new_tokens``, also the most new tokens they can write (n × the budget each
    context leaves: the response limit minus the rollout tokens it keeps)."""
    out = plan.groupby(["model", "kind"]).size().rename("contexts").reset_index()
    out = out.assign(continuations=out["contexts"] * n)
    if max_new_tokens is not None:
        kept = plan["pos"] + (plan["arm"] != "prefix").astype(int)  # keep/substitute add one
        budget = (int(max_new_tokens) - kept).clip(lower=0) * n
        most = budget.groupby([plan["model"], plan["kind"]]).sum()
        out["max_new_tokens"] = [int(most[(m, k)]) for m, k in zip(out["model"], out["kind"])]
    return out

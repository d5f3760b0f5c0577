"""What chapter 08 samples: one row per (policy model, context), from the branch points
(each with its arms), their matched controls and the takeover-curve grid of a few
case-study rollouts.

The cost is the number of rows times n continuations, each up to its budget of new
tokens (the response limit minus its prefix, and at most ``continuation_tokens``), so the
notebook prints it before anything is sampled. Rows that are the same context (a top-1
alternative that is the correct digit) are listed under both arms and sampled once
(``passes``: seeds follow the context).
"""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.counterfactuals.takeover import body_length, even_grid

COLUMNS = ["model", "rollout_id", "problem_id", "kind", "pos", "arm", "substituted_id",
           "substituted_rank", "written_id", "rule", "category", "ground_truth",
           "result_is_answer", "matched_pos", "match", "entropy_ref"]


def combine(main: pd.DataFrame, positive: pd.DataFrame) -> pd.DataFrame:
    """The branch points: the main points (arms keep and top1) and the positive
    control's first wrong digits (keep and correct); a token in both gets all three."""
    keys = ["rollout_id", "pos"]
    both = pd.concat([main.assign(main=True), positive.assign(positive=True)], ignore_index=True)
    both = both.groupby(keys, sort=True, as_index=False).first()
    both["main"] = both["main"].fillna(False).astype(bool)
    both["positive"] = both["positive"].fillna(False).astype(bool)
    return both


def arm_rows(rows: pd.DataFrame, kind: str, arms_of) -> pd.DataFrame:
    """The keep arm and the arms ``arms_of(row)`` names ("top1": the real alternative,
    "correct": the correct digit) of every row of ``rows`` (annotated token rows)."""
    out = []
    for r in rows.to_dict("records"):
        base = {c: r.get(c) for c in COLUMNS[1:]}
        base.update(kind=kind, written_id=int(r["token_id"]), entropy_ref=float(r["entropy_ref"]))
        out.append({**base, "arm": "keep", "substituted_id": None, "substituted_rank": None})
        for arm in arms_of(r):
            sub, rank = (r["alt_id"], r["alt_rank"]) if arm == "top1" else (r["correct_id"], None)
            out.append({**base, "arm": arm, "substituted_id": int(sub),
                        "substituted_rank": None if rank is None else int(rank)})
    return pd.DataFrame(out, columns=COLUMNS[1:])


def _point_arms(r: dict) -> list[str]:
    return (["top1"] if r.get("main") else []) + (["correct"] if r.get("positive") else [])


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
    return pd.DataFrame(rows, columns=COLUMNS[1:])


def case_studies(points: pd.DataFrame, count: int) -> list[str]:
    """The ``count`` rollouts with the most first wrong digits among the points, then the
    most points (ties: by id)."""
    per = points.assign(fw=points["positive"].astype(int) if "positive" in points else 0)
    per = per.groupby("rollout_id").agg(fw=("fw", "sum"), n=("pos", "size")).reset_index()
    per = per.sort_values(["fw", "n", "rollout_id"], ascending=[False, False, True])
    return per["rollout_id"].head(count).tolist()


def build(points: pd.DataFrame, controls: pd.DataFrame, tokens: pd.DataFrame,
          rollouts: pd.DataFrame, policies: dict[str, set[str] | None], *,
          case_study_ids: list[str], grid_points: int, special: set[int],
          grid_models: set[str] | None = None,
          positive_models: set[str] | None = None) -> pd.DataFrame:
    """The plan: every point's arms (``combine``), every control's keep and top1, and the
    grid of the case studies, for each policy model. ``policies`` maps a model to the
    problem ids it continues (None: all); ``grid_models`` are the policies that also
    continue the case studies' grid, ``positive_models`` those that also continue the
    positive control's arms (the correct digit; None: all of them)."""
    parts = [arm_rows(points, "point", _point_arms),
             arm_rows(controls, "control", lambda r: ["top1"])]
    grid = grid_rows(rollouts, tokens, case_study_ids, grid_points, special)
    frame = [p for p in parts if len(p)]
    one = (pd.concat(frame, ignore_index=True) if frame else grid.iloc[:0]).reindex(columns=COLUMNS[1:])
    grid = grid.reindex(columns=COLUMNS[1:])
    out = []
    positive_only = (one["kind"] == "point") & ((one["arm"] == "correct")
                                                | (one["rule"] == "positive_control"))
    for model, problems in policies.items():
        rows = one if positive_models is None or model in positive_models else one[~positive_only]
        if grid_models is None or model in grid_models:
            rows = pd.concat([rows, grid], ignore_index=True)
        rows = rows if problems is None else rows[rows["problem_id"].isin(list(problems))]
        out.append(rows.assign(model=model))
    plan = pd.concat(out, ignore_index=True)[COLUMNS]
    return plan.drop_duplicates(["model", "rollout_id", "kind", "pos", "arm"]).reset_index(drop=True)


OWN_KINDS = {"point": "own_point", "control": "own_control"}


def own_points(points: pd.DataFrame, controls: pd.DataFrame, model: str) -> pd.DataFrame:
    """The plan rows of a second policy's *own* points (its disagreement points, annotated
    with its own top-k: ``alt_id`` is its choice) and their controls: keep and top1 each,
    continued by ``model`` alone, under kinds "own_point" and "own_control" (apart from the
    rows where it continues the first policy's points)."""
    parts = [arm_rows(points, OWN_KINDS["point"], lambda r: ["top1"]),
             arm_rows(controls, OWN_KINDS["control"], lambda r: ["top1"])]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(parts, ignore_index=True).assign(model=model)[COLUMNS]


def budgets(plan: pd.DataFrame, max_new_tokens: int,
            continuation_tokens: int | None = None) -> pd.Series:
    """The most new tokens one continuation of each row may write: the response limit
    minus the rollout tokens it keeps (a substituted token counts as kept), at most
    ``continuation_tokens``."""
    kept = plan["pos"] + (plan["arm"] != "prefix").astype(int)
    budget = (int(max_new_tokens) - kept).clip(lower=0)
    return budget if continuation_tokens is None else budget.clip(upper=int(continuation_tokens))


def cost(plan: pd.DataFrame, n: int, max_new_tokens: int | None = None,
         continuation_tokens: int | None = None) -> pd.DataFrame:
    """Contexts (distinct: a row that repeats another's context is not sampled again) and
    continuations to sample, by policy and kind of row; with ``max_new_tokens``, the most
    new tokens they can write."""
    sub = plan["substituted_id"].astype("Int64").astype(object).where(plan["substituted_id"].notna())
    key = pd.DataFrame({"model": plan["model"], "kind": plan["kind"], "rid": plan["rollout_id"],
                        "k": plan["pos"] + (plan["arm"] == "keep").astype(int),
                        "sub": sub.astype(str)})
    distinct = ~key.duplicated(["model", "rid", "k", "sub"])
    rows = plan[distinct]
    out = rows.groupby(["model", "kind"]).size().rename("contexts").reset_index()
    out = out.assign(continuations=out["contexts"] * n)
    if max_new_tokens is not None:
        most = (budgets(rows, max_new_tokens, continuation_tokens) * n).groupby(
            [rows["model"], rows["kind"]]).sum()
        out["max_new_tokens"] = [int(most[(m, k)]) for m, k in zip(out["model"], out["kind"])]
    return out

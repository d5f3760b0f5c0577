"""Branching at a token: does the token the checkpoint disagrees with decide the answer?

At a position ``pos`` of a rollout, two arms are continued by the same policy:

    keep        prompt + response[:pos + 1]                (the written token)
    substitute  prompt + response[:pos] + [alternative]    (the checkpoint's preferred token)

The alternative is the checkpoint's most probable token other than the written one, from
its top-k at that position (special tokens such as EOS are passed over: a branch that
ends the response has nothing to continue). The *effect* of the branch is
pass rate(substitute) − pass rate(keep), with Newcombe's interval for a difference of
two independent proportions.

Spikes say where the checkpoint disagrees; a positive effect at a spike in a wrong
reference rollout says that writing what the checkpoint prefers there would have led to
right answers more often. An effect means little alone: the same branching is done at
*control* positions, tokens of the same rollouts (else the same problem, else any
problem) that are not spikes, matched on the reference's entropy (a confident position
and an uncertain one differ in how much any swap changes), and where the checkpoint's
preferred alternative is swapped in just the same. Effects are averaged by spike category
with a bootstrap over problems, and spikes are compared with their controls.

Small suites may have no significant spike at all (chapter 05's test needs many contexts
for Benjamini–Hochberg). Then, as in chapter 06, the strongest *departures* of the
checkpoint stand in (``select_departures``: the largest symmetric KL, one per rollout,
first and EOS tokens left out), with kind "departure" wherever they appear: they are
where the checkpoint disagrees most, not tokens shown to be surprising.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb.counterfactuals.intervals import (
    cluster_bootstrap_difference,
    newcombe_ci,
)
from rlprobe_nb.statistics import cluster_bootstrap_ci, seed_from

MATCH_LEVELS = ("same_rollout", "same_problem", "other_problem")


def preferred_alternative(topk_ids, written_id: int, exclude: set[int] = frozenset()) -> int | None:
    """The checkpoint's most probable token other than the written one (and not in
    ``exclude``), from its top-k list sorted by probability; None if there is none."""
    for t in topk_ids:
        if int(t) != int(written_id) and int(t) not in exclude:
            return int(t)
    return None


def select_spikes(spikes: pd.DataFrame, checkpoint: str, groups=("target",),
                  max_spikes: int | None = None, seed: int = 0) -> pd.DataFrame:
    """The spikes of ``checkpoint`` to branch at: significant at that checkpoint (where the
    table marks it), in rollouts of ``groups``, first response tokens left out (they depend
    on the prompt alone). ``max_spikes`` caps them with a seeded draw that takes the
    categories in turn, so a rare category is not crowded out by a common one."""
    rows = spikes[spikes["checkpoint"] == checkpoint]
    if "significant" in rows:
        rows = rows[rows["significant"].astype(bool)]
    if "first_token" in rows:
        rows = rows[~rows["first_token"].astype(bool)]
    if "group" in rows and groups is not None:
        rows = rows[rows["group"].isin(list(groups))]
    rows = rows.drop_duplicates(["rollout_id", "pos"]).assign(
        category=lambda d: d["category"].fillna("unclassified"))
    if max_spikes is None or len(rows) <= max_spikes:
        return rows.sort_values(["rollout_id", "pos"]).reset_index(drop=True)
    rng = np.random.default_rng(seed_from("select_spikes", seed, checkpoint))
    queues = {c: list(g.index[rng.permutation(len(g))]) for c, g in rows.groupby("category")}
    chosen: list = []
    while len(chosen) < max_spikes:
        for c in sorted(queues):
            if queues[c] and len(chosen) < max_spikes:
                chosen.append(queues[c].pop(0))
    return rows.loc[chosen].sort_values(["rollout_id", "pos"]).reset_index(drop=True)


def select_departures(tokens: pd.DataFrame, checkpoint: str, groups=("target",),
                      count: int = 8) -> pd.DataFrame:
    """The stand-ins for spikes when none is significant: the ``count`` tokens of
    ``checkpoint`` with the largest KL(ref‖ckpt) + KL(ckpt‖ref), one per rollout, first
    response tokens and EOS left out, in rollouts of ``groups`` (chapter 06's rule).
    ``tokens``: the per-token table (a ``category`` column is carried when present)."""
    rows = tokens[tokens["checkpoint"] == checkpoint]
    if "group" in rows and groups is not None:
        rows = rows[rows["group"].isin(list(groups))]
    rows = rows[~rows["first_token"].astype(bool) & ~rows["is_eos"].astype(bool)]
    rows = rows.assign(strength=rows["kl_ref_ckpt"].astype(np.float64) + rows["kl_ckpt_ref"])
    rows = rows.sort_values(["strength", "rollout_id", "pos"], ascending=[False, True, True])
    picked = rows.drop_duplicates("rollout_id").head(int(count))
    if "category" not in picked:
        picked = picked.assign(category="unclassified")
    picked = picked.assign(category=picked["category"].astype(object).fillna("unclassified"))
    return picked.sort_values(["rollout_id", "pos"]).reset_index(drop=True)


def _candidates(tokens: pd.DataFrame, spike_keys: set, gap: int) -> pd.DataFrame:
    """Positions that may serve as controls: not a spike nor within ``gap`` tokens of one,
    not the first response token, not EOS."""
    near = {(r, p + d) for r, p in spike_keys for d in range(-gap, gap + 1)}
    keys = list(zip(tokens["rollout_id"], tokens["pos"]))
    ok = ~tokens["first_token"].astype(bool) & ~tokens["is_eos"].astype(bool)
    ok &= np.array([k not in near for k in keys])
    return tokens[ok]


def match_controls(selected: pd.DataFrame, tokens: pd.DataFrame, all_spikes: pd.DataFrame,
                   caliper: float = 0.25, gap: int = 2, seed: int = 0) -> pd.DataFrame:
    """One control position per selected spike, matched on the reference's entropy.

    ``tokens`` is the checkpoint's token table (entropy_ref, first_token, is_eos).
    Candidates are tokens that are not spikes at any step (``all_spikes``) nor within
    ``gap`` tokens of one. For each spike, the nearest entropy within ``caliper`` nats is
    taken from the same rollout if there is one, else from the same problem, else from
    any problem; each control serves one spike. Returns one row per matched spike:
    rollout_id, problem_id, pos (the control), spike_rollout_id, matched_pos (the
    spike), match (level), entropy_ref, entropy_gap and the spike's category; spikes
    without a match are left out (count them against ``selected``)."""
    spike_keys = set(zip(all_spikes["rollout_id"], all_spikes["pos"]))
    pool = _candidates(tokens, spike_keys, gap)[["rollout_id", "problem_id", "pos",
                                                 "entropy_ref"]].copy()
    pool["tie"] = np.random.default_rng(seed_from("controls", seed)).random(len(pool))
    entropy = tokens.set_index(["rollout_id", "pos"])["entropy_ref"]
    used: set = set()
    rows = []
    for s in selected.itertuples():
        e = float(entropy.get((s.rollout_id, s.pos), np.nan))
        if np.isnan(e):
            continue
        near = pool[(pool["entropy_ref"] - e).abs() <= caliper]
        for level, where in zip(MATCH_LEVELS, (near["rollout_id"] == s.rollout_id,
                                               near["problem_id"] == s.problem_id,
                                               pd.Series(True, index=near.index))):
            options = near[where & ~near.index.isin(list(used))]
            if len(options):
                gap_e = (options["entropy_ref"] - e).abs()
                best = options.assign(g=gap_e).sort_values(["g", "tie"]).iloc[0]
                used.add(best.name)
                rows.append({"rollout_id": best.rollout_id, "problem_id": best.problem_id,
                             "pos": int(best.pos), "spike_rollout_id": s.rollout_id,
                             "matched_pos": int(s.pos), "match": level,
                             "category": getattr(s, "category", None),
                             "entropy_ref": float(best.entropy_ref), "entropy_gap": float(best.g)})
                break
    return pd.DataFrame(rows, columns=["rollout_id", "problem_id", "pos", "spike_rollout_id",
                                       "matched_pos", "match", "category", "entropy_ref",
                                       "entropy_gap"])


def branch_arms(points: pd.DataFrame, tokens: pd.DataFrame, kind: str,
                exclude: set[int] = frozenset()) -> pd.DataFrame:
    """The keep and substitute arms at each of ``points`` (rollout_id, problem_id, pos,
    and any extra columns to carry), the alternative taken from the checkpoint's top-k in
    ``tokens``. Points without an alternative are dropped."""
    at = tokens.set_index(["rollout_id", "pos"])
    rows = []
    for p in points.to_dict("records"):
        t = at.loc[(p["rollout_id"], p["pos"])]
        alt = preferred_alternative(t["topk_ids_ckpt"], int(t["token_id"]), exclude)
        if alt is None:
            continue
        base = {**p, "kind": kind, "written_id": int(t["token_id"]),
                "entropy_ref": float(t["entropy_ref"])}
        rows.append({**base, "arm": "keep", "substituted_id": None})
        rows.append({**base, "arm": "substitute", "substituted_id": alt})
    return pd.DataFrame(rows)


def effects(branches: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """One row per branch point (model, kind, rollout_id, pos): both arms' passes and n,
    effect = pass rate(substitute) − pass rate(keep) and Newcombe's interval."""
    ids = ["model", "kind", "rollout_id", "pos"]
    carry = [c for c in ("problem_id", "category", "match", "matched_pos", "entropy_ref",
                         "written_id") if c in branches]
    arms = branches[branches["arm"].isin(["keep", "substitute"])]
    keep = arms[arms["arm"] == "keep"].set_index(ids)
    sub = arms[arms["arm"] == "substitute"].set_index(ids)
    both = keep.index.intersection(sub.index)
    out = keep.loc[both, carry].copy()
    out["substituted_id"] = sub.loc[both, "substituted_id"].astype("Int64")
    for name, arm in (("keep", keep), ("sub", sub)):
        out[f"passes_{name}"] = arm.loc[both, "passes"].astype(int)
        out[f"n_{name}"] = arm.loc[both, "n"].astype(int)
    ci = [newcombe_ci(ks, ns, kk, nk, alpha) for ks, ns, kk, nk in
          zip(out.passes_sub, out.n_sub, out.passes_keep, out.n_keep)]
    out["effect"], out["effect_low"], out["effect_high"] = (list(x) for x in zip(*ci)) if ci \
        else ([], [], [])
    return out.reset_index()


def point_kind(effects_df: pd.DataFrame) -> str:
    """The kind of the branch points compared with the controls: "spike" or, where no
    spike was significant, "departure" (one of the two per table)."""
    kinds = sorted(set(effects_df["kind"]) - {"control"})
    if len(kinds) > 1:
        raise ValueError(f"one kind of branch point per comparison, got {kinds}")
    return kinds[0] if kinds else "spike"


def by_category(effects_df: pd.DataFrame, n_boot: int = 2000, alpha: float = 0.05,
                seed: int = 0) -> pd.DataFrame:
    """Mean effect by (model, category) for the branch points (spikes, or departures where
    no spike was significant) and for their controls, each with a bootstrap over
    problems, and the difference point − control (problems resampled once for both),
    labelled e.g. "spike - control". A category "all" pools every branch."""
    kind = point_kind(effects_df)
    pooled = pd.concat([effects_df, effects_df.assign(category="all")], ignore_index=True)
    rows = []
    for (model, cat), g in pooled.groupby(["model", "category"], sort=True):
        points, controls = g[g["kind"] == kind], g[g["kind"] == "control"]
        for label, part in ((kind, points), ("control", controls)):
            mean, low, high = cluster_bootstrap_ci(part["effect"].to_numpy(float),
                                                   part["problem_id"].to_numpy(), n_boot,
                                                   alpha, seed_from(seed, model, cat, label))
            rows.append({"model": model, "category": cat, "estimate": label,
                         "branches": len(part), "problems": part["problem_id"].nunique(),
                         "mean": mean, "low": low, "high": high})
        diff = cluster_bootstrap_difference(points["effect"], points["problem_id"],
                                            controls["effect"], controls["problem_id"],
                                            n_boot, alpha, seed_from(seed, model, cat, "diff"))
        rows.append({"model": model, "category": cat, "estimate": f"{kind} - control",
                     "branches": len(g), "problems": g["problem_id"].nunique(),
                     "mean": diff[0], "low": diff[1], "high": diff[2]})
    return pd.DataFrame(rows, columns=["model", "category", "estimate", "branches", "problems",
                                       "mean", "low", "high"])

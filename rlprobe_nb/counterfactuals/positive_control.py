"""The positive control of takeover curves: a planted wrong result must show as a drop
exactly where it was planted, and the same edit where the answer no longer depends on it
must show no drop.

For each right response of a model, two edited copies are made (``edits``): its result's
last digit made wrong, and the same wrong digit put after the final box. The model's
takeover curve of each copy is located with ``takeover.locate_drop`` (a coarse grid,
then bisection). A result edit is *found* when the drop's token (``drop_at − 1``, the
token whose inclusion made the curve fall) is within ``tolerance`` tokens of the edit;
an after-answer edit *passes* when its curve has no drop at all.

Contexts that do not reach the edit are token for token the unedited response's, so they
are sampled once, as the original rollout's contexts, and shared by both copies.
"""

from __future__ import annotations

import time

import pandas as pd

from rlprobe_nb.counterfactuals.edits import after_answer_edit, apply, result_edit
from rlprobe_nb.counterfactuals.passes import pass_counts
from rlprobe_nb.counterfactuals.takeover import body_length, locate_drop


class CurveSampler:
    """Memoized takeover-curve points of one model over a set of rollouts: a context is
    sampled once however many curves ask for it."""

    def __init__(self, model, tokenizer, rollouts: pd.DataFrame, gold: dict[str, str], **kw):
        self.model, self.tokenizer, self.rollouts, self.gold, self.kw = model, tokenizer, rollouts, gold, kw
        self.memo: dict[tuple[str, int], dict] = {}
        self.continuations = 0

    def points(self, pairs: list[tuple[str, int]]) -> list[dict]:
        todo = [p for p in dict.fromkeys(pairs) if p not in self.memo]
        if todo:
            plan = pd.DataFrame({"rollout_id": [r for r, _ in todo], "kind": "grid",
                                 "pos": [k for _, k in todo], "arm": "prefix",
                                 "substituted_id": None})
            plan["problem_id"] = plan["rollout_id"].map(self.rollouts.set_index("rollout_id")["problem_id"])
            got = pass_counts(self.model, self.tokenizer, plan, self.rollouts, self.gold, **self.kw)
            self.continuations += int(got["n"].sum())
            for row in got.to_dict("records"):
                self.memo[(row["rollout_id"], row["prefix_len"])] = row
        return [self.memo[p] for p in pairs]


def edited_rollouts(tokenizer, rollouts: pd.DataFrame, gold: dict[str, str]) -> pd.DataFrame:
    """Both edited copies of every right rollout that states its result as whole digits:
    rollout_id ``<original>~<where>@<pos>``, with ``source_id``, ``edit_pos``, ``where``,
    ``in_box``."""
    rows = []
    for r in rollouts[rollouts["correct"].astype(bool)].itertuples():
        first = result_edit(tokenizer, r.response_ids, gold[r.problem_id])
        second = after_answer_edit(tokenizer, r.response_ids, first) if first else None
        if second is None:
            continue
        for e in (first, second):
            rows.append({"rollout_id": f"{r.rollout_id}~{e.where}@{e.pos}", "source_id": r.rollout_id,
                         "problem_id": r.problem_id, "prompt_ids": list(r.prompt_ids),
                         "response_ids": apply(r.response_ids, e), "edit_pos": e.pos,
                         "where": e.where, "in_box": e.in_box})
    return pd.DataFrame(rows)


def run(model, tokenizer, rollouts: pd.DataFrame, gold: dict[str, str], *, model_name: str,
        n: int, temperature: float, max_new_tokens: int, seed: int, step: int = 8,
        tolerance: int = 1, alpha: float = 0.05, min_drop: float = 0.3, batch_rows: int = 32,
        eos: set[int] = frozenset()) -> pd.DataFrame:
    """One row per edited copy: where it was edited, the drop found (if any), whether the
    control passed (``ok``), its curve points and the continuations and seconds it took."""
    edited = edited_rollouts(tokenizer, rollouts, gold)
    both = pd.concat([rollouts[["rollout_id", "problem_id", "prompt_ids", "response_ids"]],
                      edited[["rollout_id", "problem_id", "prompt_ids", "response_ids"]]],
                     ignore_index=True)
    sampler = CurveSampler(model, tokenizer, both, gold, model_name=model_name, n=n,
                           temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                           batch_rows=batch_rows)
    out = []
    for e in edited.itertuples():
        def evaluate(ks, e=e):
            # up to the edit the context is the original's, token for token
            pairs = [(e.source_id if k <= e.edit_pos else e.rollout_id, k) for k in ks]
            return pd.DataFrame([{**p, "prefix_len": k} for p, k in zip(sampler.points(pairs), ks)])
        start, before = time.perf_counter(), sampler.continuations
        found, curve = locate_drop(evaluate, body_length(e.response_ids, eos), step, alpha, min_drop)
        drop_token = found["drop_at"] - 1 if found["drop"] else None
        ok = (found["drop"] and abs(drop_token - e.edit_pos) <= tolerance) if e.where == "result" \
            else not found["drop"]
        out.append({"rollout_id": e.rollout_id, "where": e.where, "in_box": e.in_box,
                    "edit_pos": e.edit_pos, "n_tokens": len(e.response_ids), "drop": found["drop"],
                    "drop_after": found["drop_after"], "drop_at": found["drop_at"],
                    "drop_token": drop_token, "ok": bool(ok),
                    "curve": list(zip(curve.prefix_len.tolist(), curve.passes.tolist())),
                    "continuations": sampler.continuations - before,
                    "seconds": round(time.perf_counter() - start, 1)})
    return pd.DataFrame(out)

"""Case studies chosen by a rule fixed in the parameters, and what each case shows.

Choosing examples by hand invites choosing the ones that tell the story. Here a
:class:`CaseRule` (its fields are notebook parameters, with a seed) picks, at the final
checkpoint and in one group of rollouts:

1. the strongest spike of the wanted persistence class (largest |statistic|, then |Δlogp|)
   in each of the ``n_categories`` most frequent categories (ties: category name);
2. the spike with the earliest onset step (ties: the stronger);
3. ``n_random`` spikes drawn with the seed among those not yet chosen;
When no spike qualifies (nothing reached significance, as on small suites), items 1–3
are replaced by the ``n_categories + n_random`` strongest *departures* of the final
checkpoint by symmetric KL (one per rollout, first and EOS tokens left out), labelled as
departures and never as spikes.

4. ``n_controls`` quiet positions: never a spike at any step, |Δlogp| at most the median,
   not a first or EOS token, whose reference entropy is nearest that of a chosen spike
   (the seed picks among the ``control_pool`` nearest), so a reader can see what an
   unremarkable token with the same uncertainty looks like.

Candidates are sorted by explicit keys before any choice, so the same tables and seed give
the same cases whatever the row order. :func:`build_cases` then gathers each case's
content from the tables: the problem and gold answer, the reference's rollout, answer and
failure type, every model's own answers, the rollout at the final checkpoint, the tokens
around the case at every step, and the spike's record at every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rlprobe_nb.render.metrics import metric_values
from rlprobe_nb.render.spike_marks import ever_spiked, significant


@dataclass(frozen=True)
class CaseRule:
    n_categories: int = 3
    earliest_onset: bool = True
    n_random: int = 1
    n_controls: int = 1
    seed: int = 0
    group: str | None = "target"  # None: every group
    persistence: str | None = "persistent"  # None: every persistence class
    strength: str = "statistic"  # the spikes column ranked by |value|
    control_pool: int = 5
    window: int = 8  # tokens either side of the case in the per-step rows


@dataclass
class Case:
    number: int
    kind: str  # "spike" | "departure" | "control"
    reason: str
    rollout_id: str
    problem_id: str
    pos: int
    checkpoint: str  # the final checkpoint
    step: int
    matched_to: int | None = None  # a control: the case whose reference entropy it matches
    problem: str | None = None
    gold: str | None = None
    ref_answer: str | None = None
    ref_correct: bool | None = None
    failure_type: str | None = None
    response: str | None = None
    answers: pd.DataFrame = field(default_factory=pd.DataFrame)
    final_rows: pd.DataFrame = field(default_factory=pd.DataFrame)
    window: pd.DataFrame = field(default_factory=pd.DataFrame)
    at_pos: pd.DataFrame = field(default_factory=pd.DataFrame)
    spike_steps: pd.DataFrame = field(default_factory=pd.DataFrame)


def final_checkpoint(tokens: pd.DataFrame) -> str:
    """The checkpoint with the largest RL step."""
    steps = tokens.groupby("checkpoint")["step"].first()
    return str(steps.idxmax())


def _in_group(df: pd.DataFrame, group: str | None) -> pd.DataFrame:
    return df if group is None or "group" not in df.columns else df[df.group == group]


def _spike_candidates(spikes: pd.DataFrame, final: str, rule: CaseRule) -> pd.DataFrame:
    sp = significant(spikes)
    if sp.empty:
        return sp.assign(strength=[], tiebreak=[], category=[])
    sp = _in_group(sp[sp.checkpoint == final], rule.group)
    if "first_token" in sp.columns:  # a first token's prediction depends on the prompt alone
        sp = sp[~sp.first_token.astype(bool)]
    if rule.persistence is not None and "persistence" in sp.columns:
        sp = sp[sp.persistence == rule.persistence]
    # ties in the statistic (e.g. p-values at the null's floor) go to the larger |Δlogp|
    tiebreak = sp["dlogp"].abs() if "dlogp" in sp.columns else 0.0
    sp = sp.assign(strength=sp[rule.strength].abs(), tiebreak=tiebreak)
    return sp.sort_values(["rollout_id", "pos"]).reset_index(drop=True)


def _pick(chosen: list[dict], row, kind: str, reason: str, matched_to=None) -> None:
    chosen.append({"case": len(chosen) + 1, "kind": kind, "reason": reason, "rollout_id": row.rollout_id,
                   "problem_id": row.problem_id, "pos": int(row.pos), "matched_to": matched_to})


def _untaken(df: pd.DataFrame, chosen: list[dict]) -> pd.DataFrame:
    taken = {(c["rollout_id"], c["pos"]) for c in chosen}
    keep = [(r, int(p)) not in taken for r, p in zip(df.rollout_id, df.pos)]
    return df[np.asarray(keep, dtype=bool)] if len(df) else df


def _quiet_positions(tokens: pd.DataFrame, spikes: pd.DataFrame, final: str, group) -> pd.DataFrame:
    rows = _in_group(tokens[tokens.checkpoint == final], group)
    keep = ~ever_spiked(spikes, rows).to_numpy(bool)
    for flag in ("first_token", "is_eos"):
        if flag in rows.columns:
            keep &= ~rows[flag].to_numpy(bool)
    absd = np.abs(metric_values(rows, "dlogp"))
    keep &= absd <= np.nanmedian(absd)
    return rows[keep].sort_values(["rollout_id", "pos"]).reset_index(drop=True)


def _pick_departures(chosen: list[dict], tokens: pd.DataFrame, final: str, rule: CaseRule) -> None:
    """The strongest departures by KL(ref‖ckpt) + KL(ckpt‖ref), one per rollout: the
    stand-ins for spikes when none reached significance."""
    rows = _in_group(tokens[tokens.checkpoint == final], rule.group)
    keep = np.ones(len(rows), dtype=bool)
    for flag in ("first_token", "is_eos"):
        if flag in rows.columns:
            keep &= ~rows[flag].to_numpy(bool)
    rows = rows[keep].assign(strength=lambda d: d.kl_ref_ckpt.astype(np.float64) + d.kl_ckpt_ref)
    rows = rows.sort_values(["strength", "rollout_id", "pos"], ascending=[False, True, True])
    for i, (_, row) in enumerate(rows.drop_duplicates("rollout_id").head(rule.n_categories + rule.n_random).iterrows()):
        _pick(chosen, row, "departure", f"departure {i + 1} by symmetric KL (no spike reached "
              "significance at any step)")


def select_cases(tokens: pd.DataFrame, spikes: pd.DataFrame, rule: CaseRule = CaseRule()) -> pd.DataFrame:
    """The cases ``rule`` picks: one row each (case, kind, reason, rollout_id, problem_id,
    pos, matched_to), in the order of the rule's items."""
    final = final_checkpoint(tokens)
    sp = _spike_candidates(spikes, final, rule)
    chosen: list[dict] = []
    counts = sp.groupby("category").size().reset_index(name="n").sort_values(["n", "category"],
                                                                              ascending=[False, True])
    for cat in counts.category.head(rule.n_categories):
        cand = _untaken(sp[sp.category == cat], chosen).sort_values(
            ["strength", "tiebreak", "rollout_id", "pos"], ascending=[False, False, True, True])
        if len(cand):
            _pick(chosen, cand.iloc[0], "spike", f"the strongest {rule.persistence or ''} spike of "
                  f"category {cat!r}".replace("  ", " "))
    if rule.earliest_onset and "onset_step" in sp.columns:
        cand = _untaken(sp.dropna(subset=["onset_step"]), chosen).sort_values(
            ["onset_step", "strength", "tiebreak", "rollout_id", "pos"], ascending=[True, False, False, True, True])
        if len(cand):
            _pick(chosen, cand.iloc[0], "spike", "the earliest onset")
    rng = np.random.default_rng(rule.seed)
    for _ in range(rule.n_random):
        cand = _untaken(sp, chosen)
        if len(cand):
            _pick(chosen, cand.iloc[int(rng.integers(len(cand)))], "spike", f"a random spike (seed {rule.seed})")
    if not chosen:
        _pick_departures(chosen, tokens, final, rule)
    spike_cases = list(chosen)
    quiet = _quiet_positions(tokens, spikes, final, rule.group)
    final_rows = tokens[tokens.checkpoint == final].set_index(["rollout_id", "pos"])
    for i in range(rule.n_controls if spike_cases else 0):
        like = spike_cases[i % len(spike_cases)]
        target = float(final_rows.loc[(like["rollout_id"], like["pos"]), "entropy_ref"])
        cand = _untaken(quiet, chosen)
        if not len(cand):
            break
        cand = cand.assign(gap=(cand.entropy_ref.astype(np.float64) - target).abs()).sort_values(
            ["gap", "rollout_id", "pos"]).head(rule.control_pool)
        _pick(chosen, cand.iloc[int(rng.integers(len(cand)))], "control",
              f"a quiet control matched on the reference's entropy to case {like['case']}", like["case"])
    return pd.DataFrame(chosen, columns=["case", "kind", "reason", "rollout_id", "problem_id", "pos", "matched_to"])


def _same_test(spikes: pd.DataFrame, row) -> pd.Series:
    """The spikes table's rows for the same test as token ``row`` (same context and token,
    or same rollout and position when the tables carry no context ids)."""
    if "context_id" in spikes.columns and "context_id" in row.index:
        return (spikes.context_id == row.context_id) & (spikes.token_id == row.token_id)
    return (spikes.rollout_id == row.rollout_id) & (spikes.pos == row.pos)


def answers_summary(answers: pd.DataFrame | None, problem_id: str, order: list[str]) -> pd.DataFrame:
    """Per model, its own answers to one problem: samples, how many right, the answers
    given with their counts (most frequent first). Models in ``order`` first."""
    if answers is None or answers.empty:
        return pd.DataFrame(columns=["model", "n", "n_correct", "answers"])
    mine = answers[answers.problem_id == problem_id]
    out = []
    for model, df in mine.groupby("model", sort=False):
        given = df.extracted.fillna("(none)").value_counts()
        out.append({"model": model, "n": len(df), "n_correct": int(df.correct.fillna(False).sum()),
                    "answers": list(zip(given.index, given.to_numpy()))})
    rank = {m: i for i, m in enumerate(order)}
    out.sort(key=lambda r: (rank.get(r["model"], len(rank)), r["model"]))
    return pd.DataFrame(out, columns=["model", "n", "n_correct", "answers"])


def build_cases(choices: pd.DataFrame, tokens: pd.DataFrame, spikes: pd.DataFrame,
                problems: pd.DataFrame | None = None, rollouts: pd.DataFrame | None = None,
                answers: pd.DataFrame | None = None, window: int = 8) -> list[Case]:
    """Each chosen case with its content gathered from the tables (see the module doc).
    ``tokens``: every checkpoint against one reference, with ``step``."""
    final = final_checkpoint(tokens)
    step = int(tokens.loc[tokens.checkpoint == final, "step"].iloc[0])
    order = [tokens.reference.iloc[0], *tokens.drop_duplicates("checkpoint").sort_values("step").checkpoint]
    problems = problems.set_index("problem_id") if problems is not None else None
    rollouts = rollouts.set_index("rollout_id") if rollouts is not None else None
    cases = []
    for c in choices.itertuples(index=False):
        rows = tokens[tokens.rollout_id == c.rollout_id]
        case = Case(int(c.case), c.kind, c.reason, c.rollout_id, c.problem_id, int(c.pos), final, step,
                    None if pd.isna(c.matched_to) else int(c.matched_to))
        if problems is not None and c.problem_id in problems.index:
            case.problem, case.gold = problems.loc[c.problem_id, ["problem", "answer"]]
        if rollouts is not None and c.rollout_id in rollouts.index:
            r = rollouts.loc[c.rollout_id]
            case.response, case.ref_answer, case.ref_correct = r.get("response"), r.get("extracted"), r.get("correct")
            case.failure_type = r.get("failure_type")
        if case.failure_type is None and "failure_type" in rows.columns:
            case.failure_type = rows.failure_type.iloc[0]
        case.answers = answers_summary(answers, c.problem_id, order)
        case.final_rows = rows[rows.checkpoint == final].sort_values("pos")
        near = rows[(rows.pos >= c.pos - window) & (rows.pos <= c.pos + window)]
        case.window = near.sort_values(["step", "pos"])
        case.at_pos = rows[rows.pos == c.pos].sort_values("step")
        mine = spikes[_same_test(spikes, case.at_pos.iloc[0])].drop(columns="step", errors="ignore")
        case.spike_steps = mine.merge(case.at_pos[["checkpoint", "step"]], on="checkpoint").sort_values("step")
        cases.append(case)
    return cases

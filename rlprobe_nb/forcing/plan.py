"""What notebook 03 forces, for which models, in which order — on top of the engine in
``forcing``. Each model of the suite is forwarded over the chosen rollouts at most once:
the reference on the first run (its cache serves every checkpoint), each checkpoint in its
own run, and every configured pair whose two caches exist is computed from the caches.

What is forced, by group (``forcing.groups``), so every effect has a contrast:
  target     the reference's wrong rollouts of the selected problems (reference wrong,
             RLVR target right), of the failure types in ``forcing.failure_types``
             (default: finished and wrong — a boxed wrong answer, an empty box, no box;
             ``truncated`` only if listed: an unfinished text is not a wrong answer)
  ref_right  the reference's right rollouts of the same problems, where any exist
  control    the rollouts of the control problems (reference right, target wrong)
  t1_unselected  rollouts sampled at temperature 1, *whatever their outcome* (right, wrong,
             truncated), of the selected and control problems: tokens that are plain draws
             from the reference, where the sampled-token KL estimators must meet the exact
             KL (chapter 04's control on real tables). Drawn first, by a seeded lot that
             never looks at the outcome; a rollout drawn here is forced in this group only,
             and the other groups draw from the rest.
``forcing.max_rollouts`` caps each group with a seeded draw stratified by temperature and
problem, so no temperature and no problem is dropped while others are kept whole;
``forcing.group_max_rollouts`` gives a group its own cap.

Devices (``distributed``): a forward is shared among the worker processes batch by batch,
models loading in the workers; ``force_checkpoints`` spreads several checkpoints over the
workers, one checkpoint per worker at a time, after the reference's cache is made once.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pandas as pd

from rlprobe_nb import distributed, forcing
from rlprobe_nb.forcing import sharded
from rlprobe_nb.statistics import seed_from
from rlprobe_nb.suite import models, params
from rlprobe_nb.suite.params import Params
from rlprobe_nb.tables import lineage, provenance, storage

GROUPS = ("target", "ref_right", "control", "t1_unselected")
UNSELECTED = "t1_unselected"


def assign_groups(rollouts: pd.DataFrame, selection: pd.DataFrame,
                  failure_types: list[str]) -> pd.DataFrame:
    """Every rollout with its group (or None: not forced), from the selection of 01."""
    group_of = selection.set_index("problem_id")["group"]
    problem_group = rollouts["problem_id"].map(group_of)
    group = pd.Series(None, index=rollouts.index, dtype=object)
    selected = problem_group == "selected"
    group[selected & rollouts["failure_type"].isin(failure_types)] = "target"
    group[selected & (rollouts["failure_type"] == "correct")] = "ref_right"
    group[problem_group == "control"] = "control"
    return rollouts.assign(group=group)


def stratified(df: pd.DataFrame, limit: int | None, seed: int) -> pd.DataFrame:
    """At most ``limit`` rows, drawn so that every temperature and every problem stays as
    evenly represented as the limit allows: each pick takes a row of the least-picked
    temperature, then of the least-picked problem, ties broken by a seeded shuffle."""
    if not limit or len(df) <= limit:
        return df
    rng = random.Random(seed)
    order = list(df.index)
    rng.shuffle(order)
    by_temp, by_problem = Counter(), Counter()
    temp = df["temperature"].fillna(-1.0)
    left, chosen = set(order), []
    for _ in range(limit):
        pick = min((i for i in order if i in left),
                   key=lambda i: (by_temp[temp[i]], by_problem[df.at[i, "problem_id"]]))
        left.discard(pick)
        chosen.append(pick)
        by_temp[temp[pick]] += 1
        by_problem[df.at[pick, "problem_id"]] += 1
    return df.loc[sorted(chosen, key=order.index)]


def unselected_draw(rollouts: pd.DataFrame, selection: pd.DataFrame, limit: int | None,
                    seed: int) -> pd.DataFrame:
    """The ``t1_unselected`` group: rollouts sampled at temperature 1 of the selected and
    control problems, any outcome, at most ``limit`` drawn evenly over the problems (the
    draw never reads failure_type, grade or text)."""
    group_of = rollouts["problem_id"].map(selection.set_index("problem_id")["group"])
    pool = rollouts[group_of.isin(["selected", "control"]) & (rollouts["temperature"] == 1.0)]
    if pool.empty:
        found = sorted(rollouts["temperature"].dropna().unique().tolist())
        raise ValueError(f"forcing.groups lists {UNSELECTED!r}, but no rollout of a selected or "
                         f"control problem was sampled at temperature 1.0 (the rollouts have "
                         f"{found}): add 1.0 to rollouts.temperatures and rerun 02, or drop the "
                         "group")
    return stratified(pool, limit, seed_from(seed, UNSELECTED))


def cap(F, group: str) -> int | None:
    """The most rollouts ``group`` forces: its own cap, else ``max_rollouts``."""
    return F.group_max_rollouts.get(group, F.max_rollouts)


def choose(rollouts: pd.DataFrame, selection: pd.DataFrame, P: Params) -> pd.DataFrame:
    """The rollouts to force, each with its ``group``, in a stable order."""
    F = P.forcing
    grouped = assign_groups(rollouts, selection, F.failure_types)
    if UNSELECTED in F.groups:  # first, so the outcome never decides what it draws
        drawn = unselected_draw(rollouts, selection, cap(F, UNSELECTED), F.seed)
        grouped.loc[drawn.index, "group"] = UNSELECTED
    parts = [stratified(grouped[grouped["group"] == g], cap(F, g), F.seed) for g in F.groups]
    chosen = pd.concat(parts) if parts else grouped.iloc[:0]
    if not (chosen["group"] == "target").any() and "target" in F.groups:
        found = grouped.loc[grouped["problem_id"].map(
            selection.set_index("problem_id")["group"]) == "selected", "failure_type"]
        raise ValueError(
            f"no target rollouts: the selected problems' rollouts are of types "
            f"{dict(Counter(found))}, and forcing.failure_types is {F.failure_types}; add "
            "the types you want forced (e.g. truncated) or rerun 02 with more tokens or samples")
    return chosen.sort_values(["group", "problem_id", "sample"], kind="stable")


def counts(chosen: pd.DataFrame, rollouts: pd.DataFrame, selection: pd.DataFrame) -> pd.DataFrame:
    """Rollouts by group of problem x failure type, and how many of each are forced."""
    group_of = selection.set_index("problem_id")["group"]
    all_ = rollouts.assign(problems=rollouts["problem_id"].map(group_of))
    table = all_.groupby(["problems", "failure_type"]).size().rename("rollouts").to_frame()
    forced = chosen.assign(problems=chosen["problem_id"].map(group_of)).groupby(
        ["problems", "failure_type"]).size().rename("forced")
    return table.join(forced).fillna(0).astype(int).reset_index()


def engine_settings(P: Params) -> dict:
    return dict(suite=P.suite, batch_tokens=P.forcing.batch_tokens,
                chunk_positions=P.forcing.chunk_positions, topk=P.forcing.topk,
                compile_body=P.forcing.compile_body,
                device=models.resolve_device(P.runtime.device))


def sequences(P: Params, chosen: pd.DataFrame, problems: pd.DataFrame) -> forcing.SequenceSet:
    """Forced sequences for the chosen rollouts, checked against the models' context
    (read from their configs: no weights are loaded)."""
    tok = models.load_tokenizer(P.reference, P)
    context = min(c for c in (models.model_context(P.reference, P),
                              models.model_context(P.checkpoint, P)) if c) \
        if P.checkpoint else models.model_context(P.reference, P)
    return forcing.build_sequences(chosen, problems, tok, P.prompt_template,
                                   max_context=context, context_policy=P.forcing.context_policy)


def hidden_dir(P: Params, name: str) -> Path:
    """The model's hidden-state cache, one folder per model identity."""
    return forcing.hidden_dir(P.suite, name, models.model_identity(name, P))


def _side(P: Params, name: str, loaded: models.LoadedModel | None = None,
          cache: bool = True) -> forcing.Side:
    return forcing.Side(name, loaded.model if loaded else None,
                        loaded.tokenizer if loaded else None,
                        hidden_dir(P, name) if cache else None, models.model_identity(name, P))


def is_cached(P: Params, name: str, seqs: forcing.SequenceSet) -> bool:
    cache = forcing.HiddenCache(hidden_dir(P, name))
    return cache.exists() and not cache.missing(seqs.sequences)


def ensure_cached(P: Params, name: str, seqs: forcing.SequenceSet) -> None:
    """Forward ``name`` over the sequences into its hidden-state cache unless it is there
    (for the reference: the one-time cost that every checkpoint then reuses), on every
    worker."""
    if is_cached(P, name, seqs):
        return

    def load():
        side = _side(P, name, models.load_model(name, P))
        return side, side

    sharded.run_pair(seqs, (name, name), None, load,
                         forwarded={name: hidden_dir(P, name)}, **engine_settings(P))


def needs_cache(P: Params, name: str) -> bool:
    """Whether a configured pair will read this model's hidden states later. Saving them
    costs disk traffic (8 KB a token at 8B), so a checkpoint in no pair skips it."""
    return any(name in pair for pair in P.forcing.pairs)


def table_key(P: Params, seqs: forcing.SequenceSet, checkpoint: str, reference: str,
              rollouts_sha: str) -> dict:
    inputs = lineage.tokens_key(P, checkpoint, reference, rollouts_sha)
    return forcing.table_key(seqs, checkpoint, reference, P.forcing.topk, inputs)


def _manifest(P: Params, names: list[str], seqs, extra=None) -> dict:
    return provenance.manifest(
        P, models=[{"name": m, **P.model_spec(m), "identity": models.model_identity(m, P)}
                   for m in names],
        extra={"producer": lineage.PRODUCERS["tokens"], "sequences": seqs.facts(),
               **(extra or {})})


def run_checkpoint(P: Params, seqs: forcing.SequenceSet, ckpt: models.LoadedModel | None,
                   rollouts_sha: str, overwrite: bool = False) -> Path:
    """Forward the checkpoint once (loaded where it runs when ``ckpt`` is None: in each
    worker); compare it with the cached reference as it goes."""
    ensure_cached(P, P.reference, seqs)
    out = forcing.pair_dir(P.suite, P.checkpoint, P.reference)
    # the loaded model's facts, for the manifest, beside the shards of the run
    loaded = storage.work_dir(out) / "_prov-checkpoint.json"
    cache = needs_cache(P, P.checkpoint)

    def load():
        lm = ckpt if ckpt is not None else models.load_model(P.checkpoint, P)
        storage.atomic_write_json(loaded, lm.provenance)
        return _side(P, P.checkpoint, lm, cache=cache), _side(P, P.reference)

    def manifest() -> dict:
        man = _manifest(P, [P.checkpoint, P.reference], seqs)
        if loaded.exists():  # absent only when an earlier run computed every batch
            man["models"][0].update(storage.read_json(loaded))
        return man

    return sharded.run_pair(
        seqs, (P.checkpoint, P.reference), out, load, provenance=manifest,
        forwarded={P.checkpoint: hidden_dir(P, P.checkpoint)} if cache else {},
        overwrite=overwrite, key=lineage.tokens_key(P, P.checkpoint, P.reference, rollouts_sha),
        **engine_settings(P))


def force_checkpoints(P: Params, names: list[str], rollouts: pd.DataFrame,
                      selection: pd.DataFrame, problems: pd.DataFrame, rollouts_sha: str,
                      overwrite: bool = False) -> list[str]:
    """The token tables of several checkpoints at once: the reference's hidden states
    first (once, shared by all), then the checkpoints spread over the workers, one per
    worker at a time (10 checkpoints on 8 devices: two rounds). Each is forced exactly as
    its own run of notebook 03 would (its parameters, its rollouts); complete tables are
    kept. Returns the checkpoints forced now."""
    plans = {}
    for name in names:
        Pc = params.variant(P, name, P.overrides)
        seqs = sequences(Pc, choose(rollouts, selection, Pc), problems)
        if not storage.plan_reuse(forcing.pair_dir(P.suite, name, P.reference),
                                  table_key(Pc, seqs, name, P.reference, rollouts_sha), overwrite):
            plans[name] = (Pc, seqs)
    for Pc, seqs in {s.fingerprint(): (Pc, s) for Pc, s in plans.values()}.values():
        ensure_cached(Pc, P.reference, seqs)

    def task(share, state):
        for name in share:
            Pc, seqs = plans[name]
            run_checkpoint(Pc, seqs, None, rollouts_sha, overwrite)

    distributed.run_sharded(task, list(plans))
    return list(plans)


def extra_pairs(P: Params) -> list[tuple[str, str]]:
    """Configured pairs this run can complete: those with this checkpoint whose other
    model is already cached, and pairs of non-checkpoint models (e.g. DPO vs SFT)."""
    out = []
    for a, b in map(tuple, P.forcing.pairs):
        if P.checkpoint in (a, b) or not ({a, b} & set(P.steps)):
            out.append((a, b))
    return out


def run_cached_pairs(P: Params, seqs: forcing.SequenceSet, rollouts_sha: str,
                     overwrite: bool = False) -> list[Path]:
    """Every extra pair that can run now, from the two caches: no forward of a checkpoint."""
    done = []
    for a, b in extra_pairs(P):
        # Another checkpoint is forwarded only by its own run of 03: wait for its cache.
        if not all(is_cached(P, m, seqs) for m in (a, b) if m in P.steps and m != P.checkpoint):
            continue
        folder = forcing.pair_dir(P.suite, a, b)
        if storage.plan_reuse(folder, table_key(P, seqs, a, b, rollouts_sha), overwrite):
            print(f"reusing {folder}: complete, same inputs")
            done.append(folder)
            continue
        for name in (a, b):  # this checkpoint's own table may have been reused: no forward yet
            if name not in P.steps or name == P.checkpoint:
                ensure_cached(P, name, seqs)
        done.append(forcing.compare_cached(
            seqs, _side(P, a), _side(P, b), forcing.pair_dir(P.suite, a, b),
            provenance=_manifest(P, [a, b], seqs), overwrite=overwrite,
            key=lineage.tokens_key(P, a, b, rollouts_sha), **engine_settings(P)))
    return done

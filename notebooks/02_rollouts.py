# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Rollouts: the reference model's reasoning, token by token
#
# Teacher forcing (notebook 03) replays the reference model's own reasoning through every
# checkpoint, so we need that reasoning as the exact token ids the reference generated.
# For each selected problem and each control problem the reference writes several
# samples under a temperature schedule. Each sample has its own seed, derived from the
# run's seed, the problem id and the sample number, so any rollout can be regenerated
# on its own. Every rollout is graded and given a *failure type*: right, a boxed wrong
# answer, an empty box, no box (finished without one), or truncated at the token limit.
# Only a finished text is a wrong answer; an unfinished one is not forced by default.

# %%
from typing import Optional

from rlprobe_nb import import_rollouts, statistics, views
from rlprobe_nb.generation import rollouts
from rlprobe_nb.problems import grading
from rlprobe_nb.problems import sources as problem_sources
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import lineage, provenance, schemas, storage

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
n_per_problem: Optional[int] = None  # rollouts of the reference per problem (default: rollouts.n_per_problem)
max_new_tokens: Optional[int] = None  # rollout length limit, tokens (default: rollouts.max_new_tokens)
overwrite: bool = False  # recompute tables computed from other inputs (without it they are refused, naming what changed)

# %% [markdown]
# Parameters come from `params/<suite>/suite.yaml`; the cell above only overrides them.
# The problems and the selection written by 01 are read only if they are current: a
# change of their inputs since (a model, a problem, a threshold) stops here, naming it.

# %%
params.check_notebook_parameters(globals())
P = params.load(suite=suite, overrides={
    "rollouts.n_per_problem": n_per_problem, "rollouts.max_new_tokens": max_new_tokens})
R = P.rollouts
PROBLEMS, PROBLEMS_SHA = lineage.read_current(P, "problems")
SELECTION, SELECTION_SHA = lineage.read_current(P, "selection")
KEY = lineage.rollouts_key(P, SELECTION_SHA, PROBLEMS_SHA)
MANIFEST = provenance.manifest(P, seeds={"rollouts": R.seed}, grader=grading.grader_info(),
                               extra={"producer": lineage.PRODUCERS["rollouts"]})
print(f"suite {P.suite}: {R.n_per_problem} rollouts per problem from {P.reference!r}, "
      f"temperatures {R.temperatures} (cycled), up to {R.max_new_tokens} new tokens, "
      f"source {R.source!r}")

# %% [markdown]
# ## Which problems
#
# The groups chosen in 01: problems where the reference failed and the target succeeded,
# and the control problems where it was the other way round.

# %%
CHOSEN = SELECTION[SELECTION["group"].isin(["selected", "control"])]
TODO = PROBLEMS[PROBLEMS["problem_id"].isin(CHOSEN["problem_id"])]
if TODO.empty:
    raise ValueError(f"no selected or control problems in the selection of suite {P.suite!r}: "
                     "loosen the filtering thresholds or add problems, then rerun 01")
CHOSEN["group"].value_counts().rename("problems").to_frame()

# %% [markdown]
# ## Sampling
#
# The rollouts table keeps the prompt ids (the chat template with its generation prompt),
# the response ids exactly as generated — the end-of-sequence token included when the
# model stopped, nothing after it — the decoded text, temperature, seed, why generation
# ended, the grade and the failure type. Shards are written as they finish; a rerun with
# the same inputs recomputes nothing.
#
# With `rollouts.source: prior` the reference's responses are imported instead, from an
# earlier run's `filtered_problems.json` (`rollouts.prior_path`): they are regraded, tokenized on their own (no special tokens added;
# special-token text in them stays text and is flagged), and marked
# `token_method = "text"`, `finish_reason = "imported"`. Empty responses are set aside
# and counted.

# %%
if R.source == "generate":
    ROLLOUTS = rollouts.sample_to_table(
        paths.table_dir(P.suite, "rollouts"), schemas.ROLLOUTS, [P.reference],
        lambda name: models.load_model(name, P), TODO, template=P.prompt_template,
        n_per_problem=R.n_per_problem, temperatures=R.temperatures,
        max_new_tokens=R.max_new_tokens, seed=R.seed, batch_size=R.batch_size,
        timeout_s=P.grading.timeout_s, workers=P.grading.workers, manifest=MANIFEST,
        key=KEY, overwrite=overwrite, compile_decode=P.runtime.compile_decode)

# %% [markdown]
# An import is regraded, and every verdict that differs from the one stored with the
# imported responses is listed.

# %%
if R.source == "prior":
    PRIOR = problem_sources.read_prior_responses(paths.resolve(R.prior_path))
    PRIOR = PRIOR[PRIOR["problem_id"].isin(TODO["problem_id"])]
    IMPORTED, DISAGREE = problem_sources.regrade_prior(PRIOR, PROBLEMS, P.reference,
                                                P.grading.timeout_s, P.grading.workers)
    ROLLOUTS, SET_ASIDE = problem_sources.rollouts_from_text(
        IMPORTED, PROBLEMS, models.load_tokenizer(P.reference, P), P.prompt_template)
    storage.write_derived(paths.table_dir(P.suite, "rollouts"), ROLLOUTS, schemas.ROLLOUTS,
                          {**MANIFEST, "set_aside": SET_ASIDE.to_dict("records")}, KEY,
                          lineage.UNIQUE["rollouts"])
    print(f"{len(SET_ASIDE)} imported responses set aside, "
          f"{int((ROLLOUTS['flags'] != '').sum())} flagged")
    display(DISAGREE)  # noqa: F821  (IPython)

# %% [markdown]
# With `rollouts.source: imported` they are a training run's own samples, as
# `python -m rlprobe_nb.import_rollouts` wrote them (`rollouts.prior_path`: its parquet,
# graded, re-tokenized rows flagged): the rows of the selected problems are kept as they are.

# %%
if R.source == "imported":
    ROLLOUTS = import_rollouts.read_imported(paths.resolve(R.prior_path), TODO["problem_id"])
    storage.write_derived(paths.table_dir(P.suite, "rollouts"), ROLLOUTS, schemas.ROLLOUTS,
                          MANIFEST, KEY, lineage.UNIQUE["rollouts"])
    print(f"{len(ROLLOUTS)} imported rollouts of {ROLLOUTS.problem_id.nunique()} problems, "
          f"{int(ROLLOUTS['flags'].str.contains('retokenized').sum())} re-tokenized from text")

# %% [markdown]
# ## What the reference wrote
#
# Failure types by group of problem. A rollout cut off at `max_new_tokens` did not finish
# its reasoning: it is "truncated", not a wrong answer.

# %%
BY = ROLLOUTS.merge(SELECTION[["problem_id", "group"]], on="problem_id")
TYPES = BY.groupby(["group", "failure_type"]).size().unstack(fill_value=0)
TYPES

# %%
wrong = BY[~BY["correct"]]
print(f"Of {len(wrong)} wrong rollouts, {int((wrong.failure_type == 'truncated').sum())} were "
      f"cut off at {R.max_new_tokens} tokens and {int(wrong.failure_type.isin(['boxed_wrong', 'empty_box', 'no_box']).sum())} "
      f"finished ({int((wrong.failure_type == 'boxed_wrong').sum())} with a boxed wrong answer).")

# %% [markdown]
# The rate of right rollouts per group of problems, with 95% intervals (binomial, and a
# bootstrap over problems where it is informative: rollouts of one problem are not
# independent):

# %%
RATES = statistics.rate_table(BY, ["group"], seed=R.seed).round(3)
RATES.assign(boot_note=RATES.boot_note.str.replace("only 1 problems", "only 1 problem"))

# %% [markdown]
# How long the rollouts are, by failure type:

# %%
BY.groupby("failure_type")["n_tokens"].describe()[["count", "mean", "min", "max"]].round(1)

# %% [markdown]
# One finished wrong rollout, as text:

# %%
FINISHED = BY[BY["failure_type"].isin(["boxed_wrong", "empty_box", "no_box"])]
if len(FINISHED):
    r = FINISHED.iloc[0]
    answer = r["extracted"] if isinstance(r["extracted"], str) else "(none: the grader found no answer)"
    print(r["rollout_id"], "|", r["failure_type"], "| extracted:", answer)
    print(r["response"][:800])

# %% [markdown]
# The table `data/<suite>/rollouts` is complete, with its manifest and key; 03 reads it.

# %%
views.how_made({k: storage.read_manifest(paths.table_dir(P.suite, "rollouts"))[k]
                for k in ("rows", "key_sha")}, "The rollouts table")

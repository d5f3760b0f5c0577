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
# For each selected problem (and each control problem) the reference writes several
# samples under a temperature schedule. Each sample has its own seed, derived from the
# run's seed, the problem id and the sample number, so any rollout can be regenerated
# on its own. Every rollout is graded; the wrong ones are what 03 forces by default.

# %%
import pandas as pd

from rlprobe_nb import grading, models, params, paths, problems, provenance, rollouts
from rlprobe_nb import schemas, statistics, storage

# %% tags=["parameters"]
suite = None
checkpoint = None
n_per_problem = None
max_new_tokens = None
include_control = True
overwrite = False

# %% [markdown]
# Parameters come from `params/<suite>/suite.yaml`; the cell above only overrides them.

# %%
params.check_notebook_parameters(globals().get("In", []), [
    "suite", "checkpoint", "n_per_problem", "max_new_tokens", "include_control", "overwrite"])
P = params.load(suite=suite, checkpoint=checkpoint, overrides={
    "rollouts.n_per_problem": n_per_problem, "rollouts.max_new_tokens": max_new_tokens})
R = P.rollouts
PROBLEMS = storage.read_table(paths.table_dir(P.suite, "problems"))
SELECTION = storage.read_table(paths.table_dir(P.suite, "selection"))
GROUPS = ["selected", "control"] if include_control else ["selected"]
print(f"suite {P.suite}: {R.n_per_problem} rollouts per problem from {P.reference!r}, "
      f"temperatures {R.temperatures} (cycled), source {R.source!r}")

# %% [markdown]
# ## Which problems
#
# The groups chosen in 01: problems where the reference failed and the target succeeded,
# and the control problems where it was the other way round.

# %%
CHOSEN = SELECTION[SELECTION["group"].isin(GROUPS)]
TODO = PROBLEMS[PROBLEMS["problem_id"].isin(CHOSEN["problem_id"])]
CHOSEN["group"].value_counts().rename("problems")

# %% [markdown]
# ## Sampling
#
# The rollouts table keeps the prompt ids (the chat template with its generation prompt),
# the response ids exactly as generated — the end-of-sequence token included when the
# model stopped, nothing after it — the decoded text, temperature, seed, why generation
# ended, and the grade. Shards are written as they finish; a rerun recomputes nothing.
#
# With `rollouts.source: prior` the reference's responses are imported from the prior
# project instead: they are regraded, tokenized on their own (no special tokens added),
# and marked `token_method = "text"`, `finish_reason = "imported"`.

# %%
if TODO.empty:
    raise ValueError(f"no {GROUPS} problems in the selection of suite {P.suite!r}: "
                     "loosen the filtering thresholds or add problems, then rerun 01")
MANIFEST = provenance.manifest(P, seeds={"rollouts": R.seed}, grader=grading.grader_info(),
                               extra={"groups": GROUPS})
if R.source == "generate":
    ROLLOUTS = rollouts.sample_to_table(
        paths.table_dir(P.suite, "rollouts"), schemas.ROLLOUTS, [P.reference],
        lambda name: models.load_model(name, P), TODO, template=P.prompt_template,
        n_per_problem=R.n_per_problem, temperatures=R.temperatures,
        max_new_tokens=R.max_new_tokens, seed=R.seed, batch_size=R.batch_size,
        timeout_s=P.grading.timeout_s, workers=P.grading.workers, manifest=MANIFEST,
        overwrite=overwrite)

# %% [markdown]
# An import is regraded, and every verdict that differs from the one stored by the prior
# project is listed.

# %%
if R.source == "prior":
    PRIOR = problems.read_prior_responses(paths.resolve(R.prior_path))
    PRIOR = PRIOR[PRIOR["problem_id"].isin(TODO["problem_id"])]
    IMPORTED, DISAGREE = problems.regrade_prior(PRIOR, PROBLEMS, P.reference,
                                                P.grading.timeout_s, P.grading.workers)
    ROLLOUTS = problems.rollouts_from_text(
        IMPORTED, PROBLEMS, models.load_tokenizer(P.reference, P), P.prompt_template)
    problems.write_if_changed(paths.table_dir(P.suite, "rollouts"), ROLLOUTS,
                              schemas.ROLLOUTS, MANIFEST)
    display(DISAGREE)  # noqa: F821  (IPython)

# %% [markdown]
# ## What the reference wrote
#
# Wrong and right rollouts per group, with a 95% interval for the rate of right ones that
# resamples problems (rollouts of one problem are not independent).

# %%
BY = ROLLOUTS.merge(SELECTION[["problem_id", "group"]], on="problem_id")
statistics.rate_table(BY, ["group"], seed=R.seed).round(3)

# %%
BY.groupby(["group", "correct", "finish_reason"]).size().rename("rollouts").reset_index()

# %% [markdown]
# How long the rollouts are, and how they ended (a rollout cut at `max_new_tokens` has
# `finish_reason = "length"` and usually no boxed answer):

# %%
BY.groupby("group")["n_tokens"].describe()[["count", "mean", "min", "max"]].round(1)

# %% [markdown]
# One wrong rollout, as text:

# %%
WRONG = BY[~BY["correct"]]
if len(WRONG):
    r = WRONG.iloc[0]
    print(r["rollout_id"], "| extracted:", r["extracted"], "| method:", r["grade_method"])
    print(r["response"][:800])

# %% [markdown]
# The table `data/<suite>/rollouts` is complete, with its manifest; 03 reads it.

# %%
{k: storage.read_manifest(paths.table_dir(P.suite, "rollouts"))[k] for k in ("rows", "complete")}

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
# # 01 · Filtering: where the reference fails and the target succeeds
#
# We study tokens where RLVR training changed a model's reasoning, so we first need
# problems on which it made a difference. Both the reference model (the start of RL) and
# the target RLVR checkpoint answer every problem several times: once greedily and a few
# times by sampling. A problem is *selected* when the reference's pass rate is at most
# `ref_max_pass` and the target's at least `target_min_pass` (ties count: the rule is
# `<=` / `>=`); a *control* group holds the opposite case. One greedy sample never
# decides "wrong" on its own.

# %%
from typing import Optional

import pandas as pd

from rlprobe_nb import reporting, statistics, views
from rlprobe_nb.generation import rollouts
from rlprobe_nb.problems import filtering, grading
from rlprobe_nb.problems import sources as problem_sources
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import keys, lineage, provenance, schemas, storage

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
n_problems: Optional[int] = None  # read at most this many problems (default: problem_sources.limit in suite.yaml)
n_samples: Optional[int] = None  # sampled answers per model and problem, besides the greedy one (default: filtering.n_samples)
max_new_tokens: Optional[int] = None  # answer length limit, tokens (default: filtering.max_new_tokens)
overwrite: bool = False  # recompute tables computed from other inputs (without it they are refused, naming what changed)

# %% [markdown]
# Parameters come from `params/<suite>/suite.yaml`; the cell above only overrides them.
# Everything the notebook uses is derived here, once.

# %%
params.check_notebook_parameters(globals())
P = params.load(suite=suite, overrides={
    "problems.limit": n_problems, "filtering.n_samples": n_samples,
    "filtering.max_new_tokens": max_new_tokens})
REFERENCE, TARGET = P.reference, P.target
F = P.filtering
SCHEDULE = [0.0] + [F.temperature] * F.n_samples  # sample 0 is greedy
MANIFEST = dict(seeds={"filtering": F.seed}, grader=grading.grader_info(),
                extra={"producer": lineage.PRODUCERS["answers"]})
print(f"suite {P.suite}: reference {REFERENCE!r}, target {TARGET!r}, "
      f"{len(SCHEDULE)} answers per problem (greedy + {F.n_samples} at T={F.temperature})")

# %% [markdown]
# ## Problems
#
# The problem source, level and subject filters are set in the suite's parameters. Ids
# are the dataset's own `unique_id`s; the gold answer is the `answer` field, or the last
# `\boxed{}` of the solution, extracted by matching braces.

# %%
PROBLEMS = problem_sources.suite_problems(P)
PROBLEMS.groupby(["subject", "level"]).size().rename("problems").reset_index()

# %%
PROBLEMS_KEY = lineage.problems_key(P)
storage.write_derived(paths.table_dir(P.suite, "problems"), PROBLEMS, schemas.PROBLEMS,
                      provenance.manifest(P, **MANIFEST), PROBLEMS_KEY, lineage.UNIQUE["problems"])
PROBLEMS.head(3)

# %% [markdown]
# ## Answers
#
# Each model answers each problem with the chat template of `rlprobe_nb.suite.prompting`.
# Answers are graded by math-verify on the last `\boxed{}` only (no box: wrong), in
# worker processes with a timeout; model text is never evaluated. Shards are written as
# they finish, so an interrupted run resumes where it stopped; a table computed from other
# inputs (models, problems, sampling, grader) is refused unless `overwrite` is set.

# %%
ANSWERS_KEY = lineage.answers_key(P, keys.key_sha(PROBLEMS_KEY))
ANSWERS = rollouts.sample_to_table(
    paths.table_dir(P.suite, "answers"), schemas.ANSWERS, [REFERENCE, TARGET],
    lambda name: models.load_model(name, P), PROBLEMS, template=P.prompt_template,
    n_per_problem=len(SCHEDULE), temperatures=SCHEDULE, max_new_tokens=F.max_new_tokens,
    seed=F.seed, batch_size=F.batch_size, timeout_s=P.grading.timeout_s,
    workers=P.grading.workers, manifest=provenance.manifest(P, **MANIFEST),
    key=ANSWERS_KEY, overwrite=overwrite, compile_decode=P.runtime.compile_decode)
ANSWERS.groupby(["model", "failure_type"]).size().unstack(fill_value=0)

# %% [markdown]
# ## Pass rates
#
# Overall pass rate per model with 95% intervals. Wilson and Clopper–Pearson treat every
# answer as independent; answers to one problem are correlated, so a bootstrap over
# problems is shown beside them — where it can say anything: with every answer right or
# every answer wrong it collapses to a point, and then only the binomial intervals are
# reported (`boot_note` says why).

# %%
RATE_TABLE = statistics.rate_table(ANSWERS, ["model"], seed=F.seed)
RATE_TABLE.round(3)

# %% [markdown]
# Per problem, the greedy answer and all samples together:

# %%
RATES = filtering.pass_rates(ANSWERS)
RATES.pivot(index="problem_id", columns="model", values="pass_rate").round(2).head(12)

# %% [markdown]
# ## Selection
#
# The rule and its thresholds come from `filtering` in the suite's parameters. Every
# problem gets a group and the reason, with its counts.

# %%
SELECTION = filtering.select(
    ANSWERS, REFERENCE, TARGET, ref_max_pass=F.ref_max_pass,
    target_min_pass=F.target_min_pass, control_ref_min_pass=F.control_ref_min_pass,
    control_target_max_pass=F.control_target_max_pass)
filtering.counts(SELECTION)

# %%
SELECTION[SELECTION["group"] != "excluded"].head(10)

# %% [markdown]
# ## Is the target better than the reference?
#
# An exact McNemar test on the paired greedy verdicts: only problems where exactly one of
# the two models is right carry information.

# %%
GREEDY_TEST = filtering.greedy_mcnemar(SELECTION)
reporting.display_table(pd.DataFrame([GREEDY_TEST]))

# %% [markdown]
# ## Tables written
#
# `problems`, `answers` and `selection` under `data/<suite>/`, each with a manifest
# (parameters, models and their hashes, seeds, grader, package versions, git commit) and
# the key of everything its rows depend on.

# %%
storage.write_derived(
    paths.table_dir(P.suite, "selection"), SELECTION, schemas.SELECTION,
    provenance.manifest(P, seeds={"filtering": F.seed}, grader=grading.grader_info(),
                        extra={"producer": lineage.PRODUCERS["selection"],
                               "greedy_test": GREEDY_TEST}),
    lineage.selection_key(P, keys.key_sha(ANSWERS_KEY)), lineage.UNIQUE["selection"])
views.how_made({str(paths.relative(paths.table_dir(P.suite, t))): {
    k: storage.read_manifest(paths.table_dir(P.suite, t))[k] for k in ("rows", "key_sha")}
    for t in ("problems", "answers", "selection")}, "The tables of this chapter")

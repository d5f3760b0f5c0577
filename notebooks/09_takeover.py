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
# # 09 · Takeover: how few tokens carry RLVR's gain?

# %%
from IPython.display import Markdown

from rlprobe_nb import views

FINDING = views.finding_slot()  # the chapter's finding, written here once its tables are read

# %% [markdown]
# Chapters 04–08 read the reference's own rollouts. Here the reference *writes*: it
# answers held-out problems while a checkpoint runs in lock-step over the same text, and
# at each position a *criterion* scores the reference's draw. Where the score passes a
# threshold, the checkpoint's draw is written instead (both draws use the same seeded
# noise, so where the two models agree they draw the same token); elsewhere the
# reference's draw stands. Sweeping the threshold gives, per criterion, a curve of the
# share of positions taken over against the accuracy reached, between two ends measured
# from the same seeds: the reference alone and the checkpoint alone.
#
# Criteria: **Δlogp**, how strongly the checkpoint rejects the reference's draw
# (log p_ref − log p_ckpt of that token: the checkpoint vetoes it); **KL**(ref‖ckpt) at
# the position; the reference's **entropy**; chapter 05's **calibrated** statistic
# (how unusual the departure at the position is against the placebo run at the
# checkpoint's step, in either direction); and a seeded **random** coin at a matched
# rate, the null. Every curve is drawn for three RLVR steps and for the placebo at the
# last step (the same training with permuted rewards). The share of the checkpoint's
# gain recovered, (acc − acc_ref) / (acc_ckpt − acc_ref), says how much of what RLVR
# changed in the answers those few positions carry.

# %%
from typing import Optional

from IPython.display import display

from rlprobe_nb import reporting
from rlprobe_nb.problems import grading
from rlprobe_nb.problems import sources as problem_sources
from rlprobe_nb.readable import counted
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import provenance, suite_tables
from rlprobe_nb.takeover import calibrated, charts, curves, labels, narrative, sweep, table

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
checkpoints: Optional[list[str]] = None  # the checkpoints that take over (default: takeover.checkpoints, else RLVR steps 100, 400, the target and its placebo)
n_problems: Optional[int] = None  # the first problems of the suite's source (default: takeover.n_problems)
samples: Optional[int] = None  # responses per problem and rule (default: takeover.samples)
criteria: Optional[list[str]] = None  # delta_logp, kl, entropy, random, calibrated (default: takeover.criteria)
budgets: Optional[list[float]] = None  # shares of positions the thresholds aim at (default: takeover.budgets)
temperature: Optional[float] = None  # sampling temperature (default: takeover.temperature)
seed: Optional[int] = None  # seed of the responses (default: takeover.seed)
n_boot: int = 1000  # bootstrap resamples of problems for every interval (the index uses 1000)
overwrite: bool = False  # recompute tables computed from other inputs (without it they are refused, naming what changed)

# %% [markdown]
# The defaults are the suite's `takeover` section (`params/<suite>/suite.yaml`); a value
# given here overrides it and is checked against the same ranges. Everything else is
# derived here: the checkpoints, the problems, and each criterion's threshold per budget,
# the criterion's (1 − budget) quantile over the checkpoint's forced positions (chapter
# 03's token tables score every position exactly as the decoder does). The calibrated
# criterion first fits chapter 05's null model on the forced departures of the placebo
# at each checkpoint's step (the placebo's own curve: on itself).

# %%
params.check_notebook_parameters(globals())
given = {"checkpoints": checkpoints, "n_problems": n_problems, "samples": samples,
         "criteria": criteria, "budgets": budgets, "temperature": temperature, "seed": seed}
P = params.load(suite, overrides={f"takeover.{k}": v for k, v in given.items()})
T = P.takeover
CHECKPOINTS = sweep.check_checkpoints(P, T.checkpoints or sweep.default_checkpoints(P))
TARGET = P.target if P.target in CHECKPOINTS else CHECKPOINTS[-1]
PLACEBO = next((c for c in CHECKPOINTS if P.run_of(c) == "placebo"), None)
PROBLEMS = problem_sources.suite_problems(P, n=T.n_problems, limit=T.n_problems)
MAX_NEW = T.max_new_tokens or P.filtering.max_new_tokens
NULLS = [calibrated.null_for(P, c) for c in CHECKPOINTS] if "calibrated" in T.criteria else []
TOKENS = suite_tables.read_tokens(P, [(c, P.reference) for c in dict.fromkeys(CHECKPOINTS + NULLS)])
SCORERS, NULL_USED = calibrated.scorers(P, TOKENS, CHECKPOINTS) if NULLS else ({}, None)
THRESHOLDS = sweep.all_thresholds(TOKENS, CHECKPOINTS, T.criteria, T.budgets, SCORERS)
figures = paths.figures_dir(P.suite)
print(f"suite {P.suite!r}: the reference {P.reference!r} writes; {', '.join(CHECKPOINTS)} take "
      f"over; {counted(len(PROBLEMS), 'problem')} x {counted(T.samples, 'sample')} at "
      f"T = {T.temperature}, at most {MAX_NEW} new tokens; criteria {T.criteria} at budgets "
      f"{T.budgets}")
if NULL_USED is not None:
    print("the calibrated criterion standardises each checkpoint against "
          + "; ".join(f"{r.checkpoint}: {r.why}" for r in NULL_USED.itertuples()))
THRESHOLDS.pivot_table(index=["criterion", "budget"], columns="checkpoint", values="threshold")

# %% [markdown]
# ## The cost, before anything is sampled
#
# Each checkpoint writes, per problem and sample, one response for every rule (the two
# ends and every criterion at every budget). Rules that write the same text share it:
# the decoder holds a tree of distinct prefixes per request and forwards each once
# through both models, so the cost is the distinct texts, a few per request, not the
# rules.

# %%
n_rules = 2 + len(T.criteria) * len(T.budgets)
n_requests = len(PROBLEMS) * T.samples
print(f"to write: {n_requests * n_rules * len(CHECKPOINTS):,} responses "
      f"({counted(n_requests, 'request')} x {counted(n_rules, 'rule')} x "
      f"{counted(len(CHECKPOINTS), 'checkpoint')}), each request's rules sharing their "
      f"common prefixes: {n_requests * len(CHECKPOINTS):,} prompts and responses of up to "
      f"{MAX_NEW} tokens through both models if no rule split from the reference's text, "
      "and the rest of a text for every split")

# %% [markdown]
# ## Writing and grading
#
# The `takeover` table is keyed on the token tables the thresholds came from and on
# everything else its rows depend on (models, problems, rules, samples, temperature,
# limits, seed, grader): the same inputs reuse it, other inputs are refused unless
# `overwrite=True`. An interrupted run resumes from its finished shards.

# %%
sampling = dict(samples=T.samples, temperature=T.temperature, max_new_tokens=MAX_NEW,
                stop_at_box=T.stop_at_box, seed=T.seed)
settings = table.takeover_settings(P, CHECKPOINTS, THRESHOLDS, PROBLEMS, **sampling)
manifest = provenance.manifest(P, seeds={"seed": T.seed}, grader=grading.grader_info(),
                               extra={"checkpoints": CHECKPOINTS})
TAKE = table.run_takeover(P, CHECKPOINTS, THRESHOLDS, PROBLEMS,
                          lambda name: models.load_model(name, P), settings, manifest,
                          batch_rows=T.batch_rows, overwrite=overwrite, scorers=SCORERS,
                          **sampling)
print(f"{len(TAKE):,} responses written and graded, "
      f"{TAKE.drop_duplicates(['checkpoint', 'problem_id', 'sample', 'response']).shape[0]:,} "
      f"of them distinct; {reporting.fmt(TAKE.n_tokens.mean())} tokens on average")
TAKE.groupby(["checkpoint", "criterion"]).agg(responses=("correct", "size"),
                                              accuracy=("correct", "mean"))

# %% [markdown]
# ## The curves
#
# Per checkpoint and rule: the accuracy, the share of positions taken over and of those
# changed, and the share of the checkpoint's own gain recovered, each with a 95%
# interval over problems (resampled together for all rules and checkpoints). Where a
# checkpoint's own gain is not above zero there is no gain to recover (the placebo's
# row says so); `of_target` measures every rule against the target's gain instead.
# A position taken over changes the text only where the checkpoint's draw differs from
# the reference's (`share_changed`): past the budget at which a criterion has taken over
# every such position, a larger budget adds positions where both draw the same token.

# %%
CURVES = curves.curve_table(TAKE, TARGET, n_boot=n_boot, seed=T.seed)
print("\n".join(narrative.end_lines(CURVES)))
reporting.with_interval_text(CURVES, "recovered", "recovered_low", "recovered_high",
                             "problems", signed=True)[
    ["checkpoint", "criterion", "budget", "share_taken", "share_changed", "acc", "recovered",
     "of_target"]]

# %%
display(views.show(charts.curve_chart(CURVES, "acc", title="accuracy against the share of "
                                      "positions taken over"),
                   save_as=figures / "09_takeover_accuracy"))

# %%
GAINING = CURVES[(CURVES.run == "rlvr") & CURVES.recovered.notna()]
if len(GAINING):
    display(views.show(charts.curve_chart(GAINING, "recovered",
                                          title="share of each checkpoint's gain recovered"),
                       save_as=figures / "09_takeover_recovered"))
else:
    print("no RLVR checkpoint gains over the reference on these problems: no gain to recover")

# %% [markdown]
# ## Where each criterion spends its budget
#
# On the checkpoint's forced positions (the reference's own rollouts, chapter 03), the
# positions above each threshold: at how many of them the checkpoint's own first choice
# is the token written (taking over there changes nothing) and how many are endorsements
# (the checkpoint raised that token's probability). A criterion that scores departures in
# both directions spends much of its budget where the checkpoint agrees with the draw.

# %%
SPENT = sweep.budget_spent(TOKENS, THRESHOLDS, SCORERS)
print("\n".join(narrative.budget_lines(SPENT, TARGET)))
SPENT

# %% [markdown]
# ## How few positions: the headline
#
# The share of positions at which Δlogp-chosen takeover by the target recovers half and
# nine tenths of its gain (read off its curve between measured points), and at that same
# share what random takeover recovers and what the placebo's Δlogp takeover reaches
# (over the target's gain), each with a 95% interval over problems.

# %%
HEADLINE = curves.headline(TAKE, TARGET, PLACEBO, n_boot=n_boot, seed=T.seed)
print("\n".join(narrative.headline_lines(HEADLINE)))
HEADLINE

# %% [markdown]
# ## What was taken over
#
# Chapter 04's ground-truth label of every position where a rule changed the token (the
# checkpoint's draw written instead of the reference's), read on the final text: are the
# few positions that carry the gain the arithmetic the demo was built to change? RLVR
# beside the placebo, per criterion and budget, against two bases: every position the
# reference writes alone, and every position where the checkpoint's draw differs from the
# reference's (rule "always": what any criterion picks its changes from). The share of
# arithmetic has a 95% interval over problems (none from fewer than five).

# %%
tokenizer = models.load_tokenizer(P.reference, P)
LABELLED = labels.changed_labels(TAKE[~TAKE.criterion.isin(["never"])], tokenizer)
SHARES = labels.label_shares(LABELLED)
BASE = labels.position_shares(TAKE[TAKE.criterion == "never"], tokenizer)
ARITHMETIC = labels.arithmetic_share(LABELLED, seed=T.seed)
print("\n".join(narrative.label_lines(ARITHMETIC, TARGET, PLACEBO, BASE)))
SHARES

# %%
if len(SHARES):
    display(views.show(charts.label_chart(SHARES[SHARES.checkpoint.isin([TARGET, PLACEBO])],
                                          title="labels of the changed positions"),
                       save_as=figures / "09_takeover_labels"))

# %% [markdown]
# ## The answer
#
# The sentence below is read from the tables above.

# %%
ANSWER = narrative.finding(HEADLINE, CURVES, ARITHMETIC, TARGET, PLACEBO, BASE)
FINDING.update(Markdown(ANSWER))
print(ANSWER)

# %% [markdown]
# ## What the scaled run adds
#
# The demo sweeps a size its time allows. `params/demo_scaled` (and `params/tulu3`) run
# the same chapter with at least 500 problems, several samples per problem and every
# step's checkpoint, so the curves' intervals narrow and the share of positions that
# carries the gain can be compared across training.

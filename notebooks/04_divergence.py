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
# # 04 · Divergence: how much, where and when each checkpoint departs from the reference
#
# Notebook 03 wrote one exact per-token table per checkpoint: at every token of the
# reference's forced rollouts, how each checkpoint's next-token distribution differs from
# the reference's. This chapter reads all of them at once and answers the book's question
# in aggregate: does the divergence grow with RL steps, is it carried by a few tokens or
# by all, where in the response and on which kinds of token does it sit, does it sit where
# the reference was unsure, and what do the sampled-token KL estimators that RL trainers
# use make of it.
#
# Two directions of KL appear throughout, always named in words:
# **KL(ref‖ckpt)**, how surprised the checkpoint is by what the reference would write,
# and **KL(ckpt‖ref)**, how surprised the reference is by what the checkpoint would write.
# **Δlogp** is the signed change of the log-probability of the token the reference
# actually wrote (negative: the checkpoint rejects it).
#
# Every mean comes with a 95% interval from a *paired cluster bootstrap over problems*:
# tokens of one problem are correlated, so whole problems are resampled, and the same
# resampled problems are used at every step, so the change from one step to the next has
# its own interval. The first response token is left out (its prediction depends on the
# prompt alone and repeats across rollouts) and shown on its own with EOS.

# %%
from typing import Optional

from IPython.display import Markdown, display

from rlprobe_nb import views
from rlprobe_nb.divergence import charts, summary, token_categories
from rlprobe_nb.divergence import entropy_concentration as entropy
from rlprobe_nb.divergence import estimator_lab as lab
from rlprobe_nb.suite import params, paths
from rlprobe_nb.tables import lineage, suite_tables

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
group: str = "target"  # the rollouts described: target, ref_right or control
seed: int = 0  # seed of the bootstrap over problems

# %%
params.check_notebook_parameters(globals())
P = params.load(suite)
TOKENS = suite_tables.read_tokens(P)
TOKENS = TOKENS[TOKENS.reference == P.reference]
ACCURACY = suite_tables.accuracy_table(P)
FIGURES = paths.figures_dir(P.suite)
print(f"suite {P.suite!r}: {TOKENS.checkpoint.nunique()} checkpoints against {P.reference!r}, "
      f"{len(TOKENS)} token rows, {TOKENS.rollout_id.nunique()} rollouts, "
      f"{TOKENS.problem_id.nunique()} problems")

# %% [markdown]
# ## What was forced
#
# The token rows per group of rollouts and failure type at each step: the target group
# (the reference's wrong rollouts of problems the RL target solves) and its contrasts,
# the reference's right rollouts of the same problems and the rollouts of control
# problems.

# %%
TOKENS.groupby(["group", "failure_type", "step"]).size().unstack("step", fill_value=0)

# %% [markdown]
# ## When: divergence against RL step
#
# The mean per token of each divergence at each checkpoint, the reference at step 0, a
# thin grey line per problem behind the means, and below it the checkpoints' accuracy.

# %%
WHEN = summary.when_table(TOKENS, seed=seed)
PER_PROBLEM = summary.per_problem_means(TOKENS)
CHANGES = summary.step_changes(TOKENS, seed=seed)
views.show(charts.when_chart(WHEN, PER_PROBLEM, group, accuracy=ACCURACY),
           save_as=FIGURES / "04_when")

# %%
Markdown(charts.say_when(WHEN, CHANGES, group))

# %% [markdown]
# The change of each mean from one step to the next, on the tokens forced at both, with
# its own interval (the first row is the change from the reference):

# %%
charts.changes_for_display(CHANGES, group)

# %% [markdown]
# Is this specific to the reference's wrong reasoning? The same mean for the contrast
# groups: if the right rollouts and the control problems move as much, RL changed the
# model's text in general, not its wrong reasoning in particular.

# %%
views.show(charts.group_contrast_chart(WHEN), save_as=FIGURES / "04_groups")

# %% [markdown]
# ## Tails: a few tokens or all of them?
#
# The distribution of KL(ref‖ckpt) per token at each step (values below 1e-6 nats, within
# float32 rounding of 0, drawn at the floor), and its upper quantiles and share above
# 1 nat with intervals.

# %%
ECDF = summary.ecdf_table(TOKENS)
TAILS = summary.tail_table(TOKENS, seed=seed)
views.show(charts.ecdf_chart(ECDF, group), save_as=FIGURES / "04_ecdf")

# %%
display(views.show(charts.tails_chart(TAILS, group), save_as=FIGURES / "04_tails"))
Markdown(charts.say_tails(TAILS, group))

# %% [markdown]
# ## Where in the response
#
# By relative position (deciles of the response), by absolute position (doubling bins),
# and the first response token and EOS on their own.

# %%
POSITION = summary.position_table(TOKENS, seed=seed)
views.show(charts.position_chart(POSITION, group), save_as=FIGURES / "04_position")

# %% [markdown]
# ## Which kinds of token
#
# Every token gets a category from its place in the response text (a sub-word belongs to
# its word; a digit is an operand, the result of a written operation or part of the
# final answer; `token_categories` lists the rules). The heatmap shows the mean Δlogp per
# category and step: red where the checkpoint gives the reference's tokens less
# probability.

# %%
ROLLOUTS, _ = lineage.read_current(P, "rollouts")
TEXTS = dict(zip(ROLLOUTS.rollout_id, ROLLOUTS.response))
CATEGORY = token_categories.classify(TOKENS, texts=TEXTS)
CATEGORIES = summary.category_table(TOKENS, CATEGORY, seed=seed)
views.show(charts.category_heatmap(CATEGORIES, group), save_as=FIGURES / "04_categories")

# %%
display(views.show(charts.category_share_chart(CATEGORIES, group),
                   save_as=FIGURES / "04_category_shares"))
Markdown(charts.say_categories(CATEGORIES, group))

# %% [markdown]
# ## Where the reference was unsure
#
# KL and the change of entropy by decile of the reference's entropy, and the share of all
# KL carried by the 20% highest-entropy positions against two baselines: the same values
# shuffled within each problem (grey; what the marginal distribution gives by chance) and
# the share a uniform small nudge to every logit would give (orange; high-entropy
# positions can move more, so some concentration is mechanical).

# %%
DECILES = entropy.entropy_decile_table(TOKENS, seed=seed)
SHARE = entropy.high_entropy_share(TOKENS, seed=seed)
views.show(charts.entropy_chart(DECILES, group), save_as=FIGURES / "04_entropy")

# %%
display(views.show(charts.concentration_chart(SHARE, group), save_as=FIGURES / "04_concentration"))
Markdown(charts.say_concentration(SHARE, group))

# %% [markdown]
# ## Are the same tokens changing all along?
#
# Spearman's rank correlation of the per-token KL(ref‖ckpt) between every two steps.

# %%
SIMILARITY = summary.step_similarity(TOKENS, seed=seed)
views.show(charts.similarity_heatmap(SIMILARITY, group), save_as=FIGURES / "04_similarity")

# %% [markdown]
# ## The estimator lab
#
# RL trainers such as verl and TRL penalise KL with the sampled-token estimators k1, k2,
# k3 of the written token. Here the tokens were sampled from the reference at each
# rollout's temperature T, so k1 and k3 estimate KL(ref‖ckpt) only at T = 1; at T ≠ 1 their
# mean targets KL(q_T‖ckpt) − KL(q_T‖ref) instead (q_T: the reference at temperature T),
# and none of them estimates KL(ckpt‖ref). Bias per token by temperature, in both
# directions:

# %%
LAB = lab.estimator_table(TOKENS, seed=seed)
display(views.show(charts.estimator_bias_chart(LAB, group), save_as=FIGURES / "04_estimator_bias"))
Markdown(charts.say_estimators(LAB, group))

# %%
SCATTER = lab.estimator_scatter(TOKENS, seed=seed)
views.show(charts.estimator_scatter_chart(SCATTER, "k3", "kl_ref_ckpt"),
           save_as=FIGURES / "04_estimator_scatter")

# %% [markdown]
# Is the bias the temperature? Reweighting each token by q(x)/q_T(x) turns tempered samples
# back into samples of the reference (bounded, since the table keeps only its top-k
# probabilities): the reweighted means should meet the exact mean where the plain ones
# miss it.

# %%
REWEIGHTED = lab.reweighted_table(TOKENS, seed=seed)
REWEIGHTED[REWEIGHTED.group == group].drop(columns="group").round(4)

# %% [markdown]
# What a verl or TRL user should take from this: a KL penalty computed from tokens sampled
# at T ≠ 1 and scored with untempered log-probabilities does not estimate the KL it is
# named for; the table above gives the size of the gap per temperature for this suite.
# A trainer that divides the logits by T before scoring estimates the KL between the
# tempered distributions instead, which is a different quantity again.
#
# ## The tables
#
# Every aggregate above is written under `data/<suite>/` with its schema and a manifest.

# %%
written = summary.write_aggregates(P, {
    "divergence_when": WHEN, "divergence_per_problem": PER_PROBLEM,
    "divergence_changes": CHANGES, "divergence_ecdf": ECDF, "divergence_tails": TAILS,
    "divergence_position": POSITION, "divergence_categories": CATEGORIES,
    "divergence_similarity": SIMILARITY, "entropy_deciles": DECILES, "entropy_share": SHARE,
    "estimator_lab": LAB, "estimator_reweighted": REWEIGHTED},
    seed=seed, settings={"group": group},
    extra={"token_rows": len(TOKENS), "checkpoints": sorted(TOKENS.checkpoint.unique())})
print("\n".join(str(folder) for folder in written))

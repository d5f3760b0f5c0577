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

# %%
from rlprobe_nb import views

FINDING = views.finding_slot()  # the chapter's finding, written here once its tables are read

# %% [markdown]
# Notebook 03 wrote one exact per-token table per checkpoint: at every token of the
# reference's forced rollouts, how each checkpoint's next-token distribution differs from
# the reference's. This chapter reads all of them at once and answers the book's question
# in aggregate: does the divergence grow with RL steps, is it carried by a few tokens or
# by all, where in the response and on which kinds of token does it sit — a change of
# content (wrong result digits) or of format — does it sit where the reference was unsure,
# and what do the sampled-token KL estimators that RL trainers use make of it.
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
# its own interval. An interval needs `min_problems` problems (a parameter): with fewer,
# the estimate is printed with "too few problems" and no interval, and no claim that reads
# an interval ("excludes 0", "most", "meets") is made. The first response token is left
# out (its prediction depends on the prompt alone and repeats across rollouts) and shown
# on its own with EOS.
#
# Every aggregate is a table under `data/<suite>/`, keyed by the token tables, the
# chapter's code and its parameters: a rerun with nothing changed reads them back and
# says so in one line; after a change it refuses, naming what changed, until it is run
# with `-p overwrite True`.

# %%
from typing import Optional

from IPython.display import Markdown, display

from rlprobe_nb import reporting, views
from rlprobe_nb.divergence import charts, ground_truth, narrative, phases, summary, token_categories
from rlprobe_nb.divergence import entropy_concentration as entropy
from rlprobe_nb.divergence import estimator_lab as lab
from rlprobe_nb.suite import params, paths
from rlprobe_nb.tables import lineage, suite_tables

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
group: str = "target"  # the rollouts described: target, ref_right or control
seed: int = 0  # seed of the bootstrap over problems
min_problems: int = 5  # fewest problems an interval is printed from (fewer: the estimate alone)
overwrite: bool = False  # recompute tables computed from other inputs (without it they are refused, naming what changed)

# %%
params.check_notebook_parameters(globals())
P = params.load(suite)
reporting.use_min_clusters(min_problems)
TOKENS = suite_tables.read_tokens(P)
TOKENS = TOKENS[TOKENS.reference == P.reference]
ACCURACY = suite_tables.accuracy_table(P)
ROLLOUTS, _ = lineage.read_current(P, "rollouts")
TEXTS = dict(zip(ROLLOUTS.rollout_id, ROLLOUTS.response))
FIGURES = paths.figures_dir(P.suite)
print(f"suite {P.suite!r}: {TOKENS.checkpoint.nunique()} checkpoints against {P.reference!r}, "
      f"{len(TOKENS)} token rows, {TOKENS.rollout_id.nunique()} rollouts, "
      f"{TOKENS.problem_id.nunique()} problems; intervals from {min_problems} problems on")
TABLES = summary.chapter_tables(P, TOKENS, seed, min_problems, overwrite)

# %% [markdown]
# ## What was forced
#
# The token rows per group of rollouts and failure type at each step: the target group
# (the reference's wrong rollouts of problems the RL target solves), its contrasts (the
# reference's right rollouts of the same problems, the rollouts of control problems),
# and `t1_unselected`, rollouts sampled at temperature 1 whatever their outcome (the
# estimator lab's control, at the end of the chapter).

# %%
TOKENS.groupby(["group", "failure_type", "step"]).size().unstack("step", fill_value=0)

# %% [markdown]
# ## Two ways to label a token
#
# A *token category* says what kind of token a row is, from its place in the response
# text (a sub-word belongs to its word; a digit is an operand, the result of a written
# operation or part of the final answer; `token_categories` lists the rules). A
# *ground-truth label* says whether the arithmetic it belongs to is right: every
# statement the response writes (`47 + 38 = 85`) is verified with exact arithmetic, and
# a token is the first wrong character of a wrong result (`result_first_wrong`), part of
# a right result (`result_correct`), an operand, an operator, the final answer, format
# (boxes, `$`, step markers) or other text (`ground_truth` lists the rules). The second
# labelling tells a change of content from a change of format. How many problems carry
# each label (a label needs `min_problems` of them for an interval):

# %%
CATEGORY = token_categories.classify(TOKENS, texts=TEXTS)
LABEL = ground_truth.label(TOKENS, texts=TEXTS)
carried = TOKENS.assign(label=LABEL.astype(str)).query("group == @group").groupby(
    "label").agg(problems=("problem_id", "nunique"), rollouts=("rollout_id", "nunique"),
                 token_rows=("pos", "size"))
carried.sort_values("problems", ascending=False)

# %% [markdown]
# ## When: divergence against RL step
#
# The mean per token of each divergence at each checkpoint, the reference at step 0, a
# thin grey line per problem behind the means; below it the mean Δlogp of each
# ground-truth label (content apart from format), and the checkpoints' accuracy. Below
# the chart, which labels each significant change of the mean KL comes from: the
# contributions of a label's tokens add up to the change.

# %%
WHEN = TABLES.get("divergence_when", summary.when_table, TOKENS, seed=seed)
PER_PROBLEM = TABLES.get("divergence_per_problem", summary.per_problem_means, TOKENS)
CHANGES = TABLES.get("divergence_changes", summary.step_changes, TOKENS, seed=seed)
GROUND_TRUTH = TABLES.get("divergence_ground_truth", summary.category_table, TOKENS, LABEL,
                          seed=seed)
CONTRIBUTIONS = TABLES.get("divergence_change_by_label", phases.change_contributions, TOKENS,
                           LABEL, seed=seed)
views.show(charts.when_chart(WHEN, PER_PROBLEM, group, accuracy=ACCURACY,
                             ground_truth=GROUND_TRUTH), save_as=FIGURES / "04_when")

# %%
Markdown(narrative.say_when(WHEN, CHANGES, group) + "\n\n"
         + narrative.say_kl_and_accuracy(CHANGES, ACCURACY, CONTRIBUTIONS, GROUND_TRUTH, group))

# %% [markdown]
# Which kind of token changes from which step: per ground-truth label, the step from
# which its mean Δlogp moves away from 0 and stays on that side (the rule is printed
# with the result).

# %%
ONSETS = TABLES.get("divergence_onsets", phases.onsets, GROUND_TRUTH)
FINDING.update(Markdown(narrative.say_finding(WHEN, ONSETS, GROUND_TRUTH, group)))
Markdown(narrative.say_phases(ONSETS, group))

# %%
reporting.display_table(ONSETS[ONSETS.group == group].drop(columns="group"), {
    "Δlogp at that step [95% interval]": ("estimate", "low", "high", "problems",
                                          {"signed": True})}).replace({"onset_step": {-1: "–"}})

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

# %%
Markdown(narrative.say_group_verdict(WHEN, group))

# %% [markdown]
# ## The disagreement map: where the checkpoint would write another token
#
# A divergence is a shift of probability; a *disagreement* is where it changes the
# choice: the checkpoint's most probable token is another token than the one the
# reference wrote (not the same text up to whitespace and case: "\n" → "\n\n" is no
# disagreement). Chapter 08 branches at exactly these contexts and asks whether the
# checkpoint's choice decides the answer. Here, for every checkpoint, RLVR beside its
# placebo at each step, and for each label (first wrong digits, operands, operators,
# other tokens), the share of positions where it disagrees (interval: 95%, problems
# resampled), the share where its choice is not the reference's top-1 either, and where
# its choice ranks in the reference's top-k. The reference itself stands at step 0: the
# rollouts were sampled from it, so where it drew another token than its first choice
# it "disagrees" too; a checkpoint's share is read against that baseline.

# %%
from rlprobe_nb.divergence import disagreement
from rlprobe_nb.divergence import disagreement_charts
from rlprobe_nb.suite import models

tokenizer = models.load_tokenizer(P.reference, P)
BOTH_RUNS = suite_tables.read_tokens(P, [(c, P.reference) for c in P.forced],
                                     columns=disagreement.TOKEN_COLUMNS)
mine = BOTH_RUNS[BOTH_RUNS.group == group]
MARKED = disagreement.annotate(mine, disagreement.labels_for(mine, TOKENS, LABEL),
                               text_of=lambda i: tokenizer.decode([i]),
                               special=set(tokenizer.all_special_ids), reference=P.reference)
DISAGREEMENT = disagreement.map_table(
    MARKED, lambda c: "reference" if c == P.reference else P.run_of(c), seed=seed)
display(disagreement.display_frame(DISAGREEMENT, reporting.interval_text))
Markdown(disagreement.sentence(DISAGREEMENT, reporting.fmt, reporting.interval_text))

# %%
views.show(disagreement_charts.share_chart(DISAGREEMENT), save_as=FIGURES / "04_disagreement_map")

# %%
views.show(disagreement_charts.rank_chart(disagreement.rank_table(DISAGREEMENT)),
           save_as=FIGURES / "04_disagreement_ranks")

# %% [markdown]
# ## Tails: a few tokens or all of them?
#
# The distribution of KL(ref‖ckpt) per token at each step (values below 1e-6 nats, within
# float32 rounding of 0, drawn at the floor), and its upper quantiles and share above
# 1 nat with intervals.

# %%
ECDF = TABLES.get("divergence_ecdf", summary.ecdf_table, TOKENS)
TAILS = TABLES.get("divergence_tails", summary.tail_table, TOKENS, seed=seed)
views.show(charts.ecdf_chart(ECDF, group), save_as=FIGURES / "04_ecdf")

# %%
display(views.show(charts.tails_chart(TAILS, group), save_as=FIGURES / "04_tails"))
Markdown(narrative.say_tails(TAILS, group))

# %% [markdown]
# ## Where in the response
#
# By relative position (deciles of the response), by absolute position (doubling bins),
# and the first response token and EOS on their own.

# %%
POSITION = TABLES.get("divergence_position", summary.position_table, TOKENS, seed=seed)
views.show(charts.position_chart(POSITION, group), save_as=FIGURES / "04_position")

# %% [markdown]
# ## Which kinds of token
#
# The mean Δlogp per token category (left) and ground-truth label (right) at each step:
# red where the checkpoint gives the reference's tokens less probability; faded cells
# come from too few problems.

# %%
CATEGORIES = TABLES.get("divergence_categories", summary.category_table, TOKENS, CATEGORY,
                        seed=seed)
views.show(charts.category_heatmap(CATEGORIES, group, ground_truth=GROUND_TRUTH),
           save_as=FIGURES / "04_categories")

# %% [markdown]
# At the last step, each category's share of the tokens beside its share of all KL, and
# what the tables say about which kinds of token lose probability: "most" only where its
# differences to the runner-up and to every other category, paired over problems, exclude 0.

# %%
BOTH = TABLES.get("divergence_contrasts", phases.contrast_table, TOKENS, CATEGORY, LABEL,
                  seed=seed)
CONTRASTS, LABEL_CONTRASTS = (BOTH[BOTH.scheme == scheme]
                              for scheme in ("token_category", "ground_truth"))
display(views.show(charts.category_share_chart(CATEGORIES, group),
                   save_as=FIGURES / "04_category_shares"))
Markdown("**By token category.** " + narrative.say_categories(CATEGORIES, CONTRASTS, group)
         + "\n\n**By ground-truth label.** "
         + narrative.say_categories(GROUND_TRUTH, LABEL_CONTRASTS, group, "label"))

# %% [markdown]
# ## Where the reference was unsure
#
# KL and the change of entropy by decile of the reference's entropy, and the share of all
# KL carried by the 20% highest-entropy positions against two baselines: the same values
# shuffled within each problem (grey; what the marginal distribution gives by chance) and
# the share a uniform small nudge to every logit would give (orange; high-entropy
# positions can move more, so some concentration is mechanical). The observed share
# means something only where it exceeds both.

# %%
DECILES = TABLES.get("entropy_deciles", entropy.entropy_decile_table, TOKENS, seed=seed)
SHARE = TABLES.get("entropy_share", entropy.high_entropy_share, TOKENS, seed=seed)
views.show(charts.entropy_chart(DECILES, group), save_as=FIGURES / "04_entropy")

# %%
display(views.show(charts.concentration_chart(SHARE, group), save_as=FIGURES / "04_concentration"))
Markdown(narrative.say_concentration(SHARE, group))

# %% [markdown]
# ## Are the same tokens changing all along?
#
# Spearman's rank correlation of the per-token KL(ref‖ckpt) between every two steps.

# %%
SIMILARITY = TABLES.get("divergence_similarity", summary.step_similarity, TOKENS, seed=seed)
views.show(charts.similarity_heatmap(SIMILARITY, group), save_as=FIGURES / "04_similarity")

# %% [markdown]
# ## The estimator lab
#
# RL trainers such as verl and TRL penalise KL with the sampled-token estimators of the
# written token x, with r = ckpt(x) / ref(x): k1 = −log r, k2 = (log r)² / 2,
# k3 = r − 1 − log r. For x drawn from the reference itself (T = 1), the means of k1 and
# k3 are exactly KL(ref‖ckpt), and k2's agrees with it to second order. The rollouts
# here were sampled at temperature T, from q_T ∝ ref^(1/T), and then each mean targets
# something else (`estimator_lab` derives them):
#
# | estimator | mean over tokens drawn from q_T |
# |---|---|
# | k1 | KL(q_T‖ckpt) − KL(q_T‖ref) |
# | k2 | E_{q_T}[(log ckpt/ref)²] / 2 |
# | k3 | KL(q_T‖ckpt) − KL(q_T‖ref) + E_{q_T}[ckpt/ref] − 1 |
#
# so k3 carries a term of its own at T ≠ 1, and none of them estimates KL(ckpt‖ref).
# Two more things stand between these means and the exact KL in the target group: its
# rollouts were *selected* (finished and wrong), so they are not draws from q_T at all,
# and each temperature's rollouts come from different problems. The bias per token by
# temperature, in both directions:

# %%
LAB = TABLES.get("estimator_lab", lab.estimator_table, TOKENS, seed=seed)
display(views.show(charts.estimator_bias_chart(LAB, group), save_as=FIGURES / "04_estimator_bias"))
COUNTS = lab.temperature_problems(TOKENS)
Markdown(narrative.say_temperature_problems(COUNTS, group))

# %% [markdown]
# Which problems each temperature's rollouts come from (rollouts per problem), and, where
# enough problems have rollouts at every temperature, the bias by temperature on those
# problems only, so that temperature is not confounded with problem:

# %%
display(COUNTS[COUNTS.group == group].drop(columns="group").set_index("problem_id")
        .loc[:, lambda t: (t > 0).any()])
SAME = lab.same_problems(TOKENS[TOKENS.group == group])
if SAME.problem_id.nunique() >= min_problems:
    SAME_LAB = lab.estimator_table(SAME, seed=seed)
    display(reporting.display_table(SAME_LAB[
        (SAME_LAB.level == "token") & (SAME_LAB.target == "kl_ref_ckpt")
        & (SAME_LAB.step == SAME_LAB.step.max())][
        ["estimator", "temperature_label", "mean_estimate", "mean_exact", "bias", "low", "high",
         "problems", "rows"]], {"bias [95% interval]": ("bias", "low", "high", "problems",
                                                       {"signed": True})}))
else:
    print(f"{SAME.problem_id.nunique()} problems of group {group!r} have rollouts at every "
          f"temperature: too few (min_problems = {min_problems}) for the same-problem comparison")

# %%
SCATTER = lab.estimator_scatter(TOKENS, seed=seed)
views.show(charts.estimator_scatter_chart(SCATTER, "k3", "kl_ref_ckpt"),
           save_as=FIGURES / "04_estimator_scatter")

# %% [markdown]
# Is the bias the temperature? Reweighting each token by ref(x)/q_T(x) turns draws from
# q_T back into draws from the reference (bounded, since the table keeps only the top-k
# probabilities): on draws, the reweighted means meet the exact mean. Each row's verdict
# reads the interval of the reweighted mean's error over problems, widened by the
# weights' bounds:

# %%
REWEIGHTED = TABLES.get("estimator_reweighted", lab.reweighted_table, TOKENS, seed=seed)
shown_rows = REWEIGHTED[REWEIGHTED.group == group].drop(columns=["group", "checkpoint"])
display(reporting.display_table(shown_rows, {
    "reweighted error [95% interval, weights' bounds]": ("error_mid", "low", "high", "problems",
                                                          {"signed": True})},
    keep=()).drop(columns=["error_low", "error_high", "reweighted_low", "reweighted_high"]))
Markdown(narrative.say_estimators(LAB, REWEIGHTED, group))

# %% [markdown]
# ## The T = 1 check on unselected rollouts
#
# Where the answer is known: the `t1_unselected` rollouts were sampled from the
# reference at T = 1 and forced whatever their outcome, so their tokens are plain draws
# from the reference. There the means of k1 and k3 must meet the exact KL(ref‖ckpt)
# within their intervals at every step; if they do not, the lab (or the tables) is wrong.
# The check is one claim about all its rows, so its intervals are simultaneous
# (Bonferroni over the rows: each at 1 − 0.05 / rows).

# %%
CHECK = lab.t1_check(TOKENS, seed=seed)
display(reporting.display_table(CHECK, {
    "bias [simultaneous interval]": ("bias", "low", "high", "problems", {"signed": True})}))
Markdown(narrative.say_t1_check(CHECK))

# %% [markdown]
# What a verl or TRL user should take from this: a KL penalty computed from tokens sampled
# at T ≠ 1 and scored with untempered log-probabilities does not estimate the KL it is
# named for; the target of each estimator is in the table above, and this suite's bias per
# temperature in the chart. A trainer that divides the logits by T before scoring
# estimates the KL between the tempered distributions instead, which is a different
# quantity again.
#
# ## The tables
#
# Every aggregate above is a table under `data/<suite>/`, with its schema and a manifest
# that records what it was computed from.

# %%
views.how_made([str(paths.relative(folder)) for folder in TABLES.folders.values()],
               "The tables of this chapter")

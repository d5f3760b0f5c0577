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
# # 05 · Spikes: at which tokens, and when, does a checkpoint break from the reference?

# %%
from rlprobe_nb import views

FINDING = views.finding_slot()  # the chapter's finding, written here once its tables are read

# %% [markdown]
# A *spike* is a context at which a checkpoint departs from the reference far more than
# it would have for no reason that has to do with the reward. Every checkpoint differs
# from the reference a little everywhere, and more where the reference itself was unsure,
# so "far more" needs a null: a description of how large the departure is at a context
# *without* the reward's information. We test every distinct context of the forced text
# against that null, control the false discovery rate with Benjamini–Hochberg, ignore
# changes too small to matter, say which way each spike goes relative to the token the
# reference wrote, measure how large a change the test can find in this suite's own
# tables, and follow every spike, and every kind of token, across the training steps.
#
# What the chapter computes is kept in tables under `data/<suite>/`, keyed by the token
# tables, the chapter's code and its parameters: a rerun with nothing changed reads them
# back and says so in one line; after a change it refuses, naming what changed, until it
# is run with `-p overwrite True`.

# %%
from typing import Optional

from IPython.display import Markdown

from rlprobe_nb import views
from rlprobe_nb.spikes import (
                                  across_steps,
                                  chapter,
                                  charts,
                                  external,
                                  narrative,
                                  onsets,
                                  placebo_plants,
                                  plants,
                                  spike_rates,
                                  summary,
                                  table,
                                  verdicts,
)
from rlprobe_nb.render import viewer_links
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import suite_tables

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
q: float = 0.05  # false discovery rate of the test (Benjamini-Hochberg, per checkpoint)
min_effect: float = 0.1  # smallest divergence that can be a spike, nats
divergence: str = "jeffreys"  # the divergence tested: jeffreys (KL both ways summed), kl_ref_ckpt, kl_ckpt_ref or js
group: str = "target"  # the group whose tokens the onsets by label read: target, ref_right or control
n_top: int = 12  # rows of the tables of strongest spikes and departures
plants_per_size: int = 10  # plants of each size in a checkpoint's table, per run of the plant check
plant_runs: int = 2  # runs of the plant check per checkpoint (each with its own plants)
seed: int = 0  # of the cross-fitting folds, the plants, the bootstrap and the calibration splits
overwrite: bool = False  # recompute tables computed from other inputs (without it they are refused, naming what changed)

# %%
params.check_notebook_parameters(globals())
P = params.load(suite)
TOKENS = suite_tables.read_tokens(P)
TOKENS = TOKENS[TOKENS.reference == P.reference].reset_index(drop=True)
PLACEBO, NULLS, NULL_USED = external.suite_nulls(P, list(TOKENS.checkpoint.unique()))
VOCAB = models.vocabulary(P.reference, P)
figures = paths.figures_dir(P.suite)
print(f"suite {P.suite!r}: {TOKENS.checkpoint.nunique()} checkpoints vs {P.reference!r}, "
      f"{len(TOKENS)} rows, {TOKENS.problem_id.nunique()} problems; BH at q = {q}, spikes of "
      f"at least {min_effect} nats ({divergence}); {len(P.placebos)} placebo checkpoints")
TABLES = chapter.chapter_tables(P, TOKENS, NULL_USED, {
    "q": q, "min_effect": min_effect, "divergence": divergence, "group": group, "seed": seed,
    "plants_per_size": plants_per_size, "plant_runs": plant_runs}, overwrite)

# %% [markdown]
# ## Which null
#
# **The external null** is used wherever the suite has a placebo checkpoint at the same
# step: the same training, with the reward permuted within each batch, so it carries no
# information about correctness. Both were forced over the same contexts. A context is a
# spike when the checkpoint's departure there lies far beyond the placebo's departures at
# comparable contexts: a robust location and scale of the departure, given how sure the
# reference was there and of the written token, is fitted on the placebo; one statistic,
# T = the larger of the standardised divergence and the standardised change of the
# written token's log-odds (either way), is computed for both; the context's p-value is the
# placebo's share of contexts with a larger T, continued beyond the placebo's 95th
# percentile by a generalized Pareto tail fitted to every placebo T above its 80th
# percentile (its shape at the upper end of its 95% interval: the placebo's far tail is
# heavier than exponential early in training, and a lighter tail would call its own
# outliers spikes). Assumed: without the reward's information the checkpoint would depart
# like the placebo (the runs differ only in their reward).
#
# **The internal null** is the fallback where no placebo exists: the same model fitted on
# the checkpoint's *own* departures at other problems' contexts (cross-fitting by problem),
# one calibration of T. It assumes spikes are rare: where training changed the checkpoint
# everywhere, its null is as wide as those changes, and it finds only what lies beyond
# them. What each checkpoint was tested against:

# %%
Markdown(narrative.say_nulls(NULL_USED))

# %%
NULL_USED

# %% [markdown]
# ## The spikes per checkpoint

# %%
tests = TABLES.get("spike_tests", chapter.tests_table, TOKENS, P.suite, q=q,
                   min_effect=min_effect, divergence=divergence, seed=seed, nulls=NULLS)
SUMMARY = summary(tests)
SUMMARY

# %% [markdown]
# ## What "no spike" means here: plants in this suite's own tables
#
# At a few contexts of each checkpoint's own table (never a first response token, never
# a context shared by rollouts, never two within a few tokens), the checkpoint's
# probability of the written token is set to q(x)·e^d, q(x) the reference's, the other
# tokens rescaled together, and every metric of the row recomputed exactly from the row.
# Each planted table is tested as the checkpoint is, with the same null. Recall is the
# share of plants called spikes that reject the written token; "other per run" counts the
# spike contexts elsewhere in a planted table.

# %%
CHECK = TABLES.get("spike_plants", plants.plant_check, TOKENS, NULLS, sizes=(-1.0, -3.0),
                   n=plants_per_size, runs=plant_runs, seed=seed, q=q, min_effect=min_effect,
                   divergence=divergence)
CHECK

# %%
Markdown(narrative.say_power(CHECK, tests, q))

# %% [markdown]
# The same plants ranked against the checkpoint's real contexts: the share of real
# contexts whose p-value is larger than the plant's (1: every plant ranks above every real
# context). A high share with a low recall means the test orders departures right but
# the null's tail, read from this suite's data, is too wide for BH to reach them.

# %%
TABLES.get("spike_plant_ranks", plants.plant_ranks, TOKENS, NULLS, sizes=(-3.0,),
           n=plants_per_size, seed=seed, divergence=divergence)

# %% [markdown]
# ## Is the test calibrated here?
#
# If a null is right, p-values of contexts without a spike are uniform: a flat histogram,
# a QQ line on the diagonal. Two checks beside the data: a real table tested against
# itself (its problems split at random into two halves, each half the external null of
# the other, ten splits: nothing differs but the problems, so its p-values should be
# uniform; the placebo's own table where the suite has one), and the detector on a
# simulated null table of the same size and typical drift (nothing planted).

# %%
pvalues = TABLES.get("spike_calibration", chapter.calibration_pvalues, TOKENS, tests, NULLS,
                     q=q, divergence=divergence, seed=seed)
views.show(charts.calibration_chart(pvalues), save_as=figures / "05_calibration")

# %%
charts.calibration_table(pvalues)

# %% [markdown]
# ### Plants in the placebo's own table
#
# A placebo holds no information about correctness: tested as an RLVR checkpoint is
# tested, against a placebo's departures, it should give no spikes, and with rejections
# planted in it, the spikes should be the plants. The suite has one placebo run, so the
# placebo's null is the placebo on other problems: its problems split at random into two
# halves, each tested against the other, plants (the sizes and density above) in the
# tested half. "Other per split" counts the spikes outside the plants over both halves;
# "unplanted per split" the placebo's spikes with nothing planted, the placebo tested as
# if it were the RLVR run.

# %%
PLACEBO_PLANTS = TABLES.get("spike_placebo_plants", placebo_plants.placebo_plant_check, PLACEBO,
                            sizes=(-1.0, -3.0), n=plants_per_size, splits=plant_runs, seed=seed,
                            q=q, min_effect=min_effect, divergence=divergence)
table.shown(PLACEBO_PLANTS, "the suite has no placebo run")

# %%
Markdown(narrative.say_placebo_plants(PLACEBO_PLANTS, SUMMARY, q))

# %% [markdown]
# The share of spikes among the distinct contexts of each contrast group: the reference's
# wrong rollouts of the selected problems (`target`), its right rollouts of the same
# problems (`ref_right`) and the rollouts of the control problems (`control`). A rate no
# higher in the target group than in the contrasts is a change to the reference's text
# in general, not to its wrong reasoning. Intervals: bootstrap over problems.

# %%
RATES = spike_rates(tests, by="group")
RATES[["checkpoint", "step", "group", "contexts", "problems", "spikes", "spike rate"]]

# %%
Markdown(verdicts.say_group_rates(RATES))

# %% [markdown]
# ## When each kind of token changes
#
# Single contexts need a large change to be spikes; a whole kind of token pools every
# token of its kind. For each ground-truth label of the written arithmetic
# (`result_first_wrong`: the first wrong character of a wrong result; `result_correct`,
# `format`, ...) and each token category of chapter 04, the mean departure of the written
# tokens at each step, with a 95% interval over problems. The departure is Δlogp (nats),
# or, where the suite has a placebo at the step, Δlogp minus the placebo's Δlogp at the
# same token. The onset: the first step whose interval excludes 0 and whose sign every
# later step keeps. Under the accuracy curve:

# %%
LABELS = onsets.labels(TOKENS)
DEPARTURES = onsets.departures(TOKENS, PLACEBO if len(PLACEBO) else None)
BY_LABEL = TABLES.get("spike_label_departures", onsets.departure_table, DEPARTURES, LABELS,
                      group=group, seed=seed)
ONSETS = onsets.onsets(BY_LABEL)
accuracy = suite_tables.accuracy_table(P)
accuracy = accuracy[accuracy.model.isin([P.reference, *P.checkpoints])].rename(
    columns={"rate": "accuracy"})
views.show(charts.onset_chart(BY_LABEL, ONSETS, accuracy), save_as=figures / "05_label_onsets")

# %%
SEPARATION = onsets.accuracy_separation(accuracy.rename(columns={"accuracy": "rate"}), P.reference)
Markdown(narrative.say_onsets(ONSETS, SEPARATION, onsets.against_text(DEPARTURES)))

# %%
ONSETS

# %% [markdown]
# The same label context by context: of the first wrong digits at the last checkpoint,
# how many are spikes, and which way they move the digit that was written.

# %%
FIRST_WRONG = verdicts.first_wrong_spikes(tests, TOKENS, LABELS, group)
Markdown(verdicts.say_first_wrong(FIRST_WRONG))

# %% [markdown]
# ### The placebo run's own onsets
#
# The same table for the placebo run: its departures from the reference (no null
# subtracted), by label and step. The optimisation without the reward's information
# changes some tokens too (the format, the end of the answer); the labels of the
# arithmetic should have few or no onsets there. The count is read from both tables.

# %%
PLACEBO_BY_LABEL = TABLES.get("spike_placebo_departures", chapter.placebo_departure_table,
                              PLACEBO, group=group, seed=seed)
PLACEBO_ONSETS = onsets.onsets(PLACEBO_BY_LABEL) if len(PLACEBO_BY_LABEL) else PLACEBO_BY_LABEL
Markdown(narrative.say_run_onsets(ONSETS, PLACEBO_ONSETS) + "\n\n**Verdict.** In the placebo run, "
         + verdicts.say_placebo_verdict(ONSETS, PLACEBO_ONSETS))

# %%
FINDING.update(Markdown(verdicts.finding(ONSETS, PLACEBO_ONSETS, FIRST_WRONG, SEPARATION)))

# %%
table.shown(PLACEBO_ONSETS, "the suite has no placebo run")

# %% [markdown]
# ## The spikes table
#
# One row per context and written token that is a spike at one step or more, at every
# step: the steps where it is not a spike are its series. Its onset is the first step at
# which it is a spike and stays one, with the same sign, at every later step; it is
# *persistent* if it has an onset, *transient* if not, a *sign flip* if the checkpoint
# first took probability from the written token and later gave it (or the reverse).

# %%
spikes, spans = TABLES.get(("spikes", "spike_regions"), chapter.spikes_tables, TOKENS, tests,
                           VOCAB, P.suite)
table.persistence_counts(spikes)

# %% [markdown]
# ## Where the spikes sit, and when they appear
#
# Each dot is a spike at one step: its position in the response, its size the
# divergence, its colour what it does to the written token (rejects, endorses, or
# redistributes probability among other tokens). Below, the strongest persistent spikes
# ordered by onset (colour: Δlogp at each step; a dot where it is a spike), and how many
# persistent spikes begin at each step, under the accuracy curve.

# %%
views.show(charts.raster_chart(spikes), save_as=figures / "05_raster")

# %%
views.show(charts.onset_heatmap(spikes, n=40), save_as=figures / "05_onsets")

# %%
per_step = across_steps.new_persistent_per_step(spikes)
views.show(charts.new_persistent_chart(per_step, accuracy=accuracy),
           save_as=figures / "05_new_persistent")

# %% [markdown]
# ## The strongest spikes in context
#
# At the last checkpoint, the first response token left out (it depends on the prompt
# alone): the sentence around the token (in [brackets]), what it did to the written
# token, and the token the checkpoint moved probability to, with its probability under
# the reference (blank when outside the reference's top-k) and the checkpoint. Each row
# links to the viewer (chapter 07) at its token.

# %%
TOP = table.top_spikes(spikes, n=n_top)
Markdown(narrative.say_spikes(SUMMARY, len(TOP), n_top))

# %%
viewer_links.with_links(TOP) if len(TOP) else table.shown(TOP, "no spike at the last checkpoint")

# %% [markdown]
# What the detector ranks highest at the last checkpoint, spike or not: the contexts with
# the smallest p-values among departures of at least the spikes' minimum effect, with the
# q-value that says how far each is from significance. Where nothing is significant these
# are the candidates a larger suite would test with more power; chapter 06 then shows the
# strongest departures, labelled as such.

# %%
viewer_links.with_links(table.strongest_departures(tests, n=n_top, min_effect=min_effect))

# %% [markdown]
# Adjacent spikes merged into regions of text, for the case studies of chapter 06.

# %%
table.shown(spans.sort_values("max_divergence", ascending=False).head(n_top),
            "no spike, so no region of spikes")

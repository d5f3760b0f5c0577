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
#
# A *spike* is a response token at which a checkpoint departs from the reference far
# more than comparable tokens do. Every checkpoint differs from the reference a little
# everywhere, and more where the reference itself was unsure, so "far more" needs a null:
# a description of how large the departure is at a token *for no RL-specific reason*.
# We test every distinct context of the forced text against that null, control the false
# discovery rate with Benjamini–Hochberg, ignore changes too small to matter, say which
# way each spike goes relative to the token the reference wrote, and follow every spike
# across the training steps.

# %%
from rlprobe_nb import views
from rlprobe_nb.spikes import (
                                  across_steps,
                                  charts,
                                  detect,
                                  simulate,
                                  spike_rates,
                                  summary,
                                  table,
)
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import lineage, provenance, schemas, suite_tables

# %% tags=["parameters"]
suite: str | None = None
q: float = 0.05
min_effect: float = 0.1
divergence: str = "jeffreys"
n_top: int = 12

# %%
params.check_notebook_parameters(globals())
P = params.load(suite)
TOKENS = suite_tables.read_tokens(P)
TOKENS = TOKENS[TOKENS.reference == P.reference].reset_index(drop=True)
VOCAB = models.vocabulary(P.reference, P)
figures = paths.figures_dir(P.suite)
print(f"suite {P.suite!r}: {TOKENS.checkpoint.nunique()} checkpoints vs {P.reference!r}, "
      f"{len(TOKENS)} rows; BH at q = {q}, spikes of at least {min_effect} nats ({divergence})")

# %% [markdown]
# ## The test at one token
#
# Two things are measured at every context and combined into one test:
#
# - **how far the distribution moved**: by default the symmetric KL(ref‖ckpt) +
#   KL(ckpt‖ref), where KL(ref‖ckpt) is how surprised the checkpoint is by what the
#   reference would write and KL(ckpt‖ref) how surprised the reference is by what the
#   checkpoint would write;
# - **how far the written token's log-odds moved** under the checkpoint, in either
#   direction.
#
# The null for each is a robust regression on what makes tokens differ for no RL reason:
# the reference's own uncertainty there (log entropy, the gap between its top two
# probabilities, how concentrated its top-k is, and for the written token its reference
# log-probability), fitted per checkpoint (which absorbs the checkpoint's overall drift).
# Its assumptions: a smooth location and scale in those covariates; a common shape of
# the standardised value, read empirically in the bulk and continued by an exponential
# tail (which covers a power-law tail of the divergence); spikes rare enough not to
# move a redescending fit; and every token tested against a null fitted on *other
# problems* only (cross-fitting by problem), so no token calibrates itself. A context
# shared by several rollouts (their common prefix) is one test.

# %%
tests = detect(TOKENS, q=q, min_effect=min_effect, divergence=divergence)
summary(tests)

# %% [markdown]
# How much power the test has depends on how many contexts were forced: BH at level q
# over m tests needs the smallest p-value below q / m before anything is called, and a
# null read from the data cannot give p-values far below one over the number of
# contexts it was fitted on. The smallest p-value of each checkpoint against that bar:

# %%
power = tests.groupby("checkpoint", sort=False).agg(
    step=("step", "first"), tests=("n_tests", "first"), smallest_p=("p", "min"),
    smallest_q=("q", "min"), spikes=("significant", "sum")).sort_values("step")
power["bar (q / m)"] = q / power.tests
print(f"{int((power.spikes > 0).sum())} of {len(power)} checkpoints have a spike; the smallest "
      f"p-value over all is {power.smallest_p.min():.2g} against a bar of "
      f"{power['bar (q / m)'].min():.2g}.")
power

# %% [markdown]
# The same rate in the contrast groups: the reference's wrong rollouts of the selected
# problems (`target`), its right rollouts of the same problems (`ref_right`) and the
# rollouts of the control problems (`control`). A spike rate that is no higher in the
# target group than in the contrasts is a change to the reference's text in general, not
# to its wrong reasoning. Intervals: bootstrap over problems.

# %%
spike_rates(tests, by="group")

# %% [markdown]
# ## Is the test calibrated here?
#
# If the null is right, p-values of contexts without a spike are uniform: a flat
# histogram, a QQ line on the diagonal, with real spikes only in the lower-left bin and
# the upper-right of the QQ plot. Beside the real data, the same detector on a null table
# of the same size and typical drift (simulated distributions, nothing planted): what
# calibration looks like when nothing is there.

# %%
target = TOKENS[TOKENS.checkpoint == P.target]
null_tests = detect(simulate.null_like(target), q=q, min_effect=0.0, divergence=divergence)
pvalues = charts.pvalues_by_label(**{f"{P.target} (real)": tests[tests.checkpoint == P.target],
                                     "simulated null": null_tests})
views.show(charts.calibration_chart(pvalues), save_as=figures / "05_calibration")

# %%
summary(null_tests)

# %% [markdown]
# ## The spikes table
#
# One row per context and written token that is a spike at one step or more, at every
# step: the steps where it is not a spike are its series. Its onset is the first step at
# which it is a spike and stays one, with the same sign, at every later step; it is
# *persistent* if it has an onset, *transient* if not, a *sign flip* if the checkpoint
# first took probability from the written token and later gave it (or the reverse).

# %%
spikes, spans = table.spikes_table(TOKENS, tests, vocab=VOCAB)
SETTINGS = {"q": q, "min_effect": min_effect, "divergence": divergence}
manifest = provenance.manifest(P, extra={**SETTINGS, "tests": len(tests)})
lineage.write_derived(P, "spikes", table.to_schema(spikes, suite=P.suite), schemas.SPIKES,
                           manifest, SETTINGS, "notebooks/05_spikes")
lineage.write_derived(P, "spike_regions", table.to_schema(spans, "spike_regions"),
                           schemas.SPIKE_REGIONS, manifest, SETTINGS, "notebooks/05_spikes")
spikes.groupby(["step", "persistence"]).context_id.nunique().unstack(fill_value=0)

# %% [markdown]
# ## Where the spikes sit
#
# Each dot is a spike at one step: its position in the response, its size the
# divergence, its colour what it does to the written token (rejects, endorses, or
# redistributes probability among other tokens).

# %%
views.show(charts.raster_chart(spikes), save_as=figures / "05_raster")

# %% [markdown]
# ## When they appear
#
# The strongest persistent spikes, ordered by onset, each labelled by its token in
# context; colour is dlogp = logp_ckpt − logp_ref at each step (red: the checkpoint takes
# probability from the written token), a dot where it is a spike.

# %%
views.show(charts.onset_heatmap(spikes, n=40), save_as=figures / "05_onsets")

# %% [markdown]
# How many persistent spikes begin at each step, by token category (chapter 04's
# classifier; uncategorised where it has not run).

# %%
per_step = across_steps.new_persistent_per_step(spikes)
accuracy = suite_tables.accuracy_table(P).rename(columns={"rate": "accuracy"})
views.show(charts.new_persistent_chart(per_step, accuracy=accuracy),
           save_as=figures / "05_new_persistent")

# %% [markdown]
# ## The strongest spikes in context
#
# At the last checkpoint, the first response token left out (it depends on the prompt
# alone): the sentence around the token (in [brackets]), what it did to the written
# token, and the token the checkpoint moved probability to, with its probability under
# the reference (blank when outside the reference's top-k) and the checkpoint.

# %%
table.top_spikes(spikes, n=n_top)

# %% [markdown]
# What the detector ranks highest at the last checkpoint, spike or not: the contexts with
# the smallest p-values, with the q-value that says how far each is from significance.
# Where nothing is significant these are the candidates a larger suite would test with
# more power; chapter 06 then shows the strongest departures, labelled as such.

# %%
table.strongest_departures(tests, n=n_top)

# %% [markdown]
# Adjacent spikes merged into regions of text, for the case studies of chapter 06.

# %%
spans.sort_values("max_divergence", ascending=False).head(n_top)

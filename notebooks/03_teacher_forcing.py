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
# # 03 · Teacher forcing: where does one checkpoint depart from the reference?
#
# We take the reference model's own rollouts (written by notebook 02) and force each
# exact token sequence through one RLVR checkpoint. The forced sequence is the chat
# template with the generation prompt followed by the rollout's generated token ids, EOS
# included when the model stopped. Row *k* of the resulting table is the checkpoint's and
# the reference's prediction of response token *k*, read from the logits at position
# `prompt_len + k − 1`, so the first response token and EOS both have rows.
#
# At every row we compare the two next-token distributions in float32 from float32
# logits: KL in both directions — KL(ref‖ckpt), how surprised the checkpoint is by what
# the reference would write, and KL(ckpt‖ref), how surprised the reference is by what the
# checkpoint would write — Jensen–Shannon, both entropies, the log-prob and rank of the
# written token and its signed change Δlogp, the top-5 alternatives of each model, and
# Schulman's sampled-token functions k1, k2, k3 of the written token.

# %%
from typing import Optional

from IPython.display import HTML

from rlprobe_nb import forcing, render, views
from rlprobe_nb.forcing import plan as forcing_plan
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import lineage, storage

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
checkpoint: str = "rlvr_step_1200"  # the RLVR checkpoint forced against the reference: params/<suite>/<checkpoint>.yaml
checkpoints: Optional[list[str]] = None  # force these checkpoints in this run first (the book passes all of them to the first run)
max_rollouts: Optional[int] = None  # force at most this many rollouts (default: forcing.max_rollouts)
batch_tokens: Optional[int] = None  # tokens per forward batch (default: forcing.batch_tokens)
overwrite: bool = False  # recompute tables computed from other inputs (without it they are refused, naming what changed)

# %%
params.check_notebook_parameters(globals())
P = params.load(suite, checkpoint, overrides={"forcing.max_rollouts": max_rollouts,
                                              "forcing.batch_tokens": batch_tokens})
OUT = forcing.pair_dir(P.suite, P.checkpoint, P.reference)
ROLLOUTS, ROLLOUTS_SHA = lineage.read_current(P, "rollouts")
PROBLEMS, _ = lineage.read_current(P, "problems")
SELECTION, _ = lineage.read_current(P, "selection")
print(f"suite {P.suite!r}: checkpoint {P.checkpoint!r} (step {P.steps[P.checkpoint]}) "
      f"vs reference {P.reference!r}, {P.runtime.device}/{P.runtime.dtype}")

# %% [markdown]
# ## What we force
#
# The *target* group is the reference's wrong answers on the selected problems (the
# reference wrong, the RLVR target right), of the failure types in
# `forcing.failure_types`; the contrast groups are the reference's right answers to the
# same problems (`ref_right`) and the rollouts of the control problems (`control`).
# Without them, "RLVR changes these tokens of wrong reasoning" could not be told apart
# from "RLVR changes every text of the reference". `t1_unselected`, where listed, holds
# rollouts sampled at temperature 1 whatever their outcome, drawn first by a lot that never
# reads the outcome: plain draws from the reference, on which chapter 04 checks the KL
# estimators. `forcing.max_rollouts` caps each group with a seeded draw stratified by
# temperature and problem (`forcing.group_max_rollouts` gives a group its own cap).

# %%
CHOSEN = forcing_plan.choose(ROLLOUTS, SELECTION, P)
forcing_plan.counts(CHOSEN, ROLLOUTS, SELECTION)

# %%
CHOSEN.groupby(["group", "temperature"]).size().unstack(fill_value=0)

# %% [markdown]
# ## Forward the checkpoint once, compare with the cached reference
#
# The reference is forwarded over these rollouts once, on the first run, and its final
# hidden states and LM head are cached. Each checkpoint is then forwarded once; while its
# hidden states are in memory, both LM heads are applied chunk by chunk and every metric
# is computed without ever holding a full tokens × vocabulary tensor. The table is
# written in atomic shards, so an interrupted run resumes where it stopped. A complete
# table computed from the same inputs is reused without loading a model; one computed
# from other inputs is refused, naming what changed (`-p overwrite True` recomputes it).
#
# `checkpoints` (a list: the book passes every checkpoint of the suite to its first run of
# this chapter) forces those checkpoints here, before this one's table is read: the
# reference's cache is read and the metrics compiled once for all of them, and the later
# runs reuse their tables. With several GPUs, one checkpoint per GPU at a time; a single
# checkpoint's batches are shared among one worker process per GPU.

# %%
if checkpoints:
    forcing_plan.force_checkpoints(P, checkpoints, ROLLOUTS, SELECTION, PROBLEMS, ROLLOUTS_SHA,
                                   overwrite)
SEQS = forcing_plan.sequences(P, CHOSEN, PROBLEMS)
KEY = forcing_plan.table_key(P, SEQS, P.checkpoint, P.reference, ROLLOUTS_SHA)
if storage.plan_reuse(OUT, KEY, overwrite):
    print(f"reusing {paths.relative(OUT)}: complete, same inputs")
else:
    forcing_plan.run_checkpoint(P, SEQS, None, ROLLOUTS_SHA, overwrite)
print(f"{P.checkpoint} vs {P.reference}: {storage.read_manifest(OUT)['rows']:,} rows in {paths.relative(OUT)}")

# %% [markdown]
# Other configured pairs that include this checkpoint (e.g. a later checkpoint against an
# earlier one) come from the two hidden-state caches and LM heads, without a forward.

# %%
for folder in forcing_plan.run_cached_pairs(P, SEQS, ROLLOUTS_SHA, overwrite):
    print("pair:", paths.relative(folder))

# %% [markdown]
# ## What the table says
#
# One row per response token, with its group, failure type and sampling temperature.

# %%
TOKENS = storage.read_table(OUT)
TOKENS.groupby("group")[["kl_ref_ckpt", "kl_ckpt_ref", "js", "dlogp", "entropy_ref"]].describe(
    percentiles=[0.5, 0.9]).T.round(4)

# %% [markdown]
# Where the checkpoint *rejects* the written token most (Δlogp most negative: it would
# rather not write it) and where it *endorses* it most (Δlogp most positive), each
# context once, the first response token left out:

# %%
RANKED = views.signed_rankings(TOKENS, n=10)
RANKED["rejects"]

# %%
RANKED["endorses"]

# %% [markdown]
# The first response token is predicted from the prompt alone, so every rollout of a
# problem repeats it; it is shown here once per problem, apart from the rankings.

# %%
views.first_tokens(TOKENS).head(8)

# %% [markdown]
# The target rollout with the strongest rejection, token by token, and the same response
# coloured by Δlogp on a fixed scale, the same on every page of the book (hover a token for
# its numbers and both models' top alternatives).

# %%
WORST = RANKED["rejects"].rollout_id.iloc[0]
views.show(views.trace_chart(TOKENS, WORST, "kl_ref_ckpt"),
           save_as=paths.figures_dir(P.suite) / f"03_trace__{P.checkpoint}")

# %%
TOKENIZER = models.load_tokenizer(P.reference, P)
HTML(render.response_html(TOKENS[TOKENS.rollout_id == WORST], render.fixed_scale("dlogp"),
                          lambda i: TOKENIZER.decode([i]), ROLLOUTS.set_index("rollout_id").response[WORST]))

# %% [markdown]
# Provenance of this table: models, revisions and hashes, parameters, versions, commit.

# %%
views.how_made({k: v for k, v in storage.read_manifest(OUT).items()
                if k in ("suite", "models", "git", "key_sha", "rows")})

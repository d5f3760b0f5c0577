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
# We take the reference model's own rollouts (written by notebook 02; by default the
# *wrong* ones) and force each exact token sequence through one RLVR checkpoint. The
# forced sequence is the chat template with the generation prompt followed by the
# rollout's generated token ids, EOS included when the model stopped. Row *k* of the
# resulting table is the checkpoint's and the reference's prediction of response token
# *k*, read from the logits at position `prompt_len + k − 1`, so the first response token
# and EOS both have rows.
#
# At every row we compare the two next-token distributions exactly, in float32 from
# float32 logits: KL in both directions, Jensen–Shannon, both entropies, the log-prob and
# rank of the written token, the top-5 alternatives of each model, and the sampled-token
# estimators k1, k2, k3 of KL(ref‖ckpt).

# %%
from rlprobe_nb import forcing, forcing_plan, models, params, paths, storage, views

# %% tags=["parameters"]
suite = None
checkpoint = "rlvr_step_1200"
max_rollouts = None
batch_tokens = None

# %%
params.check_notebook_parameters(globals().get("In", []),
                                 ["suite", "checkpoint", "max_rollouts", "batch_tokens"])
P = params.load(suite, checkpoint, overrides={"forcing.max_rollouts": max_rollouts,
                                              "forcing.batch_tokens": batch_tokens})
out_dir = forcing.pair_dir(P.suite, P.checkpoint, P.reference)
print(f"suite {P.suite!r}: checkpoint {P.checkpoint!r} (step {P.steps[P.checkpoint]}) "
      f"vs reference {P.reference!r}, {P.runtime.device}/{P.runtime.dtype}")

# %% [markdown]
# ## The rollouts we force
#
# Notebook 02 graded every rollout; `forcing.which` in the suite's parameters chooses
# the wrong ones (the default), the right ones (a control), or all.

# %%
rollouts = storage.read_table(paths.table_dir(P.suite, "rollouts"))
problems = storage.read_table(paths.table_dir(P.suite, "problems"))
chosen = forcing_plan.select_rollouts(rollouts, P.forcing.which, P.forcing.max_rollouts)
print(f"{len(chosen)} of {len(rollouts)} rollouts ({P.forcing.which}), "
      f"{chosen.problem_id.nunique()} problems, {int(chosen.n_tokens.sum())} response tokens")

# %% [markdown]
# ## Forward the checkpoint once, compare with the cached reference
#
# The reference is forwarded over these rollouts once, on the first run, and its final
# hidden states and LM head are cached. Each checkpoint is then forwarded once; while its
# hidden states are in memory, both LM heads are applied chunk by chunk and every metric
# is computed without ever holding a full tokens × vocabulary tensor. The table is
# written in atomic shards, so an interrupted run resumes where it stopped.

# %%
ckpt = None if storage.is_complete(out_dir) else models.load_model(P.checkpoint, P)
seqs = forcing_plan.sequences(P, chosen, problems, ckpt)
seqs.facts()

# %%
if ckpt is not None:
    forcing_plan.run_checkpoint(P, seqs, ckpt)
print(f"{P.checkpoint} vs {P.reference}: {storage.read_manifest(out_dir)['rows']} rows in {out_dir}")

# %% [markdown]
# Other configured pairs that include this checkpoint (e.g. a later checkpoint against an
# earlier one) come from the two hidden-state caches and LM heads, without a forward.

# %%
for folder in forcing_plan.run_cached_pairs(P, seqs):
    print("pair written:", folder)

# %% [markdown]
# ## What the table says
#
# One row per response token. Rollouts ranked by their largest reverse KL, KL(ref‖ckpt):
# the divergence that the forced tokens, sampled from the reference, estimate.

# %%
tokens = storage.read_table(out_dir)
assert set(tokens.checkpoint) == {P.checkpoint}
tokens.describe(percentiles=[0.5, 0.9, 0.99])[["kl_ref_ckpt", "kl_ckpt_ref", "js", "entropy_ref", "entropy_ckpt"]]

# %%
summary = views.rollout_summary(tokens)
summary.head(10)

# %% [markdown]
# The tokens where the checkpoint disagrees most with what the reference wrote, in context
# (the token in [brackets]):

# %%
views.top_tokens(tokens, "kl_ref_ckpt", n=12)

# %% [markdown]
# The rollout with the largest single divergence, token by token, and the same response
# shaded by KL(ref‖ckpt) (hover a token for its numbers).

# %%
worst = summary.index[0]
views.show(views.trace_chart(tokens, worst),
           save_as=paths.figures_dir(P.suite) / f"03_trace__{P.checkpoint}")

# %%
views.coloured_response(tokens, worst)

# %% [markdown]
# Provenance of this table: models, revisions and hashes, parameters, versions, commit.

# %%
{k: v for k, v in storage.read_manifest(out_dir).items() if k in ("suite", "models", "git", "engine", "rows")}

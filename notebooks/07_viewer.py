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
# # 07 · The viewer: scroll a response, see where each checkpoint departs
#
# Any forced response, token by token, coloured by how a checkpoint's next-token
# distribution departs from the reference's there. Pick a problem and one of its rollouts,
# move through training with the step slider (or press play), or compare two checkpoints.
# The colour scale is shared by the whole suite unless you ask for one fitted to this
# rollout; spikes from chapter 05 are outlined at the q-value you choose. Hover a token for
# its numbers; select one (its position, or "next spike") to see it across steps.

# %%
from IPython.display import HTML

from rlprobe_nb.render import viewer
from rlprobe_nb.suite import models, params
from rlprobe_nb.tables import lineage, suite_tables

# %% tags=["parameters"]
suite: str | None = None
metric: str = "dlogp"
scale_quantile: float = 0.99
q: float = 0.05
rollout_id: str | None = None

# %%
params.check_notebook_parameters(globals())
P = params.load(suite)
TOKENS = suite_tables.read_tokens(P)
tokens = TOKENS[TOKENS.reference == P.reference]
SPIKES = lineage.read_derived(P, "spikes")
rollouts, _ = lineage.read_current(P, "rollouts")
texts = dict(zip(rollouts.rollout_id, rollouts.response))
tokenizer = models.load_tokenizer(P.reference, P)
decode = lambda token_id: tokenizer.decode([token_id])  # noqa: E731
start = rollout_id or viewer.default_rollout(tokens, SPIKES)
print(f"suite {P.suite!r}: {tokens.rollout_id.nunique()} rollouts at {tokens.checkpoint.nunique()} checkpoints; "
      f"opening {start!r}")

# %% [markdown]
# ## The viewer
#
# It opens on the rollout with the most spikes at the final checkpoint (or the one named in
# the parameters). In a page exported without a kernel, this output shows that rollout's
# static rendering instead of the controls.

# %%
app = viewer.open_viewer(tokens, SPIKES, decode, texts, metric=metric, quantile=scale_quantile, q=q,
                         rollout_id=start)
app

# %% [markdown]
# ## The same response at the first and the final checkpoint
#
# A static view that needs no kernel: the response coloured at the earliest checkpoint and
# at the last, on the shared scale, one above the other.

# %%
HTML(app.static_html([P.checkpoints[0], P.checkpoints[-1]]))

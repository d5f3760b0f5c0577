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
# Any forced response, token by token, coloured by how a checkpoint departs from the
# reference there (by default Δlogp, the change of the written token's log-probability:
# red where the checkpoint rejects it, blue where it endorses it; KL in either direction,
# JS or the entropy change on request). Pick a rollout from the list, ranked by the final
# checkpoint's largest departure in it, move through training with the step slider (or
# press play, or ← → with the response focused), or compare two checkpoints. The colour
# scale is shared by the whole suite unless you ask for one fitted to this rollout; spikes
# from chapter 05 are outlined at the q-value you choose. Hover a token for its numbers;
# click one (or step through the spikes with n / p) to see it across steps with both
# models' top-k; search the text to outline every match. A link from chapters 05 and 06
# opens the viewer at its rollout and token (the parameters `rollout_id` and `token`).
# In a page exported without a kernel, the viewer holds the rollout it opens on and every
# rollout those chapters link to, at every step: hover, click, search, the steps and "next
# spike" work there too; the other rollouts, metrics, scales and filters, and the comparison
# of two checkpoints (shown below for the opening rollout), need the live viewer.

# %%
from typing import Optional

from IPython.display import HTML

from rlprobe_nb.render import viewer, viewer_links, viewer_targets
from rlprobe_nb.suite import models, params
from rlprobe_nb.tables import lineage, suite_tables

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
metric: str = "dlogp"  # the colour at opening: dlogp, kl_ref_ckpt, kl_ckpt_ref, js or dentropy
scale_quantile: float = 0.99  # the colour scale ends at this quantile of |value| over the suite
q: float = 0.05  # spikes whose q-value is at most this are outlined
rollout_id: Optional[str] = None  # open at this rollout (default: the most spikes at the final checkpoint)
token: Optional[int] = None  # and select this token position of it (links from 05 and 06 set both)

# %%
params.check_notebook_parameters(globals())
P = params.load(suite)
TOKENS = suite_tables.read_tokens(P)
tokens = TOKENS[TOKENS.reference == P.reference]
SPIKES = lineage.read_derived(P, "spikes")
TESTS = lineage.read_derived(P, "spike_tests")
rollouts, _ = lineage.read_current(P, "rollouts")
texts = dict(zip(rollouts.rollout_id, rollouts.response))
tokenizer = models.load_tokenizer(P.reference, P)
decode = lambda token_id: tokenizer.decode([token_id])  # noqa: E731
start = rollout_id or viewer.default_rollout(tokens, SPIKES)
linked = viewer_targets.linked_targets(tokens, SPIKES, TESTS)  # what 05's and 06's pages link to
print(f"suite {P.suite!r}: {tokens.rollout_id.nunique()} rollouts at {tokens.checkpoint.nunique()} checkpoints; "
      f"opening {start!r}" + (f" at token {token}" if token is not None else ""))

# %% [markdown]
# ## The viewer
#
# It opens on the rollout with the most spikes at the final checkpoint (or the one named in
# the parameters). In a page exported without a kernel, this output is the viewer for a
# page: the opening rollout and every rollout other chapters link to, at every step,
# coloured by the opening metric.

# %%
app = viewer.open_viewer(tokens, SPIKES, decode, texts, metric=metric, quantile=scale_quantile, q=q,
                         rollout_id=start, token=token, linked=linked)
app

# %% [markdown]
# ## The same response at the first and the final checkpoint
#
# A static view that needs no kernel: the response coloured at the earliest checkpoint and
# at the last, on the shared scale, one above the other.

# %%
HTML(app.static_html([P.checkpoints[0], P.checkpoints[-1]]))

# %% [markdown]
# ## The tokens other chapters link to
#
# Each token chapters 05 and 06 link to, and why; each link opens the viewer above at that
# token (in JupyterLab the live viewer, in the exported page the page's viewer, which holds
# all of them).

# %%
viewer_links.with_links(linked)

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
# # 06 · Case studies: a few spikes, read closely
#
# Chapter 05 found the tokens where a checkpoint departs from the reference far more than
# comparable tokens do, and the step at which each departure begins. Here we read a few of
# them in full: the problem, what every model answered, the reference's own reasoning
# coloured token by token, and what each model wanted to write at the spike, step by step.
#
# The cases are not chosen by hand. A rule fixed in the parameters picks, at the final
# checkpoint: the strongest persistent spike of each of the most frequent categories, the
# spike with the earliest onset, a random spike (seeded), and a quiet control position whose
# reference entropy matches a chosen spike's, so an unremarkable token of the same
# uncertainty is there to compare. Where no spike reached significance (small suites have
# little power; chapter 05 shows how far each checkpoint's smallest p-value is from the
# bar), the strongest departures by symmetric KL stand in for the spikes, labelled as
# departures in the table and in every caption.

# %%
from typing import Optional

from IPython.display import HTML, display

from rlprobe_nb.render import case_page, case_studies, shared_scale, viewer_links
from rlprobe_nb.suite import models, params
from rlprobe_nb.tables import lineage, suite_tables

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
seed: int = 0  # seed of the random case and of the control chosen among the nearest
n_categories: int = 3  # the strongest spike of each of this many most frequent categories
earliest_onset: bool = True  # add the spike with the earliest onset
n_random: int = 1  # random spikes added (seeded)
n_controls: int = 1  # quiet positions matched on the reference entropy of a chosen spike
group: str = "target"  # the rollout group the cases come from
persistence: str = "persistent"  # persistent, transient or sign_flip spikes only
window: int = 8  # tokens shown either side of a case, one row per step
metric: str = "dlogp"  # the colour: dlogp, kl_ref_ckpt, kl_ckpt_ref, js or dentropy
scale_quantile: float = 0.99  # the colour scale ends at this quantile of |value| over the suite

# %%
params.check_notebook_parameters(globals())
P = params.load(suite)
TOKENS = suite_tables.read_tokens(P)
tokens = TOKENS[TOKENS.reference == P.reference]
SPIKES = lineage.read_derived(P, "spikes")
tables = {name: lineage.read_current(P, name)[0] for name in ("problems", "rollouts", "answers")}
rule = case_studies.CaseRule(n_categories=n_categories, earliest_onset=earliest_onset, n_random=n_random,
                             n_controls=n_controls, seed=seed, group=group, persistence=persistence, window=window)
scale = shared_scale(tokens, metric, scale_quantile)
tokenizer = models.load_tokenizer(P.reference, P)
decode = lambda token_id: tokenizer.decode([token_id])  # noqa: E731
print(f"suite {P.suite!r}: {len(tokens):,} token rows, {len(SPIKES):,} spike rows; {scale.describe()}")

# %% [markdown]
# ## The cases the rule picks
#
# One row per case: which item of the rule chose it, the rollout and the token position,
# and a link that opens the viewer (chapter 07) there. The same tables and seed give the
# same cases.

# %%
choices = case_studies.select_cases(tokens, SPIKES, rule)
print(", ".join(f"{n} {kind} case{'' if n == 1 else 's'}" for kind, n in choices.kind.value_counts().items()))
viewer_links.with_links(choices)

# %% [markdown]
# ## Each case
#
# Every colour below is on one scale, fixed once for the whole suite, so a shade means the
# same at every step and in every case. Hover a token for its numbers: both log-probs and
# ranks, both KL directions, the two models' top-5 alternatives, and its spike record.
# The black outline marks spikes; the yellow ring marks the case's own token.

# %%
cases = case_studies.build_cases(choices, tokens, SPIKES, tables["problems"], tables["rollouts"],
                                 tables["answers"], window=rule.window)
for case in cases:
    display(HTML(case_page.case_html(case, scale, decode, SPIKES)))

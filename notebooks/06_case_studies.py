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
from IPython.display import HTML, display

from rlprobe_nb.render import case_page, case_studies, shared_scale
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import lineage, storage, suite_tables

# %% tags=["parameters"]
suite: str | None = None
seed: int = 0
n_categories: int = 3
earliest_onset: bool = True
n_random: int = 1
n_controls: int = 1
group: str = "target"
persistence: str = "persistent"
window: int = 8
metric: str = "dlogp"
scale_quantile: float = 0.99

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
# One row per case: which item of the rule chose it, the rollout and the token position.
# The same tables and seed give the same cases.

# %%
choices = case_studies.select_cases(tokens, SPIKES, rule)
print(", ".join(f"{n} {kind} case(s)" for kind, n in choices.kind.value_counts().items()))
choices

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

# %% [markdown]
# ## One page
#
# The same cases as a single self-contained page (inline CSS and SVG, no script, no
# network), to read or share without Jupyter.

# %%
page = case_page.case_studies_page(cases, scale, decode, SPIKES, title=f"Case studies · suite {P.suite}",
                                   intro=f"Cases chosen by the rule {rule}.")
path = storage.atomic_write_text(paths.figures_dir(P.suite) / "case_studies.html", page)
print(f"{path} ({len(page.encode()) / 1e6:.1f} MB)")

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
# # 08 · Counterfactual branching: does the token where a checkpoint disagrees decide the answer?
#
# Chapters 04–06 say where a checkpoint *would* write something else than the reference
# did. That does not say the token matters: a different word for the same step changes
# nothing. Here the text itself is put to the test. A model takes over a reference rollout
# after its first k tokens and writes the rest, many times, with seeded samples; every
# continuation is graded with the book's grader. Two experiments:
#
# - **takeover curves**: the pass rate as a function of k, for a few rollouts, to see where
#   inheriting more of the reference's text stops the checkpoint from reaching the answer;
# - **branching**: at each chosen token, continue once with the token the reference wrote
#   (*keep*) and once with the checkpoint's preferred token instead (*substitute*). The
#   effect is the difference in pass rates, with Newcombe's interval. The same branching
#   at control positions, matched on the reference's entropy, says how much any swap of a
#   token of that uncertainty changes.
#
# The chosen tokens are the final checkpoint's significant spikes (chapter 05). Where none
# reached significance, as on small suites, they are its strongest *departures* by
# symmetric KL, one per rollout (chapter 06's rule), labelled "departure (not a
# significant spike)" in the table, the charts and the text.

# %%
from typing import Optional

import pandas as pd
from IPython.display import display

from rlprobe_nb import views
from rlprobe_nb.counterfactuals import branching, charts, plan, table, takeover
from rlprobe_nb.divergence import token_categories
from rlprobe_nb.problems import grading
from rlprobe_nb.render import case_studies
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import lineage, provenance, suite_tables

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
checkpoint: Optional[str] = None  # the checkpoint that continues the rollouts (default: the final one)
group: str = "target"  # the rollout group branched: target, ref_right or control
n: Optional[int] = None  # continuations per context (default: counterfactuals.n)
max_points: Optional[int] = None  # branch points, spikes or else departures (default: counterfactuals.max_points)
grid_points: Optional[int] = None  # prefix lengths of each takeover curve (default: counterfactuals.grid_points)
n_case_studies: Optional[int] = None  # rollouts that get a takeover curve (default: counterfactuals.case_studies)
temperature: Optional[float] = None  # sampling temperature of the continuations (default: counterfactuals.temperature)
ref_min_pass: Optional[float] = None  # the reference continues only problems it solves at least this often
caliper: Optional[float] = None  # controls: largest gap to the point in the reference entropy, nats
seed: Optional[int] = None  # seed of the continuations (default: counterfactuals.seed)
n_boot: int = 2000  # bootstrap resamples of the effect intervals
overwrite: bool = False  # recompute tables computed from other inputs (without it they are refused, naming what changed)

# %% [markdown]
# `checkpoint` is whose spikes are branched at (None: the final one). The sampling sizes
# default to the suite's `counterfactuals` section (`params/<suite>/suite.yaml`); a value
# given here overrides it and is checked against the same ranges.

# %%
params.check_notebook_parameters(globals())
given = {"n": n, "max_points": max_points, "grid_points": grid_points,
         "case_studies": n_case_studies, "temperature": temperature,
         "ref_min_pass": ref_min_pass, "caliper": caliper, "seed": seed}
P = params.load(suite, overrides={f"counterfactuals.{k}": v for k, v in given.items()})
C = P.counterfactuals
TOKENS = suite_tables.read_tokens(P)
TOKENS = TOKENS[TOKENS.reference == P.reference]
checkpoint = checkpoint or case_studies.final_checkpoint(TOKENS)
tokens = TOKENS[(TOKENS.checkpoint == checkpoint) & (TOKENS.group == group)].reset_index(drop=True)
tokens["category"] = token_categories.classify(tokens).astype(str)
SPIKES = lineage.read_derived(P, "spikes")
ROLLOUTS, rollouts_sha = lineage.read_current(P, "rollouts")
ROLLOUTS = ROLLOUTS[ROLLOUTS.rollout_id.isin(set(tokens.rollout_id))]
PROBLEMS, _ = lineage.read_current(P, "problems")
ANSWERS, _ = lineage.read_current(P, "answers")
gold = dict(zip(PROBLEMS.problem_id, PROBLEMS.answer))
max_new_tokens = C.max_new_tokens or P.rollouts.max_new_tokens
tokenizer = models.load_tokenizer(P.reference, P)
special = set(tokenizer.all_special_ids)
figures = paths.figures_dir(P.suite)
print(f"suite {P.suite!r}: checkpoint {checkpoint!r} vs {P.reference!r}, group {group!r}: "
      f"{len(ROLLOUTS)} rollouts, {len(tokens):,} tokens; {C}")

# %% [markdown]
# ## Where to branch
#
# The significant spikes of the checkpoint in the group's rollouts (first response tokens
# left out: they depend on the prompt alone), at most `max_points`, drawn category by
# category; else its strongest departures. Each point gets one control: a token of the
# same rollout (else of the same problem, else of any) that is no spike at any step nor
# within two tokens of a chosen point, whose reference entropy is nearest the point's
# (within `caliper` nats).

# %%
spiked = branching.select_spikes(SPIKES, checkpoint, groups=(group,), max_spikes=C.max_points,
                                 seed=C.seed)
point_kind = "spike" if len(spiked) else "departure"
label = "spike" if len(spiked) else "departure (not a significant spike)"
selected = spiked if len(spiked) else branching.select_departures(tokens, checkpoint, (group,),
                                                                  C.max_points)
avoid = pd.concat([selected[["rollout_id", "pos"]], SPIKES[["rollout_id", "pos"]]])
controls = branching.match_controls(selected, tokens, avoid, caliper=C.caliper, seed=C.seed)
print(f"{len(spiked)} significant spikes of {checkpoint!r} in group {group!r}: branching at "
      f"{len(selected)} {label} point(s); {len(controls)} matched controls "
      f"({controls['match'].value_counts().to_dict()})")
selected[["rollout_id", "pos", "token", "category", "kl_ref_ckpt", "kl_ckpt_ref", "entropy_ref"]
         ] if point_kind == "departure" else selected[["rollout_id", "pos", "token", "category", "q"]]

# %% [markdown]
# ## Which policies continue
#
# The checkpoint continues every context. The reference continues only the problems it
# solves at least `ref_min_pass` of the time on its own (chapter 01's samples): where it
# never does, its pass rate is about 0 on either arm and the difference says nothing.

# %%
ref_rate = ANSWERS[ANSWERS.model == P.reference].groupby("problem_id").correct.mean()
ref_problems = set(ref_rate[ref_rate >= C.ref_min_pass].index) & set(selected.problem_id)
policies = {checkpoint: None, **({P.reference: ref_problems} if ref_problems else {})}
print(f"the reference solves {len(ref_problems)} of the {selected.problem_id.nunique()} problems "
      f"branched on at least {C.ref_min_pass:.0%} of the time: "
      + ("it continues those too" if ref_problems else "it is not used as a policy here"))

# %% [markdown]
# ## The plan and its cost
#
# One row per (policy, context): keep and substitute at every point and control, and the
# takeover grid (`grid_points` prefix lengths) of the `n_case_studies` rollouts with the
# most points. Each context gets `n` continuations, seeded by (model, rollout, k,
# substituted token, sample), each writing at most the response limit minus the prefix.

# %%
cases = plan.case_studies(selected, C.case_studies)
PLAN = plan.build(selected, controls, tokens, ROLLOUTS, policies, case_study_ids=cases,
                  grid_points=C.grid_points, special=special, point_kind=point_kind)
cost = plan.cost(PLAN, C.n, max_new_tokens)
print(f"to sample: {cost.continuations.sum():,} continuations ({len(PLAN)} contexts x n = {C.n}) "
      f"at T = {C.temperature}, at most {cost.max_new_tokens.sum():,} new tokens in all")
cost

# %% [markdown]
# ## Sampling and grading
#
# The `branches` table is keyed on the token tables it was drawn from and on everything
# else its rows depend on (models, rollouts, the plan, n, temperature, limit, seed,
# grader): the same inputs reuse it, other inputs are refused unless `overwrite=True`,
# and later chapters refuse it once a token table changes. An interrupted run resumes
# from its finished shards.

# %%
settings = table.branches_settings(P, PLAN, rollouts_sha, checkpoint=checkpoint, n=C.n,
                                   temperature=C.temperature, max_new_tokens=max_new_tokens,
                                   seed=C.seed)
manifest = provenance.manifest(P, seeds={"seed": C.seed}, grader=grading.grader_info(),
                               extra={"checkpoint": checkpoint, "point_kind": point_kind})
BRANCHES = table.run_branches(P, PLAN, ROLLOUTS, gold, lambda name: models.load_model(name, P),
                              settings, manifest, checkpoint=checkpoint, n=C.n,
                              temperature=C.temperature, max_new_tokens=max_new_tokens,
                              seed=C.seed, batch_rows=C.batch_rows, overwrite=overwrite)
grading.shutdown()
print(f"sampled and graded: {int(BRANCHES.n.sum()):,} continuations of {len(BRANCHES)} contexts")
BRANCHES.groupby(["model", "kind", "arm"]).agg(contexts=("pos", "size"), n=("n", "sum"),
                                               passes=("passes", "sum"))

# %% [markdown]
# ## Takeover curves
#
# The pass rate of each policy's continuations after the first k tokens of the case-study
# rollouts (band: Wilson 95%), with dashed rules where a branch point's token enters the
# prefix (k = pos + 1). A *drop* is a fall of at least 0.3 that lasts two points, its
# Newcombe interval below 0 after a correction for the positions scanned
# (`takeover.find_drop`); with few points and small n only large falls can show.

# %%
drops = takeover.curve_drops(BRANCHES, cases)
print(f"{int(drops['drop'].sum())} of {len(drops)} takeover curves drop")
drops

# %%
views.show(charts.takeover_chart(BRANCHES, cases, title=f"takeover curves; branch points: {label}"),
           save_as=figures / "08_takeover")

# %% [markdown]
# ## Branch effects
#
# Effect at a point = pass rate(substitute) − pass rate(keep), each arm n continuations,
# with Newcombe's hybrid score interval.

# %%
EFFECTS = branching.effects(BRANCHES[BRANCHES.kind.isin([point_kind, "control"])])
EFFECTS.sort_values(["model", "kind", "effect"])[
    ["model", "kind", "rollout_id", "pos", "category", "passes_keep", "passes_sub", "n_keep",
     "effect", "effect_low", "effect_high"]]

# %% [markdown]
# By category of the token (chapter 04's classes; a control counts in its point's
# category) and over all ("all"): the mean effect at the points, at their controls, and
# the difference, each with a 95% bootstrap interval that resamples whole problems (a
# problem's points and controls move together).

# %%
SUMMARY = branching.by_category(EFFECTS, n_boot=n_boot, seed=C.seed)
SUMMARY

# %%
if SUMMARY[["low", "high"]].notna().all(axis=1).any():
    display(views.show(charts.forest_chart(SUMMARY, title=f"branch effect by category: {label} "
                                                          "vs entropy-matched controls"),
                       save_as=figures / "08_forest"))
else:
    print("no estimate has an interval (too few branches): no forest plot")

# %% [markdown]
# ## What this says
#
# Whether the points chosen here matter more than their controls, in numbers read from
# the tables above. The bootstrap resamples problems, not continuations: when every
# branch shows the same effect (say 0 of n on both arms everywhere) its interval has no
# width, which says the branches agree, not that each effect is known; each branch's own
# Newcombe interval says how much n continuations can tell.

# %%
half = ((EFFECTS.effect_high - EFFECTS.effect_low) / 2).median()
print(f"{len(EFFECTS)} branches of n = {C.n} continuations per arm; a branch's own 95% interval "
      f"reaches ± {half:.2f} around its effect (median half-width)")
for row in SUMMARY[SUMMARY.category == "all"].itertuples():
    verdict = ("cannot be told apart from" if not row.low > 0 and not row.high < 0
               else "is larger than" if row.low > 0 else "is smaller than")
    print(f"policy {row.model}, {row.estimate}: mean effect {row.mean:+.3f} "
          f"[{row.low:+.3f}, {row.high:+.3f}] over {row.branches} branches in {row.problems} problems")
    if row.estimate.endswith(" - control"):
        print(f"  -> swapping in the checkpoint's preferred token at a {label} {verdict} doing so "
              f"at an entropy-matched control (95% interval, problems resampled)")

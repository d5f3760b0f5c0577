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
# # 08 · Counterfactual branching: does the token decide the answer?

# %%
from IPython.display import Markdown

from rlprobe_nb import views

FINDING = views.finding_slot()  # the chapter's finding, written here once its tables are read

# %% [markdown]
# Chapters 04–06 say where a checkpoint *would* write something else than the reference
# did. That does not say the token matters: a different word for the same step changes
# nothing. Here the text itself is put to the test. The checkpoint takes over one of the
# reference's wrong rollouts just before a chosen token and writes the rest, many times,
# with seeded samples, once with the token the reference wrote (*keep*) and once with
# another one swapped in; every continuation is graded with the book's grader, and the
# difference in pass rates is the token's *effect*.
#
# Two experiments, in this order:
#
# 1. **the positive control**: at the first wrong digit of a wrong result (the
#    ground-truth labeller of chapter 04 finds them), swap in the *correct* digit. Where
#    the answer is copied from that result, this must lift the pass rate. If it does, the
#    method can see a decisive token; if not, a null result below says little.
# 2. **the main result**: at the checkpoint's *disagreement points*, contexts where its
#    most probable token is another token than the one written (a real alternative, not
#    the same text up to whitespace or case), swap in its choice and compare with the same
#    swap at matched *control* tokens, label by label (first wrong digits, operands,
#    operators, other tokens). Where the written token is already the checkpoint's first
#    choice, its "alternative" is a runner-up it does not prefer, and the swap says nothing
#    about what RLVR taught it: such contexts are never main points.
# 3. **the placebo, twice**: the placebo checkpoint continuing the same contexts with the
#    same swap, and at *its own* disagreement points (its top-1 swapped in, the placebo
#    continuing): does a change made without the reward's information decide the answer?

# %%
from typing import Optional

import pandas as pd
from IPython.display import display

from rlprobe_nb import reporting, views
from rlprobe_nb.counterfactuals import (branching, by_label, charts, narrative, plan, points, table,
                                        takeover)
from rlprobe_nb.problems import grading
from rlprobe_nb.readable import counted
from rlprobe_nb.render import case_studies
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import lineage, provenance, suite_tables

# %% tags=["parameters"]
suite: Optional[str] = None  # the suite: a folder under params/ (default: $RLPROBE_SUITE, else demo)
checkpoint: Optional[str] = None  # the checkpoint that continues the rollouts (default: the final one)
group: str = "target"  # the rollout group branched: target, ref_right or control
n: Optional[int] = None  # continuations per context (default: counterfactuals.n)
max_points: Optional[int] = None  # main branch points, chosen by content (default: counterfactuals.max_points)
positive_points: Optional[int] = None  # first wrong digits of the positive control (default: counterfactuals.positive_points)
positive_pool: Optional[str] = None  # where the positive control's digits come from: problems or forced (default: counterfactuals.positive_pool)
point_rule: Optional[list[str]] = None  # within a label: spikes, then these ground-truth labels, in order (default: counterfactuals.point_rule)
point_strata: Optional[list[str]] = None  # labels drawn in turn, one point per entry and turn (default: counterfactuals.point_strata)
include_format: Optional[bool] = None  # let format tokens be points too (default: counterfactuals.include_format)
grid_points: Optional[int] = None  # prefix lengths of each takeover curve (default: counterfactuals.grid_points)
n_case_studies: Optional[int] = None  # rollouts that get a takeover curve (default: counterfactuals.case_studies)
temperature: Optional[float] = None  # sampling temperature of the continuations (default: counterfactuals.temperature)
continuation_tokens: Optional[int] = None  # most new tokens of one continuation (default: counterfactuals.continuation_tokens)
ref_min_pass: Optional[float] = None  # the reference continues only problems it solves at least this often
placebo: Optional[bool] = None  # the placebo at the checkpoint's step continues the same contexts too (default: counterfactuals.placebo)
placebo_points: Optional[int] = None  # the placebo also branches at up to this many disagreement points of its own, 0 for none (default: counterfactuals.placebo_points, else max_points)
caliper: Optional[float] = None  # controls: largest gap to the point in the reference entropy, nats
seed: Optional[int] = None  # seed of the continuations (default: counterfactuals.seed)
n_boot: int = 2000  # bootstrap resamples of the effect intervals
overwrite: bool = False  # recompute tables computed from other inputs (without it they are refused, naming what changed)

# %% [markdown]
# `checkpoint` is the policy that continues, and whose spikes and preferences choose the
# points (left empty, the suite's last checkpoint). The rest default to the suite's `counterfactuals` section
# (`params/<suite>/suite.yaml`); a value given here overrides it and is checked against
# the same ranges.

# %%
params.check_notebook_parameters(globals())
given = {"n": n, "max_points": max_points, "positive_points": positive_points,
         "point_rule": point_rule, "point_strata": point_strata,
         "include_format": include_format, "grid_points": grid_points,
         "case_studies": n_case_studies, "temperature": temperature,
         "continuation_tokens": continuation_tokens, "positive_pool": positive_pool,
         "ref_min_pass": ref_min_pass, "placebo": placebo, "placebo_points": placebo_points,
         "caliper": caliper, "seed": seed}
P = params.load(suite, overrides={f"counterfactuals.{k}": v for k, v in given.items()})
C = P.counterfactuals
TOKENS = suite_tables.read_tokens(P)
TOKENS = TOKENS[TOKENS.reference == P.reference]
checkpoint = checkpoint or case_studies.final_checkpoint(TOKENS)
tokens = TOKENS[(TOKENS.checkpoint == checkpoint) & (TOKENS.group == group)].reset_index(drop=True)
SPIKES = lineage.read_derived(P, "spikes")
ALL_ROLLOUTS, rollouts_sha = lineage.read_current(P, "rollouts")
forced = set(tokens.rollout_id)
ROLLOUTS, extra = points.rollout_pool(ALL_ROLLOUTS, P.reference, tokens, C.positive_pool)
PROBLEMS, _ = lineage.read_current(P, "problems")
ANSWERS, _ = lineage.read_current(P, "answers")
gold = dict(zip(PROBLEMS.problem_id, PROBLEMS.answer))
texts = dict(zip(ROLLOUTS.rollout_id, ROLLOUTS.response))
max_new_tokens = C.max_new_tokens or P.rollouts.max_new_tokens
tokenizer = models.load_tokenizer(P.reference, P)
special = set(tokenizer.all_special_ids)
figures = paths.figures_dir(P.suite)
print(f"suite {P.suite!r}: checkpoint {checkpoint!r} vs {P.reference!r}, group {group!r}: "
      f"{counted(len(forced), 'forced rollout')} of {counted(tokens.problem_id.nunique(), 'problem')} "
      f"({counted(len(tokens), 'token')}); for the positive control also the reference's "
      f"{counted(len(extra), 'other wrong rollout')} of those problems (positive_pool "
      f"{C.positive_pool!r})")

# %% [markdown]
# ## What each token is
#
# Every token gets chapter 04's category and the ground-truth label (is it a digit of a
# right or a wrong result, an operand, format?), the checkpoint's most probable *real
# alternative* (its text, whitespace stripped and case ignored, is neither empty nor the
# written token's: "\n" → "\n\n" is no alternative), and at a first wrong digit the
# correct digit, read from the labeller's verdict on the statement. A correct digit needs
# no forcing, so the positive control may also use the reference's other wrong rollouts
# of the same problems (`positive_pool`); points and controls need the checkpoint's top-k
# and come from the forced rollouts only.

# %%
TOK = points.branch_tokens(tokens, extra, texts, tokenizer, gold)
first_wrong = TOK[TOK.ground_truth == points.FIRST_WRONG]
for label, part in (("forced", first_wrong[first_wrong.rollout_id.isin(forced)]),
                    ("all", first_wrong)):
    fixable = part[part.correct_id.notna()]
    print(f"{label} rollouts: {counted(len(part), 'first wrong digit')} in "
          f"{counted(part.rollout_id.nunique(), 'rollout')} of "
          f"{counted(part.problem_id.nunique(), 'problem')}; a correct digit for {len(fixable)} "
          f"of them, in {counted(fixable.problem_id.nunique(), 'problem')}")
first_wrong.correct_how.value_counts().rename_axis("how corrected, or why not").to_frame(
    "first wrong digits")

# %% [markdown]
# ## Where to branch: the checkpoint's disagreements
#
# A main point is a context where the checkpoint's most probable token is a *real
# alternative* to the written one (not that token, not the same text up to whitespace
# or case): there it would have written something else, and swapping its choice in asks
# whether that choice decides the answer. Labels are drawn in turn (`point_strata`: one
# point per entry and turn, a label listed twice gets two), so first wrong digits,
# operands, operators and other tokens each get points; within a label, the checkpoint's
# significant spikes of chapter 05 come first, then the ground-truth labels of
# `point_rule` in order, then the rest, drawn in rounds over problems (the effect is
# averaged over problems), ties with the seed. At most `max_points`. Format tokens are
# never points unless `include_format`; nor are first response tokens (they depend on the
# prompt alone) or EOS. A spike whose written token is the checkpoint's own top-1 is not
# a main point (its top-1 alternative is a runner-up the checkpoint does not prefer).
# Each point's `rule` is its label.
#
# The positive control takes up to `positive_points` first wrong digits that have a
# correct digit: those among the points, then each rollout's earliest (the error the rest
# of it inherits), then later ones, each time in turn from the two kinds of wrong
# statement (its true value is the answer, or another result).

# %%
forced_tok = TOK[TOK.rollout_id.isin(forced) & points.eligible(TOK, C.include_format)]
pool = forced_tok.assign(label=points.stratum(forced_tok), disagrees=points.disagrees(forced_tok))
print(f"{int(pool.disagrees.sum())} of {len(pool):,} branchable contexts of {checkpoint!r} are "
      f"disagreements, in {counted(pool[pool.disagrees].problem_id.nunique(), 'problem')}")
display(pool.groupby("label").size().rename("branchable contexts").to_frame().join(
    pool[pool.disagrees].groupby("label").agg(disagreements=("pos", "size"),
                                              problems=("problem_id", "nunique"))).fillna(0))
MAIN = points.select_disagreements(TOK, SPIKES, checkpoint=checkpoint, strata=C.point_strata,
                                   rule=C.point_rule, max_points=C.max_points, seed=C.seed,
                                   groups=(group,), include_format=C.include_format)
POSITIVE = points.select_positive(TOK, MAIN, C.positive_points, seed=C.seed)
POINTS = plan.combine(MAIN, POSITIVE)
spiked = points.spike_keys(SPIKES, checkpoint, (group,))
agreeing = pool[~pool.disagrees.to_numpy()
                & pd.Series(list(zip(pool.rollout_id, pool.pos))).isin(spiked).to_numpy()]
print(f"strata {C.point_strata}: {counted(len(MAIN), 'point')} in "
      f"{counted(MAIN.problem_id.nunique(), 'problem')} "
      f"({MAIN.rule.value_counts().to_dict()}), {int(MAIN.spike.sum())} of them spikes; "
      f"{len(spiked)} significant spikes of {checkpoint!r} in group {group!r}, "
      f"{len(agreeing)} of them where its top-1 is the written token or the same text "
      "(not points); "
      f"positive control: {counted(len(POSITIVE), 'first wrong digit')} in "
      f"{counted(POSITIVE.problem_id.nunique(), 'problem')}")
POINTS[["rollout_id", "pos", "rule", "main", "positive", "spike", "token", "ground_truth",
        "category", "alt_token", "alt_rank", "correct_char", "entropy_ref"]]

# %% [markdown]
# Each main point gets one control: a token of the same rollout and category (else of
# any category: `match` says which) whose reference entropy is nearest the point's,
# within `caliper` nats, on the point's side of the rollout's first wrong result (kept
# text that already holds the error can only gain passes from a swap, text that does not
# can only lose them), where the checkpoint would also write another token (its top-1 is
# a real alternative, swapped in just as at the point), and that decides nothing by
# construction: no digit, number, operand or operator (another number there changes the
# calculation), not a point, a spike or within two tokens of one, not a format token.
# Its effect should be near zero. A point without such a token in its rollout has no
# control; the count by label says where.

# %%
avoid = set(zip(SPIKES.rollout_id, SPIKES.pos)) | set(zip(POINTS.rollout_id, POINTS.pos))
CONTROLS = branching.match_controls(MAIN, TOK, avoid, caliper=C.caliper, seed=C.seed,
                                    include_format=C.include_format, disagree_only=True)
print(f"{counted(len(CONTROLS), 'control')} for {counted(len(MAIN), 'point')} "
      f"({CONTROLS['match'].value_counts().to_dict()}); median entropy gap "
      f"{reporting.fmt(CONTROLS.entropy_gap.median())} nats")
pd.DataFrame({"points": MAIN.rule.value_counts(), "with a control": CONTROLS.rule.value_counts()}
             ).fillna(0).astype(int)

# %% [markdown]
# ## Which policies continue
#
# The checkpoint continues every context. So does the placebo checkpoint at its step
# (`placebo`, where the suite has one), with the same draws: the same optimisation
# without the reward's information, the contrast that says whether a token matters to
# what RLVR learned or to any model that continues it. The reference continues only the
# problems it solves at least `ref_min_pass` of the time on its own (chapter 01's
# samples): where it never does, its pass rate is about 0 on every arm and the
# difference says nothing. With `ref_min_pass` null it continues nothing.

# %%
ref_rate = ANSWERS[ANSWERS.model == P.reference].groupby("problem_id").correct.mean()
ref_problems = set() if C.ref_min_pass is None else \
    set(ref_rate[ref_rate >= C.ref_min_pass].index) & set(POINTS.problem_id)
PLACEBO = P.placebo_for(checkpoint) if C.placebo else None
policies = {checkpoint: None, **({PLACEBO: None} if PLACEBO else {}),
            **({P.reference: ref_problems} if ref_problems else {})}
print(f"the placebo {PLACEBO!r} continues every context too" if PLACEBO else
      "no placebo continues the contexts (the suite has none at this step, or placebo=False)")
if C.ref_min_pass is None:
    print("the reference continues no context (ref_min_pass: null)")
else:
    print(f"the reference solves {len(ref_problems)} of the "
          f"{counted(POINTS.problem_id.nunique(), 'problem')} branched on at least "
          f"{C.ref_min_pass:.0%} of the time: "
          + ("it continues those too" if ref_problems else "it is not used as a policy here"))

# %% [markdown]
# ## The placebo's own disagreement points
#
# The placebo is also asked the question on its own terms: at the contexts of the same
# forced rollouts where *its* most probable token is a real alternative to the written
# one, chosen by the same rule, strata and seed as the checkpoint's (at most
# `placebo_points` of them, else `max_points`), its choice swapped in and the placebo
# continuing, with controls matched the same way. Where the placebo's changes decide the answer as often as the
# checkpoint's, the effect says nothing about what the reward taught.

# %%
OWN, OWN_CONTROLS = pd.DataFrame(), pd.DataFrame()
own_max = C.max_points if C.placebo_points is None else C.placebo_points
if PLACEBO and own_max:
    placebo_rows = suite_tables.read_tokens(P, [(PLACEBO, P.reference)])
    placebo_rows = placebo_rows[placebo_rows.group == group]
    OWN_TOK = points.branch_tokens(placebo_rows.reset_index(drop=True), ROLLOUTS.iloc[:0], texts,
                                   tokenizer, gold)
    OWN = points.select_disagreements(OWN_TOK, SPIKES, checkpoint=PLACEBO, strata=C.point_strata,
                                      rule=C.point_rule, max_points=own_max, seed=C.seed,
                                      groups=(group,), include_format=C.include_format)
    own_avoid = set(zip(SPIKES.rollout_id, SPIKES.pos)) | set(zip(OWN.rollout_id, OWN.pos))
    OWN_CONTROLS = branching.match_controls(OWN, OWN_TOK, own_avoid, caliper=C.caliper,
                                            seed=C.seed, include_format=C.include_format,
                                            disagree_only=True)
    shared = set(zip(OWN.rollout_id, OWN.pos)) & set(zip(MAIN.rollout_id, MAIN.pos))
    print(f"{PLACEBO!r}: {counted(len(OWN), 'disagreement point')} in "
          f"{counted(OWN.problem_id.nunique(), 'problem')} "
          f"({OWN.rule.value_counts().to_dict()}), {len(shared)} of them also points of "
          f"{checkpoint!r}; {counted(len(OWN_CONTROLS), 'control')}")
else:
    print("the placebo does not branch at its own points (no placebo, or placebo_points 0)")

# %% [markdown]
# ## The plan and its cost
#
# One row per (policy, context): keep and each substitute arm at every point and control,
# and the takeover grid (`grid_points` prefix lengths) of the `n_case_studies` rollouts
# with the most first wrong digits (the checkpoint's and the reference's; the placebo
# continues the main points and their controls, and its own points and controls:
# kinds `own_point`, `own_control`). Each context
# gets `n` continuations, seeded by (rollout, k, substituted token, sample), so every
# policy draws with the same noise; a continuation writes at most `continuation_tokens`
# new tokens and the response limit in all, and stops at the suite's stop tokens or
# once it has closed a box (`stop_at_box`: the grader reads the box, nothing after it
# counts). The samples of one context share its prefill.

# %%
cases = plan.case_studies(POINTS, C.case_studies)
POSITIVE_MODELS = {checkpoint, P.reference} & set(policies)  # the placebo: main points only
PLAN = plan.build(POINTS, CONTROLS, TOK, ROLLOUTS, policies, case_study_ids=cases,
                  grid_points=C.grid_points, special=special,
                  grid_models={checkpoint, P.reference},
                  positive_models=POSITIVE_MODELS)
if len(OWN):
    PLAN = pd.concat([PLAN, plan.own_points(OWN, OWN_CONTROLS, PLACEBO)], ignore_index=True)
cost = plan.cost(PLAN, C.n, max_new_tokens, C.continuation_tokens)
print(f"to sample: {cost.continuations.sum():,} continuations ({cost.contexts.sum()} distinct "
      f"contexts x n = {C.n}) at T = {C.temperature}, at most "
      f"{cost.max_new_tokens.sum():,} new tokens in all "
      f"(at most {C.continuation_tokens or max_new_tokens} per continuation"
      f"{', ending at a closed box' if C.stop_at_box else ''})")
cost

# %% [markdown]
# ## Sampling and grading
#
# The `branches` table is keyed on the token tables it was drawn from and on everything
# else its rows depend on (models, rollouts, the plan, n, temperature, limits, seed,
# grader): the same inputs reuse it, other inputs are refused unless `overwrite=True`,
# and later chapters refuse it once a token table changes. An interrupted run resumes
# from its finished shards.

# %%
sampling = dict(n=C.n, temperature=C.temperature, max_new_tokens=max_new_tokens, seed=C.seed,
                continuation_tokens=C.continuation_tokens, stop_at_box=C.stop_at_box)
settings = table.branches_settings(P, PLAN, rollouts_sha, checkpoint=checkpoint, **sampling)
manifest = provenance.manifest(P, seeds={"seed": C.seed}, grader=grading.grader_info(),
                               extra={"checkpoint": checkpoint, "point_rule": C.point_rule})
BRANCHES = table.run_branches(P, PLAN, ROLLOUTS, gold, lambda name: models.load_model(name, P),
                              settings, manifest, checkpoint=checkpoint, batch_rows=C.batch_rows,
                              overwrite=overwrite, **sampling)
grading.shutdown()
print(f"sampled and graded: {int(BRANCHES.n.sum()):,} continuations of {len(BRANCHES)} "
      f"contexts; {int(BRANCHES.n_stopped.sum()):,} ended by EOS or a closed box, "
      f"{reporting.fmt((BRANCHES.mean_new_tokens * BRANCHES.n).sum() / BRANCHES.n.sum())} new "
      "tokens on average")
BRANCHES.groupby(["model", "kind", "arm"]).agg(contexts=("pos", "size"), n=("n", "sum"),
                                               passes=("passes", "sum"))

# %% [markdown]
# ## 1 · The positive control: the correct digit at first wrong digits
#
# Effect = pass rate with the correct digit − with the written (wrong) one, at each first
# wrong digit, each arm with its Wilson interval and the effect with Newcombe's; the
# mean over points with a 95% interval that resamples problems (none from fewer than
# five problems). A wrong result decides the answer only where the answer is computed
# from it, so the lift is also shown by whether the wrong statement's true value is the
# problem's answer.

# %%
POSITIVE_EFFECTS = branching.effects(BRANCHES[BRANCHES.kind == "point"], arm="correct")
POSITIVE_EFFECTS["statement"] = POSITIVE_EFFECTS.result_is_answer.map(
    {True: "its true value is the answer", False: "another result"}).fillna("answer unknown")
POSITIVE_SUMMARY = branching.summary(POSITIVE_EFFECTS, None, by="statement", n_boot=n_boot,
                                     seed=C.seed)
for model in sorted(POSITIVE_MODELS):
    print(narrative.positive_line(POSITIVE_SUMMARY, model))
    print("\n".join(["  by the wrong statement:"]
                    + narrative.group_lines(POSITIVE_SUMMARY, model, "first wrong digits")))
narrative.point_table(POSITIVE_EFFECTS)

# %%
if len(POSITIVE_EFFECTS):
    display(views.show(charts.positive_chart(
        POSITIVE_EFFECTS[POSITIVE_EFFECTS.model == checkpoint],
        title=f"positive control: the correct digit at first wrong digits ({checkpoint})"),
        save_as=figures / "08_positive_control"))
else:
    print("no first wrong digit was branched at: no chart")

# %% [markdown]
# ## 2 · The main result: the checkpoint's choice at its disagreement points
#
# Effect = pass rate with the checkpoint's most probable token swapped in − with the
# written token, at every point and control. By label (a control counts with its point)
# and over all: the mean at the points, at the controls and the difference, each with a
# 95% interval that resamples problems (none from fewer than five problems). The
# positive control's line comes first: it says whether this run could see a decisive
# token at all.

# %%
MAIN_EFFECTS = branching.effects(BRANCHES[BRANCHES.kind == "point"], arm="top1")
CONTROL_EFFECTS = branching.effects(BRANCHES[BRANCHES.kind == "control"], arm="top1")
SUMMARY = branching.summary(MAIN_EFFECTS, CONTROL_EFFECTS, by="rule", n_boot=n_boot, seed=C.seed)
for model in policies:
    if model in POSITIVE_MODELS:
        print(narrative.positive_line(POSITIVE_SUMMARY, model))
    else:
        print(f"positive control ({model}): not run for this policy (it continues the main "
              f"points, their controls and its own points only); {checkpoint}'s is above")
    print("\n".join(narrative.main_lines(SUMMARY, model, alternative_of=checkpoint)
                    + ["  by label:"] + narrative.group_lines(SUMMARY, model)))
SHOWN = reporting.with_interval_text(SUMMARY, "mean", "low", "high", "problems", signed=True)
SHOWN

# %% [markdown]
# ### The checkpoint against its placebo at the same contexts
#
# Both continued the same contexts with the same swap and the same draws, so their
# effects are compared point by point: the mean difference, with an interval that
# resamples problems.

# %%
if PLACEBO:
    CONTRAST = branching.policy_contrast(MAIN_EFFECTS, checkpoint, PLACEBO, n_boot=n_boot,
                                         seed=C.seed)
    print(narrative.contrast_line(CONTRAST))
else:
    print("no placebo continued the contexts: no contrast")

# %% [markdown]
# ### The placebo at its own disagreement points

# %%
OWN_EFFECTS = branching.effects(BRANCHES[BRANCHES.kind == plan.OWN_KINDS["point"]], arm="top1")
OWN_CONTROL_EFFECTS = branching.effects(BRANCHES[BRANCHES.kind == plan.OWN_KINDS["control"]],
                                        arm="top1")
if len(OWN_EFFECTS):
    OWN_SUMMARY = branching.summary(OWN_EFFECTS, OWN_CONTROL_EFFECTS, by="rule", n_boot=n_boot,
                                    seed=C.seed)
    print("\n".join(narrative.main_lines(OWN_SUMMARY, PLACEBO, alternative_of=PLACEBO)
                    + ["  by label:"] + narrative.group_lines(OWN_SUMMARY, PLACEBO)))
else:
    print("the placebo branched at no point of its own")

# %%
narrative.point_table(pd.concat([MAIN_EFFECTS, CONTROL_EFFECTS, OWN_EFFECTS, OWN_CONTROL_EFFECTS],
                                ignore_index=True))

# %%
if SHOWN[["low", "high"]].notna().all(axis=1).any():
    display(views.show(charts.forest_chart(SHOWN, title="effect of the checkpoint's top-1 "
                                           "at its disagreement points, by label, vs matched "
                                           "controls"),
                       save_as=figures / "08_forest"))
else:
    print(f"no estimate comes from at least {reporting.MIN_CLUSTERS} problems: no forest plot")

# %% [markdown]
# ## The answer, label by label
#
# The three experiments side by side: the checkpoint at its own disagreement points, the
# placebo continuing the same contexts with the same swap, and the placebo at its own
# disagreement points. A label *decides the answer* where the interval of its mean
# effect excludes 0. Chapter 05 asks another question of the first wrong digits: how
# much the checkpoint's probability of the written digit moved (most are spikes that
# lower it). Here the question is whether the digit the checkpoint would write instead
# changes the outcome; a lowered wrong digit need not be replaced by a right one, so the
# two results can differ without contradicting each other.

# %%
EXPERIMENTS = by_label.experiments(BRANCHES, checkpoint, PLACEBO, n_boot=n_boot, seed=C.seed)
display(by_label.table(EXPERIMENTS))
print("\n".join(by_label.conclusion(EXPERIMENTS)))
FINDING.update(Markdown(by_label.finding(EXPERIMENTS, checkpoint, narrative.contrast_line(CONTRAST)
                                         if PLACEBO else None)))

# %% [markdown]
# ## Takeover curves
#
# The pass rate of each policy's continuations after the first k tokens of the case-study
# rollouts (band: Wilson 95%), with dashed rules where a point's token enters the prefix
# (k = pos + 1). A *drop* is a fall of at least 0.3 that lasts two points, its Newcombe
# interval below 0 after a correction for the positions scanned (`takeover.find_drop`);
# with few points and small n only large falls can show.

# %%
drops = takeover.curve_drops(BRANCHES, cases)
print(f"{int(drops['drop'].sum())} of {len(drops)} takeover curves drop")
drops

# %%
if cases:
    display(views.show(charts.takeover_chart(BRANCHES, cases, title="takeover curves"),
                       save_as=figures / "08_takeover"))
else:
    print("no case study: no takeover curve")

"""One schema per table, defined once. Every table the book writes is checked against
its schema here, so a column is renamed in one place or not at all.

Natural logs (nats) throughout. The per-token table's columns are a contract that every
chapter reads: columns may be added, none renamed without a note here.
"""

from __future__ import annotations

import pyarrow as pa

_str = pa.string()
_i16, _i32, _i64 = pa.int16(), pa.int32(), pa.int64()
_f32, _f64 = pa.float32(), pa.float64()
_bool = pa.bool_()

PROBLEMS = pa.schema(
    [
        ("problem_id", _str),  # the dataset's unique_id, never Python's hash()
        ("problem", _str),
        ("solution", _str),
        ("answer", _str),  # gold answer; from `answer` or the last \boxed{} of solution
        ("subject", _str),
        ("level", _i16),
        ("source", _str),  # where it came from: "demo:test", "hub:<id>/<config>/<split>", "file:<name>"
    ]
)

# One graded answer of one model to one problem (filtering samples; imported responses).
ANSWERS = pa.schema(
    [
        ("model", _str),
        ("problem_id", _str),
        ("sample", _i32),  # 0 = greedy, 1.. = sampled
        ("temperature", _f32),  # 0.0 for greedy
        ("seed", _i64),
        ("response", _str),
        ("n_tokens", _i32),
        ("finish_reason", _str),  # "stop" (EOS written), "length", or "imported"
        ("extracted", _str),  # the graded answer string, null when none was found
        ("grade_method", _str),
        ("n_boxes", _i16),
        ("correct", _bool),
        ("failure_type", _str),  # rollouts.FAILURE_TYPES
    ]
)

# Per problem: pass rates of reference and target and the selection verdict.
SELECTION = pa.schema(
    [
        ("problem_id", _str),
        ("n_ref", _i32),
        ("pass_ref", _f64),
        ("n_target", _i32),
        ("pass_target", _f64),
        ("greedy_ref_correct", _bool),
        ("greedy_target_correct", _bool),
        ("group", _str),  # "selected" | "control" | "excluded"
        ("reason", _str),
    ]
)

ROLLOUTS = pa.schema(
    [
        ("model", _str),
        ("problem_id", _str),
        ("rollout_id", _str),  # f"{problem_id}#{sample}", stable across runs
        ("sample", _i32),
        ("temperature", _f32),
        ("seed", _i64),
        ("prompt_ids", pa.list_(_i32)),
        ("response_ids", pa.list_(_i32)),  # as generated, EOS included when the model stopped
        ("response", _str),  # decode(response_ids, skip_special_tokens=True)
        ("n_tokens", _i32),
        ("finish_reason", _str),  # "stop" | "length" | "imported"
        ("token_method", _str),  # "generated" | "text" (tokenized separately, no special tokens)
        ("extracted", _str),
        ("grade_method", _str),
        ("n_boxes", _i16),
        ("correct", _bool),
        # correct | boxed_wrong | empty_box | no_box (finished without a box) | truncated
        # (cut at max_new_tokens) | imported | ungraded (the grader failed): rollouts.failure_type
        ("failure_type", _str),
        ("flags", _str),  # comma-separated notes, e.g. "special_token_text" for imported text
    ]
)

# Row k is the prediction of response token k: logits at position prompt_len + k - 1.
# P = checkpoint, Q = reference; natural logs. Every KL is named by its direction:
#   kl_ref_ckpt = KL(ref||ckpt) = sum_v q (log q - log p): how surprised the checkpoint is,
#     on average, by what the reference would write next;
#   kl_ckpt_ref = KL(ckpt||ref) = sum_v p (log p - log q): how surprised the reference is
#     by what the checkpoint would write next.
# dlogp = logp_ckpt - logp_ref is the signed change on the token actually written
# (> 0: the checkpoint endorses it more than the reference, < 0: it rejects it).
# k1, k2, k3 are Schulman's sampled-token functions of log r = logp_ckpt - logp_ref:
# k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r. Their mean over tokens x drawn
# from the reference *at temperature 1* estimates KL(ref||ckpt) (k1, k3 unbiased, k2
# biased); over tokens drawn at temperature T != 1 (as rollouts usually are) or from
# any other distribution they estimate E_{x ~ q_T}[k(x)], which is not KL(ref||ckpt).
# The `temperature` column says which T drew each row's token.
TOKENS = pa.schema(
    [
        ("suite", _str),
        ("checkpoint", _str),
        ("reference", _str),
        ("group", _str),  # "target" | "ref_right" | "control" | "t1_unselected" (forcing.plan)
        ("problem_id", _str),
        ("rollout_id", _str),
        ("failure_type", _str),  # of the rollout: see rollouts.FAILURE_TYPES
        ("temperature", _f32),  # the rollout's sampling temperature; NaN when imported
        ("pos", _i32),
        ("token_id", _i32),
        ("token", _str),
        ("char_start", _i32),
        ("char_end", _i32),
        ("first_token", _bool),  # pos == 0: depends on the prompt alone
        ("is_eos", _bool),  # the end-of-sequence token the model wrote
        ("context_id", _i64),  # hash of prompt + response[:pos]: equal ids, same test
        ("shared_context", _bool),  # the context occurs in more than one forced rollout
        ("logp_ckpt", _f32),
        ("logp_ref", _f32),
        ("dlogp", _f32),  # logp_ckpt - logp_ref
        ("rank_ckpt", _i32),  # 1 = the model's top choice
        ("rank_ref", _i32),
        ("entropy_ckpt", _f32),
        ("entropy_ref", _f32),
        ("kl_ckpt_ref", _f32),  # KL(ckpt||ref)
        ("kl_ref_ckpt", _f32),  # KL(ref||ckpt)
        ("js", _f32),
        ("k1", _f32),
        ("k2", _f32),
        ("k3", _f32),
        ("topk_ids_ckpt", pa.list_(_i32)),
        ("topk_p_ckpt", pa.list_(_f32)),
        ("topk_ids_ref", pa.list_(_i32)),
        ("topk_p_ref", pa.list_(_f32)),
    ]
)

TABLES: dict[str, pa.Schema] = {
    "problems": PROBLEMS,
    "answers": ANSWERS,
    "selection": SELECTION,
    "rollouts": ROLLOUTS,
    "tokens": TOKENS,
}

# --- Chapter 04, divergence: aggregates over the token tables of a suite (one row per
# group x step x ...). estimate/low/high: the statistic and its 95% interval (paired
# cluster bootstrap-t over problems unless the table says otherwise); problems: how many
# problems carry weight; rows: token rows (rollouts at the sequence level) behind it.
# Directions: kl_ref_ckpt = KL(ref‖ckpt), how surprised the checkpoint is by what the
# reference would write; kl_ckpt_ref = KL(ckpt‖ref), how surprised the reference is by
# what the checkpoint would write; dlogp = logp_ckpt - logp_ref of the written token.
_INTERVAL = [("estimate", _f64), ("low", _f64), ("high", _f64)]
_COUNTS = [("problems", _i32), ("rows", _i64)]

DIVERGENCE_WHEN = pa.schema(
    [("group", _str), ("metric", _str), ("step", _i64), ("checkpoint", _str), *_INTERVAL,
     ("se", _f64), *_COUNTS, ("method", _str)]  # step 0 = the reference itself, exactly 0
)
DIVERGENCE_PER_PROBLEM = pa.schema(
    [("group", _str), ("problem_id", _str), ("step", _i64), ("checkpoint", _str),
     ("metric", _str), ("mean", _f64)]
)
DIVERGENCE_CHANGES = pa.schema(
    [("group", _str), ("metric", _str), ("step_from", _i64), ("step_to", _i64),
     ("checkpoint_from", _str), ("checkpoint_to", _str), ("change", _f64), ("low", _f64),
     ("high", _f64), ("se", _f64), *_COUNTS]
)
DIVERGENCE_ECDF = pa.schema(
    [("group", _str), ("step", _i64), ("checkpoint", _str), ("metric", _str),
     ("share", _f64), ("log10_value", _f64), ("at_floor", _f64)]
)
DIVERGENCE_TAILS = pa.schema(
    [("group", _str), ("metric", _str), ("statistic", _str), ("step", _i64),
     ("checkpoint", _str), *_INTERVAL, *_COUNTS]
)
DIVERGENCE_POSITION = pa.schema(
    [("group", _str), ("metric", _str), ("scheme", _str), ("bin", _str), ("bin_order", _i32),
     ("step", _i64), ("checkpoint", _str), *_INTERVAL, ("se", _f64), *_COUNTS]
)
DIVERGENCE_CATEGORIES = pa.schema(
    [("group", _str), ("statistic", _str), ("category", _str), ("step", _i64),
     ("checkpoint", _str), *_INTERVAL, ("se", _f64), *_COUNTS]
)
DIVERGENCE_SIMILARITY = pa.schema(
    [("group", _str), ("metric", _str), ("step_a", _i64), ("step_b", _i64),
     ("checkpoint_a", _str), ("checkpoint_b", _str), ("spearman", _f64), ("low", _f64),
     ("high", _f64), *_COUNTS]
)
ENTROPY_DECILES = pa.schema(
    [("group", _str), ("metric", _str), ("entropy_decile", _i32), ("entropy_from", _f64),
     ("entropy_to", _f64), ("step", _i64), ("checkpoint", _str), *_INTERVAL, ("se", _f64),
     *_COUNTS]
)
ENTROPY_SHARE = pa.schema(
    [("group", _str), ("metric", _str), ("top", _f64), ("step", _i64), ("checkpoint", _str),
     *_INTERVAL, ("null_mean", _f64), ("null_low", _f64), ("null_high", _f64),
     ("mechanical_low", _f64), ("mechanical_high", _f64), *_COUNTS]
)
ESTIMATOR_LAB = pa.schema(
    [("group", _str), ("level", _str), ("estimator", _str), ("target", _str),
     ("step", _i64), ("checkpoint", _str), ("temperature_label", _str),
     ("mean_estimate", _f64), ("mean_exact", _f64), ("bias", _f64), ("low", _f64),
     ("high", _f64), ("relative_bias", _f64), ("spread", _f64), ("spearman", _f64),
     ("largest_share", _f64), ("meets_exact", _str), *_COUNTS]
)
ESTIMATOR_REWEIGHTED = pa.schema(
    [("group", _str), ("estimator", _str), ("step", _i64), ("checkpoint", _str),
     ("temperature_label", _str), ("mean_exact", _f64), ("mean_raw", _f64),
     ("reweighted_low", _f64), ("reweighted_mid", _f64), ("reweighted_high", _f64),
     ("error_mid", _f64), ("error_low", _f64), ("error_high", _f64), ("low", _f64),
     ("high", _f64), ("meets_exact", _str), *_COUNTS]
)
# Chapter 04, content apart from format (rlprobe_nb.divergence.phases): per ground-truth
# label the step from which it changes; the paired differences behind "most" claims.
DIVERGENCE_ONSETS = pa.schema(
    [("group", _str), ("category", _str), ("status", _str), ("onset_step", _i64),
     ("direction", _i32), ("step", _i64), *_INTERVAL, ("problems", _i32),
     ("most_problems", _i32)]  # onset_step -1: no onset
)
DIVERGENCE_CHANGE_BY_LABEL = pa.schema(
    [("group", _str), ("metric", _str), ("step_from", _i64), ("step_to", _i64),
     ("category", _str), *_INTERVAL, ("se", _f64), *_COUNTS]  # adds up to the change
)
DIVERGENCE_CONTRASTS = pa.schema(
    [("group", _str), ("scheme", _str), ("step", _i64), ("checkpoint", _str),
     ("statistic", _str), ("category", _str), ("versus", _str), ("eligible", pa.bool_()),
     *_INTERVAL, ("se", _f64), ("problems", _i32)]
)

TABLES.update({
    "divergence_when": DIVERGENCE_WHEN,
    "divergence_per_problem": DIVERGENCE_PER_PROBLEM,
    "divergence_changes": DIVERGENCE_CHANGES,
    "divergence_ecdf": DIVERGENCE_ECDF,
    "divergence_tails": DIVERGENCE_TAILS,
    "divergence_position": DIVERGENCE_POSITION,
    "divergence_categories": DIVERGENCE_CATEGORIES,
    "divergence_ground_truth": DIVERGENCE_CATEGORIES,  # the same, by ground-truth label
    "divergence_onsets": DIVERGENCE_ONSETS,
    "divergence_contrasts": DIVERGENCE_CONTRASTS,
    "divergence_change_by_label": DIVERGENCE_CHANGE_BY_LABEL,
    "divergence_similarity": DIVERGENCE_SIMILARITY,
    "entropy_deciles": ENTROPY_DECILES,
    "entropy_share": ENTROPY_SHARE,
    "estimator_lab": ESTIMATOR_LAB,
    "estimator_reweighted": ESTIMATOR_REWEIGHTED,
})


# --- Chapter 05, spikes -----------------------------------------------------------------
# One row per (checkpoint, context, written token) that is a spike at one step or more,
# at every step: ``significant`` marks the steps where it is a spike, the other rows are
# its series. A context shared by several rollouts is one row (n_rollouts; rollout_id and
# pos name the first). divergence = KL(ref‖ckpt) + KL(ckpt‖ref) unless the notebook's
# parameters chose another; p is the context's calibrated p-value, q its BH q-value
# among the checkpoint's n_tests distinct contexts, against ``null`` (the placebo checkpoint
# at the same step, or "internal": the checkpoint's own departures at other problems). sign: rejects / endorses /
# redistributes (see rlprobe_nb.spikes.statistic). rank_ref / rank_ckpt are the written
# token's rank before / after. moved_to_*: the checkpoint top-k token whose probability
# grew most (moved_to_p_ref is null when it was outside the reference's top-k).
SPIKES = pa.schema(
    [
        ("suite", _str),
        ("checkpoint", _str),
        ("step", _i32),
        ("reference", _str),
        ("group", _str),
        ("problem_id", _str),
        ("rollout_id", _str),
        ("pos", _i32),
        ("context_id", _i64),
        ("n_rollouts", _i32),
        ("token_id", _i32),
        ("token", _str),
        ("char_start", _i32),
        ("char_end", _i32),
        ("context", _str),  # ± 12 tokens of text, the token in [brackets]
        ("category", _str),  # chapter 04's token category of the written token (spikes.table.token_category)
        ("first_token", _bool),
        ("significant", _bool),
        ("statistic", _f64),  # T = max(z_divergence, |z_written|), in null scales
        ("null", _str),  # what the checkpoint was tested against: "internal" or a placebo
        ("z_divergence", _f64),  # log divergence vs its conditional null, in null scales
        ("z_written", _f64),  # the written token's log-odds change vs its conditional null, signed
        ("p", _f64),
        ("q", _f64),
        ("n_tests", _i32),
        ("sign", _str),
        ("written_share", _f32),  # share of the divergence carried by the written token
        ("dlogp", _f32),
        ("divergence", _f64),
        ("kl_ref_ckpt", _f32),
        ("kl_ckpt_ref", _f32),
        ("rank_ref", _i32),
        ("rank_ckpt", _i32),
        ("logp_ref", _f32),
        ("logp_ckpt", _f32),
        ("entropy_ref", _f32),
        ("moved_to_id", _i32),
        ("moved_to_token", _str),
        ("moved_to_p_ckpt", _f32),
        ("moved_to_p_ref", _f32),
        ("onset_step", _i32),  # null: not a spike at the last step
        ("persistence", _str),  # persistent | transient | sign_flip
        ("region_id", _str),  # f"{rollout_id}@{pos_start}-{pos_end}", null where not a spike
    ]
)

# Adjacent spikes of one rollout at one checkpoint, merged (rlprobe_nb.spikes.regions).
SPIKE_REGIONS = pa.schema(
    [
        ("checkpoint", _str),
        ("step", _i32),
        ("problem_id", _str),
        ("rollout_id", _str),
        ("region_id", _str),
        ("pos_start", _i32),
        ("pos_end", _i32),
        ("char_start", _i32),
        ("char_end", _i32),
        ("n_spikes", _i32),
        ("signs", _str),
        ("max_divergence", _f64),
        ("text", _str),
    ]
)

# Every distinct (checkpoint, context, written token) with its test (``spikes.detect``):
# the spikes and every context that is not one, what chapter 05's summaries, rates and
# strongest departures read. Columns as in SPIKES (category: null where the token tables
# carry none); row: the row of the suite's token tables as chapter 05 concatenates them
# (``suite_tables.read_tokens``) that it comes from.
SPIKE_TESTS = pa.schema(
    [("suite", _str), ("checkpoint", _str), ("step", _i64), ("reference", _str),
     ("group", _str), ("failure_type", _str), ("problem_id", _str), ("rollout_id", _str),
     ("pos", _i32), ("context_id", _i64), ("token_id", _i32), ("token", _str),
     ("char_start", _i32), ("char_end", _i32), ("category", _str), ("first_token", _bool),
     ("logp_ref", _f32),
     ("logp_ckpt", _f32), ("dlogp", _f32), ("kl_ref_ckpt", _f32), ("kl_ckpt_ref", _f32),
     ("js", _f32), ("entropy_ref", _f32), ("entropy_ckpt", _f32), ("rank_ref", _i32),
     ("rank_ckpt", _i32), ("statistic", _f64), ("p", _f64), ("z_divergence", _f64),
     ("q", _f64), ("divergence", _f64), ("n_tests", _i64), ("null", _str),
     ("z_written", _f64), ("n_rollouts", _i64), ("row", _i64), ("written_share", _f64),
     ("sign", _str), ("significant", _bool)]
)

# The test's power on the suite's own tables (``spikes.plants.plant_check``): plants of
# size d (nats) per checkpoint, how many the test found (recall) and the spikes elsewhere
# in a planted table per run.
SPIKE_PLANTS = pa.schema(
    [("checkpoint", _str), ("step", _i64), ("null", _str), ("d", _f64), ("plants", _i64),
     ("found", _i64), ("recall", _f64), ("other_per_run", _f64)]
)

# The same plants ranked among the checkpoint's real contexts (``plants.plant_ranks``):
# the share of real contexts with a larger p-value, the plants' median p, and the bar of
# BH's first step, q / m.
SPIKE_PLANT_RANKS = pa.schema(
    [("checkpoint", _str), ("step", _i64), ("null", _str), ("d", _f64), ("plants", _i64),
     ("ranked_above", _f64), ("median_p", _f64), ("bar (q / m)", _f64)]
)

# Plants in a placebo's own table, half of its problems tested against the other half
# (``placebo_plants.placebo_plant_check``): per checkpoint and plant size the plants found;
# per split the discoveries outside the plants (their share of all discoveries) and the
# placebo's discoveries with nothing planted.
SPIKE_PLACEBO_PLANTS = pa.schema(
    [("checkpoint", _str), ("step", _i64), ("null", _str), ("d", _f64), ("plants", _i64),
     ("found", _i64), ("recall", _f64), ("other_per_split", _f64), ("other_share", _f64),
     ("unplanted_per_split", _f64)]
)

# One p-value per tested context of each calibration check (a real table, a simulated null
# table, a real table's halves tested against each other), by ``label``.
SPIKE_CALIBRATION = pa.schema([("label", _str), ("p", _f64)])

# Per ground-truth label and token category (``scheme``, ``category``) and step, the mean
# departure of the written tokens (Δlogp against the reference, or against the placebo at
# the step: ``against``) with its interval over problems (``spikes.onsets``).
SPIKE_LABEL_DEPARTURES = pa.schema(
    [("scheme", _str), ("category", _str), ("step", _i64), ("against", _str), *_INTERVAL,
     ("problems", _i64), ("rows", _i64)]
)

TABLES.update({"spikes": SPIKES, "spike_regions": SPIKE_REGIONS, "spike_tests": SPIKE_TESTS,
               "spike_plants": SPIKE_PLANTS, "spike_plant_ranks": SPIKE_PLANT_RANKS,
               "spike_placebo_plants": SPIKE_PLACEBO_PLANTS,
               "spike_calibration": SPIKE_CALIBRATION,
               "spike_label_departures": SPIKE_LABEL_DEPARTURES,
               # the placebo run's own departures from the reference, by label and step
               "spike_placebo_departures": SPIKE_LABEL_DEPARTURES})

# --- Chapter 08, counterfactuals ---------------------------------------------------------
# One row per context a policy model continued: a rollout cut at response token `pos`,
# either as it is (arm "prefix": response[:pos], a point of a takeover curve), with the
# written token kept (arm "keep": response[:pos + 1]) or with another token swapped in
# for it (response[:pos] + [substituted_id]): arm "top1", the checkpoint's most probable
# real alternative (substituted_rank: its rank in the checkpoint's top-k, from 0), or arm
# "correct", the digit the ground-truth labeller says is right at a first wrong digit;
# prefix_len counts the rollout's tokens kept. kind: "point" (a branch point; `rule`
# names the source that picked it: "spikes", a ground-truth label, or
# "positive_control"), "control" (a token of the point's rollout matched to the point at
# matched_pos on category and the reference's entropy; `match`: "category" or "entropy"
# only; `rule` is its point's), "grid" (a takeover-curve point). `model` wrote the n
# continuations (seeded per rollout, prefix, substituted token and sample: `seeds`),
# graded whole with the book's grader; passes of n, with a Wilson 95% interval.
# `category` (chapter 04's) and `ground_truth` (the labeller's) are the row's token's;
# `result_is_answer`: at a first wrong digit, whether the wrong statement's true value is
# the problem's answer (the answer is then written from that result).
BRANCHES = pa.schema(
    [
        ("suite", _str),
        ("checkpoint", _str),  # whose spikes chose the positions
        ("model", _str),  # the policy that wrote the continuations
        ("problem_id", _str),
        ("rollout_id", _str),
        ("kind", _str),  # point | control | grid
        ("rule", _str),  # what picked the point (a control: its point's)
        ("pos", _i32),
        ("arm", _str),  # prefix | keep | top1 | correct
        ("prefix_len", _i32),
        ("written_id", _i32),  # the rollout's token at pos; null at the end of the response
        ("written_token", _str),
        ("substituted_id", _i32),  # null unless arm is top1 or correct
        ("substituted_token", _str),
        ("substituted_rank", _i32),  # top1: rank in the checkpoint's top-k (from 0)
        ("category", _str),
        ("ground_truth", _str),
        ("result_is_answer", pa.bool_()),  # a first wrong digit's statement computes the answer
        ("matched_pos", _i32),  # controls: the point's position (same rollout)
        ("match", _str),
        ("entropy_ref", _f32),  # the reference's entropy at pos (nats)
        ("n", _i32),
        ("passes", _i32),
        ("pass_rate", _f64),
        ("wilson_low", _f64),
        ("wilson_high", _f64),
        ("n_stopped", _i32),  # ended with EOS or a closed box (the rest hit a limit)
        ("mean_new_tokens", _f32),
        ("temperature", _f32),
        ("max_new_tokens", _i32),  # the response's limit, prefix included
        ("continuation_tokens", _i32),  # the limit on a continuation's new tokens (null: none)
        ("seed", _i64),  # the run's seed
        ("seeds", pa.list_(_i64)),  # the n continuations' seeds
    ]
)

TABLES["branches"] = BRANCHES

# --- Chapter 09, takeover ----------------------------------------------------------------
# One row per (checkpoint, rule, problem, sample): the response written when the reference
# writes and `checkpoint` takes over where the rule passes (rlprobe_nb.takeover.lockstep).
# criterion "never" is the reference alone, "always" the checkpoint alone (budget and
# threshold null); otherwise the rule takes over where the criterion's score of the
# reference's draw is > threshold, the criterion's (1 - budget) quantile over the
# checkpoint's forced positions. `taken`: positions (0 = first response token) where the
# rule passed; `changed`: those where the checkpoint's draw was another token. Graded with
# the book's grader.
TAKEOVER = pa.schema(
    [
        ("suite", _str),
        ("checkpoint", _str),
        ("run", _str),  # rlvr | placebo
        ("step", _i32),
        ("criterion", _str),  # never | always | delta_logp | kl | entropy | random
        ("budget", _f64),
        ("threshold", _f64),
        ("problem_id", _str),
        ("sample", _i32),
        ("seed", _i64),
        ("response", _str),
        ("response_ids", pa.list_(_i32)),
        ("n_tokens", _i32),
        ("finish_reason", _str),  # stop | length | box
        ("taken", pa.list_(_i32)),
        ("changed", pa.list_(_i32)),
        ("extracted", _str),
        ("correct", _bool),
        ("temperature", _f32),
    ]
)

TABLES["takeover"] = TAKEOVER

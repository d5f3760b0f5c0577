"""Chapter 04: how much, when and where each checkpoint departs from the reference.

  clustered              intervals for tokens clustered in problems
  token_categories       what kind of token each row is, read from its place in the text
  ground_truth           the arithmetic each response writes, verified, and a label per
                         token (result_first_wrong, result_correct, operand...)
  written_arithmetic     the lexer and parser ground_truth reads statements with
  summary                the aggregates: by step, tails, position, category
  phases                 content apart from format: from which step each ground-truth label
                         changes, which label changes most (tested), what a change of the
                         mean KL is made of
  entropy_concentration  does the divergence sit where the reference was unsure?
  estimator_lab          the sampled-token estimators k1, k2, k3: what they target under
                         tempered sampling, reweighting, the T = 1 check on unselected draws
  disagreement           the disagreement map: where each checkpoint's top-1 is another token
                         than the written one, by label and step, RLVR beside placebo
  disagreement_charts    its charts
  charts                 the chapter's charts, from aggregated tables
  narrative              the chapter's sentences, from aggregated tables (via reporting)
  trainer_kl             a trainer's logged KL (TRL log_history, verl's file logger) beside
                         the exact KL of the same checkpoint on its own imported samples
"""

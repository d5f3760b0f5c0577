"""Chapter 01: problems, how answers are graded, and which problems are studied.

  sources       problem sources (hub, file, prior project, generator) -> one table
  arithmetic    seeded arithmetic problems in MATH's schema (the demo suite's source)
  grading       math-verify grading of a model's answer, never executing model text
  grading_pool  worker processes with a per-answer wall-clock limit
  filtering     pass rates, the selection rule, a control group, a paired test
"""

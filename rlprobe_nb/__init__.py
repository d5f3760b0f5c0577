"""rlprobe_nb: find the tokens where RLVR training changes a model's reasoning.

A thin helper package under the notebooks in ``notebooks/``: one module per idea
(params, paths, suite, problems, grading, rollouts, forcing, divergence, storage,
statistics). Notebooks orchestrate; everything reused, tested or numerical lives here.
"""

__version__ = "0.1.0"

"""rlprobe_nb: find the tokens where RLVR training changes a model's reasoning.

A thin helper package under the notebooks in ``notebooks/``: one module per idea
(params, paths, keys, storage, problems, grading, rollouts, forcing, divergence,
statistics, views, ...). Notebooks orchestrate; everything reused, tested or numerical
lives here.
"""

__version__ = "0.1.0"

from .progress import in_kernel as _in_kernel, quiet_library_progress as _quiet

if _in_kernel():  # library progress bars as plain text in notebooks (see progress)
    _quiet()

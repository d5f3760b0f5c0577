"""rlprobe_nb: find the tokens where RLVR training changes a model's reasoning.

A thin helper package under the notebooks in ``notebooks/``, laid out like the book:
one subpackage per stage, imports only downward (a test checks the graph).

  suite/  tables/    what a suite is; how results are kept (below every stage)
  problems/          01  problems, grading, filtering and selection
  generation/        01 02  seeded sampling of answers and rollouts
  forcing/           03  teacher forcing and the exact per-token metrics
  divergence/        04  aggregates, token categories, ground truth, entropy, estimators
  spikes/            05  tokens that depart far more than comparable ones
  render/            06 07  case studies, coloured tokens, the live viewer
  counterfactuals/   08  does the token matter? branching and grading continuations
  demo/              only the demo suite: its GRPO run, tiny stand-ins
  book, distributed, progress, statistics, views: used by every stage
  kernels, pages/, readable: how the book runs its notebooks and how its pages read
"""

__version__ = "0.1.0"

import sys as _sys

# altair checks chart specs with jsonschema, which imports the optional IRI grammar package
# rfc3987_syntax where it is installed (JupyterLab's dependencies bring it); building that
# grammar takes ~1.7 s of every kernel's start, for a string format no chart uses. Marked
# absent here (unless already imported), jsonschema leaves its "iri" format unchecked.
_sys.modules.setdefault("rfc3987_syntax", None)

from rlprobe_nb.progress import in_kernel as _in_kernel
from rlprobe_nb.progress import quiet_library_progress as _quiet

if _in_kernel():  # library progress bars as plain text in notebooks (see progress)
    _quiet()
    from rlprobe_nb.readable import install as _readable_tables

    _readable_tables()  # DataFrames to meaningful digits, token text visible (see readable)

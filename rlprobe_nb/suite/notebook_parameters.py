"""A notebook refuses parameters it does not declare.

papermill only warns about unknown ``-p`` names; a typo would then silently run with the
default. ``check_notebook_parameters`` finds the injected cell in the kernel's input
history (``In``) by its ``# Parameters`` header and reads it with ``ast`` (never
executed here).
"""

from __future__ import annotations

import ast

from rlprobe_nb.suite.param_schema import ParamsError, hint


def check_notebook_parameters(history: list[str], declared: list[str]) -> None:
    """Fail on parameters papermill injected that the notebook does not declare."""
    for source in history:
        if not source.lstrip().startswith("# Parameters"):
            continue
        names = []
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign):
                names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        unknown = [n for n in names if n not in declared]
        if unknown:
            raise ParamsError(
                f"unknown notebook parameter(s) {unknown}{hint(unknown[0], declared)}; "
                f"this notebook takes: {declared}"
            )

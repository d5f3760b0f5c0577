"""A notebook's parameters arrive with their declared types, or the run stops.

Each notebook declares its parameters in the cell tagged ``parameters``, with their types
as annotations (``overwrite: bool = False``, ``n_problems: int | None = None``); papermill
injects the values given with ``-p`` in a cell after it. papermill reads only ``True``
and ``False`` as booleans, so ``-p overwrite false`` arrives as the string ``"false"``,
and ``if overwrite:`` would be true. ``check_notebook_parameters(globals())``, the first
line after the parameters, refuses:

- a parameter the notebook does not declare (papermill only warns; a typo would run with
  the default), found in the injected cell, which is read with ``ast``, never executed;
- a value of another type than the declared one (a string for a boolean, a float for an
  integer, a string for a list), naming the parameter and how to pass it.
"""

from __future__ import annotations

import ast
import difflib
import types
import typing
from typing import Any

from rlprobe_nb.suite.param_schema import ParamsError


def _hint(key: str, valid) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def injected_names(history: list[str]) -> list[str]:
    """The names papermill assigned in its injected cell (headed ``# Parameters``)."""
    names = []
    for source in history:
        if not source.lstrip().startswith("# Parameters"):
            continue
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign):
                names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def conforms(value: Any, tp: Any) -> bool:
    """Whether ``value`` is of the declared type (int is not bool; a float accepts an int)."""
    if tp is None or tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in typing.get_args(tp))
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return isinstance(value, list) and all(conforms(v, item) for v in value)
    if tp is Any:
        return True
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    raise TypeError(f"unsupported notebook parameter type {tp!r}")


def _how_to_pass(name: str, value: Any, tp: Any) -> str:
    if isinstance(value, str) and conforms(True, tp):
        return (f"; papermill reads only True and False as booleans: -p {name} True or "
                f"-p {name} False")
    if isinstance(value, str) and any(typing.get_origin(a) is list
                                      for a in (tp, *typing.get_args(tp))):
        return f"; pass a list as YAML: -y '{name}: [a, b]'"
    return ""


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def check_notebook_parameters(namespace: dict) -> None:
    """Refuse undeclared parameters and values of another type than declared (see the
    module docstring). ``namespace``: the notebook's ``globals()``."""
    declared = dict(namespace.get("__annotations__") or {})
    if not declared:
        raise ParamsError("the notebook's parameters cell declares no types: write each "
                     "parameter as `name: type = default`")
    unknown = [n for n in injected_names(namespace.get("In") or []) if n not in declared]
    if unknown:
        raise ParamsError(f"unknown notebook parameter(s) {unknown}{_hint(unknown[0], declared)}; "
                     f"this notebook takes: {list(declared)}")
    for name, tp in declared.items():
        value = namespace.get(name)
        if not conforms(value, tp):
            raise ParamsError(f"notebook parameter {name!r}: expected {_describe(tp)}, got "
                         f"{type(value).__name__} {value!r}{_how_to_pass(name, value, tp)}")

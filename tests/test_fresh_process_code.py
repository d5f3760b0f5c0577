"""Code that runs in a fresh process is checked where pytest can see it.

Some tests hand a snippet to a new interpreter (``python -c SNIPPET`` or a file written and
run), the device scripts do the same on GPU machines, and the benchmarks are run as scripts.
pytest imports none of that code, so a module that moves breaks it only where it runs: the
GPU-only decode tests still said ``from rlprobe_nb import decoding`` after the module moved
to ``rlprobe_nb.generation``, and nothing noticed until their next run on a GPU.

Every such snippet is found by reading the sources with ``ast`` (nothing is run): the
argument after ``"-c"`` in a subprocess call, or Python text written to a file with
``write_text``, resolved through the names, concatenations and ``textwrap.dedent`` calls
that build it (a ``replace`` or ``format`` filling values into it keeps its code), and through a helper's parameter to its callers' arguments. Each must
compile, and each of its ``rlprobe_nb`` imports must resolve (the module exists and has
every name imported from it). A snippet built in a way this reader does not follow fails
with its place, so it is mended here rather than skipped unseen.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "rlprobe_nb"
SUBPROCESS_CALLS = {"run", "Popen", "check_output", "check_call", "call"}
# str methods that fill values into a snippet's placeholders: the snippet's code is the text's
TEXT_METHODS = {"replace", "format", "strip"}
# python -c "..." in a shell script: the double-quoted text (no double quote inside)
SHELL_SNIPPET = re.compile(r'python3?\s+-c\s+"([^"]*)"')
SHELL_MODULE = re.compile(r'\s-m\s+(rlprobe_nb[\w.]*)')  # python -m rlprobe_nb.X, $(PY) -m ...


class _Module:
    """One test module's parse tree, with its assignments by scope and its functions."""

    def __init__(self, path: Path):
        self.path = path
        self.tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        self.parents = {child: node for node in ast.walk(self.tree)
                        for child in ast.iter_child_nodes(node)}
        self.functions = {node.name: node for node in ast.walk(self.tree)
                          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def where(self, node: ast.AST) -> str:
        return f"{self.path.relative_to(REPO)}:{node.lineno}"

    def function_of(self, node: ast.AST):
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None

    def assigned(self, name: str, scope: ast.AST) -> ast.expr | None:
        """The last plain assignment of ``name`` directly in ``scope`` (a function or the
        module), or None."""
        found = None
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                if scope is self.tree and self.function_of(node) is not None:
                    continue  # a function's local, not the module's constant
                found = node.value
        return found

    def text(self, expr: ast.expr, at: ast.AST, depth: int = 0) -> list[str] | None:
        """Every text ``expr`` can take (one per caller where it is a helper's parameter),
        or None where it is built in a way this reader does not follow."""
        if depth > 8:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return [expr.value]
        if isinstance(expr, ast.JoinedStr):  # an f-string: its fields become a plain name
            return ["".join(v.value if isinstance(v, ast.Constant) else "_field"
                            for v in expr.values)]
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left, right = self.text(expr.left, at, depth + 1), self.text(expr.right, at, depth + 1)
            return None if left is None or right is None else [a + b for a in left for b in right]
        if isinstance(expr, ast.Call) and _called(expr) == "dedent" and expr.args:
            inner = self.text(expr.args[0], at, depth + 1)
            return None if inner is None else [textwrap.dedent(t) for t in inner]
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and expr.func.attr in TEXT_METHODS:  # values filled into the text's literals
            return self.text(expr.func.value, at, depth + 1)
        if isinstance(expr, ast.Name):
            return self._name(expr.id, at, depth)
        return None

    def _name(self, name: str, at: ast.AST, depth: int) -> list[str] | None:
        function = self.function_of(at)
        if function is not None:
            local = self.assigned(name, function)
            if local is not None:
                return self.text(local, local, depth + 1)
            params = [a.arg for a in function.args.args]
            if name in params:
                return self._callers_arguments(function, params.index(name), depth)
        value = self.assigned(name, self.tree)
        return None if value is None else self.text(value, value, depth + 1)

    def _callers_arguments(self, function, index: int, depth: int) -> list[str] | None:
        texts: list[str] = []
        for call in ast.walk(self.tree):
            if isinstance(call, ast.Call) and _called(call) == function.name:
                if len(call.args) <= index:
                    return None
                found = self.text(call.args[index], call, depth + 1)
                if found is None:
                    return None
                texts += found
        return texts or None


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _imports_something(text: str) -> bool:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    return any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree))


def _test_snippets(module: _Module):
    """(place, text or None) of every snippet the module runs in a fresh process."""
    for call in ast.walk(module.tree):
        if not isinstance(call, ast.Call):
            continue
        name = _called(call)
        if name in SUBPROCESS_CALLS and call.args and isinstance(call.args[0], (ast.List, ast.Tuple)):
            argv = call.args[0].elts
            for i, arg in enumerate(argv[:-1]):
                if isinstance(arg, ast.Constant) and arg.value == "-c":
                    for k, text in enumerate(module.text(argv[i + 1], call) or [None]):
                        yield f"{module.where(call)}#{k}", text
                elif isinstance(arg, ast.Constant) and arg.value == "-m" \
                        and isinstance(argv[i + 1], ast.Constant):  # python -m MODULE
                    yield f"{module.where(call)}#m", f"import {argv[i + 1].value}\n"
        elif name == "write_text" and call.args:
            for k, text in enumerate(module.text(call.args[0], call) or []):
                if _imports_something(text):  # Python text written to a file and run
                    yield f"{module.where(call)}#w{k}", text


def _snippets() -> list[tuple[str, str | None]]:
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        found += list(_test_snippets(_Module(path)))
    for path in [*sorted((REPO / "scripts").glob("*.sh")), REPO / "Makefile"]:
        for match in SHELL_SNIPPET.finditer(path.read_text(encoding="utf-8")):
            line = path.read_text(encoding="utf-8")[:match.start()].count("\n") + 1
            found.append((f"{path.relative_to(REPO)}:{line}", match.group(1)))
        for match in SHELL_MODULE.finditer(path.read_text(encoding="utf-8")):
            line = path.read_text(encoding="utf-8")[:match.start()].count("\n") + 1
            found.append((f"{path.relative_to(REPO)}:{line}#m", f"import {match.group(1)}\n"))
    for folder in ("benchmarks", "scripts"):  # run as scripts: the whole file is the snippet
        for path in sorted((REPO / folder).glob("*.py")):
            found.append((str(path.relative_to(REPO)), path.read_text(encoding="utf-8")))
    return found


def unresolved_imports(text: str, place: str) -> list[str]:
    """The package imports of ``text`` that do not resolve (compiling it first)."""
    tree = compile(text, place, "exec", flags=ast.PyCF_ONLY_AST)
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            missing += [a.name for a in node.names if a.name.split(".")[0] == PACKAGE
                        and importlib.util.find_spec(a.name) is None]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == PACKAGE:
            try:
                module = importlib.import_module(node.module)
            except ImportError:
                missing.append(node.module)
                continue
            missing += [f"{node.module}.{a.name}" for a in node.names if a.name != "*"
                        and not hasattr(module, a.name)
                        and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    return missing


SNIPPETS = _snippets()


def test_the_reader_finds_the_snippets_it_was_written_for():
    places = {place.split("#")[0].split(":")[0] for place, _ in SNIPPETS}
    for expected in ("tests/test_decoding_cuda.py", "tests/test_fused_metrics.py",
                     "tests/test_forcing_resume.py", "tests/test_grading.py",
                     "scripts/device_book.sh", "benchmarks/bench_engine.py"):
        assert expected in places, expected


@pytest.mark.parametrize("place,text", SNIPPETS, ids=[p for p, _ in SNIPPETS])
def test_fresh_process_code_compiles_and_its_imports_resolve(place, text):
    assert text is not None, (f"{place}: the code run in a fresh process is built in a way "
                              "this test does not follow; build it from plain strings")
    assert unresolved_imports(text, place) == [], place


def test_a_moved_module_is_caught():
    snippet = "import json\nfrom rlprobe_nb import decoding\n"
    assert unresolved_imports(snippet, "here") == ["rlprobe_nb.decoding"]
    assert unresolved_imports("from rlprobe_nb.generation import decoding\n", "here") == []
    with pytest.raises(SyntaxError):
        unresolved_imports("def (:\n", "here")

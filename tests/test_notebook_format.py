"""Every notebook is a jupytext py:percent file with an .ipynb twin: in sync, outputs
stripped, kernelspec python3, one `parameters` cell of plain literals, then a cell that
derives everything else."""

import ast

import jupytext
import nbformat
import pytest

from rlprobe_nb.suite import paths

SOURCES = sorted(paths.notebooks_dir().glob("*.py"))


def test_there_are_notebooks():
    assert len(SOURCES) >= 1


def cells(nb):
    return [(c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in nb.cells]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_py_and_ipynb_in_sync(source):
    twin = source.with_suffix(".ipynb")
    assert twin.exists(), f"{twin.name} missing: run `make sync`"
    from_py = jupytext.read(source)
    from_ipynb = nbformat.read(twin, as_version=4)
    assert cells(from_py) == cells(from_ipynb), f"{source.name} and {twin.name} differ: run `make sync`"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_ipynb_is_stripped_with_python3_kernel(source):
    nb = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "outputs not stripped"


def is_plain_literal(node) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_one_parameters_cell_of_plain_literals(source):
    nb = jupytext.read(source)
    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell must be tagged `parameters`"
    body = ast.parse(code[tagged[0]].source).body
    assert body, "the parameters cell is empty"
    for stmt in body:  # `name: type = literal`: the type is what check_notebook_parameters holds
        assert isinstance(stmt, ast.AnnAssign) and stmt.value is not None \
            and is_plain_literal(stmt.value), (
            f"parameters cell: `{ast.unparse(stmt)}` is not `name: type = plain literal`")
    derive = code[tagged[0] + 1].source
    assert "params.check_notebook_parameters(globals())" in derive, (
        "the cell after `parameters` derives everything and first refuses unknown parameters "
        "and values of another type than declared")
    if source.name[:2].isdigit():
        assert "params.load(" in derive, "a chapter derives its parameters with params.load"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_no_relative_data_paths(source):
    text = source.read_text()
    assert "../data" not in text and "../figures" not in text, "paths come from rlprobe_nb.suite.paths"

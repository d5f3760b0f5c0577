"""Notebook runs through papermill, as a user runs them: bad parameters fail in the
derive cell, before any model is loaded; the demo chain 01 -> 02 -> 03 runs on small
parameters and its output names what it used."""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from rlprobe_nb import paths, storage

NB = paths.notebooks_dir()
PAPERMILL = [sys.executable, "-m", "papermill", "--no-progress-bar"]


def papermill(notebook, out, *params, env=None):
    args = [str(NB / notebook), str(out)]
    for key, value in params:
        args += ["-p", key, str(value)]
    return subprocess.run(PAPERMILL + args, capture_output=True, text=True, env=env,
                          cwd=paths.REPO_ROOT, timeout=1800)


def outputs(path) -> str:
    nb = nbformat.read(path, as_version=4)
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text.append(out.get("text") or out.get("data", {}).get("text/plain", "")
                        or "\n".join(out.get("traceback", [])))
    return "\n".join(map(str, text))


def failing_cell(path) -> str:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return cell.source
    return ""


@pytest.fixture()
def out_env(tmp_path):
    return {**os.environ, "RLPROBE_OUT": str(tmp_path / "out")}


def test_unknown_checkpoint_fails_before_any_model_loads(tmp_path, out_env):
    result = papermill("03_teacher_forcing.ipynb", tmp_path / "o.ipynb",
                       ("checkpoint", "rlvr_step_1300"), env=out_env)
    assert result.returncode != 0
    text = outputs(tmp_path / "o.ipynb")
    assert "rlvr_step_1300.yaml" in text and "'rlvr_step_1200'" in text
    assert "params.load(" in failing_cell(tmp_path / "o.ipynb")
    assert "load_model" not in failing_cell(tmp_path / "o.ipynb")
    assert "Loading weights" not in text


def test_misspelled_notebook_parameter_fails(tmp_path, out_env):
    result = papermill("03_teacher_forcing.ipynb", tmp_path / "o.ipynb",
                       ("checkpont", "rlvr_step_1200"), env=out_env)
    assert result.returncode != 0
    text = outputs(tmp_path / "o.ipynb")
    assert "unknown notebook parameter" in text and "did you mean 'checkpoint'" in text

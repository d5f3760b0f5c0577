"""`make clean-results` deletes results and installs nothing (issue 22 item 7): it
depended on `install`, which reinstalls whenever pyproject.toml or the constraints are
newer than the environment."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from rlprobe_nb.suite import paths


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_clean_results_installs_nothing():
    plan = subprocess.run(["make", "-n", "-B", "clean-results"], cwd=paths.REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "rlprobe_nb.tables.clean" in plan.stdout
    assert "pip install" not in plan.stdout and "venv" not in plan.stdout.replace(
        ".venv/bin/python", ""), plan.stdout

"""Nothing stale is served as current, chapters 04 and 05 (issue 34, acceptance 2): on a
copy of the shrunk whole book (the session's small book), an unchanged rerun reuses every
table in one line; a changed source file or a changed input table is refused by name,
before any work; -p overwrite True recomputes. (Chapters 01 to 03: test_staleness.py.)"""

import subprocess
import sys
from pathlib import Path

import pytest
import session_book
from test_notebooks import outputs, papermill
from test_staleness import changed_code, edit_yaml

from rlprobe_nb.suite import paths
from rlprobe_nb.tables import storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

CHAPTERS = {"04_divergence": "divergence/summary.py", "05_spikes": "spikes/statistic.py"}


@pytest.fixture(scope="module")
def book(small_book, tmp_path_factory):
    """A private copy of the shrunk book's results and parameters (the session's own copy
    stays as the book wrote it)."""
    return session_book.private_copy(small_book, tmp_path_factory.mktemp("stale_book"))


def run_chapter(book, notebook, *extra, env=None) -> tuple[bool, str]:
    out = book["root"] / f"{notebook}.ipynb"
    result = papermill(f"{notebook}.ipynb", out, *extra, env=env or book["env"])
    return result.returncode == 0, outputs(out)


def chapter_parts(book, notebook) -> dict[str, int]:
    """Every part of the tables ``notebook`` wrote, with its modification time."""
    parts = {}
    for manifest in book["data"].glob(f"*/{storage.MANIFEST}"):
        if storage.read_json(manifest).get("producer") == f"notebooks/{notebook}":
            parts.update({str(p): p.stat().st_mtime_ns for p in manifest.parent.glob("*.parquet")})
    assert parts, f"{notebook} wrote no table"
    return parts


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_04_and_05_reuse_every_table_when_nothing_changed(book, notebook):
    before = chapter_parts(book, notebook)
    ok, text = run_chapter(book, notebook)
    assert ok and text.count("reusing ") == 1, text[-2500:]
    assert chapter_parts(book, notebook) == before


@pytest.mark.parametrize("notebook,file", CHAPTERS.items())
def test_04_and_05_refuse_a_changed_source_file_by_name(book, notebook, file):
    before = chapter_parts(book, notebook)
    env = {**book["env"], **changed_code(book["root"], {file: ("\n", "\n# a changed line\n")})}
    ok, text = run_chapter(book, notebook, env=env)
    assert not ok and f"code.files.{file}" in text and "StaleTableError" in text, text[-2500:]
    assert chapter_parts(book, notebook) == before


def test_04_and_05_refuse_a_changed_input_table_then_recompute_it(book):
    """The token tables forced again under another forcing.seed (same rollouts, another
    key): 04 and 05 name the token table that changed; overwrite recomputes, and the
    next run reuses."""
    suite_file = Path(book["env"]["RLPROBE_PARAMS"]) / "demo" / "suite.yaml"
    edit_yaml(lambda d: d["forcing"].update(seed=d["forcing"]["seed"] + 1))(suite_file)
    done = subprocess.run([sys.executable, "-m", "rlprobe_nb.book", "--only", "03", "--overwrite"],
                          env=book["env"], cwd=paths.REPO_ROOT, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2500:]
    for notebook in CHAPTERS:
        before = chapter_parts(book, notebook)
        ok, text = run_chapter(book, notebook)
        assert not ok and "inputs.tokens/rlvr_step_1200__vs__dpo" in text, text[-2500:]
        assert "StaleTableError" in text and chapter_parts(book, notebook) == before
        ok, text = run_chapter(book, notebook, ("overwrite", True))
        assert ok and "recomputing" in text and "reusing " not in text, text[-2500:]
        ok, text = run_chapter(book, notebook)
        assert ok and text.count("reusing ") == 1, text[-2500:]

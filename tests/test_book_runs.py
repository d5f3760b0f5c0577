"""How the book runs its notebooks (issue 44 items 9 and 10): Ctrl-C stops every run of
a wave at once, with one line and no traceback; temporary notebooks of interrupted runs
are removed by the next run; a notebook whose .ipynb is not its .py twin is refused."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlprobe_nb import book, book_runs, kernels
from rlprobe_nb.suite import paths


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt here, whatever an earlier test of this process left
    (an ignored SIGINT is also inherited by the book started below)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_stops_both_runs_of_a_wave_at_once_without_a_traceback(monkeypatch, capsys,
                                                                       tmp_path):
    """Before, the book waited for both notebooks of a two-notebook wave to finish and
    then printed a raw traceback."""
    stop = threading.Event()
    ended = []

    def run(nb, parameters, stem):  # a notebook that runs until its kernel is signalled
        if not stop.wait(timeout=60):
            raise AssertionError("never stopped")
        ended.append(stem)
        (tmp_path / f"{stem}.FAILED.ipynb").write_text("{}")
        raise book_runs.NotebookFailed(nb, "KeyboardInterrupt", None)

    sent = []
    monkeypatch.setattr(kernels, "signal_kernels", lambda sig=signal.SIGINT: (sent.append(sig), stop.set()))
    plan = [(Path("03_a.ipynb"), {}, "03_a"), (Path("03_b.ipynb"), {}, "03_b")]
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.perf_counter()
    status = book_runs.run_waves(plan, [[[0], [1]]], run, lambda i, r: None,
                                 lambda i, e: None, lambda stem: tmp_path / f"{stem}.FAILED.ipynb")
    assert status == 130
    assert time.perf_counter() - t0 < 10
    assert sent == [signal.SIGINT] and sorted(ended) == ["03_a", "03_b"]
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err
    assert "03_a.FAILED.ipynb" in err and "03_b.FAILED.ipynb" in err


def test_ctrl_c_of_the_book_ends_its_notebook_with_status_130_and_no_traceback(tmp_path):
    """A real book, a real kernel: SIGINT to the book alone (not its kernel's process
    group) stops the notebook and ends the book with one line."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    import nbformat

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("print('started', flush=True)"),
                nbformat.v4.new_code_cell("import time\ntime.sleep(120)")]
    nbformat.write(nb, nbdir / "zz_sleep.ipynb")
    out = tmp_path / "out"
    script = ("import sys; from pathlib import Path; from rlprobe_nb import book\n"
              f"book.notebooks = lambda: [Path({str(nbdir / 'zz_sleep.ipynb')!r})]\n"
              "sys.exit(book.main(['--only', 'zz_sleep']))\n")
    env = {**os.environ, "RLPROBE_OUT": str(out), "PYTHONPATH": str(paths.REPO_ROOT)}
    env.pop("RLPROBE_SUITE", None)
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    figures = out / "figures" / "demo"
    deadline = time.time() + 60
    while time.time() < deadline and not any(figures.glob(".zz_sleep.*.tmp.ipynb")):
        time.sleep(0.2)
    time.sleep(3)  # the kernel is in its sleeping cell
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.perf_counter() - t0 < 30
    assert "Traceback" not in err and "interrupted" in err
    assert (figures / "zz_sleep.FAILED.ipynb").exists()
    assert not list(figures.glob(".*.tmp.ipynb"))


def test_temporary_notebooks_of_dead_runs_are_removed_and_a_live_ones_kept(tmp_path):
    """Before, an interrupted book left a hidden 0600 notebook that no later run removed."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    files = {name: tmp_path / name for name in (
        f".03_x.book-{dead.pid}.tmp.ipynb",      # a killed book's
        ".01_filtering.k2j4_xq1.tmp.ipynb",       # an older version's (mkstemp)
        f".02_rollouts.book-{os.getppid()}.tmp.ipynb",  # a book still running
        ".keep.json")}
    for f in files.values():
        f.write_text("{}")
    removed = book_runs.remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == sorted(list(files)[:2])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(list(files)[2:])


def test_a_notebook_edited_as_py_without_sync_is_refused(tmp_path, monkeypatch, capsys):
    """Issue 44 item 10: after editing notebooks/*.py without `make sync`, the book ran
    the stale .ipynb silently."""
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path / "out"))
    monkeypatch.delenv("RLPROBE_SUITE", raising=False)
    src = paths.notebooks_dir() / "06_case_studies.py"
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    for suffix in (".py", ".ipynb"):
        shutil.copy(src.with_suffix(suffix), nbdir / src.with_suffix(suffix).name)
    copy = nbdir / "06_case_studies.ipynb"
    assert book_runs.out_of_sync([copy]) == []
    py = copy.with_suffix(".py")
    py.write_text(py.read_text() + "\n# %%\nprint('a new cell')\n")
    said = book_runs.out_of_sync([copy])
    assert len(said) == 1 and "06_case_studies.ipynb differs from 06_case_studies.py" in said[0]
    monkeypatch.setattr(book, "notebooks", lambda: [copy])
    assert book.main(["--only", "06"]) == 2
    assert "make sync" in capsys.readouterr().err

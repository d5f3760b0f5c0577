"""Files the book writes have the modes the umask gives (issue 22 item 5): under umask
022 a failed run's .FAILED.ipynb (a private temporary file moved into place) and the
converted demo model's weights (save_pretrained) were 0600."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from rlprobe_nb.suite import paths

SCRIPT = textwrap.dedent("""
    import os, sys, tempfile
    from pathlib import Path
    os.umask(0o022)
    from rlprobe_nb import book
    from rlprobe_nb.suite import gguf_cache
    sys.path.insert(0, sys.argv[2])
    from tiny_models import tiny_llama
    out = Path(sys.argv[1])
    fd, tmp = tempfile.mkstemp(dir=out, suffix=".ipynb")  # 0600, as papermill's output
    os.write(fd, b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    os.close(fd)
    book._keep_failed(Path(tmp), out / "x.FAILED.ipynb")
    gguf = out / "model.gguf"
    gguf.write_bytes(b"a stand-in: convert_gguf hashes it and converts the model given")
    print(gguf_cache.convert_gguf(gguf, out / "cache", loaded=tiny_llama()))
""")


def test_a_failed_notebook_and_a_converted_model_are_world_readable(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(paths.REPO_ROOT), "RLPROBE_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path),
                           str(paths.REPO_ROOT / "tests")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    failed = tmp_path / "x.FAILED.ipynb"
    assert oct(failed.stat().st_mode & 0o777) == oct(0o644)
    converted = tmp_path / "cache" / done.stdout.strip().splitlines()[-1].split("/")[-1]
    files = {f.name: oct(f.stat().st_mode & 0o777) for f in converted.iterdir()}
    assert "model.safetensors" in files and set(files.values()) == {oct(0o644)}, files
    assert oct(converted.stat().st_mode & 0o777) == oct(0o755)

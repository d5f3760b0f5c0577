"""Nothing stale is served as current (issue 9, acceptance 2; issue 22, acceptance 2 and
3; issue 34, acceptance 2): a small suite is run through 01 -> 02 -> 03 with papermill
(chapters 04 and 05: test_staleness_chapters.py), then each input is changed in
turn — the reference's weights (a GGUF model's converted copy), the RLVR
adapter, the tokenizer's files and chat template, a gold answer, a problem's text, top-k,
max_rollouts, the configured pairs, a source file of the grader or of a stage — and the
notebook that depends on it must recompute or refuse, naming the difference. Unchanged,
every notebook reuses its table without loading a model, saying so once. `-p overwrite
false` never overwrites; a part copied in from another run is refused; a standard reader
never opens a half-written table, even while 03 is killed mid-way."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml
from mini_suite import write_problems, write_suite
from test_notebooks import outputs, papermill

from rlprobe_nb.suite import gguf_cache, paths
from rlprobe_nb.tables import storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
LOADS = "Loading weights"


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """The demo model as a GGUF reference whose converted copy lives in a private cache
    (so a test may change it), a copied adapter (target), problems from a file, everything
    small; 01, 02 and 03 run once."""
    root = tmp_path_factory.mktemp("stale")
    gguf = gguf_cache.demo_gguf_path()
    ref = gguf_cache.cache_entry(gguf, root / "cache" / "models")
    shutil.copytree(gguf_cache.convert_gguf(gguf, paths.cache_dir() / "models"), ref)
    adapter = root / "models" / "rlvr"
    shutil.copytree(paths.shipped_dir("demo") / "adapters" / "rlvr_step_1200", adapter)
    problems = write_problems(root / "problems.jsonl", [(12, 30), (7, 8), (25, 19)])
    params = root / "params" / "mini"
    write_suite(params, gguf, problems, max_rollouts=3)
    (params / "rlvr_step_1200.yaml").write_text(yaml.safe_dump(
        {"step": 1200, "model": {"kind": "peft", "base": "dpo", "path": str(adapter)}}))
    env = {**os.environ, "RLPROBE_OUT": str(root / "out"),
           "RLPROBE_PARAMS": str(root / "params"), "RLPROBE_CACHE": str(root / "cache")}
    s = {"root": root, "ref": ref, "adapter": adapter, "problems": problems,
         "yaml": params / "suite.yaml", "env": env}
    for nb in ("01_filtering", "02_rollouts", "03_teacher_forcing"):
        ok, text = run(s, nb)
        assert ok, text[-3000:]
    return s


def run(s, notebook, *extra, env=None):
    out = s["root"] / f"{notebook}.ipynb"
    args = [("suite", "mini"), *extra]
    if notebook.startswith("03"):
        args.append(("checkpoint", "rlvr_step_1200"))
    result = papermill(f"{notebook}.ipynb", out, *args, env=env or s["env"])
    return result.returncode == 0, outputs(out)


class changed:
    """Change a file for the duration of a block; its old bytes come back afterwards."""

    def __init__(self, path: Path, edit):
        self.path, self.edit = path, edit

    def __enter__(self):
        self.old = self.path.read_bytes()
        self.edit(self.path)

    def __exit__(self, *exc):
        self.path.write_bytes(self.old)


def edit_yaml(change):
    def apply(path):
        data = yaml.safe_load(path.read_text())
        change(data)
        path.write_text(yaml.safe_dump(data))
    return apply


def test_unchanged_inputs_are_reused_without_loading_a_model(suite):
    for nb in ("01_filtering", "02_rollouts", "03_teacher_forcing"):
        ok, text = run(suite, nb)
        assert ok and text.count("reusing ") == 1 and LOADS not in text, (nb, text[-2000:])


def flip_a_byte(path):
    blob = bytearray(path.read_bytes())
    blob[-3] ^= 0x01  # one weight changes in its last bits
    path.write_bytes(bytes(blob))


# A converted copy changed after its conversion is damage (issue 44): refused by name,
# naming the file, before anything is keyed on it (ConversionCacheError, not stale).
DAMAGED = "does not match the sha256 recorded when it was converted"


@pytest.mark.parametrize("what,notebook,file,edit,named", [
    ("reference weights", "01_filtering", "ref/model.safetensors", flip_a_byte,
     f"model.safetensors {DAMAGED}"),
    ("adapter weights", "03_teacher_forcing", "adapter/adapter_int8.safetensors", flip_a_byte,
     "models.rlvr_step_1200.files.adapter_int8.safetensors"),
    ("chat template", "02_rollouts", "ref/tokenizer_config.json",
     lambda p: p.write_text(p.read_text().replace("<|im_start|>", "<|im_start|> ", 1)),
     f"tokenizer_config.json {DAMAGED}"),
    *[(f"GGUF chat template ({nb})", nb, "ref/chat_template.jinja",
       lambda p: p.write_text(p.read_text().replace("<|im_start|>", "<|im_start|> ", 1)),
       f"chat_template.jinja {DAMAGED}")
      for nb in ("01_filtering", "02_rollouts", "03_teacher_forcing")],
    ("gold answer", "02_rollouts", "problems",
     lambda p: p.write_text(p.read_text().replace('"answer": "42"', '"answer": "41"')),
     "files.problems.path"),
    ("problem text", "03_teacher_forcing", "problems",
     lambda p: p.write_text(p.read_text().replace("What is $7", "What is $9")),
     "files.problems.path"),
    ("top-k", "03_teacher_forcing", "yaml", edit_yaml(lambda d: d["forcing"].update(topk=3)),
     "topk: 5 -> 3"),
    ("max_rollouts", "03_teacher_forcing", "yaml",
     edit_yaml(lambda d: d["forcing"].update(max_rollouts=2)), "forcing.max_rollouts: 3 -> 2"),
])
def test_a_changed_input_is_refused_with_the_difference_named(suite, what, notebook, file,
                                                            edit, named):
    target = {"yaml": suite["yaml"], "problems": suite["problems"]}.get(file)
    if target is None:
        folder, name = file.split("/")
        target = suite[folder] / name
    with changed(target, edit):
        ok, text = run(suite, notebook)
    assert not ok, f"{what}: {notebook} ran on stale inputs"
    assert named in text, (what, text[-2500:])
    error = "ConversionCacheError" if file.startswith("ref/") else "StaleTableError"
    assert error in text and LOADS not in text, (what, text[-2500:])


def changed_code(root: Path, edits: dict[str, tuple[str, str]]) -> dict:
    """An environment whose kernels import a copy of the package with ``edits`` (file ->
    (old text, new text)) applied: what a user gets after editing the code."""
    copy = root / "changed_code"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(paths.PACKAGE_DIR, copy / "rlprobe_nb",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name, (old, new) in edits.items():
        f = copy / "rlprobe_nb" / name
        assert old in f.read_text(), (name, old)
        f.write_text(f.read_text().replace(old, new, 1))
    for shared in ("data", ".cache"):  # the checkout's shipped inputs and converted models
        if (paths.REPO_ROOT / shared).exists():
            (copy / shared).symlink_to(paths.REPO_ROOT / shared)
    return {"PYTHONPATH": str(copy)}


@pytest.mark.parametrize("notebook,file,old,new", [
    ("01_filtering", "problems/grading.py", "MAX_ANSWER_CHARS = 2000", "MAX_ANSWER_CHARS = 1"),
    ("02_rollouts", "problems/grading.py", "MAX_ANSWER_CHARS = 2000", "MAX_ANSWER_CHARS = 1"),
    ("03_teacher_forcing", "forcing/metrics.py", "\n", "\n# a changed line\n"),
])
def test_a_changed_source_file_is_refused_by_name(suite, notebook, file, old, new):
    """A measurement tool notices that the code that computed a table changed: the grader
    (answers, rollouts), the teacher-forcing math (token tables)."""
    env = {**suite["env"], **changed_code(suite["root"], {file: (old, new)})}
    ok, text = run(suite, notebook, env=env)
    assert not ok and f"code.files.{file}" in text and "StaleTableError" in text, text[-2500:]
    assert LOADS not in text


def test_changed_pairs_compute_the_new_pair_and_reuse_the_rest(suite):
    with changed(suite["yaml"], edit_yaml(lambda d: d["forcing"].update(
            pairs=[["rlvr_step_1200", "dpo"], ["dpo", "rlvr_step_1200"]]))):
        ok, text = run(suite, "03_teacher_forcing")
    assert ok, text[-2500:]
    assert "reusing" in text and "pair:" in text, text
    folder = Path(suite["env"]["RLPROBE_OUT"]) / "data" / "mini" / "tokens" / "dpo__vs__rlvr_step_1200"
    assert storage.is_complete(folder)


TOKENS = ("tokens", "rlvr_step_1200__vs__dpo")


def data(suite) -> Path:
    return Path(suite["env"]["RLPROBE_OUT"]) / "data" / "mini"


@pytest.mark.parametrize("notebook", ["02_rollouts", "03_teacher_forcing"])
def test_overwrite_false_is_refused_never_taken_for_true(suite, notebook):
    """papermill passes `-p overwrite false` as the string "false"."""
    before = storage.read_manifest(data(suite).joinpath(*TOKENS))["key_sha"]
    extra = [("checkpoint", "rlvr_step_1200")] if notebook.startswith("03") else []
    with changed(suite["yaml"], edit_yaml(lambda d: d["forcing"].update(topk=6))):
        result = papermill(f"{notebook}.ipynb", suite["root"] / "o.ipynb", ("suite", "mini"),
                           *extra, ("overwrite", "false"), env=suite["env"])
        text = outputs(suite["root"] / "o.ipynb")
    assert result.returncode != 0 and "notebook parameter 'overwrite'" in text, text[-2000:]
    assert storage.read_manifest(data(suite).joinpath(*TOKENS))["key_sha"] == before


SLOW_SHARDS = """
import time
from rlprobe_nb.tables import storage
_write = storage.ShardedTable.write_shard
def _slow(self, key, df):
    time.sleep(1.0)
    return _write(self, key, df)
storage.ShardedTable.write_shard = _slow
"""


def readable_tables(root: Path) -> dict[str, tuple[int, int | None]]:
    """Every table folder under ``root`` (a folder holding parquet files) that a standard
    reader opens: (rows it read, rows its manifest says). Hidden folders (a run's working
    folder, a writer's lock) are no table folders: standard readers skip them as they skip
    hidden files."""
    seen = {}
    for folder in [p for p in root.rglob("*") if p.is_dir()]:
        if any(part.startswith(".") for part in folder.relative_to(root).parts) \
                or not any(folder.glob("*.parquet")):
            continue
        try:
            rows = len(pd.read_parquet(folder))
        except Exception:  # noqa: BLE001 - not a table a reader can open
            continue
        man = folder / storage.MANIFEST
        seen[str(folder.relative_to(root))] = (rows, storage.read_json(man)["rows"]
                                               if man.exists() else None)
    return seen


def running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_run(proc: subprocess.Popen) -> None:
    """SIGKILL every process of a papermill run, the kernel first: it runs in a session of
    its own, so killing papermill's process group left it running for about half a second
    (long enough, once, to publish its table). None may be left running."""
    run = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    assert any("ipykernel" in " ".join(p.cmdline()) for p in run[1:]), "no kernel found"
    for process in reversed(run):  # the kernel (and what it started) before papermill
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    # a SIGKILL takes effect at once; a kernel left to notice papermill's death on its own
    # polls for it once a second
    deadline = time.time() + 0.25
    while any(running(p) for p in run) and time.time() < deadline:
        time.sleep(0.01)
    left = [p for p in run if running(p)]
    assert not left, f"still running after the kill: {[p.cmdline()[:3] for p in left]}"


def test_a_run_of_03_killed_midway_leaves_no_half_table_and_adopts_no_foreign_part(suite, tmp_path):
    """While 03 recomputes the token table (top-k 3, overwrite) and is killed mid-way,
    every folder a standard reader can open holds a complete table; a part of the old
    table copied into the unfinished run is refused; without it the run resumes."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_SHARDS)
    env = {**suite["env"], "PYTHONPATH": os.pathsep.join([str(tmp_path), str(paths.REPO_ROOT)])}
    table = data(suite).joinpath(*TOKENS)
    work = storage.work_dir(table)
    with changed(suite["yaml"], edit_yaml(lambda d: d["forcing"].update(topk=3))):
        args = [sys.executable, "-m", "papermill", "--no-progress-bar",
                str(paths.notebooks_dir() / "03_teacher_forcing.ipynb"), str(tmp_path / "o.ipynb"),
                "-p", "suite", "mini", "-p", "overwrite", "True", "-p", "batch_tokens", "48"]
        proc = subprocess.Popen(args, env=env, cwd=paths.REPO_ROOT, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline, seen = time.time() + 900, []
        while not list(work.glob("part-*.parquet")):
            assert proc.poll() is None and time.time() < deadline, "03 wrote no part in time"
            seen.append(readable_tables(data(suite)))
            time.sleep(0.2)
        seen.append(readable_tables(data(suite)))
        kill_run(proc)
        seen.append(readable_tables(data(suite)))
        for snapshot in seen:
            for folder, (rows, listed) in snapshot.items():
                assert rows == listed, (folder, rows, listed)  # complete, or not openable
        assert "/".join(TOKENS) in seen[-1] and storage.read_manifest(table)["rows"]
        old_part = next(table.glob("part-*.parquet"))  # the complete top-k 5 table
        foreign = work / old_part.name
        shutil.copy(old_part, foreign)
        ok, text = run(suite, "03_teacher_forcing", ("overwrite", True))
        assert not ok and "belongs to another table" in text and old_part.name in text, text[-2500:]
        foreign.unlink()
        ok, text = run(suite, "03_teacher_forcing", ("overwrite", True))
        assert ok, text[-2500:]
        assert storage.read_manifest(table)["key"]["settings"]["topk"] == 3
        assert len(storage.read_table(table).topk_ids_ref.iloc[0]) == 3


def test_overwrite_recomputes_under_the_new_key(suite):
    with changed(suite["yaml"], edit_yaml(lambda d: d["forcing"].update(topk=3))):
        ok, text = run(suite, "03_teacher_forcing", ("overwrite", True))
        assert ok, text[-2500:]
        folder = Path(suite["env"]["RLPROBE_OUT"]) / "data" / "mini" / "tokens" / "rlvr_step_1200__vs__dpo"
        assert storage.read_manifest(folder)["key"]["settings"]["topk"] == 3
        assert len(storage.read_table(folder).topk_ids_ref.iloc[0]) == 3

"""Nothing stale is served as current (issue 9, acceptance 2): a small suite is run through
01 -> 02 -> 03 with papermill, then each input is changed in turn — the reference's
weights, the RLVR adapter, the tokenizer's chat template, a gold answer, a problem's text,
top-k, max_rollouts, the configured pairs, the grader's version — and the notebook that
depends on it must recompute or refuse, naming the difference. Unchanged, every notebook
reuses its table without loading a model."""

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from test_notebooks import outputs, papermill

from rlprobe_nb.suite import gguf_cache, paths
from rlprobe_nb.tables import storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
LOADS = "Loading weights"


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """The demo models as a local folder (reference) and a copied adapter (target), problems
    from a file, everything small; 01, 02 and 03 run once."""
    root = tmp_path_factory.mktemp("stale")
    ref = root / "models" / "dpo"
    shutil.copytree(gguf_cache.convert_gguf(gguf_cache.demo_gguf_path(),
                                            paths.cache_dir() / "models"), ref)
    adapter = root / "models" / "rlvr"
    shutil.copytree(paths.shipped_dir("demo") / "adapters" / "rlvr_step_1200", adapter)
    problems = root / "problems.jsonl"
    problems.write_text("".join(json.dumps(
        {"unique_id": f"p/{i}", "problem": f"What is ${a} + {b}$?", "answer": str(a + b)}) + "\n"
        for i, (a, b) in enumerate([(12, 30), (7, 8), (25, 19)])))
    params = root / "params" / "mini"
    params.mkdir(parents=True)
    (params / "suite.yaml").write_text(yaml.safe_dump({
        "suite": "mini", "reference": "dpo", "target": "rlvr_step_1200",
        "models": {"dpo": {"kind": "local", "path": str(ref)}},
        "problems": {"source": "file", "path": str(problems)},
        "grading": {"timeout_s": 5.0, "workers": 1},
        "filtering": {"n_samples": 1, "max_new_tokens": 24, "batch_size": 8,
                      "ref_max_pass": 1.0, "target_min_pass": 0.0},
        "rollouts": {"n_per_problem": 2, "max_new_tokens": 24, "batch_size": 8},
        "forcing": {"failure_types": ["boxed_wrong", "empty_box", "no_box", "truncated"],
                    "max_rollouts": 3, "topk": 5, "pairs": []},
        "runtime": {"device": "cpu", "dtype": "float32"}}))
    (params / "rlvr_step_1200.yaml").write_text(yaml.safe_dump(
        {"step": 1200, "model": {"kind": "peft", "base": "dpo", "path": str(adapter)}}))
    env = {**os.environ, "RLPROBE_OUT": str(root / "out"),
           "RLPROBE_PARAMS": str(root / "params")}
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


@pytest.mark.parametrize("what,notebook,file,edit,named", [
    ("reference weights", "01_filtering", "ref/model.safetensors", flip_a_byte,
     "models.dpo.files.model.safetensors"),
    ("adapter weights", "03_teacher_forcing", "adapter/adapter_model.safetensors", flip_a_byte,
     "models.rlvr_step_1200.files.adapter_model.safetensors"),
    ("chat template", "02_rollouts", "ref/tokenizer_config.json",
     lambda p: p.write_text(p.read_text().replace("<|im_start|>", "<|im_start|> ", 1)),
     "dpo.files.tokenizer_config.json"),
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
    assert "StaleTableError" in text and LOADS not in text, (what, text[-2500:])


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
    return {"PYTHONPATH": str(copy), "RLPROBE_CACHE": str(paths.cache_dir())}


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


def test_overwrite_recomputes_under_the_new_key(suite):
    with changed(suite["yaml"], edit_yaml(lambda d: d["forcing"].update(topk=3))):
        ok, text = run(suite, "03_teacher_forcing", ("overwrite", True))
        assert ok, text[-2500:]
        folder = Path(suite["env"]["RLPROBE_OUT"]) / "data" / "mini" / "tokens" / "rlvr_step_1200__vs__dpo"
        assert storage.read_manifest(folder)["key"]["settings"]["topk"] == 3
        assert len(storage.read_table(folder).topk_ids_ref.iloc[0]) == 3

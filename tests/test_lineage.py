"""Lineage: a table's manifest records the key hashes of the tables it was computed from,
and a derived table's currency is read from its inputs' manifests. Writing a table
computed from the token tables hashes no file and reads the suite's YAML no second time;
a changed adapter byte makes every table downstream stale; a changed source file of the
producing stage does too, naming the file."""

from __future__ import annotations

import shutil
import sys

import pandas as pd
import pyarrow as pa
import pytest
import yaml

from rlprobe_nb.suite import params, paths
from rlprobe_nb.tables import lineage, provenance, storage, suite_tables

SCHEMA = pa.schema([("x", pa.int32())])
CKPT = "rlvr_step_400"  # not the target: only the token table depends on it


@pytest.fixture()
def suite(tmp_path, monkeypatch):
    """The demo suite with one checkpoint whose adapter is a private copy (so a test may
    change it), results under tmp_path."""
    root = tmp_path / "params"
    shutil.copytree(paths.params_dir() / "demo", root / "demo")
    for f in (root / "demo").glob("*_step_*.yaml"):  # no placebo: none is needed here
        if f.stem not in (CKPT, "rlvr_step_1200"):  # the target, and a pair of the two
            f.unlink()
    adapter = tmp_path / "adapter"
    shutil.copytree(paths.shipped_dir("demo") / "adapters" / CKPT, adapter)
    ck = root / "demo" / f"{CKPT}.yaml"
    spec = yaml.safe_load(ck.read_text())
    spec["model"]["path"] = str(adapter)
    ck.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("RLPROBE_PARAMS", str(root))
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path / "out"))
    return {"adapter": adapter, "yaml": root / "demo" / "suite.yaml"}


def write(P, name: str, key: dict) -> str:
    storage.write_table(paths.table_dir(P.suite, name), pd.DataFrame({"x": [1, 2]}), SCHEMA,
                        provenance.manifest(P), key=key)
    return storage.read_manifest(paths.table_dir(P.suite, name))["key_sha"]


def write_chain(P) -> None:
    """problems -> answers -> selection -> rollouts -> the checkpoint's token table, each
    keyed as its notebook keys it (the rows are placeholders)."""
    problems = write(P, "problems", lineage.problems_key(P))
    answers = write(P, "answers", lineage.answers_key(P, problems))
    selection = write(P, "selection", lineage.selection_key(P, answers))
    rollouts = write(P, "rollouts", lineage.rollouts_key(P, selection, problems))
    Pc = params.load("demo", CKPT)
    write(Pc, paths.token_table_name(CKPT, P.reference),
          lineage.tokens_key(Pc, CKPT, P.reference, rollouts))


def write_derived(P, table: str) -> None:
    lineage.write_derived(P, table, pd.DataFrame({"x": [3]}), SCHEMA, {}, {"seed": 0},
                          "notebooks/04_divergence")


class Calls:
    """Count calls of a function of the package wherever a module bound it by name."""

    def __init__(self, monkeypatch, module, name: str):
        self.n = 0
        real = getattr(module, name)

        def counted(*args, **kwargs):
            self.n += 1
            return real(*args, **kwargs)
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("rlprobe_nb") and \
                    getattr(mod, name, None) is real:
                monkeypatch.setattr(mod, name, counted)


def test_writing_a_derived_table_hashes_no_file_and_reads_the_yaml_once(suite, monkeypatch):
    write_chain(params.load("demo"))
    reads = []
    real_read = params._read_yaml
    monkeypatch.setattr(params, "_read_yaml", lambda path: reads.append(path) or real_read(path))
    P = params.load("demo")  # as a notebook of chapter 04 starts
    tokens = suite_tables.read_tokens(P)
    assert len(tokens) == 2
    hashes = Calls(monkeypatch, provenance, "sha256_file")
    write_derived(P, "divergence_when")
    write_derived(P, "divergence_tails")
    assert hashes.n == 0
    assert reads.count(suite["yaml"]) == 1, reads
    man = storage.read_manifest(paths.table_dir("demo", "divergence_when"))
    token_table = paths.token_table_name(CKPT, P.reference)
    assert man["key"]["inputs"] == {token_table: lineage.current_sha(P, token_table)}
    assert "divergence/summary.py" in man["key"]["code"]["files"]


def test_a_changed_adapter_byte_makes_every_table_downstream_stale(suite):
    write_chain(params.load("demo"))
    P = params.load("demo")
    for table in ("divergence_when", "spikes"):
        write_derived(P, table)
        assert len(lineage.read_derived(P, table)) == 1
    weights = suite["adapter"] / "adapter_int8.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-3] ^= 1
    weights.write_bytes(bytes(blob))
    P = params.load("demo")  # a notebook run after the change
    for table in ("divergence_when", "spikes"):
        with pytest.raises(storage.StaleTableError,
                           match=f"{CKPT}.files.adapter_int8.safetensors.*rerun notebooks/03"):
            lineage.read_derived(P, table)
    lineage.read_current(P, "rollouts")  # upstream of the adapter: still current


def test_a_changed_parameter_upstream_names_the_table_and_the_parameter(suite):
    write_chain(params.load("demo"))
    # the caller's own overrides do not matter: a table is checked with those it was
    # written with (today's files as they were give it again)
    lineage.read_current(params.load("demo", overrides={"filtering.ref_max_pass": 0.25}),
                         "rollouts")
    cfg = yaml.safe_load(suite["yaml"].read_text())
    cfg["filtering"]["ref_max_pass"] = 0.25
    suite["yaml"].write_text(yaml.safe_dump(cfg))
    with pytest.raises(storage.StaleTableError,
                       match=r"data/demo/selection .*params\.filtering\.ref_max_pass: [\d.]+ -> 0\.25"):
        lineage.read_current(params.load("demo"), "rollouts")


def test_a_changed_source_file_of_the_stage_is_named(suite, monkeypatch, tmp_path):
    write_chain(params.load("demo"))
    code = tmp_path / "pkg"
    shutil.copytree(paths.PACKAGE_DIR, code, ignore=shutil.ignore_patterns("__pycache__"))
    grading = code / "problems" / "grading.py"
    grading.write_text(grading.read_text().replace("MAX_ANSWER_CHARS = 2000",
                                                   "MAX_ANSWER_CHARS = 1"))
    monkeypatch.setattr(paths, "PACKAGE_DIR", code)
    with pytest.raises(storage.StaleTableError,
                       match=r"code\.files\.problems/grading\.py: \w+ -> \w+.*rerun notebooks/01"):
        lineage.read_current(params.load("demo"), "answers")


def test_a_table_of_an_earlier_key_form_is_refused_by_name(suite):
    P = params.load("demo")
    write(P, "problems", {"table": "problems", "version": 1})
    with pytest.raises(storage.StaleTableError, match="earlier version of the book"):
        lineage.read_current(P, "problems")


def test_each_module_that_builds_the_models_is_in_the_key_of_every_table_made_with_them(
        suite, monkeypatch, tmp_path):
    """Issue 44 item 2: halving the LoRA merge's scaling still printed "reusing" in 02 and
    03. Each model-building module is in the key of the tables made by running a model
    (answers, rollouts, tokens) and so, through its inputs, of every table below; a change
    to any one refuses the old tables naming the file."""
    write_chain(params.load("demo"))
    write_derived(params.load("demo"), "spikes")
    code = tmp_path / "pkg"
    shutil.copytree(paths.PACKAGE_DIR, code, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(paths, "PACKAGE_DIR", code)
    token_table = paths.token_table_name(CKPT, params.load("demo").reference)
    merge = code / "suite" / "lora_merge.py"
    halved = merge.read_text().replace(
        'scaling = float(config["lora_alpha"]) / int(config["r"])',
        'scaling = float(config["lora_alpha"]) / int(config["r"]) / 2')
    assert halved != merge.read_text()
    edits = {"suite/lora_merge.py": halved}
    for module in lineage.MODEL_CODE:
        edits.setdefault(module, (code / module).read_text() + "\n# changed\n")
    for module, text in edits.items():
        original = (code / module).read_text()
        (code / module).write_text(text)
        P = params.load("demo")  # a notebook run after the change
        for table in ("answers", "rollouts", token_table):
            with pytest.raises(storage.StaleTableError,
                               match=rf"code\.files\.{module}: \w+ -> \w+.*rerun notebooks/0"):
                lineage.read_current(P, table)
        with pytest.raises(storage.StaleTableError, match=rf"code\.files\.{module}"):
            lineage.read_derived(P, "spikes")
        lineage.read_current(P, "problems")  # built without a model: still current
        (code / module).write_text(original)
    lineage.read_current(params.load("demo"), token_table)  # restored: current again


def test_a_source_file_declared_after_a_table_was_written_makes_it_stale(suite, monkeypatch):
    """A table written before a file joined its stage's code is stale, naming the file
    (its key's recorded patterns are not what decides)."""
    write_chain(params.load("demo"))
    monkeypatch.setitem(lineage.CODE, "selection", lineage.CODE["selection"] + ("readable.py",))
    with pytest.raises(storage.StaleTableError, match=r"code\.files\.readable\.py: \(absent\)"):
        lineage.read_current(params.load("demo"), "selection")


def test_an_adapter_changed_after_the_keys_were_computed_is_not_loaded(suite):
    """Issue 44 item 1: a table is never written under a key it was not computed from:
    the adapter that loads must be the one the suite's keys hashed."""
    from rlprobe_nb.suite import models

    P = params.load("demo", CKPT, overrides={"runtime.device": "cpu"})
    lineage.tokens_key(P, CKPT, P.reference, "r" * 16)  # the keys hash the adapter once
    weights = suite["adapter"] / "adapter_int8.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-3] ^= 1
    weights.write_bytes(bytes(blob))
    with pytest.raises(models.ModelLoadError, match=r"adapter_int8\.safetensors changed after"):
        models.load_model(CKPT, P)

"""A suite may name placebo checkpoints (``run: placebo``): the same training with an
uninformative reward, chapter 05's external null. They are forced like any checkpoint,
matched to the RLVR checkpoint of the same step, and left out of what chapter 04 reads.
The suite here is the demo's parameters with a placebo file added, pointing at a shipped
adapter (a stand-in: the shipped demo suite has no placebo run)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from rlprobe_nb import book
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import suite_tables


def _placebo_file(folder, name, step, adapter="rlvr_step_100", **extra):
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({
        "step": step, "run": "placebo", **extra,
        "model": {"kind": "peft", "base": "dpo",
                  "path": f"data/demo/shipped/adapters/{adapter}"}}))


@pytest.fixture()
def demo_copy(tmp_path, monkeypatch):
    folder = tmp_path / "params" / "demo"
    shutil.copytree(paths.params_dir() / "demo", folder)
    monkeypatch.setenv("RLPROBE_PARAMS", str(tmp_path / "params"))
    assert paths.suite_params_dir("demo") == folder
    return folder


def test_a_placebo_is_matched_by_step_and_kept_out_of_the_rlvr_run(demo_copy):
    _placebo_file(demo_copy, "placebo_step_200", 200)
    _placebo_file(demo_copy, "placebo_step_1200", 1200)
    P = params.load("demo")
    assert P.checkpoints == ["rlvr_step_100", "rlvr_step_200", "rlvr_step_400",
                             "rlvr_step_800", "rlvr_step_1200"]
    assert P.placebos == ["placebo_step_200", "placebo_step_1200"]
    assert P.forced == P.checkpoints + P.placebos
    assert P.placebo_for("rlvr_step_200") == "placebo_step_200"
    assert P.placebo_for("rlvr_step_400") is None
    assert P.run_of("placebo_step_200") == "placebo" and P.run_of("rlvr_step_200") == "rlvr"
    with pytest.raises(params.ParamsError, match="not an RLVR checkpoint"):
        P.placebo_for("placebo_step_200")
    assert P.as_dict()["placebos"] == P.placebos
    roles = models.describe(P).set_index("model").role
    assert roles["placebo_step_200"] == "placebo" and roles["rlvr_step_200"] == "checkpoint"
    # 03 runs for every checkpoint of both runs, the RLVR run first
    runs = [stem for _, _, stem in book.runs(P, only=["03"])]
    assert runs == [f"03_teacher_forcing__{c}" for c in P.forced]
    # a placebo's own parameters load like a checkpoint's (what its run of 03 does)
    Pp = params.load("demo", "placebo_step_200")
    assert Pp.checkpoint == "placebo_step_200" and Pp.steps["placebo_step_200"] == 200
    # chapter 04 reads the RLVR run; the placebo tables are asked for by name
    assert suite_tables.placebo_pairs(P) == [("placebo_step_200", "dpo"),
                                             ("placebo_step_1200", "dpo")]


def test_the_shipped_demo_has_no_placebo():
    P = params.load("demo")
    assert P.placebos == [] and P.forced == P.checkpoints
    assert all(P.placebo_for(c) is None for c in P.checkpoints)


def test_a_placebo_at_a_step_the_rlvr_run_lacks_is_refused(demo_copy):
    _placebo_file(demo_copy, "placebo_step_300", 300)
    with pytest.raises(params.ParamsError) as err:
        params.load("demo")
    msg = str(err.value)
    assert "placebo_step_300.yaml" in msg and "step 300" in msg
    assert "[100, 200, 400, 800, 1200]" in msg


def test_a_misspelled_run_is_refused_with_the_valid_ones(demo_copy):
    _placebo_file(demo_copy, "placebo_step_200", 200)
    path = demo_copy / "placebo_step_200.yaml"
    path.write_text(path.read_text().replace("run: placebo", "run: placeebo"))
    with pytest.raises(params.ParamsError, match=r"key 'run': 'placeebo' is not one of "
                                                 r"\['rlvr', 'placebo'\].*did you mean 'placebo'"):
        params.load("demo")


def test_two_placebos_at_one_step_are_refused_but_may_share_it_with_the_rlvr_run(demo_copy):
    _placebo_file(demo_copy, "placebo_step_200", 200)
    params.load("demo")  # a placebo shares its step with its RLVR checkpoint
    _placebo_file(demo_copy, "placebo_b_step_200", 200)
    with pytest.raises(params.ParamsError, match=r"share step 200"):
        params.load("demo")


def test_a_placebo_cannot_be_the_target(demo_copy):
    _placebo_file(demo_copy, "placebo_step_1200", 1200)
    suite_file = demo_copy / "suite.yaml"
    suite_file.write_text(suite_file.read_text().replace("target: rlvr_step_1200",
                                                         "target: placebo_step_1200"))
    with pytest.raises(params.ParamsError, match="is a placebo checkpoint"):
        params.load("demo")

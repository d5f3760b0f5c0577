"""A suite may name placebo checkpoints (``run: placebo``): the same training with an
uninformative reward, chapter 05's external null. They are forced like any checkpoint,
matched to the RLVR checkpoint of the same step, and left out of what chapter 04 reads.
The demo suite ships a placebo run: a placebo checkpoint at every step of its RLVR run.
The notebooks' part is read from the session's small book, which forces two of them."""

from __future__ import annotations

import shutil

import pytest
import yaml

from rlprobe_nb import book
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import storage, suite_tables


def _placebo_file(folder, name, step, adapter="placebo_step_100", **extra):
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
    (demo_copy / "placebo_step_400.yaml").unlink()  # the RLVR step 400 without its placebo
    P = params.load("demo")
    assert P.checkpoints == ["rlvr_step_100", "rlvr_step_200", "rlvr_step_400",
                             "rlvr_step_800", "rlvr_step_1200"]
    assert P.placebos == ["placebo_step_100", "placebo_step_200", "placebo_step_800",
                          "placebo_step_1200"]
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
    assert suite_tables.placebo_pairs(P) == [(c, "dpo") for c in P.placebos]


def test_the_shipped_demo_has_a_placebo_at_every_rlvr_step():
    P = params.load("demo")
    assert len(P.placebos) == len(P.checkpoints) == 5
    assert [P.placebo_for(c) for c in P.checkpoints] == P.placebos


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


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_notebook_03_forces_a_placebo_and_05_tests_against_it(small_book, monkeypatch):
    """The session's small book (two RLVR checkpoints and the placebo at each of their
    steps, run through 01, 02 and 03 for every checkpoint as `make demo` runs them): 03
    forced each placebo; the placebo's token table is read only when asked for, and 05's
    external null uses it."""
    from test_notebooks import outputs

    from rlprobe_nb.spikes import chapter, detect, external

    for name in ("placebo_step_400", "placebo_step_1200"):
        text = outputs(small_book["figures"] / f"03_teacher_forcing__{name}.ipynb")
        assert f"checkpoint '{name}' (step {name.rsplit('_', 1)[1]})" in text
        assert f"{name} vs dpo:" in text
    for name in ("RLPROBE_OUT", "RLPROBE_PARAMS"):
        monkeypatch.setenv(name, small_book["env"][name])
    P = params.load("demo")
    assert P.checkpoints == ["rlvr_step_400", "rlvr_step_1200"]
    assert P.placebos == ["placebo_step_400", "placebo_step_1200"]
    tokens = suite_tables.read_tokens(P)
    assert set(tokens.checkpoint) == set(P.checkpoints)
    tokens = tokens[tokens.reference == P.reference].reset_index(drop=True)
    placebo, nulls, used = external.suite_nulls(P, P.checkpoints)
    assert set(placebo.checkpoint) == set(P.placebos)
    assert used.null.tolist() == P.placebos
    # both runs were forced over the same contexts
    assert set(placebo.context_id) == set(tokens.context_id)
    tests = detect(tokens, nulls=nulls)
    assert (tests.null == tests.checkpoint.map(P.placebo_for)).all() and tests.p.between(0, 1).all()
    # 05's tables, as the book wrote them, are keyed on the placebo's token tables too:
    # forced again, they go stale
    keys = [storage.read_json(f)["key"] for f in small_book["data"].glob(f"*/{storage.MANIFEST}")
            if storage.read_json(f).get("producer") == chapter.PRODUCER]
    assert len(keys) >= 8, "05 wrote its tables"
    for name in P.placebos:
        assert all(f"tokens/{name}__vs__dpo" in key["inputs"] for key in keys)
    # 05 planted in the placebo's own tables, half of its problems against the other half
    import nbformat

    nb = nbformat.read(small_book["figures"] / "05_spikes.ipynb", as_version=4)
    said = [o.get("data", {}).get("text/markdown", "") for c in nb.cells for o in c.get("outputs", [])]
    assert any(m.startswith("Planted in the placebo's own tables") for m in said)
    text = outputs(small_book["figures"] / "05_spikes.ipynb")
    assert text.count("the other half of its problems") == 2 * len(P.placebos)

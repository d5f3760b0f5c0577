"""Parameter files are checked before any model loads, with errors that name the file,
the key and the valid values (issue 2, acceptance 3)."""

import shutil

import re

import pytest
import yaml

from rlprobe_nb.suite import params, paths


@pytest.fixture()
def params_copy(tmp_path, monkeypatch):
    """A private copy of params/ so each test can break a file."""
    shutil.copytree(paths.params_dir(), tmp_path / "params")
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    return tmp_path / "params"


def edit(path, change):
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))


def test_demo_and_tulu_suites_load():
    P = params.load("demo", "rlvr_step_1200")
    assert P.suite == "demo" and P.checkpoint == "rlvr_step_1200"
    assert P.checkpoints == sorted(P.checkpoints, key=P.steps.get)
    assert {"rlvr_step_400", "rlvr_step_1200"} <= set(P.checkpoints)
    T = params.load("tulu3", "rlvr_step_400")
    assert T.model_spec("dpo")["id"] == "allenai/Llama-3.1-Tulu-3-8B-DPO"
    assert T.runtime.device == "cuda" and T.runtime.dtype == "bfloat16"


def test_demo_is_the_default_suite(monkeypatch):
    monkeypatch.delenv("RLPROBE_SUITE", raising=False)
    assert params.load().suite == "demo"


def test_misspelled_key_names_file_key_and_valid_keys(params_copy):
    suite_file = params_copy / "demo" / "suite.yaml"
    edit(suite_file, lambda d: d["forcing"].update(batch_tokenz=d["forcing"].pop("batch_tokens")))
    with pytest.raises(params.ParamsError) as err:
        params.load("demo")
    msg = str(err.value)
    assert str(suite_file) in msg
    assert "forcing.batch_tokenz" in msg
    assert "did you mean 'batch_tokens'" in msg and "'chunk_positions'" in msg


def test_misspelled_top_level_key(params_copy):
    suite_file = params_copy / "demo" / "suite.yaml"
    edit(suite_file, lambda d: d.update(filtring=d.pop("filtering")))
    with pytest.raises(params.ParamsError, match=r"unknown key 'filtring'.*did you mean 'filtering'"):
        params.load("demo")


def test_wrong_type_names_file_key_and_expected_type(params_copy):
    suite_file = params_copy / "demo" / "suite.yaml"
    edit(suite_file, lambda d: d["rollouts"].update(n_per_problem="five"))
    with pytest.raises(params.ParamsError) as err:
        params.load("demo")
    msg = str(err.value)
    assert str(suite_file) in msg and "rollouts.n_per_problem" in msg and "integer" in msg


def test_bool_is_not_an_integer(params_copy):
    edit(params_copy / "demo" / "suite.yaml", lambda d: d["forcing"].update(topk=True))
    with pytest.raises(params.ParamsError, match="forcing.topk.*integer"):
        params.load("demo")


def test_compile_body_is_true_false_or_unset(params_copy):
    assert params.load("demo").forcing.compile_body is None  # the engine decides: on CUDA
    edit(params_copy / "demo" / "suite.yaml", lambda d: d["forcing"].update(compile_body=False))
    assert params.load("demo").forcing.compile_body is False
    edit(params_copy / "demo" / "suite.yaml", lambda d: d["forcing"].update(compile_body="yes"))
    with pytest.raises(params.ParamsError, match="forcing.compile_body.*true/false"):
        params.load("demo")


def test_bad_choice_lists_valid_values(params_copy):
    edit(params_copy / "demo" / "suite.yaml", lambda d: d["forcing"].update(groups=["target", "wrong"]))
    with pytest.raises(params.ParamsError, match=r"forcing.groups.*'wrong' is not one of \['target', 'ref_right', 'control', 't1_unselected'\]"):
        params.load("demo")


def test_unknown_checkpoint_lists_valid_checkpoints():
    with pytest.raises(params.ParamsError) as err:
        params.load("demo", "rlvr_step_1300")
    msg = str(err.value)
    assert "rlvr_step_1300.yaml" in msg and "'rlvr_step_400'" in msg and "'rlvr_step_1200'" in msg


def test_checkpoint_file_with_wrong_key(params_copy):
    ck = params_copy / "demo" / "rlvr_step_400.yaml"
    edit(ck, lambda d: d.update(stepp=d.pop("step")))
    with pytest.raises(params.ParamsError) as err:
        params.load("demo")
    assert str(ck) in str(err.value) and "'stepp'" in str(err.value)


def test_model_spec_is_validated(params_copy):
    edit(params_copy / "demo" / "suite.yaml", lambda d: d["models"]["dpo"].update(kind="hf"))
    with pytest.raises(params.ParamsError, match=r"model 'dpo'.*'hf'.*\['hub', 'local', 'gguf', 'peft'\]"):
        params.load("demo")


def test_pairs_must_name_known_models(params_copy):
    edit(params_copy / "demo" / "suite.yaml", lambda d: d["forcing"].update(pairs=[["rlvr_step_1200", "sft"]]))
    with pytest.raises(params.ParamsError, match=r"forcing.pairs\[0\]"):
        params.load("demo")


def test_overrides_are_validated_and_none_means_default():
    P = params.load("demo", overrides={"forcing.batch_tokens": 1024, "forcing.topk": None})
    assert P.forcing.batch_tokens == 1024 and P.forcing.topk == 5
    with pytest.raises(params.ParamsError, match="did you mean 'batch_tokens'"):
        params.load("demo", overrides={"forcing.batch_tokns": 1})


def test_checkpoint_file_may_override_forcing(params_copy):
    edit(params_copy / "demo" / "rlvr_step_400.yaml", lambda d: d.update(forcing={"batch_tokens": 512}))
    assert params.load("demo", "rlvr_step_400").forcing.batch_tokens == 512
    assert params.load("demo", "rlvr_step_800").forcing.batch_tokens == 4096


def notebook(injected: str, **values) -> dict:
    """A notebook's namespace after its parameters cell (``suite: str | None = None``,
    ``checkpoint: str``, ``overwrite: bool``, ``n_problems: int | None``,
    ``checkpoints: list[str] | None``) and papermill's injected cell."""
    ns = {"__annotations__": {"suite": str | None, "checkpoint": str, "overwrite": bool,
                              "n_problems": int | None, "checkpoints": list[str] | None},
          "suite": None, "checkpoint": "rlvr_step_1200", "overwrite": False,
          "n_problems": None, "checkpoints": None, "In": ["import x", injected]}
    return {**ns, **values}


def test_injected_unknown_notebook_parameter_fails():
    injected = '# Parameters\ncheckpoint = "rlvr_step_1200"\ncheckpont = "x"\n'
    with pytest.raises(params.ParamsError, match=r"\['checkpont'\].*did you mean 'checkpoint'"):
        params.check_notebook_parameters(notebook(injected, checkpont="x"))
    params.check_notebook_parameters(notebook(injected.replace("checkpont", "suite"), suite="x"))


@pytest.mark.parametrize("name,value,says", [
    ("overwrite", "false", "-p overwrite True or -p overwrite False"),  # papermill's "false"
    ("overwrite", "False ", "expected bool"),
    ("overwrite", 0, "expected bool"),
    ("n_problems", 2.5, "expected int | None"),
    ("n_problems", True, "expected int | None"),
    ("n_problems", "5", "expected int | None"),
    ("checkpoints", "[rlvr_step_400]", "-y 'checkpoints: [a, b]'"),
    ("checkpoints", [400], "expected list[str] | None"),
    ("checkpoint", None, "expected str"),
])
def test_a_parameter_of_another_type_than_declared_is_refused(name, value, says):
    """papermill reads only True/False as booleans: `-p overwrite false` arrives as the
    string "false", which `if overwrite:` would take as true."""
    injected = f"# Parameters\n{name} = {value!r}\n"
    with pytest.raises(params.ParamsError, match=re.escape(says)) as err:
        params.check_notebook_parameters(notebook(injected, **{name: value}))
    assert f"notebook parameter {name!r}" in str(err.value)


def test_parameters_of_their_declared_types_pass():
    injected = "# Parameters\noverwrite = True\nn_problems = 3\ncheckpoints = ['a', 'b']\n"
    params.check_notebook_parameters(notebook(injected, overwrite=True, n_problems=3,
                                              checkpoints=["a", "b"]))


# issue 22 item 7: values that would run, but not as anyone meant
@pytest.mark.parametrize("file,change,says", [
    ("suite.yaml", lambda d: d["rollouts"].update(temperatures=[]), "the list is empty"),
    ("suite.yaml", lambda d: d["filtering"].update(n_samples=0), "outside the allowed range"),
    ("suite.yaml", lambda d: d["forcing"].update(groups=[]), "the list is empty"),
    ("suite.yaml", lambda d: d["forcing"].update(groups=["target", "target"]),
     "appear more than once"),
    ("suite.yaml", lambda d: d["forcing"].update(pairs=[["rlvr_step_400", "rlvr_step_400"]]),
     "two different models"),
    # issue 34 item 4: a pair listed twice is refused like a repeated group or temperature
    ("suite.yaml", lambda d: d["forcing"].update(pairs=[["rlvr_step_1200", "rlvr_step_400"]] * 2),
     "'forcing.pairs': [['rlvr_step_1200', 'rlvr_step_400']] appear more than once"),
    ("suite.yaml", lambda d: d.update(target=d["reference"]), "'reference' and 'target' are both"),
    ("suite.yaml", lambda d: d["forcing"].update(group_max_rollouts={"traget": 5}),
     "'traget' is not one of"),
    ("suite.yaml", lambda d: d["forcing"].update(group_max_rollouts={"target": 0}),
     "outside the allowed range"),
    ("suite.yaml", lambda d: d["forcing"].update(group_max_rollouts=[5]), "expected a mapping"),
    ("rlvr_step_400.yaml", lambda d: d.update(step=-400), "is negative"),
    ("rlvr_step_400.yaml", lambda d: d.update(step=800), "share step 800"),
])
def test_questionable_values_are_refused(params_copy, file, change, says):
    edit(params_copy / "demo" / file, change)
    with pytest.raises(params.ParamsError, match=re.escape(says)) as err:
        params.load("demo")
    assert "demo" in str(err.value)


def _laughs(levels=9, width=9):
    lines = ["suite: demo", "lol0: &l0 [lol]"]
    for i in range(1, levels):
        lines.append(f"lol{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("content, says", [
    (b"suite: demo\nreference: \xff\xfe\n", r"suite\.yaml, line 2: byte 0xff is not UTF-8"),
    (("suite: demo\nx: " + "[" * 3000 + "]" * 3000 + "\n").encode(), "nested more than 32"),
    (("suite: demo\nx: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n").encode(), "nested more than"),
    (_laughs().encode(), "more than 64 aliases"),
    (_laughs(levels=6, width=10).encode(), "expand to more than"),
    (("suite: demo\nx: [" + "1, " * 600_000 + "1]\n").encode(), "bytes, more than"),
])
def test_a_hostile_or_damaged_yaml_is_refused_quickly_naming_the_file(params_copy, content, says):
    """Issue 44 item 5: a raw UnicodeDecodeError or RecursionError without the file, an
    alias bomb ending in MemoryError after 90 s, a 50 MB list parsed for 10 minutes."""
    import time

    suite_file = params_copy / "demo" / "suite.yaml"
    suite_file.write_bytes(content)
    t0 = time.perf_counter()
    with pytest.raises(params.ParamsError, match=says) as err:
        params.load("demo")
    assert str(suite_file) in str(err.value)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("bases, loop", [
    ({"dpo": "dpo"}, "dpo -> dpo"),
    ({"dpo": "rlvr_step_1200"}, "dpo -> rlvr_step_1200 -> dpo"),
])
def test_peft_models_whose_bases_form_a_cycle_are_refused_when_the_suite_loads(
        params_copy, bases, loop):
    """Issue 44 item 6: a peft model whose base is itself, or a two-model cycle, was
    accepted and then failed with RecursionError."""
    edit(params_copy / "demo" / "suite.yaml",
         lambda cfg: [cfg["models"][n].update(base=b) for n, b in bases.items()])
    with pytest.raises(params.ParamsError, match=re.escape(loop)):
        params.load("demo")

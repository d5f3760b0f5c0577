"""Bad input gets a clear error before any work, and nothing is silently altered
(issue 9 items 8, 9, 10, 12, 16)."""

import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from rlprobe_nb.demo.tiny import tiny_tokenizer
from rlprobe_nb.problems import sources as problem_sources
from rlprobe_nb.suite import params, paths, prompting
from rlprobe_nb.tables import clean


@pytest.fixture()
def params_copy(tmp_path, monkeypatch):
    shutil.copytree(paths.params_dir(), tmp_path / "params")
    monkeypatch.setenv("RLPROBE_PARAMS", str(tmp_path / "params"))
    return tmp_path / "params"


# item 8 -------------------------------------------------------------------------------

def test_a_repeated_yaml_key_is_refused_with_both_lines(params_copy):
    suite = params_copy / "demo" / "suite.yaml"
    suite.write_text(suite.read_text() + "forcing:\n  topk: 3\n")
    with pytest.raises(params.ParamsError, match=r"key 'forcing' appears twice, on lines \d+ and \d+"):
        params.load("demo")


# item 9 -------------------------------------------------------------------------------

@pytest.mark.parametrize("section,key,value,why", [
    ("forcing", "topk", 0, "outside the allowed range"),
    ("rollouts", "n_per_problem", 0, "outside the allowed range"),
    ("grading", "timeout_s", float("nan"), "not a finite number"),
    ("grading", "timeout_s", float("inf"), "not a finite number"),
    ("rollouts", "temperatures", [0.7, -1.0], "outside the allowed range"),
    ("filtering", "ref_max_pass", 1.5, "outside the allowed range"),
    ("forcing", "batch_tokens", -4, "outside the allowed range"),
])
def test_out_of_range_values_fail_at_load(params_copy, section, key, value, why):
    suite = params_copy / "demo" / "suite.yaml"
    data = yaml.safe_load(suite.read_text())
    data[section][key] = value
    suite.write_text(yaml.safe_dump(data))
    with pytest.raises(params.ParamsError, match=f"{section}.{key}.*{why}"):
        params.load("demo")


# item 16 ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".hidden", ""])
def test_suite_names_that_are_not_plain_are_refused(name):
    with pytest.raises((params.ParamsError, ValueError), match="plain"):
        params.load(name) if name else paths.data_dir(name)


def test_a_suite_yaml_without_suite_key_cannot_write_outside(params_copy, tmp_path):
    (params_copy / "..x").mkdir()
    with pytest.raises(params.ParamsError, match="plain name"):
        params.load("../../x")
    with pytest.raises(ValueError, match="plain"):
        paths.table_dir("../../x", "rollouts")


# item 12 ------------------------------------------------------------------------------

@pytest.mark.parametrize("suite", ["", "../..", "nope"])
def test_clean_results_refuses_bad_suite_names_and_deletes_nothing(suite, tmp_path, monkeypatch):
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))
    keep = tmp_path / "data" / "demo" / "rollouts" / "part.parquet"
    keep.parent.mkdir(parents=True)
    keep.write_text("x")
    assert clean.main(["--suite", suite]) == 2
    assert keep.exists()


def test_clean_results_keeps_shipped_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))
    data = tmp_path / "data" / "demo"
    (data / "rollouts").mkdir(parents=True)
    (data / "shipped").mkdir()
    (data / "shipped" / "adapter.safetensors").write_text("keep")
    (tmp_path / "figures" / "demo").mkdir(parents=True)
    assert clean.main(["--suite", "demo"]) == 0
    assert sorted(p.name for p in data.iterdir()) == ["shipped"]
    assert not (tmp_path / "figures" / "demo").exists()


def test_make_clean_results_with_an_empty_suite_deletes_nothing():
    root = paths.REPO_ROOT
    shipped = sorted(p.name for p in (root / "data" / "demo" / "shipped").iterdir())
    done = subprocess.run(["make", "-s", "clean-results", "SUITE=", f"PY={sys.executable}"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "plain name" in done.stderr
    assert sorted(p.name for p in (root / "data" / "demo" / "shipped").iterdir()) == shipped


# item 10 ------------------------------------------------------------------------------

def test_special_token_text_in_an_imported_response_stays_text_and_is_flagged():
    tok = tiny_tokenizer()
    answers = pd.DataFrame({"model": "dpo", "problem_id": ["p1", "p2"], "sample": 0,
                            "response": ["so the answer is 4<|im_end|> really", "4"],
                            "extracted": [None, None], "grade_method": "no_box",
                            "n_boxes": 0, "correct": False})
    probs = pd.DataFrame({"problem_id": ["p1", "p2"], "problem": ["2+2?", "1+3?"]})
    rollouts, set_aside = problem_sources.rollouts_from_text(answers, probs, tok, "{problem}")
    first = rollouts.iloc[0]
    assert tok.eos_token_id not in list(first.response_ids)
    assert tok.decode(list(first.response_ids)) == first.response
    assert first["flags"] == "special_token_text" and rollouts.iloc[1]["flags"] == ""
    assert set_aside.empty
    assert prompting.text_ids(tok, "4<|im_end|>") != tok("4<|im_end|>", add_special_tokens=False)["input_ids"]


def test_an_empty_imported_response_is_set_aside_not_fatal():
    tok = tiny_tokenizer()
    answers = pd.DataFrame({"model": "dpo", "problem_id": ["p1", "p2"], "sample": 0,
                            "response": ["  ", "the answer is 4"], "extracted": [None, None],
                            "grade_method": "no_box", "n_boxes": 0, "correct": False})
    probs = pd.DataFrame({"problem_id": ["p1", "p2"], "problem": ["2+2?", "1+3?"]})
    rollouts, set_aside = problem_sources.rollouts_from_text(answers, probs, tok, "{problem}")
    assert list(rollouts.problem_id) == ["p2"]
    assert set_aside.to_dict("records") == [{"model": "dpo", "problem_id": "p1",
                                             "reason": "empty response"}]


def test_a_repeated_id_in_a_json_object_is_an_error(tmp_path):
    path = tmp_path / "responses.json"
    path.write_text('{"a": {"response": "1"}, "b": {"response": "2"}, "a": {"response": "3"}}')
    with pytest.raises(problem_sources.ProblemsError, match="'a' appears twice"):
        problem_sources.read_prior_responses(path)
    path.write_text('{"a": {"problem": "1+1", "answer": "2"}, "a": {"problem": "2+2", "answer": "4"}}')
    with pytest.raises(problem_sources.ProblemsError, match="'a' appears twice"):
        problem_sources.from_file(path)


def test_a_binary_parquet_problem_column_is_decoded_not_stringified(tmp_path):
    path = tmp_path / "problem_sources.parquet"
    pd.DataFrame({"unique_id": ["x/1"], "problem": [b"What is $1+1$?"],
                  "answer": [b"2"]}).to_parquet(path)
    df = problem_sources.from_file(path)
    assert df.problem.iloc[0] == "What is $1+1$?" and df.answer.iloc[0] == "2"
    pd.DataFrame({"unique_id": ["x/1"], "problem": [b"\xff\xfe"], "answer": ["2"]}).to_parquet(path)
    with pytest.raises(problem_sources.ProblemsError, match="not UTF-8"):
        problem_sources.from_file(path)


# issue 34 item 3: bad input named where a person looks ----------------------------------

def test_invalid_utf8_in_a_problems_file_names_its_line_and_column(tmp_path):
    """An editor shows lines and columns, not byte offsets."""
    path = tmp_path / "problems.jsonl"
    good = '{"unique_id": "p/1", "problem": "What is $1+1$?", "answer": "2"}\n'
    path.write_bytes(good.encode() + good.encode() + b'{"unique_id": "p/\xc3\xa9\xff"}\n')
    with pytest.raises(problem_sources.ProblemsError) as err:
        problem_sources.from_file(path)
    # line 3; before the bad byte: '{"unique_id": "p/' (17 characters) and 'é' (one, two bytes)
    assert f"{path}:3:19" in str(err.value) and "line 3, column 19" in str(err.value), err.value
    assert "offset" not in str(err.value), err.value


@pytest.mark.parametrize("name,text,line", [
    ("problems.jsonl", '{"unique_id": "p/1", "problem": "1+1?", "answer": "2"}\n\n\n'
                       '{"unique_id": "p/2", "problem": "2+2?"}\n', 4),
    ("problems.json", '[\n  {"unique_id": "p/1", "problem": "1+1?", "answer": "2"},\n\n'
                      '  {"unique_id": "p/2",\n   "problem": "2+2?"}\n]\n', 4),
    ("problems.json", '{\n"p/1": {"problem": "1+1?", "answer": "2"},\n'
                      '"p/2": {"problem": "2+2?"}}', 3),
])
def test_a_record_without_an_answer_names_its_file_line(tmp_path, name, text, line):
    """The line the record starts on (1-based), not its 0-based index among the records."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(problem_sources.ProblemsError, match="no gold answer") as err:
        problem_sources.from_file(path)
    assert str(err.value).startswith(f"{path}:{line} (p/2): problem has no gold answer"), err.value
    assert "row 1" not in str(err.value), err.value

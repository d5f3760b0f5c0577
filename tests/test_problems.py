"""Problem sources, ids, filters, the hub's fast offline failure, and the prior import."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from rlprobe_nb.problems import grading
from rlprobe_nb.problems import sources as problem_sources
from rlprobe_nb.problems.sources import ProblemsError
from rlprobe_nb.tables import schemas, storage

DATA = Path(__file__).parent / "data"
PRIOR = DATA / "prior_small"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _stop_workers():
    yield
    grading.shutdown()


def test_jsonl_file_in_math_schema():
    df = problem_sources.from_file(DATA / "math_small.jsonl")
    assert list(df.columns) == schemas.PROBLEMS.names
    by = df.set_index("problem_id")
    assert by.loc["test/algebra/11.json", "answer"] == r"\frac{14}{3}"  # nested braces kept
    assert by.loc["test/algebra/11.json", "subject"] == "Algebra"  # MATH's `type` column
    assert by.loc["test/prealgebra/10.json", "level"] == 1  # "Level 1"
    assert by.loc["test/number_theory/13.json", "answer"] == "4"  # "\boxed 4"
    storage.to_arrow(df, schemas.PROBLEMS)  # fits the schema exactly


def test_parquet_and_json_files_give_the_same_table(tmp_path):
    jsonl = problem_sources.from_file(DATA / "math_small.jsonl")
    records, _ = problem_sources.read_records(DATA / "math_small.jsonl")
    raw = pd.DataFrame(records).astype({"level": str})  # MATH mixes "Level 1" and 3
    raw.to_parquet(tmp_path / "p.parquet")
    pq = problem_sources.from_file(tmp_path / "p.parquet")
    pd.testing.assert_frame_equal(jsonl.drop(columns="source"), pq.drop(columns="source"))


def test_filters_levels_subjects_limit_in_id_order():
    df = problem_sources.load_problems("file", path=DATA / "math_small.jsonl", levels=[2, 3])
    assert sorted(df["level"]) == [2, 3, 3]
    assert list(df["problem_id"]) == sorted(df["problem_id"])
    df = problem_sources.load_problems("file", path=DATA / "math_small.jsonl", subjects=["Algebra"],
                                limit=1)
    assert list(df["problem_id"]) == ["test/algebra/11.json"]
    with pytest.raises(ProblemsError, match="unknown subjects"):
        problem_sources.load_problems("file", path=DATA / "math_small.jsonl", subjects=["Algebre"])
    with pytest.raises(ProblemsError, match="no problems left"):
        problem_sources.load_problems("file", path=DATA / "math_small.jsonl", levels=[5])


def test_duplicate_ids_are_an_error():
    with pytest.raises(ProblemsError, match="duplicate problem ids.*dup/1"):
        problem_sources.from_file(DATA / "math_duplicate_ids.jsonl")


def test_missing_problem_id_is_a_clear_error():
    df = problem_sources.from_file(DATA / "math_small.jsonl")
    assert problem_sources.get_problem(df, "test/algebra/12.json")["answer"] == "32"
    with pytest.raises(KeyError, match="not in the problems table"):
        problem_sources.get_problem(df, "test/algebra/99.json")


def test_missing_file_and_bad_source():
    with pytest.raises(ProblemsError, match="does not exist"):
        problem_sources.from_file(DATA / "nope.jsonl")
    with pytest.raises(ProblemsError, match="unknown problems.source"):
        problem_sources.load_problems("web")


def test_demo_source_calls_the_generator():
    from rlprobe_nb.problems.arithmetic import generate_problems

    df = problem_sources.load_problems("demo", n=6, seed=0, split_name="test")
    raw = generate_problems("test", 6, 0)
    assert set(df["problem_id"]) == {r["unique_id"] for r in raw}
    assert (df["source"] == "demo:test").all()
    by = df.set_index("problem_id")
    assert all(by.loc[r["unique_id"], "answer"] == r["answer"] for r in raw)


def test_hub_fails_fast_offline():
    code = ("import time\nfrom rlprobe_nb.problems import sources as problem_sources\nt = time.time()\n"
            "try:\n    problem_sources.from_hub('HuggingFaceH4/MATH-500', None, 'test')\n"
            "except problem_sources.ProblemsError as e:\n    print('ERR', round(time.time() - t, 1), e)\n")
    for env in ({"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "https://hub.invalid"}):
        t = time.monotonic()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=REPO, env={**os.environ, **env}, timeout=60)
        assert out.stdout.startswith("ERR"), out.stderr[-2000:]
        assert "problems.source: file" in out.stdout  # says how to use a local file instead
        assert time.monotonic() - t < 20


def test_prior_import_is_regraded_and_disagreements_listed():
    probs = problem_sources.load_problems("prior", path=PRIOR / "filtered_problems.json")
    dpo = problem_sources.read_prior_responses(PRIOR / "dpo_responses.json")
    answers, dis = problem_sources.regrade_prior(dpo, probs, "dpo", timeout_s=10)
    storage.to_arrow(answers, schemas.ANSWERS)
    got = answers.set_index("problem_id")["correct"].to_dict()
    assert got == {"test/algebra/1.json": True, "test/prealgebra/2.json": False,
                   "test/intermediate_algebra/3.json": False, "test/geometry/4.json": True}
    # the prior grader's cut gold (\frac{14) and its (0,1)-for-[0,1) verdict both disagree
    assert sorted(dis["problem_id"]) == ["test/algebra/1.json", "test/intermediate_algebra/3.json"]
    row = dis.set_index("problem_id").loc["test/algebra/1.json"]
    assert row["stored_ground_truth"] == r"\frac{14" and row["gold"] == r"\frac{14}{3}"

    rlvr = problem_sources.read_prior_responses(PRIOR / "rlvr_responses.json")
    answers, dis = problem_sources.regrade_prior(rlvr, probs, "rlvr", timeout_s=10)
    # no box in the geometry answer: wrong under our policy, stored as right
    assert set(dis["problem_id"]) == {"test/algebra/1.json", "test/geometry/4.json"}
    assert dis.set_index("problem_id").loc["test/geometry/4.json", "grade_method"] == "no_box"


def test_prior_import_naming_unknown_problems_fails():
    probs = problem_sources.from_file(DATA / "math_small.jsonl")
    dpo = problem_sources.read_prior_responses(PRIOR / "dpo_responses.json")
    with pytest.raises(ProblemsError, match="missing from the problems table"):
        problem_sources.regrade_prior(dpo, probs, "dpo")


def test_a_problem_file_that_is_not_utf8_is_refused_naming_it(tmp_path):
    """Issue 22 item 7: a Latin-1 file failed with a bare UnicodeDecodeError."""
    for name in ("p.jsonl", "p.json"):
        path = tmp_path / name
        text = '{"unique_id": "a", "problem": "Café: 2 + 2?", "answer": "4"}'
        path.write_bytes((text if name.endswith("l") else f"[{text}]").encode("latin-1"))
        with pytest.raises(problem_sources.ProblemsError, match=rf"{name}:1:\d+: not UTF-8 text"):
            problem_sources.read_records(path)


def test_a_problem_text_longer_than_any_statement_is_refused_naming_its_row(tmp_path):
    """Issue 44 item 7: a 10 MB problem text ran 01 out of memory (reported as out of GPU
    memory on a CPU run)."""
    path = tmp_path / "p.jsonl"
    rows = [{"unique_id": "ok", "problem": "1+1?", "answer": "2"},
            {"unique_id": "huge", "problem": "x" * 10_000_000, "answer": "1"}]
    path.write_text("\n".join(__import__("json").dumps(r) for r in rows) + "\n")
    t0 = time.perf_counter()
    with pytest.raises(ProblemsError, match=r"p\.jsonl:2: its problem text has 10,000,000 characters"):
        problem_sources.from_file(path)
    assert time.perf_counter() - t0 < 5


def test_suite_problems_reads_the_suites_problems_section():
    """The one call 01, 09 and the takeover benchmark make: the suite's own problems, or
    the first ``n`` of the same source."""
    from rlprobe_nb.suite import params

    P = params.load("demo")
    own = problem_sources.suite_problems(P)
    assert len(own) == P.problems.n
    first = problem_sources.suite_problems(P, n=12, limit=12)
    assert list(first.problem_id) == list(problem_sources.load_problems(
        "demo", n=12, seed=P.problems.seed, split_name=P.problems.split_name).problem_id)
    assert list(first.problem_id) == list(own.problem_id[:12])  # a prefix of the same split

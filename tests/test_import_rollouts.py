"""import_rollouts: a verl rollout JSONL, a TRL completions parquet (chat messages) and
open-instruct traces become the book's rollouts table, graded by the book's grader, with
exact ids kept and text re-tokenized and flagged; the forcing engine forces the result."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import pyarrow.parquet as pq
import yaml

from rlprobe_nb import forcing
from rlprobe_nb.demo.tiny import tiny_llama, tiny_tokenizer
from rlprobe_nb import import_rollouts
from rlprobe_nb.suite import prompting
from rlprobe_nb.tables import schemas, storage

PROBLEMS = {"What is $2 + 3$?": "5", "What is $7 \\times 6$?": "42"}
ANSWERS = ["We add: \\boxed{5}", "Six sevens: \\boxed{41}"]  # one right, one wrong


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """A suite "run" over a tiny local reference (params in their own folder)."""
    root = tmp_path_factory.mktemp("imp")
    tok = tiny_tokenizer()
    tok.save_pretrained(root / "ref")
    tiny_llama(len(tok)).save_pretrained(root / "ref")
    (root / "params" / "run").mkdir(parents=True)
    (root / "params" / "run" / "suite.yaml").write_text(yaml.safe_dump({
        "suite": "run", "reference": "initial", "target": "rlvr_step_1",
        "models": {"initial": {"kind": "local", "path": str(root / "ref")}},
        "runtime": {"device": "cpu", "dtype": "float32"}}))
    (root / "params" / "run" / "rlvr_step_1.yaml").write_text(yaml.safe_dump({
        "step": 1, "model": {"kind": "local", "path": str(root / "ref")}}))
    return root, tok


@pytest.fixture
def env(suite, monkeypatch):
    root, tok = suite
    monkeypatch.setenv("RLPROBE_PARAMS", str(root / "params"))
    monkeypatch.setenv("RLPROBE_OUT", str(root / "out"))
    return root, tok


def dumps(root: Path, tok) -> dict:
    """The three dumps, as the trainers write them (text decoded without special tokens)."""
    items = list(PROBLEMS.items())
    verl = root / "1.jsonl"
    verl.write_text("".join(json.dumps({
        "input": tok.decode(prompting.prompt_ids(tok, p), skip_special_tokens=True),
        "output": a, "gts": g, "score": float(a.endswith(f"{{{g}}}")), "step": 1}) + "\n"
        for (p, g), a in zip(items, ANSWERS)))
    trl = root / "completions_00001.parquet"
    pd.DataFrame({"step": [1, 1], "prompt": [[{"role": "user", "content": prompting.user_message(p)}]
                                              for p, _ in items],
                  "completion": [[{"role": "assistant", "content": a}] for a in ANSWERS],
                  "accuracy_reward": [1.0, 0.0]}).to_parquet(trl)
    oi = root / "run_rollouts_000000.jsonl"
    oi.write_text("".join(json.dumps({
        "prompt_tokens": prompting.prompt_ids(tok, p),
        "response_tokens": prompting.text_ids(tok, a) + [tok.eos_token_id],
        "finish_reason": "stop", "ground_truth": g}) + "\n" for (p, g), a in zip(items, ANSWERS)))
    return {"verl": verl, "trl": trl, "open-instruct": oi}


@pytest.mark.parametrize("fmt", ["verl", "trl", "open-instruct"])
def test_a_dump_becomes_a_graded_rollouts_table(env, fmt, capsys):
    root, tok = env
    dump = dumps(root, tok)[fmt]
    extra = ["--problems", str(root / "problems.jsonl")] if fmt == "trl" else []
    if fmt == "trl":  # TRL keeps no ground truth: the run's problems file gives it
        (root / "problems.jsonl").write_text("".join(
            json.dumps({"unique_id": f"math/{i}", "problem": p, "answer": g}) + "\n"
            for i, (p, g) in enumerate(PROBLEMS.items())))
    assert import_rollouts.main([str(dump), "--suite", "run", *extra]) == 0
    assert f"({fmt})" in capsys.readouterr().out
    table = pq.read_table(root / "out" / "data" / "run" / "imported" / f"rollouts_{dump.stem}.parquet")
    assert table.schema.equals(schemas.ROLLOUTS)
    df = table.to_pandas()
    assert df.correct.tolist() == [True, False]
    assert df.failure_type.tolist() == ["correct", "boxed_wrong" if fmt == "open-instruct"
                                        else "imported"]
    exact = fmt == "open-instruct"
    assert set(df.token_method) == {"generated" if exact else "text"}
    assert all(("retokenized" in f) != exact for f in df["flags"])
    assert all(("lossy_prompt" in f) == (fmt == "verl") for f in df["flags"])
    if exact:
        assert [list(r)[-1] for r in df.response_ids] == [tok.eos_token_id] * 2
    if fmt == "trl":
        assert df.problem_id.tolist() == ["math/0", "math/1"]
    problems = pd.read_json(root / "out" / "data" / "run" / "imported" /
                            f"problems_{dump.stem}.jsonl", lines=True)
    assert sorted(problems.problem) == sorted(PROBLEMS)
    texts = dict(zip(problems.unique_id, problems.problem))
    seqs = forcing.build_sequences(df, texts, tok, progress=False)
    ckpt, ref = tiny_llama(len(tok), seed=1), tiny_llama(len(tok), seed=0)
    out = forcing.run_pair(seqs, forcing.Side("ckpt", ckpt), forcing.Side("ref", ref),
                           root / f"tokens_{fmt}", suite="run", chunk_positions=64, topk=5,
                           device="cpu", compile=False, progress=False, batch_tokens=256)
    tokens = storage.read_table(out)
    assert len(tokens) == sum(len(r) for r in df.response_ids) and tokens.kl_ref_ckpt.gt(0).all()


def test_a_prompt_that_is_not_the_template(env, capsys):
    root, tok = env
    bad = root / "bad.jsonl"
    bad.write_text(json.dumps({"input": "Solve this: 2+2", "output": "4", "gts": "4"}) + "\n")
    assert import_rollouts.main([str(bad), "--suite", "run"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "row 0" in err and "--prompt-template" in err


def test_chapter_02_reads_an_import_of_the_selected_problems_and_refuses_a_wrong_file(env):
    """``rollouts.source: imported``: chapter 02 keeps the imported rows of its selected
    problems as they are (flags included), so 03 forces them like any rollouts table;
    a missing file, a file of another schema and an import of other problems are refused,
    each naming the file and the fix."""
    root, tok = env
    dump = dumps(root, tok)["verl"]
    assert import_rollouts.main([str(dump), "--suite", "run"]) == 0
    path = root / "out" / "data" / "run" / "imported" / f"rollouts_{dump.stem}.parquet"
    every = pd.read_parquet(path)
    kept = import_rollouts.read_imported(path, every.problem_id.iloc[:1])
    assert len(kept) == 1 and kept["flags"].iloc[0] == every["flags"].iloc[0]
    assert "retokenized" in kept["flags"].iloc[0]
    with pytest.raises(import_rollouts.ImportError_, match="does not exist"):
        import_rollouts.read_imported(root / "nowhere.parquet", every.problem_id)
    other = root / "other.parquet"
    pd.DataFrame({"x": [1]}).to_parquet(other)
    with pytest.raises(import_rollouts.ImportError_, match="not a rollouts table"):
        import_rollouts.read_imported(other, every.problem_id)
    with pytest.raises(import_rollouts.ImportError_, match="problems.path"):
        import_rollouts.read_imported(path, ["math/999"])

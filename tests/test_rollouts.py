"""Rollouts: reproducible in fresh processes, seed-sensitive, token ids kept exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rlprobe_nb.generation import rollouts
from rlprobe_nb.problems import grading
from rlprobe_nb.suite import params
from rlprobe_nb.suite.prompting import prompt_ids
from rlprobe_nb.tables import schemas, storage

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = params.load("demo").prompt_template
PROBLEMS = pd.DataFrame({
    "problem_id": ["t/1", "t/2", "t/3"],
    "problem": ["What is $2+3$?", "What is $12 \\times 4$?", "Solve $3x = 14$ for $x$."],
    "answer": ["5", "48", r"\frac{14}{3}"],
})


@pytest.fixture(scope="module", autouse=True)
def _stop_workers():
    yield
    grading.shutdown()



SCRIPT = """
import json, sys
import pandas as pd
from transformers import AutoModelForCausalLM, AutoTokenizer
from rlprobe_nb.generation import rollouts
from rlprobe_nb.problems import grading
folder, seed, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(folder).eval()
tok = AutoTokenizer.from_pretrained(folder)
problems = pd.DataFrame(json.loads(sys.argv[4]))
df = rollouts.generate_rollouts(model, tok, problems, model_name="tiny", template=sys.argv[5],
    n_per_problem=3, temperatures=[0.0, 1.0], max_new_tokens=10, seed=seed,
    batch_size=batch, progress=False)
grading.shutdown()
print(json.dumps({r: list(map(int, ids)) for r, ids in zip(df.rollout_id, df.response_ids)}))
"""


def run_fresh(folder, seed, batch=4):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder), str(seed), str(batch),
         PROBLEMS.to_json(orient="records"), TEMPLATE],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_same_seed_same_tokens_in_fresh_processes(tiny):
    folder = tiny[0]
    a, b = run_fresh(folder, 7), run_fresh(folder, 7)
    assert a == b
    c = run_fresh(folder, 8)
    sampled = [k for k in a if not k.endswith("#0") and not k.endswith("#2")]  # T = 1.0
    greedy = [k for k in a if k.endswith("#0")]
    assert any(a[k] != c[k] for k in sampled)  # another seed, other samples
    assert all(a[k] == c[k] for k in greedy)  # greedy does not depend on the seed


def test_batch_size_does_not_change_samples(tiny):
    _, model, tok = tiny
    kw = dict(model_name="tiny", template=TEMPLATE, n_per_problem=3, temperatures=[0.0, 1.0],
              max_new_tokens=8, seed=3, progress=False)
    one = rollouts.generate_rollouts(model, tok, PROBLEMS, batch_size=1, **kw)
    many = rollouts.generate_rollouts(model, tok, PROBLEMS, batch_size=9, **kw)
    assert one["response_ids"].map(list).tolist() == many["response_ids"].map(list).tolist()


def test_rows_schema_ids_and_text(tiny):
    _, model, tok = tiny
    df = rollouts.generate_rollouts(model, tok, PROBLEMS, model_name="tiny", template=TEMPLATE,
                                    n_per_problem=2, temperatures=[0.0, 0.7], max_new_tokens=6,
                                    seed=1, batch_size=4, progress=False)
    storage.to_arrow(df, schemas.ROLLOUTS)
    assert df["rollout_id"].tolist() == [f"{p}#{s}" for p in PROBLEMS.problem_id for s in (0, 1)]
    assert df["temperature"].tolist() == [0.0, 0.7] * 3
    for r in df.itertuples():
        assert list(r.prompt_ids) == prompt_ids(tok, PROBLEMS.set_index("problem_id")
                                                .loc[r.problem_id, "problem"], TEMPLATE)
        assert r.response == tok.decode(list(r.response_ids), skip_special_tokens=True)
        assert r.n_tokens == len(r.response_ids)
        assert (r.finish_reason == "length") == (r.n_tokens == 6)
    assert df["seed"].nunique() == len(df)


def test_eos_is_kept_and_nothing_after_it(tiny):
    _, model, tok = tiny
    prompt = prompt_ids(tok, "What is $2+3$?", TEMPLATE)
    (free, _), = rollouts.generate_batch(model, tok, [prompt], [0.0], [0], 8)
    stop_token = free[2]  # make the third greedy token the EOS
    original = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = stop_token
    try:
        out = rollouts.generate_batch(model, tok, [prompt, prompt[3:]], [0.0, 0.0], [0, 0], 8)
    finally:
        model.generation_config.eos_token_id = original
    ids, reason = out[0]
    assert reason == "stop" and ids == free[:free.index(stop_token) + 1]
    assert stop_token not in ids[:-1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="temperatures"):
        rollouts.generate_rollouts(None, None, PROBLEMS, model_name="x", template=TEMPLATE,
                                   n_per_problem=1, temperatures=[], max_new_tokens=4, seed=0,
                                   batch_size=1)


def test_sharded_run_resumes_without_recomputing(tmp_path):
    table = storage.ShardedTable(tmp_path / "t", schemas.SELECTION)
    calls = []

    def job(k):
        def fn():
            calls.append(k)
            return pd.DataFrame([{c: None for c in schemas.SELECTION.names}]).assign(
                problem_id=k, n_ref=1, n_target=1, pass_ref=0.0, pass_target=1.0,
                greedy_ref_correct=False, greedy_target_correct=True, group="selected",
                reason="r")
        return fn

    jobs = [(k, job(k)) for k in ("a", "b")]
    table.begin("fp")
    assert storage.run_shards(table, jobs, {"x": 1}, progress=False) == ["a", "b"]
    table.begin("fp")
    assert storage.run_shards(table, jobs, {"x": 1}, progress=False) == []
    assert calls == ["a", "b"] and storage.is_complete(tmp_path / "t")
    assert len(storage.read_table(tmp_path / "t")) == 2


def test_a_compiled_decode_step_changes_the_sampling_keys():
    from rlprobe_nb.tables import lineage

    def sampling_keys(P):
        return lineage.answers_key(P, "problems-sha"), lineage.rollouts_key(P, "sel", "problems-sha")
    default = sampling_keys(params.load("demo"))
    assert all("runtime.compile_decode" not in key["params"] for key in default)
    compiled = sampling_keys(params.load("demo", overrides={"runtime.compile_decode": True}))
    assert [k["params"]["runtime.compile_decode"] for k in compiled] == [True, True]
    assert params.load("tulu3").runtime.compile_decode


def test_compiling_allows_every_compilation_and_never_falls_back_silently():
    import torch._dynamo

    from rlprobe_nb.generation import decoding
    before = torch._dynamo.config.recompile_limit, torch._dynamo.config.fail_on_recompile_limit_hit
    with decoding._compiling(True):
        assert torch._dynamo.config.recompile_limit >= 64
        assert torch._dynamo.config.fail_on_recompile_limit_hit
    with decoding._compiling(False):
        assert (torch._dynamo.config.recompile_limit,
                torch._dynamo.config.fail_on_recompile_limit_hit) == before
    assert (torch._dynamo.config.recompile_limit,
            torch._dynamo.config.fail_on_recompile_limit_hit) == before


def test_a_prompt_that_does_not_fit_the_context_is_refused_before_sampling(tiny):
    """Issue 44 item 7: no prompt-length check; a prompt past the model's context is named
    (with its length and the budget) before any token is drawn."""
    _, model, tok = tiny
    context = model.config.max_position_embeddings
    long = pd.DataFrame({"problem_id": ["long", "short"], "problem": ["1 + " * context, "1+1"],
                         "answer": ["1", "2"]})
    with pytest.raises(ValueError, match=rf"1 problems' prompts.*context of tiny \({context} "
                                         r"tokens\), e.g\. long \(\d+ prompt tokens\)"):
        rollouts.generate_rollouts(model, tok, long, model_name="tiny", template=TEMPLATE,
                                   n_per_problem=1, temperatures=[0.0], max_new_tokens=4,
                                   seed=0, batch_size=2, progress=False)

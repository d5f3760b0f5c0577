"""The branches table: written through lineage (keyed on the token tables), reused
with the same inputs, refused when stale or when its inputs changed, resumable shard by
shard after an interruption. A tiny random model writes the continuations."""

from __future__ import annotations

import pandas as pd
import pytest
from tiny_models import tiny_llama

from rlprobe_nb.counterfactuals import table
from rlprobe_nb.problems import grading
from rlprobe_nb.suite import models, params, paths, prompting
from rlprobe_nb.tables import lineage, storage


@pytest.fixture(scope="module")
def tiny():
    model, tok = tiny_llama()
    yield models.LoadedModel("tiny", model, tok)
    grading.shutdown()


def stub_token_tables(monkeypatch, shas: dict) -> None:
    """The suite's token tables as their key hashes alone (``shas``, mutable)."""
    real = lineage.current_sha
    monkeypatch.setattr(lineage, "token_shas", lambda P, pairs=None: dict(shas))
    monkeypatch.setattr(lineage, "current_sha",
                        lambda P, name: shas[name] if name in shas else real(P, name))


@pytest.fixture()
def suite(tmp_path, monkeypatch, tiny):
    """The demo suite's parameters writing under tmp_path, token tables stubbed by their
    key hashes (``shas``, mutable), model identities by their names."""
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))
    shas = {"tokens/rlvr_step_1200__vs__dpo": "aaaa"}
    stub_token_tables(monkeypatch, shas)
    monkeypatch.setattr(models, "model_identity", lambda name, P: {"name": name})
    P = params.load("demo")
    tok = tiny.tokenizer
    rollouts = pd.DataFrame([{
        "rollout_id": f"p{i}#0", "problem_id": f"p{i}",
        "prompt_ids": prompting.prompt_ids(tok, f"What is {i} + 3?"),
        "response_ids": tok.encode(f"We add {i} and 3 to get {i + 3}.", add_special_tokens=False)}
        for i in range(3)])
    plan = pd.DataFrame([
        {"model": "tiny", "rollout_id": f"p{i}#0", "problem_id": f"p{i}", "kind": kind, "pos": 4,
         "arm": arm, "substituted_id": tok.encode(" 7", add_special_tokens=False)[0]
         if arm == "top1" else None, "category": "number"}
        for i in range(3) for kind, arm in (("point", "keep"), ("point", "top1"),
                                            ("grid", "prefix"))])
    gold = {f"p{i}": str(i + 3) for i in range(3)}
    settings = table.branches_settings(P, plan, "rollouts-sha", checkpoint="rlvr_step_1200",
                                       n=2, temperature=1.0, max_new_tokens=12, seed=0)
    return {"P": P, "plan": plan, "rollouts": rollouts, "gold": gold, "settings": settings,
            "shas": shas}


def run(s, tiny, settings=None, overwrite=False, loader=None):
    return table.run_branches(s["P"], s["plan"], s["rollouts"], s["gold"], loader or (lambda m: tiny),
                              settings or s["settings"], {}, checkpoint="rlvr_step_1200", n=2,
                              temperature=1.0, max_new_tokens=12, seed=0, batch_rows=4,
                              rollouts_per_shard=1, overwrite=overwrite)


def never(name):
    raise AssertionError("a reused table loads no model")


def test_written_keyed_reused_and_refused_when_stale(suite, tiny):
    first = run(suite, tiny)
    assert len(first) == len(suite["plan"]) and set(first.kind) == {"point", "grid"}
    assert (first.n == 2).all() and first.seeds.map(len).eq(2).all()
    assert not paths.table_dir("demo", "branches_shards").exists()  # shards folded in
    again = run(suite, tiny, loader=never)  # same inputs: reused
    pd.testing.assert_frame_equal(again, first)
    with pytest.raises(storage.StaleTableError, match="sampling"):  # other sampling: refused
        run(suite, tiny, settings={**suite["settings"], "sampling": {"n": 3}}, loader=never)
    suite["shas"]["tokens/rlvr_step_1200__vs__dpo"] = "bbbb"  # a token table was recomputed
    with pytest.raises(storage.StaleTableError, match="aaaa -> bbbb"):
        lineage.read_derived(suite["P"], "branches")
    with pytest.raises(storage.StaleTableError):
        run(suite, tiny, loader=never)
    redone = run(suite, tiny, overwrite=True)
    pd.testing.assert_frame_equal(redone, first)  # seeded: the same rows again
    assert len(lineage.read_derived(suite["P"], "branches")) == len(first)


def test_an_interrupted_run_resumes_from_its_shards(suite, tiny, monkeypatch):
    calls = []
    real = table.pass_counts

    def flaky(*args, **kw):
        calls.append(sorted(set(args[2].rollout_id)))
        if len(calls) == 2:
            raise KeyboardInterrupt("interrupted")
        return real(*args, **kw)

    monkeypatch.setattr(table, "pass_counts", flaky)
    with pytest.raises(KeyboardInterrupt):
        run(suite, tiny)
    assert not storage.is_complete(paths.table_dir("demo", "branches"))
    done = len(calls)
    out = run(suite, tiny)
    assert len(calls) - done == 2, "only the two unfinished shards are computed again"
    monkeypatch.setattr(table, "pass_counts", real)
    fresh = run(suite, tiny, overwrite=True, settings={**suite["settings"], "again": 1})
    cols = ["rollout_id", "kind", "arm", "passes", "seeds"]
    pd.testing.assert_frame_equal(
        out[cols].sort_values(cols[:3]).reset_index(drop=True),
        fresh[cols].sort_values(cols[:3]).reset_index(drop=True))


def test_two_worker_processes_write_the_table_one_writes(suite, tiny, monkeypatch):
    from rlprobe_nb import distributed
    ran, real = [], distributed.run_sharded
    monkeypatch.setattr(distributed, "run_sharded", lambda *a, **k: ran.append(real(*a, **k)))
    monkeypatch.setenv(distributed.PROCESSES_ENV, "2")  # 3 shards: 2 for one worker, 1 for the other
    two = run(suite, tiny)
    assert ran == [2]
    monkeypatch.setenv(distributed.PROCESSES_ENV, "1")
    one = run(suite, tiny, overwrite=True, settings={**suite["settings"], "again": 1})
    cols = ["rollout_id", "kind", "arm", "passes", "seeds", "n"]
    pd.testing.assert_frame_equal(two[cols].sort_values(cols[:3]).reset_index(drop=True),
                                  one[cols].sort_values(cols[:3]).reset_index(drop=True))

"""Sharded stages (issue 14): the rollouts (02) and token (03) tables written by 2 worker
processes equal those of 1, and a worker killed mid-run followed by a rerun gives the same
tables. On the CPU the workers talk over gloo; ``RLPROBE_TEST_DEVICE=cuda`` runs the same
tests on the GPUs of the host (one worker per GPU, NCCL).

On the demo suite's own models, loaded where they run (in each worker) through the suite
registry exactly as notebooks 02 and 03 load them: the reference (the GGUF's converted
cache) samples the rollouts (``rollouts.sample_to_table`` with ``models.load_model``), and
``forcing_plan.run_checkpoint`` forces them through rlvr_step_1200 (a LoRA adapter merged
into the reference) against the reference's hidden-state cache. Small on purpose: the
suite's first 4 demo problems, 4 samples each at the suite's temperatures and seed (one
problem a shard, its samples decoded as one batch), 16 new tokens; every one of those
rollouts forced, 2 or 3 a batch."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from rlprobe_nb import distributed, forcing
from rlprobe_nb.forcing import plan as forcing_plan
from rlprobe_nb.generation import rollouts
from rlprobe_nb.problems import grading
from rlprobe_nb.problems import sources as problem_sources
from rlprobe_nb.suite import models, params
from rlprobe_nb.tables import lineage, schemas, storage

DEVICE = os.environ.get("RLPROBE_TEST_DEVICE", "cpu")
CHECKPOINT = "rlvr_step_1200"
N_PROBLEMS, N_SAMPLES = 4, 4
OVERRIDES = {"runtime.device": DEVICE, "runtime.dtype": "float32", "problems.n": N_PROBLEMS,
             "rollouts.n_per_problem": N_SAMPLES, "rollouts.max_new_tokens": 16,
             "rollouts.batch_size": N_SAMPLES,  # a problem's samples decoded together
             "forcing.batch_tokens": 256}  # 2 or 3 sequences a batch: 6 batches
METRICS = ["logp_ckpt", "logp_ref", "dlogp", "entropy_ckpt", "entropy_ref", "kl_ckpt_ref",
           "kl_ref_ckpt", "js", "k1", "k2", "k3"]

pytestmark = pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.device_count() < 2,
                                reason="needs 2 GPUs")


@pytest.fixture(scope="module", autouse=True)
def _stop_workers():
    yield
    grading.shutdown()


@pytest.fixture(autouse=True)
def _two_workers(monkeypatch):
    monkeypatch.setenv(distributed.PROCESSES_ENV, "2")


@pytest.fixture(scope="module", autouse=True)
def _one_problem_a_shard():
    """A rollouts shard of one batch (one problem's samples), not SHARD_BATCHES: 4 shards,
    2 for each worker. (Workers are forked, so they see it too.)"""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(rollouts, "SHARD_BATCHES", 1)
        yield


@pytest.fixture(scope="module")
def demo():
    """The demo suite at the test's size: its parameters and its first problems."""
    P = params.load("demo", CHECKPOINT, overrides=OVERRIDES)
    models.load_tokenizer(P.reference, P)  # converting the GGUF (once per cache) is set-up
    S = P.problems
    todo = problem_sources.load_problems(S.source, n=S.n, seed=S.seed, split_name=S.split_name)
    assert len(todo) == N_PROBLEMS
    return SimpleNamespace(P=P, problems=todo)


def _rollouts(demo, out: Path) -> pd.DataFrame:
    """Notebook 02's sampling call, into ``out``."""
    P, R = demo.P, demo.P.rollouts
    return rollouts.sample_to_table(
        out, schemas.ROLLOUTS, [P.reference], lambda name: models.load_model(name, P),
        demo.problems, template=P.prompt_template, n_per_problem=R.n_per_problem,
        temperatures=R.temperatures, max_new_tokens=R.max_new_tokens, seed=R.seed,
        batch_size=R.batch_size, timeout_s=P.grading.timeout_s, workers=1,
        manifest={"test": "sharding"},
        key=lineage.rollouts_key(P, "sharding test", "sharding test"))


@pytest.fixture(scope="module")
def two_rollouts(demo, tmp_path_factory):
    """The rollouts table sampled by 2 workers (the token test's input, too)."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv(distributed.PROCESSES_ENV, "2")
        out = tmp_path_factory.mktemp("rollouts") / "two"
        table = _rollouts(demo, out)
    assert storage.read_manifest(out)["rows"] == len(table)
    return table


def _single(fn) -> None:
    """``fn()`` in one process. On GPUs, in a forked child: a process that has initialized
    CUDA cannot start workers any more, and the later tests need this one to."""
    if DEVICE != "cuda":
        fn()
        return
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=fn)
    child.start()
    child.join()
    assert child.exitcode == 0, f"the single-process run failed ({child.exitcode})"


def _in_order(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return df.sort_values(by).reset_index(drop=True)


def _same_rollouts(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a, b = (_in_order(x, ["problem_id", "sample"]) for x in (a, b))
    assert len(a) == N_PROBLEMS * N_SAMPLES
    pd.testing.assert_frame_equal(a, b)


def _kill_rank_1_at_its_second(monkeypatch, module, name: str, flag: Path) -> None:
    """Rank 1 of the next sharded run kills itself (SIGKILL) when it reaches its second
    call of ``module.name``, once (``flag`` records that it did)."""
    real = getattr(module, name)
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        from accelerate import PartialState

        if PartialState._shared_state and PartialState().process_index == 1 \
                and not flag.exists():
            calls["n"] += 1
            if calls["n"] == 2:
                flag.write_text("killed")
                os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)


@pytest.mark.slow  # about 40 s on 2 CPU cores, the 2-worker sampling (fixture) included
def test_rollouts_two_processes_equal_one_and_survive_a_killed_rank(demo, two_rollouts,
                                                                    tmp_path, monkeypatch):
    two = two_rollouts  # sampled by 2 workers
    assert two["temperature"].nunique() == len(set(demo.rollouts.temperatures)) and (two["n_tokens"] > 0).all()

    flag = tmp_path / "killed.flag"
    with monkeypatch.context() as m:
        _kill_rank_1_at_its_second(m, rollouts, "generate_rollouts", flag)
        with pytest.raises(Exception):
            _rollouts(demo, tmp_path / "killed")
    assert flag.exists(), "rank 1 was never killed"
    assert 0 < len(storage.ShardedTable(tmp_path / "killed", schemas.ROLLOUTS).done()) < N_PROBLEMS
    again = _rollouts(demo, tmp_path / "killed")
    _same_rollouts(two, again)
    # the single process last: on GPUs it initializes CUDA (in a forked child there)
    monkeypatch.setenv(distributed.PROCESSES_ENV, "1")
    _single(lambda: _rollouts(demo, tmp_path / "one"))
    _same_rollouts(storage.read_table(tmp_path / "one"), two)


def _force(demo, seqs, root: Path, monkeypatch) -> pd.DataFrame:
    """Notebook 03's forcing of the checkpoint (the reference's hidden states cached
    first), every table and cache under ``root`` (read at call time, in every worker)."""
    monkeypatch.setenv("RLPROBE_OUT", str(root))
    folder = forcing_plan.run_checkpoint(demo.P, seqs, None, "sharding test")
    return storage.read_table(folder)


# Each rank runs with one thread and a single process with two, so a float32 matrix
# product sums in another order: the logits (tens of nats) agree to about 1e-6 of their
# size, and a metric read from them to a few 1e-5 nats, not bitwise. Tokens, ranks and
# top-k ids must be identical.
METRIC_ATOL, METRIC_RTOL = 5e-5, 1e-5


def _same_tokens(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a, b = (_in_order(x, ["rollout_id", "pos"]) for x in (a, b))
    assert len(a) == len(b) > 0
    exact = [c for c in a.columns if c not in METRICS and not c.startswith("topk_p")]
    pd.testing.assert_frame_equal(a[exact], b[exact])
    for c in METRICS:
        x, y = a[c].to_numpy(np.float64), b[c].to_numpy(np.float64)
        worst = np.abs(x - y) - METRIC_RTOL * np.abs(y)
        assert worst.max() <= METRIC_ATOL, (c, np.abs(x - y).max())
    for c in ("topk_p_ckpt", "topk_p_ref"):
        diff = max(abs(x - y) for u, v in zip(a[c], b[c]) for x, y in zip(u, v))
        assert diff <= 1e-5, c  # probabilities: at most 1, so rounding stays below this


@pytest.mark.slow  # about 70 s on 2 CPU cores
def test_token_table_two_processes_equal_one_and_survive_a_killed_rank(demo, two_rollouts,
                                                                      tmp_path, monkeypatch):
    seqs = forcing_plan.sequences(demo.P, two_rollouts.assign(group="target"), demo.problems)
    assert len(seqs) == N_PROBLEMS * N_SAMPLES
    table = lambda: forcing.pair_dir("demo", CHECKPOINT, demo.P.reference)  # noqa: E731
    two = _force(demo, seqs, tmp_path / "two", monkeypatch)  # 2 first: see the test above
    manifest = storage.read_manifest(table())
    assert manifest["engine"]["processes"] == 2 and manifest["rows"] == len(two)
    assert two["kl_ref_ckpt"].max() > 1e-2  # the checkpoint is not the reference

    flag = tmp_path / "killed.flag"
    with monkeypatch.context() as m:
        _kill_rank_1_at_its_second(m, storage.ShardedTable, "write_shard", flag)
        with pytest.raises(Exception):
            _force(demo, seqs, tmp_path / "killed", monkeypatch)
    assert flag.exists(), "rank 1 was never killed"
    again = _force(demo, seqs, tmp_path / "killed", monkeypatch)
    assert 0 < storage.read_manifest(table())["engine"]["rows_computed_this_run"] < len(again)
    _same_tokens(two, again)
    monkeypatch.setenv(distributed.PROCESSES_ENV, "1")
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path / "one"))  # here too: on GPUs it runs in a child
    _single(lambda: _force(demo, seqs, tmp_path / "one", monkeypatch))
    assert "processes" not in storage.read_manifest(table())["engine"]  # ran in this process
    _same_tokens(storage.read_table(table()), two)


def test_several_checkpoints_are_spread_over_the_workers(tmp_path, monkeypatch):
    """``forcing_plan.force_checkpoints``: the reference's cache made once, in the
    coordinator, for the checkpoints' common sequences; each checkpoint whose table is not
    complete forced exactly once, by one of the 2 workers; complete ones skipped. (The
    forcing itself is stubbed: the tests above cover it.)"""
    from rlprobe_nb.forcing import plan as forcing_plan

    P = params.load("demo", "rlvr_step_1200")
    names = ["rlvr_step_100", "rlvr_step_200", "rlvr_step_400", "rlvr_step_800"]
    done_already = "rlvr_step_200"
    log = tmp_path / "log"
    log.mkdir()
    cached = []

    class Seqs:
        def fingerprint(self):
            return "the same rollouts for every checkpoint"

    monkeypatch.setattr(forcing_plan, "choose", lambda rollouts, selection, Pc: None)
    monkeypatch.setattr(forcing_plan, "sequences", lambda Pc, chosen, problems: Seqs())
    monkeypatch.setattr(forcing_plan, "table_key", lambda *args: {"test": 1})
    monkeypatch.setattr(forcing_plan.storage, "plan_reuse",
                        lambda out, key, overwrite: done_already in Path(out).name)
    monkeypatch.setattr(forcing_plan, "ensure_cached",
                        lambda Pc, name, seqs: cached.append(name))

    def run_checkpoint(Pc, seqs, ckpt, rollouts_sha, overwrite):
        (log / f"{Pc.checkpoint}.{os.getpid()}").write_text(rollouts_sha)

    monkeypatch.setattr(forcing_plan, "run_checkpoint", run_checkpoint)
    forced = forcing_plan.force_checkpoints(P, names, None, None, None, "sha")
    want = [n for n in names if n != done_already]
    assert forced == want
    assert cached == [P.reference]
    runs = sorted(f.name for f in log.iterdir())
    assert sorted(r.split(".")[0] for r in runs) == sorted(want)
    assert len({r.split(".")[1] for r in runs}) == 2, runs  # both workers forced some
    assert str(os.getpid()) not in {r.split(".")[1] for r in runs}

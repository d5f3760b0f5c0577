"""Sharded stages (issue 14): the rollouts (02) and token (03) tables written by 2 worker
processes equal those of 1, and a worker killed mid-run followed by a rerun gives the same
tables. On the CPU the workers talk over gloo; ``RLPROBE_TEST_DEVICE=cuda`` runs the same
tests on the GPUs of the host (one worker per GPU, NCCL).

Small on purpose: a tiny random Llama with the demo suite's tokenizer and prompt template,
4 demo-style problems, 4 samples each (one problem a shard), 12 new tokens; forcing of those rollouts."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from rlprobe_nb import distributed, forcing, grading, models, params, rollouts, schemas, storage

DEVICE = os.environ.get("RLPROBE_TEST_DEVICE", "cpu")
TEMPLATE = params.load("demo").prompt_template
PROBLEMS = pd.DataFrame({
    "problem_id": ["t/1", "t/2", "t/3", "t/4"],
    "problem": ["What is $2+3$?", "What is $12 \\times 4$?", "Solve $3x = 14$ for $x$.",
                "What is $7-9$?"],
    "answer": ["5", "48", r"\frac{14}{3}", "-2"],
})
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


def _tokenizer():
    folder = os.environ.get("RLPROBE_TEST_TOKENIZER")
    if folder:
        return models._finish_tokenizer(AutoTokenizer.from_pretrained(folder))
    P = params.load("demo")
    return models.load_tokenizer(P.reference, P)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two tiny random Llamas (P, Q) saved with the demo tokenizer: workers load them."""
    tok = _tokenizer()
    root = tmp_path_factory.mktemp("shard_models")
    for name, seed in (("P", 0), ("Q", 1)):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        LlamaForCausalLM(cfg).eval().save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return SimpleNamespace(root=root, tok=tok)


def _load(folder: Path):
    model = AutoModelForCausalLM.from_pretrained(folder).to(DEVICE).eval()
    return SimpleNamespace(model=model, tokenizer=AutoTokenizer.from_pretrained(folder),
                           provenance={"name": folder.name})


def _rollouts(world, out: Path) -> pd.DataFrame:
    return rollouts.sample_to_table(
        out, schemas.ROLLOUTS, ["P"], lambda name: _load(world.root / name), PROBLEMS,
        template=TEMPLATE, n_per_problem=4, temperatures=[0.0, 1.0], max_new_tokens=12, seed=3,
        batch_size=1, timeout_s=5.0, workers=1, manifest={"test": "sharding"},
        key={"test": "sharding", "device": DEVICE})


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
    assert len(a) == len(PROBLEMS) * 4
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


@pytest.mark.slow  # about a minute each on 2 CPU cores
def test_rollouts_two_processes_equal_one_and_survive_a_killed_rank(world, tmp_path, monkeypatch):
    # the single process last: on GPUs it initializes CUDA here, after which this
    # process can start no workers
    two = _rollouts(world, tmp_path / "two")
    assert storage.read_manifest(tmp_path / "two")["rows"] == len(two)

    flag = tmp_path / "killed.flag"
    with monkeypatch.context() as m:
        _kill_rank_1_at_its_second(m, rollouts, "generate_rollouts", flag)
        with pytest.raises(Exception):
            _rollouts(world, tmp_path / "killed")
    assert flag.exists(), "rank 1 was never killed"
    again = _rollouts(world, tmp_path / "killed")
    _same_rollouts(two, again)
    monkeypatch.setenv(distributed.PROCESSES_ENV, "1")
    _single(lambda: _rollouts(world, tmp_path / "one"))
    _same_rollouts(storage.read_table(tmp_path / "one"), two)


def _sequences(world, rollouts_df: pd.DataFrame) -> forcing.SequenceSet:
    return forcing.build_sequences(rollouts_df, PROBLEMS, world.tok, TEMPLATE, max_context=512,
                                   progress=False)


def _force(world, seqs, out: Path, workers: int):
    def load():
        return (forcing.Side("P", _load(world.root / "P").model),
                forcing.Side("Q", _load(world.root / "Q").model))

    folder = distributed.run_pair(seqs, ("P", "Q"), out, load, forwarded={}, workers=workers,
                                  batch_tokens=256, topk=3, key={"test": "sharding"},
                                  provenance={"test": "sharding"}, suite="t", device=DEVICE,
                                  compile=False)
    return storage.read_table(folder)


def _same_tokens(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a, b = (_in_order(x, ["rollout_id", "pos"]) for x in (a, b))
    assert len(a) == len(b) > 0
    exact = [c for c in a.columns if c not in METRICS and not c.startswith("topk_p")]
    pd.testing.assert_frame_equal(a[exact], b[exact])
    for c in METRICS:
        assert (a[c] - b[c]).abs().max() <= 1e-5, c
    for c in ("topk_p_ckpt", "topk_p_ref"):
        diff = max(abs(x - y) for u, v in zip(a[c], b[c]) for x, y in zip(u, v))
        assert diff <= 1e-5, c


@pytest.mark.slow  # about a minute each on 2 CPU cores
def test_token_table_two_processes_equal_one_and_survive_a_killed_rank(world, tmp_path,
                                                                      monkeypatch):
    seqs = _sequences(world, _rollouts(world, tmp_path / "rollouts"))
    assert len(seqs) == 16
    two = _force(world, seqs, tmp_path / "two", workers=2)  # 2 first: see the test above
    manifest = storage.read_manifest(tmp_path / "two")
    assert manifest["engine"]["processes"] == 2 and manifest["rows"] == len(two)

    flag = tmp_path / "killed.flag"
    with monkeypatch.context() as m:
        _kill_rank_1_at_its_second(m, storage.ShardedTable, "write_shard", flag)
        with pytest.raises(Exception):
            _force(world, seqs, tmp_path / "killed", workers=2)
    assert flag.exists(), "rank 1 was never killed"
    again = _force(world, seqs, tmp_path / "killed", workers=2)
    _same_tokens(two, again)
    monkeypatch.setenv(distributed.PROCESSES_ENV, "1")
    _single(lambda: _force(world, seqs, tmp_path / "one", workers=1))
    _same_tokens(storage.read_table(tmp_path / "one"), two)


def test_several_checkpoints_are_spread_over_the_workers(tmp_path, monkeypatch):
    """``forcing_plan.force_checkpoints``: the reference's cache made once, in the
    coordinator, for the checkpoints' common sequences; each checkpoint whose table is not
    complete forced exactly once, by one of the 2 workers; complete ones skipped. (The
    forcing itself is stubbed: the tests above cover it.)"""
    from rlprobe_nb import forcing_plan

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

"""discover and import_rollouts on a real TRL GRPO run (``byo_grpo``: two steps on CPU,
full weights and LoRA): the suite loads in the book, each checkpoint computes what TRL
saved, and the run's own completions are forced by checkpoint 1 against the reference."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from rlprobe_nb import import_rollouts
from rlprobe_nb.suite import discover, models, params

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                                reason="trl is not installed (the test extra pins it: make install)")


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(REPO / "tests" / "byo_grpo.py"), str(root)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.fixture
def env(tmp_path, monkeypatch):
    (tmp_path / "params" / "demo").mkdir(parents=True)
    shutil.copy2(REPO / "params" / "demo" / "suite.yaml", tmp_path / "params" / "demo")
    monkeypatch.setenv("RLPROBE_PARAMS", str(tmp_path / "params"))
    monkeypatch.setenv("RLPROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path / "out"))
    return tmp_path


def suite_of(grpo: Path, layout: str, name: str):
    args = discover.parse_args([str(grpo / layout), "--name", name, "--reference",
                                str(grpo / "init"), "--like", "demo"])
    discover.discover(args)
    return params.load(name, overrides={"runtime.device": "cpu"})


def logits(model, ids=torch.tensor([[1, 5, 9, 20, 33, 40]])):
    with torch.no_grad():
        return model(ids).logits


def test_full_weights_are_used_as_saved(grpo, env):
    from transformers import AutoModelForCausalLM

    P = suite_of(grpo, "full", "g_full")
    record = json.loads((env / "params" / "g_full" / "discovered.json").read_text())
    dumps = record["rollout_dumps"]
    assert [Path(p).name for p in dumps[next(k for k in dumps if k.startswith("completions"))]] \
        == ["completions_00001.parquet", "completions_00002.parquet"]
    assert P.checkpoints == ["rlvr_step_1", "rlvr_step_2"] and P.reference == "initial"
    for name, step in (("rlvr_step_1", 1), ("rlvr_step_2", 2)):
        saved = AutoModelForCausalLM.from_pretrained(grpo / "full" / f"checkpoint-{step}")
        assert torch.equal(logits(models.load_model(name, P).model), logits(saved))
    ref = logits(models.load_model("initial", P).model)
    assert not torch.equal(ref, logits(models.load_model("rlvr_step_2", P).model))  # it trained


def test_lora_adapters_load_over_the_reference(grpo, env):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    P = suite_of(grpo, "lora", "g_lora")
    spec = P.model_spec("rlvr_step_2")
    assert spec == {"kind": "peft", "base": "initial", "path": str(grpo / "lora" / "checkpoint-2")}
    base = AutoModelForCausalLM.from_pretrained(grpo / "init")
    merged = PeftModel.from_pretrained(base, grpo / "lora" / "checkpoint-2").merge_and_unload()
    torch.testing.assert_close(logits(models.load_model("rlvr_step_2", P).model), logits(merged))


def test_the_runs_own_completions_are_forced(grpo, env):
    """completions_00002 (checkpoint 1's own samples) -> rollouts -> checkpoint 1 vs the
    reference through the forcing engine, and the trainer's logged KL beside it."""
    from rlprobe_nb import forcing
    from rlprobe_nb.tables import storage

    P = suite_of(grpo, "full", "g_imp")
    dump = grpo / "full" / "completions" / "completions_00002.parquet"
    assert import_rollouts.main([str(dump), "--suite", "g_imp", "--model", "rlvr_step_1",
                                 "--temperature", "1.0"]) == 0
    folder = env / "out" / "data" / "g_imp" / "imported"
    rollouts = pd.read_parquet(folder / "rollouts_completions_00002.parquet")
    assert len(rollouts) == len(pd.read_parquet(dump)) and set(rollouts.token_method) == {"text"}
    assert rollouts.failure_type.eq("ungraded").all()  # TRL keeps no ground truth
    problems = pd.read_json(folder / "problems_completions_00002.jsonl", lines=True)
    ckpt, ref = models.load_model("rlvr_step_1", P), models.load_model("initial", P)
    seqs = forcing.build_sequences(rollouts, dict(zip(problems.unique_id, problems.problem)),
                                   ref.tokenizer, progress=False)
    tokens = storage.read_table(forcing.run_pair(
        seqs, forcing.Side("rlvr_step_1", ckpt.model, ckpt.tokenizer),
        forcing.Side("initial", ref.model, ref.tokenizer), env / "tokens", suite="g_imp",
        chunk_positions=64, topk=5, device="cpu", compile=False, progress=False,
        batch_tokens=512))
    assert len(tokens) == sum(len(r) for r in rollouts.response_ids)
    assert (tokens.kl_ckpt_ref > 0).all()
    # the trainer's KL at step 2 (computed from checkpoint 1's weights) beside the exact one
    from rlprobe_nb.divergence import trainer_kl

    log = trainer_kl.trl_log(grpo / "full")
    assert log.step.tolist() == [1, 2] and log.kl.iloc[0] == 0.0  # step 1: the reference itself
    row = trainer_kl.beside(log, tokens, 1, 1.0, "TRL").iloc[0]
    history = json.loads((grpo / "full" / "checkpoint-2" / "trainer_state.json").read_text())
    assert row.logged_kl == [h["kl"] for h in history["log_history"] if h["step"] == 2][0] > 0
    assert row.exact_kl_ckpt_ref == pytest.approx(tokens.kl_ckpt_ref.mean())
    assert "before update 2" in row.note and "KL(π‖ref)" in row.note
    assert "not comparable" in trainer_kl.beside(log, tokens, 1, 0.7, "TRL").iloc[0].note

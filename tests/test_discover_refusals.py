"""Every refusal of discover names the folder, what is missing or wrong, and the command to
run instead; each comes before any weights are read (the weight files here are not even
valid). The run folders are laid out by hand around a tiny reference model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlprobe_nb.suite import discover
from rlprobe_nb.suite.run_layouts import DiscoverError

REPO = Path(__file__).resolve().parents[1]
NOT_WEIGHTS = b"not a weights file: discover must refuse before reading it"


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlprobe_nb.demo.tiny import tiny_tokenizer

    folder = tmp_path_factory.mktemp("ref")
    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture
def env(tmp_path, monkeypatch):
    (tmp_path / "params" / "demo").mkdir(parents=True)
    shutil.copy2(REPO / "params" / "demo" / "suite.yaml", tmp_path / "params" / "demo")
    monkeypatch.setenv("RLPROBE_PARAMS", str(tmp_path / "params"))
    monkeypatch.setenv("RLPROBE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def refused(run: Path, ref: Path, *extra: str) -> str:
    args = discover.parse_args([str(run), "--name", "x", "--reference", str(ref), "--like",
                                "demo", *extra])
    with pytest.raises(DiscoverError) as info:
        discover.discover(args)
    assert not (run.parent / "params" / "x").exists()
    return str(info.value)


def verl_actor(run: Path, ref: Path, ranks=(0, 1), meta=None, lora=False) -> Path:
    actor = run / "global_step_3" / "actor"
    shutil.copytree(ref, actor / "huggingface", ignore=shutil.ignore_patterns("*.safetensors"))
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 2}))
    key = ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" if lora
           else "model.embed_tokens.weight")
    for r in ranks:
        torch.save({key: torch.zeros(2, 16)}, actor / f"model_world_size_2_rank_{r}.pt")
    if meta is not None:
        (actor / "lora_train_meta.json").write_text(json.dumps(meta))
    return actor


def test_a_missing_rank_file(env, ref):
    actor = verl_actor(env / "run", ref, ranks=(0,))
    msg = refused(env / "run", ref)
    assert str(actor) in msg and "model_world_size_2_rank_1.pt missing" in msg
    assert "--steps" in msg


def test_a_step_that_disagrees_with_its_folder(env, ref):
    ckpt = env / "run" / "checkpoint-300"
    shutil.copytree(ref, ckpt)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 298}))
    msg = refused(env / "run", ref)
    assert str(ckpt) in msg and "global_step 298" in msg and "the folder says 300" in msg
    assert "checkpoint-298" in msg and "--steps" in msg


def test_zero3_is_left_to_deepspeed(env, ref):
    tag = env / "run" / "_actor" / "global_step5"
    tag.mkdir(parents=True)
    (tag / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(NOT_WEIGHTS)
    (env / "run" / "_actor" / "latest").write_text("global_step5")
    msg = refused(env / "run", ref)
    assert str(tag) in msg and "ZeRO-3" in msg and "no mp_rank_00_model_states.pt" in msg
    assert f"python {env / 'run' / '_actor'}/zero_to_fp32.py" in msg and "--tag global_step5" in msg


def test_megatron_dist_ckpt_is_left_to_verl(env, ref):
    actor = env / "run" / "global_step_4" / "actor"
    (actor / "model" / "dist_ckpt").mkdir(parents=True)
    (actor / "ckpt_contents.json").write_text(json.dumps({"global_step": 4}))
    msg = refused(env / "run", ref)
    assert str(actor) in msg and "Megatron dist_ckpt only" in msg
    assert f"python -m verl.model_merger merge --backend megatron --local_dir {actor}" in msg


def test_a_checkpoint_with_another_chat_template(env, ref):
    ckpt = env / "run" / "checkpoint-1"
    shutil.copytree(ref, ckpt)
    (ckpt / "model.safetensors").write_bytes(NOT_WEIGHTS)
    (ckpt / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    msg = refused(env / "run", ref)
    assert str(ckpt) in msg and "chat templates differ" in msg
    assert "--tokenizer-from reference" in msg
    args = discover.parse_args([str(env / "run"), "--name", "x", "--reference", str(ref),
                                "--like", "demo", "--tokenizer-from", "reference", "--dry-run"])
    assert discover.discover(args)["plan"][0][1].refuse is None  # the reference's, as asked


def test_lora_shards_without_their_alpha(env, ref):
    actor = verl_actor(env / "run", ref, lora=True)
    msg = refused(env / "run", ref)
    assert str(actor) in msg and "no lora_train_meta.json" in msg and "--lora-alpha" in msg
    args = discover.parse_args([str(env / "run"), "--name", "x", "--reference", str(ref),
                                "--like", "demo", "--lora-alpha", "16", "--dry-run"])
    plan = discover.discover(args)["plan"]
    assert plan[0][1].extra["lora_alpha"] == 16.0


def test_another_architecture(env, ref):
    ckpt = env / "run" / "checkpoint-1"
    shutil.copytree(ref, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    (ckpt / "model.safetensors").write_bytes(NOT_WEIGHTS)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    msg = refused(env / "run", ref)
    assert str(ckpt / "config.json") in msg and "num_hidden_layers 3 vs 1" in msg


def test_an_unknown_layout_and_the_command_line(env, ref, capsys):
    (env / "run" / "weights").mkdir(parents=True)
    msg = refused(env / "run", ref)
    assert str(env / "run") in msg and "--framework folders" in msg
    assert discover.main([str(env / "run"), "--name", "x", "--reference", str(ref)]) == 2
    assert "no known layout" in capsys.readouterr().err


def test_a_suite_the_book_would_refuse_is_not_left_behind(env, ref):
    ckpt = env / "run" / "checkpoint-1"
    shutil.copytree(ref, ckpt)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    msg = refused(env / "run", ref, "--reference-name", "rlvr_step_1")
    assert str(env / "params" / "x") in msg and "is also a model" in msg
    assert not (env / "params" / "x").exists()


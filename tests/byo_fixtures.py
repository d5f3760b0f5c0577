"""Run folders of every trainer layout, built at test time, offline, on CPU, from a tiny
random Llama (hidden 32, 2 layers) and the tiny BPE tokenizer of ``rlprobe_nb.demo.tiny``.

Real sharded saves come from a 2-process gloo job (``byo_shards.py``: FSDP2 and FSDP1 shard
files, FSDP2 LoRA shards, torch distributed checkpoints); the layouts whose trainers cannot
be installed here (verl, OpenRLHF, open-instruct, NeMo-RL, and TRL, which is not a
dependency) are laid out by hand around them, with the file names those trainers write.
Every checkpoint keeps the exact weights it came from under ``truth/``, for bit-exact checks.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _tokenizer():
    from rlprobe_nb.demo.tiny import tiny_tokenizer

    return tiny_tokenizer()


def _reference(root: Path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tokenizer()
    vocab = len(tok) | 1  # odd: the embedding splits unevenly over 2 ranks
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(root / "ref")
    tok.save_pretrained(root / "ref")
    return model, tok


def _perturbed(model, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {k: (v + 0.01 * torch.randn(v.shape, generator=gen)).contiguous()
            for k, v in model.state_dict().items()}


def _lora_state(model) -> dict:
    from peft import LoraConfig, get_peft_model

    sys.path.insert(0, str(HERE))
    from byo_shards import LORA

    import copy
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(**LORA))
    gen = torch.Generator().manual_seed(7)
    state = peft_model.state_dict()
    return {k: (torch.randn(v.shape, generator=gen) * 0.1 if ".lora_" in k else v).contiguous()
            for k, v in state.items()}


def _hf(folder: Path, model, state: dict, tok) -> Path:
    model.load_state_dict(state)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shard_job(root: Path) -> None:
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    import os
    env = {**os.environ, **env}
    done = subprocess.run([sys.executable, str(HERE / "byo_shards.py"), str(root),
                           str(_free_port())], env=env, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the 2-rank shard job failed:\n{done.stderr[-3000:]}")


def _verl_actor(actor: Path, shards: Path, ref: Path, version, lora_meta=None) -> Path:
    (actor / "huggingface").mkdir(parents=True)
    for p in shards.glob("model_world_size_*"):
        shutil.copy2(p, actor / p.name)
    for name in ("config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja"):
        if (ref / name).is_file():
            shutil.copy2(ref / name, actor / "huggingface" / name)
    if version is not None:
        (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": version,
                                                           "world_size": 2}))
    if lora_meta is not None:
        (actor / "lora_train_meta.json").write_text(json.dumps(lora_meta))
    return actor


def _trainer_state(folder: Path, step: int) -> None:
    history = [{"step": s, "kl": 0.0 if s == 1 else 0.001 * s, "entropy": 1.2, "reward": 0.5}
               for s in range(1, step + 1)]
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step,
                                                          "log_history": history}))


def build(root: Path) -> dict:
    """Every layout under ``root``; returns the paths the tests use."""
    model, tok = _reference(root)
    truth = root / "truth"
    truth.mkdir()
    from safetensors.torch import save_file

    steps = {s: _perturbed(model, s) for s in (1, 2)}
    for s, state in steps.items():
        save_file(state, truth / f"step_{s}.safetensors")
    lora = _lora_state(model)
    save_file(lora, truth / "lora_full.safetensors")
    _shard_job(root)
    ref, shards = root / "ref", root / "shards"
    runs = root / "runs"
    # verl: FSDP2 (fsdp_config.json), FSDP1, legacy (no fsdp_config.json), LoRA
    _verl_actor(runs / "verl" / "global_step_1" / "actor", shards / "fsdp2", ref, 2)
    _verl_actor(runs / "verl_fsdp1" / "global_step_1" / "actor", shards / "fsdp1", ref, 1)
    _verl_actor(runs / "verl_legacy" / "global_step_1" / "actor", shards / "fsdp2", ref, None)
    _verl_actor(runs / "verl_lora" / "global_step_1" / "actor", shards / "lora", ref, 2,
                {"r": 4, "lora_alpha": 8, "task_type": "CAUSAL_LM"})
    # TRL: full weights at steps 1, 2 (+ an unfinished checkpoint-3), LoRA, FSDP-sharded (DCP)
    work = type(model)(model.config)
    for s in (1, 2):
        _trainer_state(_hf(runs / "trl" / f"checkpoint-{s}", work, steps[s], tok), s)
    _hf(runs / "trl" / "checkpoint-3", work, steps[2], tok)  # no trainer_state.json
    _trl_lora(runs / "trl_lora" / "checkpoint-1", model, lora)
    fsdp_ckpt = runs / "trl_fsdp" / "checkpoint-1"
    shutil.copytree(shards / "dcp", fsdp_ckpt / "pytorch_model_fsdp_0")
    _trainer_state(fsdp_ckpt, 1)
    # NeMo-RL: step_1 with a DCP {"model": sd}, its tokenizer, config naming the reference
    nemo = runs / "nemo" / "step_1"
    shutil.copytree(shards / "dcp", nemo / "policy" / "weights")
    tok.save_pretrained(nemo / "policy" / "tokenizer")
    (nemo / "training_info.json").write_text(json.dumps({"step": 1}))
    (nemo / "config.yaml").write_text(f"policy:\n  model_name: {ref}\n")
    (runs / "nemo" / "tmp_step_2").mkdir()
    # OpenRLHF: an HF copy at step 1, a ZeRO-2 state at step 2 (Actor's "model." prefix)
    _hf(runs / "openrlhf" / "global_step1_hf", work, steps[1], tok)
    ds = runs / "openrlhf" / "_actor" / "global_step2"
    ds.mkdir(parents=True)
    module = {f"model.{k}": v for k, v in steps[2].items()}
    from collections import OrderedDict  # the other keys DeepSpeed's engine saves beside it
    torch.save({"module": module, "buffer_names": [], "optimizer": None,
                "param_shapes": [OrderedDict((k, v.shape) for k, v in module.items())],
                "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None,
                "lr_scheduler": {"last_epoch": 2}, "sparse_tensor_module_names": set(),
                "skipped_steps": 0, "global_steps": 2, "global_samples": 16,
                "dp_world_size": 2, "mp_world_size": 1, "ds_config": {"zero_optimization":
                {"stage": 2}, "bf16": {"enabled": False}}, "ds_version": "0.19.8"},
               ds / "mp_rank_00_model_states.pt")
    (runs / "openrlhf" / "_actor" / "latest").write_text("global_step2")
    # open-instruct: step_1, step_2 finished, step_3 without its marker
    for s in (1, 2, 3):
        d = _hf(runs / "oi" / "run_checkpoints" / f"step_{s}", work, steps[min(s, 2)], tok)
        if s < 3:
            (d / ".checkpoint_complete").touch()
    return {"root": root, "ref": ref, "runs": runs, "truth": truth, "steps": steps, "lora": lora}


def _trl_lora(folder: Path, model, lora: dict) -> None:
    """A PEFT adapter folder as TRL saves one (adapter_model.safetensors + config)."""
    from peft import LoraConfig, get_peft_model

    sys.path.insert(0, str(HERE))
    from byo_shards import LORA

    import copy
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(**LORA))
    peft_model.load_state_dict(lora)
    peft_model.save_pretrained(folder)
    _trainer_state(folder, 1)

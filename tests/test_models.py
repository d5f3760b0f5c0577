"""The model registry: local folders, refusals, provenance, and a fast, clear failure for
hub models when the hub cannot be reached."""

import time

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from rlprobe_nb.suite import models, params, paths


@pytest.fixture(scope="module")
def demo_tokenizer():
    P = params.load("demo")
    return models.load_tokenizer(P.reference, P)


def write_suite(root, models, reference="ref"):
    folder = root / "params" / "mini"
    folder.mkdir(parents=True)
    (folder / "suite.yaml").write_text(yaml.safe_dump(
        {"suite": "mini", "reference": reference, "target": reference, "models": models}))


def test_local_model_loads_with_provenance(tmp_path, monkeypatch, demo_tokenizer):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(demo_tokenizer), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "m")
    demo_tokenizer.save_pretrained(tmp_path / "m")
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    write_suite(tmp_path, {"ref": {"kind": "local", "path": "m"}})
    P = params.load("mini", overrides={"runtime.device": "cpu"})
    lm = models.load_model("ref", P)
    assert lm.provenance["kind"] == "local" and lm.provenance["lm_head_rows"] == len(demo_tokenizer)
    assert lm.provenance["tokenizer"]["chat_template_sha256"] and lm.provenance["tokenizer"]["vocab_sha256"]
    assert not lm.model.training and lm.tokenizer.pad_token is not None


def test_hub_model_fails_fast_and_clearly_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    write_suite(tmp_path, {"ref": {"kind": "hub", "id": "allenai/Llama-3.1-Tulu-3-8B-DPO",
                                   "revision": "main"}})
    P = params.load("mini", overrides={"runtime.device": "cpu"})
    start = time.perf_counter()
    with pytest.raises(models.ModelLoadError, match=r"Llama-3.1-Tulu-3-8B-DPO.*kind: local"):
        models.load_model("ref", P)
    assert time.perf_counter() - start < 30


def test_missing_adapter_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    write_suite(tmp_path, {"ref": {"kind": "local", "path": "nowhere"}})
    P = params.load("mini", overrides={"runtime.device": "cpu"})
    with pytest.raises(models.ModelLoadError, match="has no config.json"):
        models.load_model("ref", P)


def test_different_tokenizers_are_refused(demo_tokenizer):
    import copy

    other = copy.deepcopy(demo_tokenizer)
    other.add_tokens(["<extra_token_for_test>"])
    with pytest.raises(ValueError, match=r"'dpo' and 'other' have different tokenizers: .*vocabularies differ"):
        models.check_same_tokenizer(demo_tokenizer, other, names=("dpo", "other"))
    models.check_same_tokenizer(demo_tokenizer, copy.deepcopy(demo_tokenizer))
    changed = copy.deepcopy(demo_tokenizer)
    changed.chat_template = "{{ messages }}"
    with pytest.raises(ValueError, match="chat templates differ"):
        models.check_same_tokenizer(demo_tokenizer, changed)

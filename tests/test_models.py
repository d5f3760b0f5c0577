"""The model registry: local folders, refusals, provenance, and a fast, clear failure for
hub models when the hub cannot be reached."""

import os
import shutil
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
    target = {"kind": "peft", "base": reference, "path": "adapter"}  # named, never loaded here
    (folder / "suite.yaml").write_text(yaml.safe_dump(
        {"suite": "mini", "reference": reference, "target": "target",
         "models": {**models, "target": target}}))


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


def _gguf_suite(tmp_path, monkeypatch):
    """A suite whose reference is a GGUF model, its converted copy in a private cache
    (weights linked from the real conversion, tokenizer and template copied)."""
    from rlprobe_nb.suite import gguf_cache

    real = gguf_cache.convert_gguf(gguf_cache.demo_gguf_path(), paths.cache_dir() / "models")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"stands for the GGUF file: its copy below is what loads")
    cache = tmp_path / "cache"
    copy = gguf_cache.cache_entry(gguf, cache / "models")
    copy.mkdir(parents=True)
    for f in real.iterdir():
        (copy / f.name).symlink_to(f) if f.suffix == ".safetensors" else shutil.copy(f, copy)
    monkeypatch.setenv("RLPROBE_CACHE", str(cache))
    suite = tmp_path / "params" / "g"
    suite.mkdir(parents=True)
    (suite / "suite.yaml").write_text(yaml.safe_dump({
        "suite": "g", "reference": "ref", "target": "other",
        "models": {"ref": {"kind": "gguf", "path": str(gguf)},
                   "other": {"kind": "local", "path": str(real)}}}))
    monkeypatch.setenv("RLPROBE_PARAMS", str(tmp_path / "params"))
    return copy


def test_a_gguf_models_identity_covers_its_tokenizer_and_chat_template(tmp_path, monkeypatch):
    """Issue 22 item 4: the converted copy's chat template is what the models load, so it
    is part of the model's identity (01 and 02 reused rollouts sampled with the old one)."""
    copy = _gguf_suite(tmp_path, monkeypatch)
    before = models.model_identity("ref", params.load("g"))
    assert {"chat_template.jinja", "tokenizer.json", "model.safetensors"} <= set(before["converted"])
    template = copy / "chat_template.jinja"
    template.write_text(template.read_text().replace("<|im_start|>", "<|im_start|> ", 1))
    # issue 44: a converted copy changed after its conversion is refused by name, not keyed
    from rlprobe_nb.suite import gguf_cache

    with pytest.raises(gguf_cache.ConversionCacheError, match=r"chat_template\.jinja"):
        models.model_identity("ref", params.load("g"))


def test_a_byte_flipped_in_place_with_its_stamp_kept_is_seen(tmp_path, monkeypatch):
    """Issue 22 item 7: the hash memo trusted (size, mtime, inode); a small file (an
    adapter, a problem file) is hashed each time a notebook asks."""
    from rlprobe_nb.tables import provenance

    monkeypatch.setenv("RLPROBE_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "adapter_model.safetensors"
    f.write_bytes(bytes(range(256)) * 64)
    before, st = provenance.sha256_file(f), f.stat()
    with open(f, "r+b") as h:  # in place: same inode, same size
        h.seek(100)
        h.write(b"\x00")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same time
    assert (f.stat().st_ino, f.stat().st_size, f.stat().st_mtime_ns) == \
        (st.st_ino, st.st_size, st.st_mtime_ns)
    assert provenance.sha256_file(f) != before

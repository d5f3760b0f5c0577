"""suite.compact_adapters: LoRA weights in 8 bits, decoded once into a cache PEFT reads."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlprobe_nb.suite import compact_adapters


def lora_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"layer.q_proj.lora_A.weight": torch.randn(8, 64, generator=g) * 0.03,
            "layer.q_proj.lora_B.weight": torch.randn(48, 8, generator=g) * 1e-3,
            "layer.v_proj.lora_B.weight": torch.zeros(16, 8)}


def test_round_trip_error_is_at_most_half_a_step_of_each_row():
    state = lora_state()
    decoded = compact_adapters.decode_tensors(compact_adapters.encode_tensors(state))
    for key, weight in state.items():
        step = weight.abs().amax(dim=1, keepdim=True) / 127
        err = (decoded[key] - weight).abs()
        # half an int8 step, plus float16's rounding of the absmax (2^-11 relative)
        assert (err <= step * (0.5 + 127 * 2.0 ** -11) + 1e-12).all(), key
    assert torch.equal(decoded["layer.v_proj.lora_B.weight"], torch.zeros(16, 8))


def test_absmax_is_float16_only_where_float16_holds_it_exactly_enough():
    tiny = {"a.lora_B.weight": torch.full((2, 8), 1e-6)}  # below float16's normal range
    enc = compact_adapters.encode_tensors({**lora_state(), **tiny})
    assert enc["layer.q_proj.lora_A.weight.absmax"].dtype == torch.float16
    assert enc["a.lora_B.weight.absmax"].dtype == torch.float32
    dec = compact_adapters.decode_tensors(enc)
    assert torch.allclose(dec["a.lora_B.weight"], tiny["a.lora_B.weight"], rtol=1e-6)


def test_only_matrices_are_encoded():
    with pytest.raises(compact_adapters.CompactAdapterError, match="only matrices"):
        compact_adapters.encode_tensors({"bias": torch.zeros(4)})


def peft_folder(path, state):
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    save_file(state, str(path / "adapter_model.safetensors"))
    return path


def test_folder_encodes_with_its_source_checksum_and_decodes_once(tmp_path):
    from rlprobe_nb.tables.provenance import sha256_file

    src = peft_folder(tmp_path / "src", lora_state())
    dest = compact_adapters.encode_folder(src, tmp_path / "compact", texts={"note.json": "{}"})
    assert sorted(p.name for p in dest.iterdir()) == ["adapter_config.json", "adapter_int8.safetensors",
                                                      "note.json"]
    meta = compact_adapters.metadata(dest)
    assert meta["source_sha256"] == sha256_file(src / "adapter_model.safetensors")
    assert (dest / "adapter_int8.safetensors").stat().st_size < 0.6 * (src / "adapter_model.safetensors").stat().st_size
    cache = tmp_path / "cache"
    first = compact_adapters.loadable(dest, cache)
    assert first != dest and (first / "adapter_model.safetensors").is_file()
    stamp = (first / "adapter_model.safetensors").stat().st_mtime_ns
    assert compact_adapters.loadable(dest, cache) == first  # reused, not decoded again
    assert (first / "adapter_model.safetensors").stat().st_mtime_ns == stamp
    decoded = load_file(str(first / "adapter_model.safetensors"))
    for key, weight in lora_state().items():
        assert torch.allclose(decoded[key], weight, atol=float(weight.abs().max()) / 200 + 1e-12)
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []  # nothing half-written
    assert compact_adapters.loadable(src, cache) == src  # a PEFT folder is used as it is


def test_changed_compact_bytes_decode_into_another_cache_folder(tmp_path):
    src = peft_folder(tmp_path / "src", lora_state())
    a = compact_adapters.encode_folder(src, tmp_path / "a")
    first = compact_adapters.loadable(a, tmp_path / "cache")
    (src / "adapter_model.safetensors").unlink()
    save_file(lora_state(seed=1), str(src / "adapter_model.safetensors"))
    compact_adapters.encode_folder(src, a)  # replaced in place
    assert compact_adapters.loadable(a, tmp_path / "cache") != first


def test_a_folder_that_is_not_an_adapter_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(compact_adapters.CompactAdapterError, match="not a PEFT adapter"):
        compact_adapters.encode_folder(tmp_path / "empty", tmp_path / "out")


def _flip_byte(path, at=-100):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_byte_flipped_in_the_decoded_cache_is_refused_by_name(tmp_path):
    """Issue 44 item 1: one flipped byte under .cache/adapters/ went unseen (03 recomputed
    its table from the damaged weights and wrote it under the same key)."""
    src = peft_folder(tmp_path / "src", lora_state())
    compact = compact_adapters.encode_folder(src, tmp_path / "compact")
    decoded = compact_adapters.loadable(compact, tmp_path / "cache")
    good = (decoded / "adapter_model.safetensors").read_bytes()
    _flip_byte(decoded / "adapter_model.safetensors")
    with pytest.raises(compact_adapters.CompactAdapterError,
                       match=r"adapter_model\.safetensors does not match.*delete"):
        compact_adapters.loadable(compact, tmp_path / "cache")
    (decoded / "adapter_model.safetensors").write_bytes(good)
    assert compact_adapters.loadable(compact, tmp_path / "cache") == decoded
    (decoded / "adapter_config.json").write_text("{}")  # the config is checked too
    with pytest.raises(compact_adapters.CompactAdapterError, match="adapter_config.json"):
        compact_adapters.loadable(compact, tmp_path / "cache")


def test_a_decoded_cache_of_an_older_version_is_decoded_again(tmp_path):
    src = peft_folder(tmp_path / "src", lora_state())
    compact = compact_adapters.encode_folder(src, tmp_path / "compact")
    decoded = compact_adapters.loadable(compact, tmp_path / "cache")
    good = {k: v.clone() for k, v in load_file(str(decoded / "adapter_model.safetensors")).items()}
    record = json.loads((decoded / "decoded_from.json").read_text())
    del record["written"]  # what an older version wrote: nothing to check it against
    (decoded / "decoded_from.json").write_text(json.dumps(record))
    _flip_byte(decoded / "adapter_model.safetensors")
    damaged = load_file(str(decoded / "adapter_model.safetensors"))
    assert any(not torch.equal(damaged[k], good[k]) for k in good), "the flip reached a weight"
    assert compact_adapters.loadable(compact, tmp_path / "cache") == decoded
    # the weights decoded again (not the file's bytes: safetensors writes its metadata's
    # keys in no fixed order, so two writes of the same tensors may differ in the header)
    again = load_file(str(decoded / "adapter_model.safetensors"))
    assert again.keys() == good.keys() and all(torch.equal(again[k], good[k]) for k in good)
    assert "written" in json.loads((decoded / "decoded_from.json").read_text())

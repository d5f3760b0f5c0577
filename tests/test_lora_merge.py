"""suite.lora_merge: a plain LoRA adapter merged without PEFT gives PEFT's merged weights
exactly; anything else is left to PEFT, with the model untouched."""

import copy
import json
import shutil

import pytest
import torch

from rlprobe_nb.suite import compact_adapters, lora_merge, paths
from tiny_models import tiny_llama

SHIPPED = paths.shipped_dir("demo") / "adapters"


@pytest.fixture(scope="module")
def tiny_and_adapter(tmp_path_factory):
    """A tiny Llama and a random (non-zero) LoRA adapter over it, saved by PEFT."""
    from peft import LoraConfig, get_peft_model

    model, _ = tiny_llama()
    torch.manual_seed(1)
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.05)
    folder = tmp_path_factory.mktemp("adapter")
    peft_model.save_pretrained(folder)
    return model, folder


def peft_merged(model, folder):
    from peft import PeftModel

    return PeftModel.from_pretrained(copy.deepcopy(model), str(folder)).merge_and_unload()


def test_a_plain_lora_merges_to_pefts_weights_exactly(tiny_and_adapter):
    model, folder = tiny_and_adapter
    want = peft_merged(model, folder).state_dict()
    mine = copy.deepcopy(model)
    assert lora_merge.merge(mine, folder)
    got = mine.state_dict()
    assert set(got) == set(want)
    changed = [k for k in got if not torch.equal(got[k], model.state_dict()[k])]
    assert changed and all("q_proj" in k or "v_proj" in k or "down_proj" in k for k in changed)
    for key in got:
        assert torch.equal(got[key], want[key]), key


def test_the_demo_adapters_merge_as_peft_merges_them():
    from rlprobe_nb.suite import gguf_cache

    base, _ = gguf_cache.demo_model()
    folder = compact_adapters.loadable(SHIPPED / "rlvr_step_1200", paths.cache_dir() / "adapters")
    want = peft_merged(base, folder).state_dict()
    assert lora_merge.merge(base, folder)
    got = base.state_dict()
    worst = max(float((got[k] - want[k]).abs().max()) for k in got)
    assert worst == 0.0, worst


@pytest.mark.parametrize("change", [{"use_dora": True}, {"use_rslora": True},
                                    {"rank_pattern": {"q_proj": 2}}, {"fan_in_fan_out": True},
                                    {"modules_to_save": ["lm_head"]}, {"peft_type": "IA3"}])
def test_anything_but_a_plain_lora_is_left_to_peft(tiny_and_adapter, tmp_path, change):
    model, folder = tiny_and_adapter
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**config, **change}))
    mine = copy.deepcopy(model)
    assert not lora_merge.merge(mine, other)
    assert all(torch.equal(a, b) for a, b in zip(mine.state_dict().values(),
                                                 model.state_dict().values()))

"""Issue #3, acceptance 2: the shipped rlvr_step_1200 loads on CPU, offline, in seconds,
through the suite registry as the notebooks load it; its next-token distributions differ
from the base model's; a second load gives identical logits."""


import pytest
import torch

from rlprobe_nb.problems import arithmetic
from rlprobe_nb.suite import models, params, paths, prompting

ADAPTER = paths.shipped_dir("demo") / "adapters" / "rlvr_step_1200"


@pytest.fixture(scope="module")
def demo():
    P = params.load("demo", overrides={"runtime.device": "cpu", "runtime.dtype": "float32"})
    models.load_tokenizer(P.reference, P)  # converting the GGUF (once per cache) is set-up
    return P


def sample_batch(tok):
    problems = arithmetic.generate_problems("test", 3, seed=0)
    ids = [prompting.prompt_ids(tok, p["problem"]) for p in problems]
    width = min(len(i) for i in ids)
    return torch.tensor([i[:width] for i in ids])  # equal lengths: no padding to reason about


def logits(lm, ids):
    with torch.no_grad():
        return lm.model(ids).logits


def test_adapter_files_are_shipped():
    assert (ADAPTER / "adapter_config.json").is_file()
    assert (ADAPTER / "adapter_model.safetensors").is_file()
    total = sum(f.stat().st_size for f in ADAPTER.parent.rglob("*") if f.is_file())
    assert total < 40 * 2**20, f"shipped adapters take {total / 2**20:.1f} MiB"


def test_checkpoint_loads_offline_and_differs_from_base(demo, monkeypatch):
    from rlprobe_nb.suite import gguf_cache

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")

    def no_dequantizing(*a, **k):  # the slow path (~15 s): the converted cache must serve
        raise AssertionError("the GGUF was dequantized again instead of read from the cache")

    monkeypatch.setattr(gguf_cache, "load_gguf", no_dequantizing)
    ckpt = models.load_model("rlvr_step_1200", demo)
    assert ckpt.provenance["adapter_sha256"] and ckpt.provenance["base"]["gguf_sha256"]
    base = models.load_model("dpo", demo)
    ids = sample_batch(ckpt.tokenizer)
    logp = torch.log_softmax(logits(ckpt, ids).double(), -1)
    logq = torch.log_softmax(logits(base, ids).double(), -1)
    kl = (logp.exp() * (logp - logq)).sum(-1)  # KL(ckpt || base) per position, float64, nats
    assert torch.isfinite(kl).all() and (kl > -1e-12).all()
    assert kl.max() > 1e-2, f"adapter barely changes the model: max KL {kl.max():.2e}"
    # The first answer token is where GRPO moved the model most (it learned to box).
    assert kl[:, -1].mean() > 1e-2

    again = models.load_model("rlvr_step_1200", demo)
    assert torch.equal(logits(again, ids), logits(ckpt, ids))

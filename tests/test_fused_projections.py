"""Fused q/k/v and gate/up projections: the same logits as the model's own modules, the
weights unchanged in value and shared (no copy), everything restored after the block."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlprobe_nb.generation import fused_projections


def _model(bias: bool = False):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attention_bias=bias,
                      mlp_bias=bias)
    return LlamaForCausalLM(cfg).double().eval()


def test_fused_logits_equal_the_modules_own():
    for bias in (False, True):
        model = _model(bias)
        ids = torch.randint(0, 300, (3, 11), generator=torch.Generator().manual_seed(1))
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            plain = model(ids).logits
            with fused_projections.fused(model) as groups:
                assert groups == 2 * 2  # (q, k, v) and (gate, up) in each of 2 layers
                joined = model(ids).logits
            after = model(ids).logits
        torch.testing.assert_close(joined, plain, rtol=0, atol=1e-12)
        torch.testing.assert_close(after, plain, rtol=0, atol=1e-12)
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k]), k
        attn = model.model.layers[0].self_attn
        assert "forward" not in attn.q_proj.__dict__  # the modules' own forward again
        shared = attn.q_proj.weight.untyped_storage().data_ptr()
        assert attn.k_proj.weight.untyped_storage().data_ptr() == shared  # one tensor, views


def test_weights_moved_after_fusing_are_joined_again():
    model = _model()
    ids = torch.randint(0, 300, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), fused_projections.fused(model):
        model(ids)
    model.float()  # new parameter tensors: the old joined ones are stale
    with torch.no_grad():
        plain = model(ids).logits
        with fused_projections.fused(model):
            joined = model(ids).logits
    torch.testing.assert_close(joined, plain, rtol=0, atol=1e-5)


def test_a_wrapped_forward_leaves_the_model_unfused():
    model = _model()
    proj = model.model.layers[1].mlp.up_proj
    proj.forward = proj.forward  # what accelerate's hooks do: an instance-level forward
    with fused_projections.fused(model) as groups:
        assert groups == 0

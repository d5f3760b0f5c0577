"""A tiny random model for tests that need a real transformers model but not the demo's."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlprobe_nb.suite import models, params


def tiny_llama():
    """(model, tokenizer): a 2-layer random Llama (seed 0) with the demo suite's tokenizer."""
    P = params.load("demo")
    tok = models.load_tokenizer(P.reference, P)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg).eval(), tok

"""What the GPU benchmarks force and sample, with no downloads: random-weight Llama models
(Llama-3.1-8B's shape, or a tiny shape for CPU dry runs) and random token sequences."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlprobe_nb import forcing  # noqa: E402


def llama_8b_config(**overrides):
    """Llama-3.1-8B's shape (rope scaling left out: it changes no cost)."""
    from transformers import LlamaConfig
    return LlamaConfig(**{**dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                 num_hidden_layers=32, num_attention_heads=32,
                                 num_key_value_heads=8, max_position_embeddings=8192,
                                 rope_theta=500000.0, tie_word_embeddings=False), **overrides})


def tiny_config(**overrides):
    """Two layers of width 64 over 1,000 tokens: a dry run's model."""
    from transformers import LlamaConfig
    return LlamaConfig(**{**dict(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=2048),
                          **overrides})


def build_model(cfg, seed: int, device, dtype, attention: str | None = None):
    """A LlamaForCausalLM of ``cfg`` initialised from ``seed`` directly on ``device``."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    if attention:
        model.config._attn_implementation = attention
    return model.to(device=device, dtype=dtype).eval()


def make_sequences(n: int, prompt_len: int, response_len: int, vocab: int, seed: int):
    """``n`` random sequences of ``prompt_len`` + ``response_len`` token ids."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(n):
        ids = torch.randint(0, vocab, (prompt_len + response_len,), generator=g).tolist()
        seqs.append(forcing.make_sequence(f"r{i:04d}", f"p{i:04d}", ids[:prompt_len],
                                          ids[prompt_len:]))
    ident = {"size": vocab, "vocab_sha256": "random-benchmark-vocabulary"}
    return forcing.SequenceSet(seqs, tokenizer=ident)

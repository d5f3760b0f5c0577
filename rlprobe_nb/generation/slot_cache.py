"""The decode loop's view of a model's attention: per-slot key/value buffers that HF
attention layers write through (``SlotCache``, duck-typing the one ``Cache`` method they
call), and the attention function the loop registers with HF's ``AttentionInterface``
(``slot_attention``): at decode time the query heads that share a key/value head attend
together, so the buffers are read once and never copied per head; a prompt attends
causally to itself."""

from __future__ import annotations

import torch


def slot_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0,
                   scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention in HF's ``AttentionInterface`` form. Decode (one query per slot): the
    query heads of each key/value head attend together under the slots' mask. Prefill
    (one prompt): causal over the prompt itself."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    batch, heads, length, dim = query.shape
    groups = heads // key.shape[1]
    if length == 1:
        packed = query.reshape(batch, key.shape[1], groups, dim)
        out = sdpa(packed, key, value, attn_mask=attention_mask, scale=scaling)
        out = out.reshape(batch, heads, 1, dim)
    else:
        out = sdpa(query, key, value, is_causal=True, scale=scaling, enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


class SlotCache:
    """Per-slot key/value buffers, duck-typing the part of HF's ``Cache`` that attention
    layers call. Decode: each slot's new key and value go to its own position and the
    layer attends over the first ``span`` positions of every slot. Prefill: one prompt's
    keys and values go to positions [0, n) of one slot and the layer attends over them."""

    def __init__(self, layers: int, slots: int, kv_heads: int, length: int, head_dim: int,
                 dtype, device):
        shape = (slots, kv_heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.rows = torch.arange(slots, device=device)
        self.prefill_slot: int | None = None
        self.positions: torch.Tensor | None = None
        self.span = length

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if isinstance(self.prefill_slot, torch.Tensor):  # a captured prefill: slot on device
            n = key.shape[2]
            k[:, :, :n].index_copy_(0, self.prefill_slot, key)
            v[:, :, :n].index_copy_(0, self.prefill_slot, value)
            return key, value
        if self.prefill_slot is not None:
            n = key.shape[2]
            k[self.prefill_slot, :, :n] = key[0]
            v[self.prefill_slot, :, :n] = value[0]
            return key, value
        k[self.rows, :, self.positions] = key[:, :, 0]
        v[self.rows, :, self.positions] = value[:, :, 0]
        return k[:, :, :self.span], v[:, :, :self.span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # never needed: every call passes its position ids

    def copy_slot(self, src: int, dst: list[int], n: int) -> None:
        for buf in self.keys + self.values:
            buf[dst, :, :n] = buf[src, :, :n]

    def select(self, keep: torch.Tensor) -> None:
        """Keep the slots ``keep``, one buffer at a time (so the old and the new copy of
        only one layer's buffer are in memory together)."""
        for bufs in (self.keys, self.values):
            for i, buf in enumerate(bufs):
                bufs[i] = buf[keep]
        self.rows = torch.arange(len(keep), device=keep.device)

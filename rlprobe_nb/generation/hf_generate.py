"""Decoding through HF ``generate`` for models the slot loop does not serve (see
``decoding``): the same seeded draws (``sampling.SeededLogitsProcessor``), in left-padded
batches of ``size`` requests, cut after EOS, where ``finish`` ends a sequence (as the slot
loop cuts it: a draw depends on its seed and step alone, so the tokens up to the cut are
the same), or at each request's token budget."""

from __future__ import annotations

from collections import deque
from typing import Sequence

import torch

from rlprobe_nb.generation import sampling


def hf_generate(model, queue: deque, size: int, eos: Sequence[int], pad: int | None,
                 results: dict, on_result, finish=None) -> None:
    """HF ``generate`` with the seeded draws, ``size`` requests at a time (left-padded)."""
    from torch.nn.utils.rnn import pad_sequence
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    pad = eos[0] if pad is None else pad
    stop = set(eos)
    items = list(queue)
    for start in range(0, len(items), size):
        batch = items[start:start + size]
        prompts = [torch.tensor(r.prompt[::-1]) for _, r in batch]  # left padding, by flipping
        ids = pad_sequence(prompts, batch_first=True, padding_value=pad).flip(1)
        mask = pad_sequence([torch.ones_like(p) for p in prompts], batch_first=True).flip(1)
        budget = max(r.max_new_tokens for _, r in batch)
        config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=budget,
                                  eos_token_id=list(eos), pad_token_id=pad, bos_token_id=None)
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             generation_config=config, logits_processor=[
                                 sampling.SeededLogitsProcessor(
                                     [r.temperature for _, r in batch], [r.seed for _, r in batch])])
        for (who, req), row in zip(batch, out[:, ids.shape[1]:].tolist()):
            results[who] = _cut(row, stop, finish, req.max_new_tokens)
            on_result()


def _cut(row: list[int], stop: set, finish, max_new_tokens: int) -> tuple[list[int], str]:
    from rlprobe_nb.generation.decoding import finish_reason

    for k, token in enumerate(row[:max_new_tokens]):
        why = finish_reason(row[:k + 1], token, stop, finish, max_new_tokens)
        if why is not None:
            return row[:k + 1], why
    return row[:max_new_tokens], "length"

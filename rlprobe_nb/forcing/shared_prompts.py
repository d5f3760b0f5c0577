"""The forward of a batch whose sequences share prompts: each prompt once, then the
responses against its keys and values.

A problem's rollouts are forced with the same prompt (the chat template, a system prompt
and the question: on the demo suite 60-75 tokens, longer than the 40-token responses),
so forwarding every sequence whole computes each prompt once per rollout. Here each
distinct prompt of the batch is forwarded once (right-padded, so each one's own positions
see nothing of another's), its keys and values are repeated for every rollout that
shares it, and the responses are forwarded against them (their position ids continue the
prompt's; the attention mask hides the padding between a shorter prompt and its
response). The row that predicts the first response token comes from the prompt's last
position, the others from the response's positions, in the order ``batch_inputs``'
``rows`` lists them.

The hidden states equal those of the whole-sequence forward up to float rounding (the
same products in other shapes): float32 within ~1e-5 on the demo model
(``tests/test_forcing_shared_prompts.py``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from rlprobe_nb.forcing.body import decoder_of
from rlprobe_nb.forcing.sequences import ForcedSequence


def prompt_groups(members: Sequence[ForcedSequence]) -> tuple[list[tuple[int, ...]], list[int]]:
    """The distinct prompts of a batch (in order of first use) and each member's index
    among them."""
    prompts: dict[tuple[int, ...], int] = {}
    index = []
    for s in members:
        prompt = tuple(s.input_ids[:s.prompt_len])
        index.append(prompts.setdefault(prompt, len(prompts)))
    return list(prompts), index


def shares_prompts(members: Sequence[ForcedSequence]) -> bool:
    """Whether any prompt of the batch is forced more than once."""
    return len(prompt_groups(members)[0]) < len(members)


def _padded(rows: list[list[int]], device, pad_id: int):
    tensors = [torch.tensor(r, dtype=torch.long) for r in rows]
    ids = pad_sequence(tensors, batch_first=True, padding_value=pad_id)
    mask = pad_sequence([torch.ones_like(t) for t in tensors], batch_first=True)
    return ids.to(device), mask.to(device)


def _repeated_cache(cache, index: torch.Tensor):
    """A new DynamicCache holding, per layer, the rows ``index`` of ``cache``."""
    from transformers import DynamicCache

    if hasattr(cache, "layers"):
        layers = [(layer.keys.index_select(0, index), layer.values.index_select(0, index))
                  for layer in cache.layers]
    else:  # a legacy tuple cache
        layers = [(k.index_select(0, index), v.index_select(0, index)) for k, v in cache]
    return DynamicCache(layers)


def _cache_keyword(body) -> str:
    """The forward's cache argument: ``cache`` in recent transformers, else the older name."""
    import inspect

    return "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"


def _cache_of(output):
    return output["cache"] if "cache" in output.keys() else output["past_key_values"]


def forward_shared(model, members: Sequence[ForcedSequence], device, pad_id: int = 0
                   ) -> torch.Tensor:
    """Final normed hidden states [n_rows, hidden] of the rows that predict the members'
    response tokens (``batch_inputs``' order), each distinct prompt forwarded once."""
    body = decoder_of(model)
    prompts, which = prompt_groups(members)
    index = torch.tensor(which, dtype=torch.long, device=device)
    lengths = [len(p) for p in prompts]
    with torch.inference_mode():
        ids, mask = _padded([list(p) for p in prompts], device, pad_id)
        first = body(input_ids=ids, attention_mask=mask if min(lengths) < ids.shape[1] else None,
                     use_cache=True)
        last = first.last_hidden_state[torch.arange(len(prompts), device=device),
                                       torch.tensor(lengths, device=device) - 1]
        responses = [s.response_ids[:-1] for s in members]  # the last token predicts nothing
        if not any(responses):
            return last.index_select(0, index)
        r_ids, r_mask = _padded([list(r) or [pad_id] for r in responses], device, pad_id)
        for b, r in enumerate(responses):
            if not r:
                r_mask[b] = 0
        width = r_ids.shape[1]
        starts = torch.tensor([lengths[w] for w in which], device=device)
        positions = starts[:, None] + torch.arange(width, device=device)[None, :]
        attention = torch.cat([mask.index_select(0, index), r_mask], dim=1)
        second = body(input_ids=r_ids, attention_mask=attention, position_ids=positions,
                      use_cache=True, **{_cache_keyword(body): _repeated_cache(_cache_of(first), index)})
    hidden = second.last_hidden_state
    rows = []
    for b, r in enumerate(responses):
        rows.append(last[which[b]:which[b] + 1])
        rows.append(hidden[b, :len(r)])
    return torch.cat(rows)

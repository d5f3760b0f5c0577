"""Length-bucketed batches of forced sequences and their padded device inputs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from rlprobe_nb.forcing.sequences import ForcedSequence, SequenceSet


@dataclass
class Batch:
    index: int
    members: list[int]  # indices into the sequences given to plan_batches
    width: int  # padded input length
    key: str = ""  # names the batch by its content: the same sequences, the same key

    @staticmethod
    def content_key(members: Sequence[ForcedSequence]) -> str:
        blob = json.dumps([s.content_hash() for s in members])
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


def plan_batches(seqs: SequenceSet | Sequence[ForcedSequence], batch_tokens: int,
                 max_sequences: int | None = None) -> list[Batch]:
    """Batches of at most ``batch_tokens`` padded input tokens (a longer sequence goes
    alone) and at most ``max_sequences`` sequences. The rollouts of one prompt are kept
    together, so that a batch forwards each prompt once (``shared_prompts``); prompts go
    by their longest rollout, longest first (an out-of-memory shows at once), and within
    a prompt by length. Deterministic: ties broken by rollout id."""
    items = seqs.sequences if isinstance(seqs, SequenceSet) else list(seqs)
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
    lengths = [len(s.input_ids) - 1 for s in items]  # the last token predicts nothing
    prompts = [tuple(s.input_ids[:s.prompt_len]) for s in items]
    longest: dict[tuple, int] = {}
    for p, n in zip(prompts, lengths):
        longest[p] = max(longest.get(p, 0), n)
    order = sorted(range(len(items)), key=lambda i: (-longest[prompts[i]], prompts[i],
                                                     -lengths[i], items[i].rollout_id))
    groups, current, width = [], [], 0
    for i in order:
        w = max(width, lengths[i])
        full = max_sequences is not None and len(current) >= max_sequences
        if current and (w * (len(current) + 1) > batch_tokens or full):
            groups.append((current, width))
            current, w = [], lengths[i]
        current.append(i)
        width = w
    if current:
        groups.append((current, width))
    return [Batch(k, members, width, Batch.content_key([items[i] for i in members]))
            for k, (members, width) in enumerate(groups)]


def batch_inputs(members: Sequence[ForcedSequence], width: int, device, pad_id: int = 0):
    """Right-padded input ids, attention mask (None when nothing is padded), the flat
    indices of the rows that predict response tokens, and those tokens."""
    inputs = [torch.tensor(s.input_ids[:-1], dtype=torch.long) for s in members]
    ids = pad_sequence(inputs, batch_first=True, padding_value=pad_id)
    mask = pad_sequence([torch.ones_like(t) for t in inputs], batch_first=True)
    if ids.shape[1] != width:
        raise RuntimeError(f"internal: batch width {ids.shape[1]} != planned {width}")
    rows = torch.cat([torch.arange(s.prompt_len - 1, len(t)) + b * width
                      for b, (s, t) in enumerate(zip(members, inputs))])
    targets = torch.tensor([t for s in members for t in s.response_ids], dtype=torch.long)
    padded = bool((mask == 0).any())
    dev = torch.device(device)
    pin = dev.type == "cuda"

    def move(t):
        return (t.pin_memory() if pin else t).to(dev, non_blocking=pin)

    return move(ids), move(mask) if padded else None, move(rows), move(targets)

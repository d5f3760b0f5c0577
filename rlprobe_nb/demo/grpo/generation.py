"""Generating completions: left-padded prompt batches and pure sampling (or greedy
decoding) that cuts each completion at its first EOS."""

from __future__ import annotations

import torch


def left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[list[int]], max_new_tokens: int,
             temperature: float | None, device: str, batch_size: int = 1024):
    """Completions (token ids up to and including the first EOS) and whether EOS came.

    temperature None or 0 means greedy. Sampling is pure (top_k=0, top_p=1) so the sampler
    is exactly the model's distribution at that temperature.
    """
    eos = tokenizer.eos_token_id
    out_tokens, stopped = [], []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        ids, mask = left_pad(chunk, tokenizer.pad_token_id, device)
        kw = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=eos)
        if temperature:
            kw.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        seq = model.generate(input_ids=ids, attention_mask=mask, **kw)
        for row in seq[:, ids.shape[1]:].tolist():
            if eos in row:
                cut = row.index(eos) + 1
                out_tokens.append(row[:cut])
                stopped.append(True)
            else:
                out_tokens.append(row)
                stopped.append(False)
    return out_tokens, stopped

"""Per-token log-probabilities of completions under a model: prompts and completions
padded into one batch whose positions match generation, scored with an fp32 log-softmax."""

from __future__ import annotations

import torch

from rlprobe_nb.demo.grpo.generation import left_pad


def autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)

def batch_tensors(prompts, completions, pad_id, device):
    """Left-padded prompts + right-padded completions, with masks and position ids that
    match what generate() used (positions count only real tokens)."""
    p_ids, p_mask = left_pad(prompts, pad_id, device)
    width = max(len(c) for c in completions)
    c_ids = torch.full((len(completions), width), pad_id, dtype=torch.long)
    c_mask = torch.zeros((len(completions), width), dtype=torch.long)
    for i, c in enumerate(completions):
        c_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        c_mask[i, :len(c)] = 1
    c_ids, c_mask = c_ids.to(device), c_mask.to(device)
    ids = torch.cat([p_ids, c_ids], dim=1)
    mask = torch.cat([p_mask, c_mask], dim=1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos, c_ids, c_mask


def completion_logprobs(model, ids, mask, pos, c_ids, device) -> torch.Tensor:
    """log p(completion token k) for each row, fp32 log-softmax; [batch, completion_len]."""
    width = c_ids.shape[1]
    with autocast(device):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                       logits_to_keep=width + 1).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, c_ids.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def chunked_logprobs(model, prompts, completions, pad_id, device, chunk: int) -> list[torch.Tensor]:
    out = []
    for s in range(0, len(prompts), chunk):
        ids, mask, pos, c_ids, c_mask = batch_tensors(prompts[s:s + chunk],
                                                      completions[s:s + chunk], pad_id, device)
        lp = completion_logprobs(model, ids, mask, pos, c_ids, device)
        out.extend(lp[i, :len(c)].cpu() for i, c in enumerate(completions[s:s + chunk]))
    return out

"""Seeded continuations of ``prompt + response[:k]`` (optionally with one token swapped in).

A *context* is the chat prompt of a problem followed by the first k tokens of a response,
possibly with its (k+1)-th token replaced by another one (a branch). A model writes
``n`` continuations of each context; the response graded afterwards is the context's
response part followed by the continuation, decoded together.

Reproducibility. Continuation ``s`` of a context has its own random stream, seeded with
``statistics.seed_from("continuation", seed, model, rollout_id, k, substituted, s)``, and
each row of a batch draws its tokens from its own stream on the CPU
(``rollouts.PerRowSampler``), at the context's temperature. So a continuation does not
depend on which other continuations share its batch, on the batch size or on the number of
devices: only floating-point differences between batch shapes remain, which could flip a
draw that falls exactly on a boundary between two tokens (see ``rollouts``).

Cost. The expensive part of counterfactuals is generation: every context costs ``n``
continuations of up to ``max_new_tokens - k`` tokens. All continuations of one context
share its prompt, so with ``share_prefix`` each distinct context of a batch is forwarded
once (prefill), its key/value cache is copied to its ``n`` rows, and only the new tokens
are decoded row by row. A continuation stops at EOS or when the response reaches
``max_new_tokens`` tokens in all (the rollouts' limit, counted from the response's first
token, so a continuation after k tokens adds at most ``max_new_tokens - k``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from rlprobe_nb.generation.rollouts import PerRowSampler, eos_ids
from rlprobe_nb.progress import tqdm
from rlprobe_nb.statistics import seed_from


def _cache_keyword() -> str:
    """Where ``generate`` takes a cache and outputs carry it: ``cache`` from transformers
    5.2x on, ``past_key_values`` before (still accepted, with a warning)."""
    from transformers.utils import ModelOutput
    return "cache" if isinstance(getattr(ModelOutput, "past_key_values", None), property) \
        else "past_key_values"


_CACHE_KW = _cache_keyword()


@dataclass(frozen=True)
class Context:
    """A context to continue: ``prompt_ids + response_ids`` (the response part already
    cut at k and with any substituted token in place), and how long a response may get."""
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    max_new_tokens: int  # limit on the whole response, prefix included

    @property
    def budget(self) -> int:
        return self.max_new_tokens - len(self.response_ids)


def branch_response(response_ids: Sequence[int], k: int, substituted: int | None) -> tuple[int, ...]:
    """The response part of a context: the first ``k`` tokens, then ``substituted`` when a
    token is swapped in for token k."""
    if not 0 <= k <= len(response_ids):
        raise ValueError(f"prefix length {k} outside the response (0..{len(response_ids)})")
    head = tuple(int(t) for t in response_ids[:k])
    return head if substituted is None else head + (int(substituted),)


def continuation_seed(seed: int, model: str, rollout_id: str, k: int,
                      substituted: int | None, sample: int) -> int:
    """The seed of continuation ``sample`` of a context: a function of what the context is,
    never of where it was computed."""
    return seed_from("continuation", int(seed), model, rollout_id, int(k),
                     "keep" if substituted is None else int(substituted), int(sample))


class RowBudget:
    """Stops each row once it has written its own number of new tokens (rows of a batch
    continue contexts of different lengths, so their limits differ)."""

    def __init__(self, start: int, budgets: Sequence[int]):
        self.start = start
        self.budgets = torch.tensor(list(budgets), dtype=torch.long)

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        written = input_ids.shape[1] - self.start
        return (written >= self.budgets).to(input_ids.device)


def _left_pad(seqs: list[tuple[int, ...]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):  # left padding: every context ends where generation starts
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids as ``generate`` makes them from a left-padded mask."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def _prefill(model, ids: torch.Tensor, mask: torch.Tensor):
    """The key/value cache of every token but the last (``generate`` forwards the last one
    itself and takes its first draw from that forward)."""
    out = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1],
                position_ids=_positions(mask)[:, :-1], use_cache=True)
    return out.cache if _CACHE_KW == "cache" else out.past_key_values


@torch.no_grad()
def generate_rows(model, tokenizer, contexts: list[Context], rows: list[int],
                  seeds: list[int], temperature: float, share_prefix: bool = True
                  ) -> list[tuple[list[int], str]]:
    """One batch: row r continues ``contexts[rows[r]]`` with seed ``seeds[r]``; returns
    (new token ids, finish_reason) per row, cut after EOS ("stop") or at the context's
    budget ("length")."""
    from transformers import GenerationConfig, StoppingCriteriaList

    stop = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
    device = next(model.parameters()).device
    seqs = [c.prompt_ids + c.response_ids for c in contexts]
    ids, mask = _left_pad(seqs, pad)
    index = torch.tensor(rows, dtype=torch.long)
    budgets = [contexts[i].budget for i in rows]
    kwargs = {}
    if share_prefix and ids.shape[1] > 1:
        cache = _prefill(model, ids.to(device), mask.to(device))
        cache.batch_select_indices(index.to(device))  # each context's cache, once per row
        kwargs[_CACHE_KW] = cache
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max(budgets),
                              eos_token_id=stop, pad_token_id=pad, bos_token_id=None)
    out = model.generate(input_ids=ids[index].to(device), attention_mask=mask[index].to(device),
                         generation_config=config,
                         logits_processor=[PerRowSampler([temperature] * len(rows), seeds)],
                         stopping_criteria=StoppingCriteriaList([RowBudget(ids.shape[1], budgets)]),
                         **kwargs)
    results = []
    for row, budget in zip(out[:, ids.shape[1]:].cpu().tolist(), budgets):
        row = row[:budget]
        cut = next((j for j, t in enumerate(row) if t in stop), None)
        results.append((row, "length") if cut is None else (row[:cut + 1], "stop"))
    return results


def batches(n_contexts: int, n_samples: int, batch_rows: int) -> Iterator[list[tuple[int, int]]]:
    """(context, sample) pairs in batches of at most ``batch_rows`` rows, in order: the
    samples of one context stay together where they fit, so its prefix is forwarded once."""
    pairs = [(c, s) for c in range(n_contexts) for s in range(n_samples)]
    for start in range(0, len(pairs), max(1, int(batch_rows))):
        yield pairs[start:start + batch_rows]


def continue_contexts(model, tokenizer, contexts: list[Context], seeds: list[list[int]],
                      temperature: float, batch_rows: int = 32, share_prefix: bool = True,
                      progress: bool | str = False) -> list[list[tuple[list[int], str]]]:
    """``len(seeds[c])`` continuations of each context ``c`` (one per seed); returns, per
    context, (new token ids, finish_reason) per sample.

    Contexts whose budget is used up (the prefix already has ``max_new_tokens`` tokens)
    get no continuation: ([], "length") for every sample.
    """
    n = {len(s) for s in seeds}
    if len(n) > 1 or len(seeds) != len(contexts):
        raise ValueError("every context needs the same number of seeds, one list per context")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    n_samples = n.pop() if n else 0
    out: list[list] = [[None] * n_samples for _ in contexts]
    live = [i for i, c in enumerate(contexts) if c.budget > 0]
    for i in set(range(len(contexts))) - set(live):
        out[i] = [([], "length")] * n_samples
    # Longest contexts first: similar lengths share a batch, and the first batch shows the
    # worst-case memory.
    live.sort(key=lambda i: (-len(contexts[i].prompt_ids) - len(contexts[i].response_ids), i))
    label = progress if isinstance(progress, str) else "continuations"
    bar = tqdm(total=len(live) * n_samples, desc=label, disable=progress is False, leave=False)
    for batch in batches(len(live), n_samples, batch_rows):
        used = sorted({live[c] for c, _ in batch})
        where = {ctx: j for j, ctx in enumerate(used)}
        got = generate_rows(model, tokenizer, [contexts[i] for i in used],
                            [where[live[c]] for c, _ in batch],
                            [seeds[live[c]][s] for c, s in batch], temperature, share_prefix)
        for (c, s), result in zip(batch, got):
            out[live[c]][s] = result
        bar.update(len(batch))
    bar.close()
    return out

"""Seeded continuations of ``prompt + response[:k]`` (optionally with one token swapped in).

A *context* is the chat prompt of a problem followed by the first k tokens of a response,
possibly with its (k+1)-th token replaced by another one (a branch). A model writes
``n`` continuations of each context; the response graded afterwards is the context's
response part followed by the continuation, decoded together.

Reproducibility. Continuation ``s`` of a context has its own random stream, seeded with
``statistics.seed_from("continuation", seed, model, rollout_id, k, substituted, s)``: its
j-th token is ``sampling.draw`` under (that seed, j), on the CPU, at the context's
temperature (the draw of ``rollouts.PerRowSampler``). So a continuation does not depend on
which other continuations share its batch, on the batch size or on the number of
devices: only floating-point differences between batch shapes remain, which could flip a
draw that falls exactly on a boundary between two tokens (see ``rollouts``).

Cost. The expensive part of counterfactuals is generation: every context costs ``n``
continuations. Three things keep it down:

- **shared prefixes** (``share_prefix``): every context of a rollout is a prefix of the
  rollout's prompt and response up to its last token (keep, substitute and takeover
  contexts alike), so the key/value cache of that text is computed once per rollout
  (``prefix_caches``: contexts grouped by prompt, one forward of the longest text whose
  prefixes they all are) and each row of a batch starts from a slice of it; only the
  contexts' last tokens and the new tokens are forwarded row by row;
- **a batch that stays full**: a row that has stopped leaves the batch and its cache,
  and waiting rows join it (once a quarter of it is free; all rows left-padded to one
  width, columns that only pad are trimmed), so decoding costs what the rows write, not
  ``rows x the longest`` per batch;
- **short continuations**: a continuation stops at EOS, when the response reaches
  ``max_new_tokens`` tokens in all (the rollouts' limit, counted from the response's
  first token), at ``max_continuation`` new tokens where the context sets one, and with
  ``stop_at_box`` once its own new text has closed a ``\\boxed{...}`` (finish reason
  "box"): the grader reads the last box, so nothing written after it changes the grade.
  A box in the context (the reference's own) does not stop it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from rlprobe_nb.generation import sampling
from rlprobe_nb.generation.rollouts import eos_ids
from rlprobe_nb.problems import grading
from rlprobe_nb.progress import tqdm
from rlprobe_nb.statistics import seed_from


def _cache_keyword() -> str:
    """The forward's cache argument: ``cache`` from transformers 5.2x on,
    ``past_key_values`` before (still accepted, with a warning)."""
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
    max_continuation: int | None = None  # limit on the new tokens (None: the response's)

    @property
    def budget(self) -> int:
        left = self.max_new_tokens - len(self.response_ids)
        return left if self.max_continuation is None else min(left, int(self.max_continuation))

    @property
    def ids(self) -> tuple[int, ...]:
        return self.prompt_ids + self.response_ids


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


class BoxWatch:
    """Whether a row's new text has closed a box (``grading.extract_boxed`` finds one);
    a row's text is decoded only after a token that holds "}"."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._closes: dict[int, bool] = {}

    def closes(self, token: int) -> bool:
        if token not in self._closes:
            self._closes[token] = "}" in self.tokenizer.decode([token])
        return self._closes[token]

    def closed(self, new_ids: list[int]) -> bool:
        return bool(new_ids) and self.closes(new_ids[-1]) and bool(grading.extract_boxed(
            self.tokenizer.decode(new_ids, skip_special_tokens=True)))


# --- prefix caches --------------------------------------------------------------------

def _layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache]  # a legacy tuple cache


def _cache_of(output):
    return output.cache if _CACHE_KW == "cache" else output.past_key_values


@torch.no_grad()
def prefix_caches(model, contexts: list[Context], indices: Sequence[int] | None = None
                  ) -> tuple[dict[int, int], list[list]]:
    """Per context (of ``indices``, default all), the index of its group, and per group the
    key/value tensors (one (keys, values) pair per layer, batch 1) of the group's text:
    contexts with the same prompt whose texts but their last tokens are prefixes of one
    longest such text form a group; the others are groups of their own."""
    device = next(model.parameters()).device
    heads: list[tuple[int, ...]] = []
    groups: dict[int, int] = {}
    todo = range(len(contexts)) if indices is None else indices
    for c in sorted(todo, key=lambda i: -len(contexts[i].ids)):
        head = contexts[c].ids[:-1]
        if not head:
            raise ValueError("a context of one token has no prefix to share")
        g = next((j for j, h in enumerate(heads) if h[:len(head)] == head), None)
        if g is None:
            heads.append(head)
            g = len(heads) - 1
        groups[c] = g
    tensors = [_layers(_cache_of(model(input_ids=torch.tensor([h], device=device),
                                       use_cache=True, logits_to_keep=1))) for h in heads]
    return groups, tensors


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    if t.shape[dim] == width:
        return t
    shape = list(t.shape)
    shape[dim] = width - t.shape[dim]
    return torch.cat([t.new_zeros(shape), t], dim)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def _new_rows(model, contexts: list[Context], cs: list[int], caches, device):
    """Key/value tensors (per layer, [rows, heads, width, dim], left-padded) of contexts
    ``cs`` but their last tokens, and the mask [rows, width + 1] with the last token: from
    the shared prefixes in ``caches``, else from each row's own forward."""
    width = max(len(contexts[c].ids) for c in cs) - 1
    mask = torch.zeros((len(cs), width + 1), dtype=torch.long, device=device)
    for i, c in enumerate(cs):
        mask[i, width + 1 - len(contexts[c].ids):] = 1
    if caches is not None:
        groups, tensors = caches
        layers = []
        for layer in range(len(tensors[0])):
            keys, values = zip(*(
                (_left_pad(tensors[groups[c]][layer][0][:, :, :len(contexts[c].ids) - 1], width, 2),
                 _left_pad(tensors[groups[c]][layer][1][:, :, :len(contexts[c].ids) - 1], width, 2))
                for c in cs))
            layers.append((torch.cat(keys), torch.cat(values)))
        return layers, mask
    ids = torch.zeros((len(cs), width), dtype=torch.long, device=device)
    for i, c in enumerate(cs):
        head = contexts[c].ids[:-1]
        if not head:
            raise ValueError("a context of one token has no prefix to forward")
        ids[i, width - len(head):] = torch.tensor(head, device=device)
    out = model(input_ids=ids, attention_mask=mask[:, :-1], position_ids=_positions(mask[:, :-1]),
                use_cache=True, logits_to_keep=1)
    return _layers(_cache_of(out)), mask


def _join(old, new):
    """Two sets of rows (per-layer tensors, mask) as one, left-padded to the wider."""
    if old is None:
        return new
    width = max(old[1].shape[1], new[1].shape[1])
    layers = [(torch.cat([_left_pad(ka, width - 1, 2), _left_pad(kb, width - 1, 2)]),
               torch.cat([_left_pad(va, width - 1, 2), _left_pad(vb, width - 1, 2)]))
              for (ka, va), (kb, vb) in zip(old[0], new[0])]
    return layers, torch.cat([_left_pad(old[1], width, 1), _left_pad(new[1], width, 1)])


def _roomy_layer_class():
    from transformers.cache_utils import DynamicLayer

    class RoomyLayer(DynamicLayer):
        """A DynamicLayer whose keys and values are views into buffers with room to grow:
        a decoding step writes its key and value in place, where DynamicLayer copies the
        whole cache (a concatenation) at every step."""

        ROOM = 64

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, add = self.get_seq_length(), key_states.shape[-2]
            kb, vb = getattr(self, "_buffers_kv", (None, None))
            if (kb is None or kb.shape[0] != key_states.shape[0] or kb.shape[2] < n + add
                    or self.keys.data_ptr() != kb.data_ptr()):
                shape = (*key_states.shape[:2], n + add + self.ROOM, key_states.shape[3])
                kb, vb = key_states.new_empty(shape), value_states.new_empty(shape)
                if n:
                    kb[:, :, :n], vb[:, :, :n] = self.keys, self.values
                self._buffers_kv = (kb, vb)
            kb[:, :, n:n + add], vb[:, :, n:n + add] = key_states, value_states
            self.keys, self.values = kb[:, :, :n + add], vb[:, :, :n + add]
            return self.keys, self.values

    return RoomyLayer


def _cache(layers: list[tuple[torch.Tensor, torch.Tensor]]):
    """A DynamicCache over ``layers`` (per layer (keys, values)) whose layers grow in place."""
    from transformers import DynamicCache

    cache = DynamicCache(layers)
    roomy = _ROOMY[0] if _ROOMY else _ROOMY.append(_roomy_layer_class()) or _ROOMY[0]
    new = []
    for k, v in layers:
        layer = roomy()
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        new.append(layer)
    cache.layers = new
    return cache


_ROOMY: list = []


# --- decoding -------------------------------------------------------------------------

class _Rows:
    """The rows being decoded: their (context, sample), new tokens, whether they still
    run, the key/value cache of everything before their pending token, the mask (cache +
    pending) and the pending tokens. A row that stops stays in the batch, its draws
    ignored, until ``compact`` drops the stopped rows together (each drop copies the
    whole cache)."""

    def __init__(self):
        self.keys: list[tuple[int, int]] = []
        self.out: list[list[int]] = []
        self.alive: list[bool] = []
        self.cache = self.mask = self.pending = None

    def add(self, pairs, layers, mask, pending):
        old = (_layers(self.cache), self.mask) if self.keys else None
        layers, self.mask = _join(old, (layers, mask))
        self.cache = _cache(layers)
        self.pending = pending if not self.keys else torch.cat([self.pending, pending])
        self.keys += pairs
        self.out += [[] for _ in pairs]
        self.alive += [True] * len(pairs)

    def advance(self, drawn: list[int]):
        """The drawn tokens become the pending ones."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.keys), 1))], 1)
        self.pending = torch.tensor(drawn, dtype=torch.long, device=self.mask.device)

    def compact(self):
        """Drop the stopped rows and the columns that only pad the rest."""
        index = [j for j, a in enumerate(self.alive) if a]
        at = torch.tensor(index, dtype=torch.long, device=self.mask.device)
        self.keys, self.out = [self.keys[j] for j in index], [self.out[j] for j in index]
        self.alive = [True] * len(index)
        self.mask, self.pending = self.mask[at], self.pending[at]
        if not index:
            self.cache = None
            return
        first = int(self.mask.any(0).long().argmax())
        self.cache = _cache([(k[at][:, :, first:], v[at][:, :, first:])
                             for k, v in _layers(self.cache)])
        self.mask = self.mask[:, first:]


@torch.no_grad()
def _stream(model, tokenizer, contexts: list[Context], pairs: list[tuple[int, int]],
            seeds: list[list[int]], temperature: float, batch_rows: int, share_prefix: bool,
            stop_at_box: bool, bar) -> dict[tuple[int, int], tuple[list[int], str]]:
    """Continue every (context, sample) of ``pairs``, at most ``batch_rows`` rows at once:
    once a quarter of the batch (or half its rows) has stopped, the stopped rows leave it
    and waiting ones join, so the batch stays full. Returns (new token ids,
    finish_reason) per pair."""
    stop = set(eos_ids(model, tokenizer))
    box = BoxWatch(tokenizer) if stop_at_box else None
    device = next(model.parameters()).device
    caches = prefix_caches(model, contexts, sorted({c for c, _ in pairs})) if share_prefix else None
    queue, rows, done = list(reversed(pairs)), _Rows(), {}
    quarter = max(1, int(batch_rows) // 4)
    while queue or any(rows.alive):
        dead = rows.alive.count(False)
        if dead and (dead >= quarter or dead >= len(rows.keys) - dead):
            rows.compact()
        room = int(batch_rows) - len(rows.keys)
        if queue and (not rows.keys or room >= quarter):
            new = [queue.pop() for _ in range(min(room, len(queue)))]
            layers, mask = _new_rows(model, contexts, [c for c, _ in new], caches, device)
            last = torch.tensor([contexts[c].ids[-1] for c, _ in new], device=device)
            rows.add(new, layers, mask, last)
        logits = model(input_ids=rows.pending[:, None], attention_mask=rows.mask,
                       position_ids=_positions(rows.mask)[:, -1:], use_cache=True,
                       logits_to_keep=1, **{_CACHE_KW: rows.cache}).logits[:, -1].float()
        drawn = sampling.draw_rows(logits, [seeds[c][s] for c, s in rows.keys],
                                   [len(o) for o in rows.out], [temperature] * len(rows.keys)
                                   ).tolist()
        for j, ((c, s), t) in enumerate(zip(rows.keys, drawn)):
            if not rows.alive[j]:
                continue
            rows.out[j].append(int(t))
            why = ("stop" if t in stop else "box" if box and box.closed(rows.out[j])
                   else "length" if len(rows.out[j]) >= contexts[c].budget else None)
            if why is not None:
                rows.alive[j] = False
                done[(c, s)] = (rows.out[j], why)
                bar.update(1)
        rows.advance(drawn)
    return done


def continue_contexts(model, tokenizer, contexts: list[Context], seeds: list[list[int]],
                      temperature: float, batch_rows: int = 32, share_prefix: bool = True,
                      progress: bool | str = False, stop_at_box: bool = False
                      ) -> list[list[tuple[list[int], str]]]:
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
    out: list[list] = [[([], "length")] * n_samples for _ in contexts]
    # Longest contexts first: similar lengths share the batch, and the first rows show
    # the worst-case memory; a context's samples stay together.
    live = sorted((i for i, c in enumerate(contexts) if c.budget > 0),
                  key=lambda i: (-len(contexts[i].ids), i))
    pairs = [(c, s) for c in live for s in range(n_samples)]
    label = progress if isinstance(progress, str) else "continuations"
    bar = tqdm(total=len(pairs), desc=label, disable=progress is False, leave=False)
    if pairs:
        done = _stream(model, tokenizer, contexts, pairs, seeds, temperature, batch_rows,
                       share_prefix, stop_at_box, bar)
        for (c, s), result in done.items():
            out[c][s] = result
    bar.close()
    return [list(per) for per in out]

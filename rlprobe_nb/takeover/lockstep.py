"""Takeover decoding: the reference writes, a checkpoint runs in lock-step over the same
text, and at each position a rule says whose draw stands.

At every position of every response both models' next-token distributions are computed
over the same prefix. Both draws use the same seeded Gumbel noise (``sampling.draw``: the
noise is a function of the request's seed, the position and the token), so where the two
distributions are close the two draws are the same token, and where they differ the
draws differ the way the two models would. A *rule* scores the reference's draw (a
criterion of ``criteria``) and, where the score passes the rule's threshold, the token is
the checkpoint's draw instead (a *takeover*), else the reference's draw stands. A rule
that never passes writes exactly what the reference writes alone with the same seed, one
that always passes what the checkpoint writes alone.

Shared work. One request (a prompt and a seed) carries many rules at once (every
criterion at every threshold, and both ends). Their texts are identical up to the first
position where two rules pick different tokens, and at most positions every rule picks
the same token (both draws agree, or no rule passes), so the rules of a request are held
as a tree of distinct prefixes: each *node* (one distinct prefix) is one row of the decode
batch in both models, and when the rules at a node pick different tokens the node splits,
its keys and values copied into a free slot. The cost is the number of distinct prefixes,
not the number of rules: a sweep of twenty rules costs a few texts per request. A prompt
is prefilled once per model (``PromptCache``: a problem's samples share it, and the
reference's prompts can be kept for the next checkpoint's run).

Slots. Key/value buffers per model hold one slot per live node (``SlotCache``, the
book's decode loop's buffers, written through the same attention function); idle slots
are masked, the buffers grow when a split needs a slot and none is free, and shrink to the
live slots once half of them are idle and no request waits. Each node's tokens depend on
its own prompt, seed and rules, and on the batch shapes (the rounding of the matrix
products: the same inputs in the same order give the same tokens).

Memory (CUDA). A slot holds both models' keys and values for the whole text length, and a
decision holds float64 arrays over the vocabulary per row: at 8B (Llama-3.1, bf16, 1,344
positions) a slot is about 350 MB, so the slots are sized by the device's free memory
(``slot_limit``): requests are admitted while the live nodes fill at most half of what
it holds (the rest is room for splits), and the buffers never grow past it but by the one
slot a split needs. An out-of-memory error all the same halves the number of nodes
decoded at a time and decodes the unfinished requests again (what finished is kept). On
the CPU nothing is capped.
"""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from rlprobe_nb.generation import sampling
from rlprobe_nb.generation.decoding import (SLOT_ATTENTION, SPAN_STEP, _model_shape,
                                            finish_reason, kv_bytes_per_slot)
from rlprobe_nb.generation.out_of_memory import halving_on_oom
from rlprobe_nb.generation.slot_cache import SlotCache, slot_attention
from rlprobe_nb.takeover import criteria


@dataclass(frozen=True)
class Rule:
    """Take over where ``criterion``'s score of the reference's draw is > ``threshold``
    (criterion "never" and "always" are the two ends)."""
    criterion: str
    threshold: float = 0.0


NEVER, ALWAYS = Rule("never"), Rule("always")
ROW_TEMPORARIES = 12  # float64 arrays over the vocabulary a decision holds per row (the two
# log-softmaxes, probabilities, the criteria's products; the calibrated scorer's too)


def slot_limit(ref, ckpt, length: int, reserve: int = 0) -> int | None:
    """The most slots the free memory of the models' CUDA device holds (both models' keys
    and values over ``length`` positions and a decision's temporaries per slot), once
    ``reserve`` bytes (the prompt caches' room) and a tenth are kept free; None on the
    CPU."""
    device = next(ref.parameters()).device
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    per_slot = (kv_bytes_per_slot(ref, length) + kv_bytes_per_slot(ckpt, length)
                + ROW_TEMPORARIES * 8 * ref.config.vocab_size)
    return max(2, int((0.9 * free - reserve) // per_slot))


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    seed: int
    rules: tuple[Rule, ...]


@dataclass
class Written:
    """What one rule wrote for one request."""
    ids: list[int]
    finish: str
    taken: list[int]     # positions (0 = first response token) where the rule passed
    changed: list[int]   # of those, where the checkpoint's draw differs from the reference's


@dataclass(eq=False)
class _Node:
    request: int
    slot: int
    ids: list[int]
    rules: list[int]
    taken: dict[int, list[int]] = field(default_factory=dict)
    changed: dict[int, list[int]] = field(default_factory=dict)

    def fork(self, rules: list[int], slot: int) -> "_Node":
        return _Node(self.request, slot, list(self.ids), rules,
                     {r: list(self.taken[r]) for r in rules},
                     {r: list(self.changed[r]) for r in rules})


class PromptCache:
    """One model's prompts as prefilled alone: the keys and values of each prompt and its
    last logits, kept while they fit in ``max_bytes``. A prompt's prefill runs on it alone
    (batch 1), so what it leaves is a function of the model and the prompt only: taken
    from here it is the very same tensors. ``takeover_generate`` keeps one per model
    for its run (a problem's samples share a prompt); ``table.run_takeover`` keeps the
    reference's across checkpoints (every checkpoint's run prefills the same prompts)."""

    def __init__(self, model, max_bytes: int = 1 << 30):
        self.model, self.max_bytes = model, int(max_bytes)
        self.entries: dict[tuple[int, ...], tuple[list, list, torch.Tensor]] = {}
        self.bytes = self.hits = 0

    def get(self, prompt: tuple[int, ...]):
        found = self.entries.get(prompt)
        self.hits += found is not None
        return found

    def put(self, prompt: tuple[int, ...], cache: SlotCache, slot: int, logits: torch.Tensor
            ) -> None:
        n = len(prompt)
        keys = [k[slot, :, :n].clone() for k in cache.keys]
        values = [v[slot, :, :n].clone() for v in cache.values]
        size = sum(t.numel() * t.element_size() for t in keys + values) + \
            logits.numel() * logits.element_size()
        if self.bytes + size <= self.max_bytes:
            self.entries[prompt] = (keys, values, logits.clone())
            self.bytes += size


class _Pair:
    """The two models' key/value buffers, slot for slot."""

    def __init__(self, ref, ckpt, slots: int, length: int,
                 prompts: tuple[PromptCache, PromptCache] | None = None,
                 limit: int | None = None):
        p = next(ref.parameters())
        self.limit = limit  # the most slots the buffers may hold (None: no cap)
        self.models, self.device, self.dtype = (ref, ckpt), p.device, p.dtype
        self.prompts = prompts or (PromptCache(ref), PromptCache(ckpt))
        self.length = -(-length // SPAN_STEP) * SPAN_STEP
        self.caches = [SlotCache(*_cache_shape(m, slots, self.length), self.dtype, self.device)
                       for m in self.models]
        self.positions_ = torch.arange(self.length, device=self.device)
        self.free = list(range(slots))[::-1]

    @property
    def slots(self) -> int:
        return len(self.caches[0].rows)

    def _forward(self, model, cache, ids, positions, mask) -> torch.Tensor:
        return model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache,
                     use_cache=True, logits_to_keep=1).logits[:, -1]

    def _mask(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden.shape, dtype=self.dtype, device=self.device).masked_fill(
            hidden, torch.finfo(self.dtype).min)

    def prefill(self, prompt: tuple[int, ...], slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt into ``slot`` of both models; each model's last logits [1, V]."""
        n = len(prompt)
        ids = torch.tensor([prompt], device=self.device)
        mask = self._mask(self.positions_[:n][None, :] > self.positions_[:n][:, None])
        out = []
        for model, cache, kept in zip(self.models, self.caches, self.prompts):
            found = kept.get(prompt)
            if found is not None:
                for buf, saved in zip(cache.keys + cache.values, found[0] + found[1]):
                    buf[slot, :, :n] = saved
                out.append(found[2])
                continue
            cache.prefill_slot = slot
            try:
                out.append(self._forward(model, cache, ids, self.positions_[:n][None],
                                         mask[None, None]))
            finally:
                cache.prefill_slot = None
            kept.put(prompt, cache, slot, out[-1])
        return out[0], out[1]

    def step(self, tokens: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per slot at its position (idle slots: any token, masked); logits
        [slots, V] of both models."""
        span = min(self.length, -(-(int(pos.max()) + 1) // SPAN_STEP) * SPAN_STEP)
        mask = self._mask(self.positions_[:span][None, :] > pos[:, None])[:, None, None, :]
        out = []
        for model, cache in zip(self.models, self.caches):
            cache.prefill_slot, cache.positions, cache.span = None, pos, span
            out.append(self._forward(model, cache, tokens[:, None], pos[:, None], mask))
        return out[0], out[1]

    def copy(self, src: int, dst: int, n: int) -> None:
        for cache in self.caches:
            cache.copy_slot(src, [dst], n)

    def take(self) -> int:
        """A free slot, the buffers grown by half (past ``limit`` only by one) if none is."""
        if not self.free:
            extra = max(8, self.slots // 2)
            if self.limit is not None:
                extra = max(1, min(extra, self.limit - self.slots))
            self.grow(extra)
        return self.free.pop()

    def release(self) -> None:
        """Drop the buffers (an out-of-memory error's traceback keeps this object)."""
        for cache in self.caches:
            cache.keys.clear()
            cache.values.clear()

    def grow(self, extra: int) -> None:
        for cache in self.caches:
            for bufs in (cache.keys, cache.values):
                for i, buf in enumerate(bufs):
                    bufs[i] = torch.cat([buf, torch.zeros((extra, *buf.shape[1:]),
                                                          dtype=buf.dtype, device=buf.device)])
            cache.rows = torch.arange(len(cache.rows) + extra, device=self.device)
        self.free = list(range(self.slots - extra, self.slots))[::-1] + self.free

    def compact(self, live: list[int]) -> dict[int, int]:
        """Keep only ``live`` slots (in that order); returns old slot -> new slot."""
        keep = torch.tensor(live, device=self.device)
        for cache in self.caches:
            cache.select(keep)
        self.free = []
        return {old: new for new, old in enumerate(live)}


def _cache_shape(model, slots: int, length: int) -> tuple[int, int, int, int, int]:
    layers, kv_heads, head_dim = _model_shape(model)
    return layers, slots, kv_heads, length, head_dim


class _Run:
    """One lock-step run over a list of requests (see the module docstring)."""

    def __init__(self, pair: _Pair, requests: Sequence[Request], temperature: float,
                 max_new_tokens: int, eos: set[int], finish: Callable | None,
                 batch: int, record: Callable | None, calibrated: Callable | None = None,
                 results: dict | None = None):
        self.pair, self.requests, self.temperature = pair, requests, float(temperature)
        self.calibrated = calibrated
        self.max_new_tokens, self.eos, self.finish = max_new_tokens, eos, finish
        self.batch, self.record = batch, record
        self.nodes: list[_Node] = []
        self.results: dict[tuple[int, int], Written] = {} if results is None else results
        self.node_steps = 0  # rows forwarded in both models: the run's cost

    def admit(self, queue: deque) -> None:
        while queue and len(self.nodes) < self.batch:
            i = queue.popleft()
            req = self.requests[i]
            node = _Node(i, self.pair.take(), [], list(range(len(req.rules))),
                         {r: [] for r in range(len(req.rules))},
                         {r: [] for r in range(len(req.rules))})
            ref_logits, ckpt_logits = self.pair.prefill(req.prompt, node.slot)
            self.decide([node], ref_logits, ckpt_logits)

    def decide(self, nodes: list[_Node], ref_logits: torch.Tensor,
               ckpt_logits: torch.Tensor) -> None:
        """Each node's rules pick their tokens from both models' logits [len(nodes), V];
        nodes split where their rules disagree, and end where their text does."""
        seeds = sampling.check_seeds([self.requests[n.request].seed for n in nodes])
        steps = torch.tensor([len(n.ids) for n in nodes], dtype=torch.long)
        temps = torch.full((len(nodes),), self.temperature, dtype=torch.float64)
        dev = ref_logits.device
        # eager on CUDA too: the rows change from step to step, and a sampler compiled
        # for fixed shapes compiles again for each new number (eight times, then a warning)
        x_ref = sampling.draw(ref_logits, seeds.to(dev), steps.to(dev), temps.to(dev),
                              compiled=False).cpu()
        x_ckpt = sampling.draw(ckpt_logits, seeds.to(dev), steps.to(dev), temps.to(dev),
                               compiled=False).cpu()
        scores = criteria.scores(ref_logits, ckpt_logits, x_ref.to(dev), seeds, steps,
                                 self.calibrated)
        if self.record is not None:
            self.record(nodes, x_ref, x_ckpt, scores)
        for b, node in enumerate(list(nodes)):
            self._advance(node, b, int(x_ref[b]), int(x_ckpt[b]), scores)

    def _advance(self, node: _Node, b: int, x_ref: int, x_ckpt: int, scores: dict) -> None:
        rules = self.requests[node.request].rules
        by_token: dict[int, list[int]] = {}
        pos = len(node.ids)
        for r in node.rules:
            passed = criteria.passes(rules[r], scores, b)
            if passed:
                node.taken[r].append(pos)
                if x_ckpt != x_ref:
                    node.changed[r].append(pos)
            by_token.setdefault(x_ckpt if passed else x_ref, []).append(r)
        groups = sorted(by_token.items(), key=lambda kv: min(kv[1]))
        children = [node]
        node.rules = groups[0][1]
        for _, rs in groups[1:]:
            child = node.fork(rs, self.pair.take())
            self.pair.copy(node.slot, child.slot, len(self.requests[node.request].prompt) + pos)
            self.nodes.append(child)
            children.append(child)
        if node not in self.nodes:
            self.nodes.append(node)
        for child, (token, _) in zip(children, groups):
            child.ids.append(token)
            why = finish_reason(child.ids, token, self.eos, self.finish, self.max_new_tokens)
            if why is not None:
                for r in child.rules:
                    self.results[(child.request, r)] = Written(
                        list(child.ids), why, child.taken[r], child.changed[r])
                self.nodes.remove(child)
                self.pair.free.append(child.slot)

    def step(self) -> None:
        slots = self.pair.slots
        tokens = torch.zeros(slots, dtype=torch.long)
        pos = torch.zeros(slots, dtype=torch.long)
        for node in self.nodes:
            tokens[node.slot] = node.ids[-1]
            pos[node.slot] = len(self.requests[node.request].prompt) + len(node.ids) - 1
        dev = self.pair.device
        ref_logits, ckpt_logits = self.pair.step(tokens.to(dev), pos.to(dev))
        live = list(self.nodes)
        self.node_steps += len(live)
        index = torch.tensor([n.slot for n in live], device=dev)
        self.decide(live, ref_logits.index_select(0, index), ckpt_logits.index_select(0, index))

    def shrink(self) -> None:
        moved = self.pair.compact([n.slot for n in self.nodes])
        for node in self.nodes:
            node.slot = moved[node.slot]

    def run(self, order: Sequence[int], progress: Callable[[int], None]) -> None:
        """Decode the requests of ``order`` (indices into ``requests``)."""
        queue = deque(order)
        self.admit(queue)
        while self.nodes:
            done = len(self.results)
            self.step()
            if len(self.results) > done:
                progress(len(self.results) - done)
            self.admit(queue)
            if not queue and self.nodes and len(self.nodes) <= self.pair.slots // 2:
                self.shrink()


@torch.inference_mode()
def takeover_generate(ref, ckpt, requests: Sequence[Request], eos: Sequence[int], *,
                      temperature: float, max_new_tokens: int, batch: int = 64,
                      finish: Callable[[list[int]], str | None] | None = None,
                      progress: Callable[[int], None] | None = None,
                      record: Callable | None = None, stats: dict | None = None,
                      calibrated: Callable | None = None,
                      ref_prompts: PromptCache | None = None) -> list[list[Written]]:
    """Per request, per rule: what it wrote (``Written``). ``ref`` writes, ``ckpt`` takes
    over where a rule passes (see the module docstring); both are HF decoder-only models of
    one tokenizer on one device (Llama-like attention, as the book's decode loop needs).
    ``batch``: nodes decoded at a time (requests are admitted while fewer are live; on
    CUDA at most half of what the free memory holds, and halved after an out-of-memory
    error). ``record(nodes, x_ref, x_ckpt, scores)`` sees every decision (tests);
    ``stats`` gets the run's cost (``node_steps``: rows forwarded through both models;
    ``prompt_hits``: prompts taken from the caches; ``slot_limit``: the memory's cap on
    slots, None on the CPU); ``calibrated``: the scorer of the "calibrated" criterion
    (``calibrated.Scorer``), which its rules need; ``ref_prompts``: the reference's
    ``PromptCache`` to reuse (another run's over the same prompts), else a new one."""
    if not requests:
        return []
    _check_requests(requests, temperature, max_new_tokens, calibrated)
    if ref_prompts is not None and ref_prompts.model is not ref:
        raise ValueError("ref_prompts holds another model's prompts: give the reference's")
    length = max(len(r.prompt) for r in requests) + max_new_tokens
    prompts = (ref_prompts or PromptCache(ref), PromptCache(ckpt))
    hits_before = sum(c.hits for c in prompts)
    needed = any(r.criterion == "calibrated" for req in requests for r in req.rules)
    limit = slot_limit(ref, ckpt, length, sum(max(0, c.max_bytes - c.bytes) for c in prompts))
    results: dict[tuple[int, int], Written] = {}
    cost = {"node_steps": 0}
    report = progress or (lambda k: None)

    def attempt(size: int) -> None:
        unfinished = [i for i, req in enumerate(requests)
                      if any((i, r) not in results for r in range(len(req.rules)))]
        todo = set(unfinished)
        partial = [key for key in results if key[0] in todo]
        for key in partial:  # a request is decoded again whole
            del results[key]
        if partial:
            report(-len(partial))
        slots = min(size, len(unfinished)) * (2 if limit is None else 1)
        pair = _Pair(ref, ckpt, slots, length, prompts, limit)
        run = _Run(pair, requests, temperature, max_new_tokens, {int(e) for e in eos},
                   finish, size, record, calibrated if needed else None, results)
        try:
            run.run(unfinished, report)
        except Exception:
            pair.release()
            raise
        finally:
            cost["node_steps"] += run.node_steps

    # under a memory cap, admit while the live nodes fill half of it: splits take the rest
    start = batch if limit is None else max(1, min(batch, limit // 2))
    with _slot_attention(ref, ckpt):
        halving_on_oom(attempt, start, lambda old, new: (
            f"out of GPU memory in takeover decoding at {old} nodes at a time: the "
            f"unfinished requests again at {new}"))
    if stats is not None:
        stats.update(cost, prompt_hits=sum(c.hits for c in prompts) - hits_before,
                     slot_limit=limit)
    return [[results[(i, r)] for r in range(len(req.rules))]
            for i, req in enumerate(requests)]


def _check_requests(requests: Sequence[Request], temperature: float, max_new_tokens: int,
                    calibrated: Callable | None) -> None:
    if temperature < 0 or max_new_tokens < 1:
        raise ValueError(f"need temperature >= 0 and max_new_tokens >= 1, got "
                         f"{temperature}, {max_new_tokens}")
    for i, req in enumerate(requests):
        if not req.prompt:
            raise ValueError(f"request {i} has an empty prompt: give it the prompt's token ids")
        if not req.rules:
            raise ValueError(f"request {i} has no rules: give it at least one Rule "
                             f"(NEVER and ALWAYS are the two ends)")
        for rule in req.rules:
            criteria.check_rule(rule)
            if rule.criterion == "calibrated" and calibrated is None:
                raise ValueError(f"request {i} has a calibrated rule but no scorer: pass "
                                 "calibrated=calibrated.Scorer(...) (chapter 05's null)")


@contextmanager
def _slot_attention(*models):
    """The models attend through the slot buffers for the block's duration."""
    from transformers import AttentionInterface

    AttentionInterface.register(SLOT_ATTENTION, slot_attention)
    previous = [m.config._attn_implementation for m in models]
    for m in models:
        m.config._attn_implementation = SLOT_ATTENTION
    try:
        yield
    finally:
        for m, prev in zip(models, previous):
            m.config._attn_implementation = prev

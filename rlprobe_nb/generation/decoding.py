"""The book's decode loop: seeded generation in slots that are refilled as sequences end.

Slots. The loop holds ``slots`` sequences at a time. Each slot has its own rows in
preallocated key/value buffers [slots, kv_heads, length, head_dim] per layer, with its
tokens at positions [0, n) (left-aligned, no padding), and its own position, seed, step
and temperature. A decode step forwards one token per slot, written at the slot's own
position, under a 4D additive mask that lets slot b see its positions [0, pos_b]; the
model's attention reaches the buffers through a duck-typed cache (``SlotCache.update``,
the one method HF attention layers call) and runs through the book's own attention
function (registered with HF's ``AttentionInterface`` for the loop's duration): one SDPA
call per layer in which the query heads that share a key/value head attend together, so
the buffers are read once and never copied per head; a prompt attends causally to
itself. When a sequence ends (EOS, or its token budget)
its slot takes the next waiting request at once: the prompt is prefilled alone (batch 1,
so its keys and values depend on no other prompt), once for the waiting requests that
share it (a problem's samples), copied into their slots, and each slot's first token is
drawn from the prompt's last logits. Tokens are drawn by ``sampling.draw``. So a
sequence's tokens depend on its own prompt, seed and temperature, and on the number of
slots (the matrix shapes) and the device; not on which sequences share the batch or when
they came in.

Speed. Requests are taken longest prompt first, a problem's samples together. On CUDA the
whole decode step (mask, forward, sampler, counters: tensor operations on preallocated
buffers, no host synchronisation) is captured in CUDA graphs, one per attention span (a
quarter, half, three quarters or all of the buffers' length), so a step is one graph
launch; the sampler is compiled. A prompt's prefill is a graph too, one per prompt length
rounded up to SPAN_STEP (the prompt is padded after its end; attention is causal, so the
padding changes none of its positions). The engine (buffers and graphs) is kept for the
next call with the same model and number of slots, so a table's shards capture once
(``release`` frees it; a model whose weights moved gets a new one). On
CUDA each layer's q/k/v and gate/up projections run as one product each
(``fused_projections``). With ``compiled=True`` the step's model call also goes through
``torch.compile`` (inductor's deterministic mode: no on-device autotuning, so
every process compiles the same kernels): about 20% faster per step at 8B, two minutes
of compilation per process, number of slots and buffer length, and tokens that differ in the last bits
from the uncompiled loop (the suite's ``runtime.compile_decode``, recorded in the table
keys). On the CPU the step runs eagerly
over the span of the longest live sequence, and the batch shrinks to its live slots once
half of them are idle and nothing waits (a change of shape: its rounding may differ in
the last bits). ``slots="auto"`` takes the largest number of slots the free device memory
holds; an out-of-memory error halves the number and goes on, keeping the finished
sequences.

Models: HF decoder-only models whose attention layers call ``cache.update`` and attend
causally over the whole context (Llama, Mistral without a sliding window, Qwen2/3,
OLMo 2), under "sdpa" or "eager" attention. Others go through HF ``generate`` with the
same draws (``sampling.SeededLogitsProcessor``), in batches of ``slots``.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from rlprobe_nb.generation import fused_projections, sampling
from rlprobe_nb.generation.hf_generate import hf_generate
from rlprobe_nb.generation.out_of_memory import halving_on_oom, is_out_of_memory
from rlprobe_nb.generation.slot_cache import SlotCache, slot_attention

SLOT_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "olmo2")
SPAN_STEP = 64  # attention spans and buffer lengths are multiples of this
SLOT_ATTENTION = "rlprobe_slots"


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    temperature: float
    seed: int
    max_new_tokens: int


Result = tuple[list[int], str]  # (new token ids, "stop" | "length" | finish's reason)
Finish = Callable[[list[int]], "str | None"]  # a sequence's new ids -> why it ends, or None


def _round_up(n: int, step: int = SPAN_STEP) -> int:
    return -(-int(n) // step) * step


def uses_slots(model) -> bool:
    """Whether ``generate`` runs the slot loop for this model (else HF ``generate``)."""
    cfg = model.config
    params = inspect.signature(model.forward).parameters
    return (getattr(cfg, "model_type", None) in SLOT_MODEL_TYPES
            and not getattr(cfg, "sliding_window", None)
            and ("cache" in params or "past_key_values" in params))


def _model_shape(model) -> tuple[int, int, int]:
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", None) or heads, head_dim


def kv_bytes_per_slot(model, length: int) -> int:
    layers, kv_heads, head_dim = _model_shape(model)
    elem = next(model.parameters()).element_size()
    return 2 * layers * kv_heads * head_dim * _round_up(length) * elem


class _Slots:
    """One run of the slot loop at a fixed number of slots (see the module docstring)."""

    def __init__(self, model, slots: int, length: int, eos: Sequence[int], graphs: bool,
                 compiled: bool = False):
        p = next(model.parameters())
        self.model, self.device, self.dtype = model, p.device, p.dtype
        self.weights = _weights_in_place(model)
        self.length = _round_up(length)
        layers, kv_heads, head_dim = _model_shape(model)
        self.cache = SlotCache(layers, slots, kv_heads, self.length, head_dim, self.dtype,
                               self.device)
        params = inspect.signature(model.forward).parameters
        self.call = {"cache" if "cache" in params else "past_key_values": self.cache,
                     "use_cache": True}
        if "logits_to_keep" in params:
            self.call["logits_to_keep"] = 1
        self.eos = set(int(e) for e in eos)
        self.positions_ = torch.arange(self.length, device=self.device)
        self._state(slots)
        self.occupant: list[int | None] = [None] * slots
        self.tokens: list[list[int]] = [[] for _ in range(slots)]
        self.requests: dict[int, Request] = {}
        self.finish: Finish | None = None
        self.spans = sorted({min(self.length, _round_up(math.ceil(self.length * q / 4)))
                             for q in (1, 2, 3, 4)})
        self.graphs: dict[int, tuple] | None = None
        self.prefill_graphs: dict[int, tuple] = {}
        self.prefill_pool = None  # one memory pool for every prompt bucket's graph
        self.model_step = self._forward
        if compiled:
            self.model_step = torch.compile(self._forward, dynamic=False,
                                            options={"deterministic": True})
        if graphs:
            self._capture()

    def reset(self, eos: Sequence[int]) -> None:
        """Ready for another call: every slot idle (the graphs read the state in place)."""
        self.eos = set(int(e) for e in eos)
        for state in (self.ids, self.pos, self.steps, self.seeds, self.temps):
            state.zero_()
        self.occupant = [None] * len(self.occupant)
        self.tokens = [[] for _ in self.occupant]
        self.requests = {}

    def _state(self, slots: int) -> None:
        dev = self.device
        self.ids = torch.zeros(slots, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(slots, dtype=torch.long, device=dev)
        self.steps = torch.zeros(slots, dtype=torch.long, device=dev)
        self.seeds = torch.zeros(slots, dtype=torch.long, device=dev)
        self.temps = torch.zeros(slots, dtype=torch.float64, device=dev)

    # the device side ---------------------------------------------------------------
    def _forward(self, ids, positions, mask) -> torch.Tensor:
        return self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                          **self.call).logits[:, -1]

    def _mask(self, hidden: torch.Tensor) -> torch.Tensor:
        """The additive attention mask: 0 where seen, the dtype's minimum where hidden."""
        return torch.zeros(hidden.shape, dtype=self.dtype, device=self.device).masked_fill(
            hidden, torch.finfo(self.dtype).min)

    def _step(self, span: int) -> torch.Tensor:
        """One token per slot: tensor operations only, so it can be captured in a graph."""
        pos = self.pos.clamp(max=self.length - 1)  # an idle slot keeps counting
        mask = self._mask(self.positions_[:span][None, :] > pos[:, None])
        self.cache.prefill_slot, self.cache.positions, self.cache.span = None, pos, span
        logits = self.model_step(self.ids, pos[:, None], mask[:, None, None, :])
        nxt = sampling.draw(logits, self.seeds, self.steps, self.temps)
        self.ids.copy_(nxt[:, None])
        self.pos.add_(1)
        self.steps.add_(1)
        return nxt

    def _capture(self) -> None:
        """A CUDA graph of ``_step`` per span, recorded with every slot idle; eager steps
        (with a warning) if capturing fails. Out of memory, and any failure of a compiled
        step, is raised: the first halves the slots, the second names its setting."""
        with _compiling(self.model_step is not self._forward):
            self._capture_spans()

    def _capture_spans(self) -> None:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: compilation, library handles
                for span in self.spans:
                    for _ in range(2):
                        self._step(span)
            torch.cuda.current_stream().wait_stream(side)
            graphs = {}
            for span in self.spans:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = self._step(span)
                graphs[span] = (graph, out)
            self.graphs = graphs
        except Exception as err:  # noqa: BLE001 - capture is an optimisation: go on eager
            if is_out_of_memory(err):
                raise
            if self.model_step is not self._forward:
                raise RuntimeError(
                    f"compiling the decode step failed ({err!r}); sample without it: "
                    "runtime.compile_decode: false in the suite's parameters") from err
            warnings.warn(f"capturing the decode step in CUDA graphs failed ({err!r}); "
                          "decoding eagerly")
            self.graphs = None
        for state in (self.ids, self.pos, self.steps, self.seeds, self.temps):
            state.zero_()  # in place: the graphs read these very tensors

    def _run_step(self, span: int) -> list[int]:
        if self.graphs is not None:
            graph, out = self.graphs[min(s for s in self.spans if s >= span)]
            graph.replay()
            return out.tolist()
        return self._step(span).tolist()

    def _causal(self, n: int) -> torch.Tensor:
        future = self.positions_[:n][None, :] > self.positions_[:n][:, None]
        return self._mask(future)[None, None]

    def _prompt_logits(self, prompt: tuple[int, ...], slot: int) -> torch.Tensor:
        """The prompt's keys and values into ``slot``; its last position's logits [1, V].
        Eager: the prompt alone. With graphs: the prompt padded after its end to a multiple
        of SPAN_STEP (causal attention: the padding changes none of the prompt's own
        positions), one graph replay per prompt length bucket."""
        if self.graphs is None:
            n = len(prompt)
            self.cache.prefill_slot = slot
            try:
                return self._forward(torch.tensor([prompt], device=self.device),
                                     self.positions_[:n][None], self._causal(n))
            finally:
                self.cache.prefill_slot = None
        bucket = _round_up(len(prompt))
        if bucket not in self.prefill_graphs:
            self.prefill_graphs[bucket] = tuple(
                torch.zeros(shape, dtype=torch.long, device=self.device)
                for shape in ((1, bucket), (1,), (1,)))
        ids, last, target, *captured = self.prefill_graphs[bucket]
        ids.copy_(torch.tensor([list(prompt) + [0] * (bucket - len(prompt))]))
        last.fill_(len(prompt) - 1)
        target.fill_(slot)
        if not captured:  # its warm-up run fills this very slot
            captured = self._capture_prefill(ids, last, target)
            self.prefill_graphs[bucket] += captured
        graph, out = captured
        graph.replay()
        return out

    def _capture_prefill(self, ids: torch.Tensor, last: torch.Tensor, target: torch.Tensor
                         ) -> tuple:
        """A CUDA graph of a prompt's forward from static buffers: the padded ids, the
        last real position and the slot."""
        bucket = ids.shape[1]
        positions, mask = self.positions_[:bucket][None], self._causal(bucket)
        call = {**self.call, "logits_to_keep": last} if "logits_to_keep" in self.call \
            else self.call

        def forward() -> torch.Tensor:
            self.cache.prefill_slot = target
            try:
                out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                                 **call).logits
                return out[:, -1] if "logits_to_keep" in call \
                    else out.index_select(1, last)[:, 0]
            finally:
                self.cache.prefill_slot = None

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self.prefill_pool is None:
            self.prefill_pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.prefill_pool):  # replayed one at a time
            out = forward()
        return graph, out

    def _prefill(self, prompt: tuple[int, ...], slots: list[int], requests: list[Request]
                 ) -> list[int]:
        """The prompt's keys and values into ``slots``; returns each slot's first token."""
        n = len(prompt)
        logits = self._prompt_logits(prompt, slots[0])
        self.cache.copy_slot(slots[0], slots[1:], n)
        first = sampling.draw_rows(logits.expand(len(slots), -1), [r.seed for r in requests], 0,
                                   [r.temperature for r in requests], compiled=False)
        index = torch.tensor(slots, device=self.device)
        self.ids[index, 0] = first
        self.pos[index] = n
        self.steps[index] = 1
        self.seeds[index] = sampling.check_seeds([r.seed for r in requests]).to(self.device)
        self.temps[index] = torch.tensor([float(r.temperature) for r in requests],
                                         dtype=torch.float64, device=self.device)
        return first.tolist()

    # the host side -----------------------------------------------------------------
    def run(self, queue: deque, results: dict, on_result: Callable[[], None],
            finish: Finish | None = None) -> None:
        """Decode every (index, request) of ``queue`` into ``results[index]``."""
        self.finish = finish
        self._fill(queue, results, on_result)
        while any(o is not None for o in self.occupant):
            tokens = self._run_step(self._span())
            for b, who in enumerate(self.occupant):
                if who is not None:
                    self._append(b, tokens[b], results, on_result)
            self._fill(queue, results, on_result)
            live = sum(o is not None for o in self.occupant)
            if self.graphs is None and self.device.type == "cpu" and not queue \
                    and 0 < live <= len(self.occupant) // 2:
                self._shrink()

    def _append(self, b: int, token: int, results: dict, on_result) -> None:
        who = self.occupant[b]
        self.tokens[b].append(token)
        why = finish_reason(self.tokens[b], token, self.eos, self.finish,
                            self.requests[who].max_new_tokens)
        if why is not None:
            results[who] = (self.tokens[b], why)
            self.occupant[b], self.tokens[b] = None, []
            del self.requests[who]
            on_result()

    def _fill(self, queue: deque, results: dict, on_result) -> None:
        """Free slots take waiting requests, a shared prompt prefilled once."""
        while queue:
            free = [b for b, o in enumerate(self.occupant) if o is None]
            if not free:
                return
            group = [queue.popleft()]
            while queue and len(group) < len(free) and queue[0][1].prompt == group[0][1].prompt:
                group.append(queue.popleft())
            slots = free[:len(group)]
            for b, (who, req) in zip(slots, group):
                self.occupant[b], self.tokens[b], self.requests[who] = who, [], req
            first = self._prefill(group[0][1].prompt, slots, [r for _, r in group])
            for b, token in zip(slots, first):
                self._append(b, token, results, on_result)

    def _span(self) -> int:
        longest = max(len(self.requests[o].prompt) + len(self.tokens[b])
                      for b, o in enumerate(self.occupant) if o is not None)
        return min(self.length, _round_up(longest))

    def _shrink(self) -> None:
        keep = [b for b, o in enumerate(self.occupant) if o is not None]
        index = torch.tensor(keep, device=self.device)
        self.cache.select(index)
        for name in ("ids", "pos", "steps", "seeds", "temps"):
            setattr(self, name, getattr(self, name)[index])
        self.occupant = [self.occupant[b] for b in keep]
        self.tokens = [self.tokens[b] for b in keep]


def finish_reason(tokens: list[int], token: int, eos: set, finish: Finish | None,
                  max_new_tokens: int) -> str | None:
    """Why a sequence ends after its newest ``token``, or None while it goes on."""
    if token in eos:
        return "stop"
    why = finish(tokens) if finish is not None else None
    if why is None and len(tokens) >= max_new_tokens:
        return "length"
    return why


def auto_slots(model, length: int, vocab: int, cap: int) -> int:
    """The most slots the free memory of the model's CUDA device holds (key/value buffers,
    logits and sampler temporaries of every span's graph), with a tenth kept free; ``cap``
    on the CPU."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return cap
    free, _ = torch.cuda.mem_get_info(device)
    per_slot = kv_bytes_per_slot(model, length) + 4 * vocab * 4 * 6
    return max(1, min(cap, int(0.9 * free // per_slot)))


@torch.inference_mode()
def generate(model, requests: Sequence[Request], eos: Sequence[int], *,
             slots: int | str = 64, cuda_graphs: bool | None = None, compiled: bool = False,
             pad: int | None = None, progress: Callable[[], None] | None = None,
             finish: Finish | None = None) -> list[Result]:
    """(new token ids, finish reason) per request, in order: ids cut after EOS ("stop", the
    EOS kept), where ``finish`` (called with a sequence's new ids after each token) names
    a reason to end it, or at the request's ``max_new_tokens`` ("length").

    slots: sequences decoded at a time, or "auto" (the most that fit, at most 1024).
    cuda_graphs: capture the decode step (default: on CUDA). compiled: the captured step's
    model call through torch.compile (CUDA graphs only). progress: called once per finished
    request."""
    if not requests:
        return []
    if any(r.max_new_tokens < 1 or not r.prompt or r.temperature < 0 for r in requests):
        raise ValueError("each request needs a prompt, max_new_tokens >= 1 and a temperature >= 0")
    on_result = progress or (lambda: None)
    length = max(len(r.prompt) + r.max_new_tokens for r in requests)
    cap = min(len(requests), 1024 if slots == "auto" else int(slots))
    start = auto_slots(model, length, model.config.vocab_size, cap) if slots == "auto" else cap
    order = sorted(range(len(requests)), key=lambda i: (-len(requests[i].prompt),
                                                        requests[i].prompt, i))
    results: dict[int, Result] = {}
    device = next(model.parameters()).device
    graphs = device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)

    def attempt(size: int) -> None:
        queue = deque((i, requests[i]) for i in order if i not in results)
        if not uses_slots(model):
            return hf_generate(model, queue, size, eos, pad, results, on_result, finish)
        try:
            _engine(model, min(size, len(queue)), length, eos, graphs, compiled).run(
                queue, results, on_result, finish)
        except Exception as err:
            if is_out_of_memory(err):
                release()  # the next, smaller engine needs the memory this one holds
            raise

    previous = model.config._attn_implementation
    if uses_slots(model):
        from transformers import AttentionInterface

        AttentionInterface.register(SLOT_ATTENTION, slot_attention)
        model.config._attn_implementation = SLOT_ATTENTION
    fuse = device.type == "cuda" and uses_slots(model)
    try:
        with fused_projections.fused(model) if fuse else contextlib.nullcontext():
            halving_on_oom(attempt, start)
    finally:
        model.config._attn_implementation = previous
    return [results[i] for i in range(len(requests))]


_HELD: dict = {}  # "engine": ((model id, slots, graphs, compiled), _Slots)


def _engine(model, slots: int, length: int, eos: Sequence[int], graphs: bool,
            compiled: bool) -> _Slots:
    """A slot engine for this call. With CUDA graphs the engine (buffers and captured
    graphs) is kept for the next call with the same model and number of slots and no
    longer sequences, so a run of calls (a table's shards) captures once; ``release``
    frees it."""
    compiled = graphs and compiled
    key = (id(model), slots, graphs, compiled)
    held = _HELD.get("engine")
    if held is not None and held[0] == key and held[1].model is model \
            and held[1].length >= length and held[1].weights == _weights_in_place(model):
        held[1].reset(eos)
        return held[1]
    release()
    engine = _Slots(model, slots, length, eos, graphs, compiled)
    if engine.graphs is not None:
        _HELD["engine"] = (key, engine)
    return engine


def _compiling(compiled: bool):
    """Room for every compilation a process needs (each span, number of slots and buffer
    length is one), and an error rather than torch's silent fall-back to the uncompiled
    step past the limit: that would change the tokens with the process's history."""
    if not compiled:
        return contextlib.nullcontext()
    import torch._dynamo
    return torch._dynamo.config.patch(recompile_limit=256, fail_on_recompile_limit_hit=True)


def _weights_in_place(model) -> tuple[int, ...]:
    """Where the model's parameters live: captured graphs read them there."""
    return tuple(p.data_ptr() for p in model.parameters())


def release() -> None:
    """Free the slot engine kept between calls (its key/value buffers and graphs)."""
    if _HELD.pop("engine", None) is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()

"""Teacher forcing: push the reference's rollouts through models, once per model, and
write the exact per-token divergence table of every compared pair (BOOK.md §4, §5).

The notebook's three calls::

    seqs = forcing.build_sequences(rollouts, problems, tokenizer, template,
                                   max_context=forcing.model_context(model))
    ckpt = forcing.Side("rlvr_step_1200", model=lm.model, tokenizer=lm.tokenizer,
                        cache_dir=paths.table_dir(suite, "hidden/rlvr_step_1200"))
    ref = forcing.Side("dpo", cache_dir=paths.table_dir(suite, "hidden/dpo"))
    out = forcing.run_pair(seqs, ckpt, ref, forcing.pair_dir(suite, ckpt.name, ref.name),
                           suite=suite, batch_tokens=..., chunk_positions=..., topk=5,
                           device="cuda", provenance=manifest_dict)

A ``Side`` is one model of a pair: with ``model`` it is forwarded (and its final hidden
states are saved to ``cache_dir``, batch by batch); without a model its hidden states and
LM head come from ``cache_dir``, which must already hold every rollout. So:
  - the reference is forwarded once (``forward_to_cache`` or its first pair);
  - "one more checkpoint" = ``run_checkpoint``: forward the checkpoint, and while its
    hidden states are on the device compute every metric against the cached reference;
  - any further pair (rlvr_step_1200 vs rlvr_step_400, dpo vs sft) = ``compare_cached``:
    two caches, two LM heads, no forward at all.

Alignment. A ForcedSequence is prompt ids (prompting.prompt_ids: chat template with the
generation prompt, one BOS) + the rollout's own generated ids (EOS included when the model
stopped). Row k predicts response token k from position prompt_len + k - 1, so the first
response token and EOS have rows; the last input position predicts nothing and is not fed.

Numerics. The model body (decoder + final norm) runs in the model's dtype; the LM head is
applied to chunks of ``chunk_positions`` positions with float32 output (bf16 weights on
CUDA: torch.mm(..., out_dtype=float32), fp32 accumulation, no reduced-precision
reductions; on CPU an fp32 upcast), restricted to the tokenizer's real vocabulary when
the head has padded extra rows. divergence.token_metrics does the math. No [tokens x
vocab] tensor is ever held whole; per-token results stay on the device and go to the host
once per batch through pinned memory, and a background thread writes shards, so the
forward loop never waits on the host.

Storage. Hidden-state cache: safetensors shards named by a hash of their batch's content
(self-describing: rollout ids, row counts and sequence hashes in the header) + model.json
(identity, tokenizer, dtype) + head.safetensors (the sliced LM head) + index.json written
last. Token table: storage.ShardedTable, one shard per batch (key = batch index of the
deterministic plan, guarded by the run fingerprint), manifest written last. Both are
atomic and resumable: a killed run, rerun, yields exactly the rows of an uninterrupted run.

Refusals, all before the first forward: tokenizers differ (including a cache made with
another tokenizer), a response longer than the context (policy "skip", counted in the
manifest, or "error"), a rollout id that does not exist, duplicate rollout ids, an empty
response, a side whose cache does not exist or lacks rollouts, a prompt that does not
match the one the rollout was sampled from.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import json
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from .progress import tqdm

from . import divergence, paths, prompting, schemas, storage, tokenizers

TOKEN_METHODS = ("generated", "text")
CONTEXT_POLICIES = ("skip", "error")


# ----------------------------------------------------------------------------- tokenizers

# ----------------------------------------------------------------------------- sequences

@dataclass
class ForcedSequence:
    """One rollout as forced input. Row k of its table predicts ``response_ids[k]``."""

    rollout_id: str
    problem_id: str
    input_ids: list[int]  # prompt ids + response ids
    prompt_len: int
    response_ids: list[int]
    token_method: str  # "generated" | "text"
    tokens: list[str] = field(default_factory=list)  # text of each response token
    char_start: list[int] = field(default_factory=list)  # span in response_text
    char_end: list[int] = field(default_factory=list)
    response_text: str = ""

    @property
    def n_rows(self) -> int:
        return len(self.response_ids)

    def row_positions(self) -> range:
        """Input positions whose logits predict the response tokens."""
        return range(self.prompt_len - 1, self.prompt_len + len(self.response_ids) - 1)

    def content_hash(self) -> str:
        blob = json.dumps([self.rollout_id, self.prompt_len, self.input_ids])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def make_sequence(rollout_id: str, problem_id: str, prompt_ids: Sequence[int],
                  response_ids: Sequence[int], token_method: str = "generated",
                  tokenizer=None) -> ForcedSequence:
    """A ForcedSequence from ids; with a tokenizer, also token texts and character spans."""
    if token_method not in TOKEN_METHODS:
        raise ValueError(f"token_method must be one of {TOKEN_METHODS}, got {token_method!r}")
    prompt_ids, response_ids = [int(i) for i in prompt_ids], [int(i) for i in response_ids]
    if not prompt_ids:
        raise ValueError(f"rollout {rollout_id!r}: empty prompt")
    if not response_ids:
        raise ValueError(f"rollout {rollout_id!r}: empty response; there is nothing to "
                         "force (drop it from the rollouts or regenerate it)")
    seq = ForcedSequence(rollout_id, problem_id, prompt_ids + response_ids, len(prompt_ids),
                         response_ids, token_method)
    if tokenizer is not None:
        seq.tokens, seq.char_start, seq.char_end, seq.response_text = token_spans(
            tokenizer, response_ids)
    else:
        seq.tokens = [""] * len(response_ids)
        seq.char_start = [0] * len(response_ids)
        seq.char_end = [0] * len(response_ids)
    return seq


def token_spans(tokenizer, ids: Sequence[int]) -> tuple[list[str], list[int], list[int], str]:
    """Per token: its own text, and its [start, end) span in the response text
    decode(ids, skip_special_tokens=True).

    Incremental decoding over a short window (as serving engines stream text): a token
    that ends inside a multi-byte character gets an empty span and the token completing
    the character gets the whole character; special tokens get an empty span at the
    current end. Spans are monotone and tile the text. Tokenizers whose window decodes do
    not add up to the full decode fall back to exact (quadratic) prefix decoding.
    """
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    special = set(int(i) for i in getattr(tokenizer, "all_special_ids", []))
    pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    starts, ends = [], []
    emitted_len, kept = 0, []
    prefix_off = read_off = 0
    last_real = -1
    for k, tid in enumerate(ids):
        if tid in special:
            starts.append(emitted_len)
            ends.append(emitted_len)
            continue
        kept.append(tid)
        last_real = k
        prefix_text = tokenizer.decode(kept[prefix_off:read_off], skip_special_tokens=True)
        new_text = tokenizer.decode(kept[prefix_off:], skip_special_tokens=True)
        delta = ""
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            prefix_off, read_off = read_off, len(kept)
        starts.append(emitted_len)
        emitted_len += len(delta)
        ends.append(emitted_len)
    if emitted_len < len(text) and last_real >= 0:
        # A response cut inside a character: its replacement char belongs to the last
        # real token; special tokens after it sit at the end.
        ends[last_real] = len(text)
        for k in range(last_real + 1, len(ids)):
            starts[k] = ends[k] = len(text)
        emitted_len = len(text)
    ok = emitted_len == len(text) and all(s <= e for s, e in zip(starts, ends))
    if ok:
        # The window deltas must reproduce the text exactly, not just its length.
        ok = "".join(text[s:e] for s, e in zip(starts, ends)) == text
    if not ok:
        starts, ends = _spans_by_prefix(tokenizer, ids, text)
    return pieces, starts, ends, text


def _spans_by_prefix(tokenizer, ids, text):
    starts, ends, end = [], [], 0
    for k in range(len(ids)):
        prefix = tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
        common = len(os.path.commonprefix([prefix, text]))
        starts.append(end)
        end = max(end, common)
        ends.append(end)
    return starts, ends


@dataclass
class SequenceSet:
    """The forced sequences of one run, plus what was skipped and why."""

    sequences: list[ForcedSequence]
    skipped: list[dict] = field(default_factory=list)
    tokenizer: dict = field(default_factory=dict)  # tokenizer_identity of the tokenizer used
    max_context: int | None = None
    context_policy: str = "skip"

    def __len__(self) -> int:
        return len(self.sequences)

    def fingerprint(self) -> str:
        return storage.fingerprint([[s.rollout_id, s.content_hash()] for s in self.sequences]
                                   + [self.tokenizer.get("vocab_sha256")])

    def n_rows(self) -> int:
        return sum(s.n_rows for s in self.sequences)

    def facts(self) -> dict:
        methods = Counter(s.token_method for s in self.sequences)
        return {
            "sequences": len(self.sequences), "response_tokens": self.n_rows(),
            "token_methods": dict(methods), "skipped_for_context": len(self.skipped),
            "skipped": self.skipped, "max_context": self.max_context,
            "context_policy": self.context_policy, "sequences_fingerprint": self.fingerprint(),
            "tokenizer": self.tokenizer,
        }


def build_sequences(rollouts: pd.DataFrame, problems, tokenizer,
                    template: str = prompting.DEFAULT_TEMPLATE,
                    rollout_ids: Iterable[str] | None = None, max_context: int | None = None,
                    context_policy: str = "skip", progress: bool = True) -> SequenceSet:
    """Forced sequences from a rollouts table (schemas.ROLLOUTS columns).

    problems: a DataFrame with problem_id and problem, or a mapping id -> problem text.
    rollout_ids: which rollouts (default all, in table order); unknown ids are refused.
    max_context: the smallest context of the models to be forwarded (model_context());
    longer sequences are skipped and counted (policy "skip") or refused ("error").
    """
    if context_policy not in CONTEXT_POLICIES:
        raise ValueError(f"context_policy must be one of {CONTEXT_POLICIES}, "
                         f"got {context_policy!r}")
    need = {"rollout_id", "problem_id"}
    if missing := need - set(rollouts.columns):
        raise ValueError(f"rollouts table lacks columns {sorted(missing)}")
    dup = rollouts["rollout_id"][rollouts["rollout_id"].duplicated()].unique().tolist()
    if dup:
        raise ValueError(f"rollouts table has duplicate rollout ids, e.g. {dup[:5]}: "
                         "rebuild it (rollout_id must be unique)")
    if isinstance(problems, pd.DataFrame):
        problem_text = dict(zip(problems["problem_id"].astype(str), problems["problem"]))
    else:
        problem_text = {str(k): v for k, v in dict(problems).items()}
    table = rollouts.set_index("rollout_id", drop=False)
    if rollout_ids is None:
        wanted = list(rollouts["rollout_id"])
    else:
        wanted = list(rollout_ids)
        if dup := [r for r, c in Counter(wanted).items() if c > 1]:
            raise ValueError(f"rollout ids requested twice: {dup[:5]}")
        unknown = [r for r in wanted if r not in table.index]
        if unknown:
            raise KeyError(f"{len(unknown)} requested rollout ids do not exist in the rollouts "
                           f"table, e.g. {unknown[:5]}; check the ids (or rerun notebook 02)")
    missing_problems = sorted({str(table.at[r, "problem_id"]) for r in wanted}
                              - set(problem_text))
    if missing_problems:
        raise KeyError(f"{len(missing_problems)} problems of the rollouts are missing from the "
                       f"problems table, e.g. {missing_problems[:5]}")
    ident = tokenizers.tokenizer_identity(tokenizer)
    prompt_cache: dict[str, list[int]] = {}
    sequences, skipped, empty = [], [], []
    for rid in tqdm(wanted, desc="forced sequences", disable=not progress, leave=False):
        row = table.loc[rid]
        pid = str(row["problem_id"])
        if pid not in prompt_cache:
            prompt_cache[pid] = prompting.prompt_ids(tokenizer, problem_text[pid], template)
        prompt = prompt_cache[pid]
        stored_prompt = row.get("prompt_ids", None)
        if stored_prompt is not None and len(stored_prompt) and list(map(int, stored_prompt)) != prompt:
            raise ValueError(
                f"rollout {rid!r} was sampled from another prompt than "
                "prompting.prompt_ids(tokenizer, problem, template) gives now (template or "
                "tokenizer changed?); force with the template the rollouts were made with")
        method = row.get("token_method", "generated") or "generated"
        stored = row.get("response_ids", None)
        stored = [] if stored is None else [int(i) for i in stored]
        if method == "text":
            text = row.get("response", "") or ""
            response = tokenizer(text, add_special_tokens=False)["input_ids"]
            if stored and stored != list(response):
                raise ValueError(f"rollout {rid!r}: stored response_ids differ from the "
                                 "tokenization of its text (add_special_tokens=False)")
        elif method == "generated":
            response = stored
        else:
            raise ValueError(f"rollout {rid!r}: unknown token_method {method!r}; "
                             f"expected one of {TOKEN_METHODS}")
        if not response:
            empty.append(rid)
            continue
        total = len(prompt) + len(response)
        if max_context is not None and total > max_context:
            if context_policy == "error":
                raise ValueError(f"rollout {rid!r} has {total} tokens, more than the model "
                                 f"context {max_context}; use context_policy='skip' to skip "
                                 "and count such rollouts")
            skipped.append({"rollout_id": rid, "tokens": total, "reason": "context"})
            continue
        sequences.append(make_sequence(rid, pid, prompt, response, method, tokenizer))
    if empty:
        raise ValueError(f"{len(empty)} rollouts have an empty response, e.g. {empty[:5]}: "
                         "nothing to force; exclude them with rollout_ids or regenerate them")
    if not sequences:
        raise ValueError("no rollout left to force (all skipped for context?)")
    return SequenceSet(sequences, skipped, ident, max_context, context_policy)


def model_context(model) -> int | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "max_position_embeddings", None)


# ----------------------------------------------------------------------------- batches

@dataclass
class Batch:
    index: int
    members: list[int]  # indices into SequenceSet.sequences
    width: int  # padded input length

    @property
    def key(self) -> str:
        return f"{self.index:05d}"


def plan_batches(seqs: SequenceSet | Sequence[ForcedSequence], batch_tokens: int,
                 max_sequences: int | None = None) -> list[Batch]:
    """Length-bucketed batches: longest first (an out-of-memory shows at once), each
    holding at most ``batch_tokens`` padded input tokens (a longer sequence goes alone)
    and at most ``max_sequences`` sequences. Deterministic: ties broken by rollout id."""
    items = seqs.sequences if isinstance(seqs, SequenceSet) else list(seqs)
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
    lengths = [len(s.input_ids) - 1 for s in items]  # the last token predicts nothing
    order = sorted(range(len(items)), key=lambda i: (-lengths[i], items[i].rollout_id))
    batches, current, width = [], [], 0
    for i in order:
        w = max(width, lengths[i])
        full = max_sequences is not None and len(current) >= max_sequences
        if current and (w * (len(current) + 1) > batch_tokens or full):
            batches.append(Batch(len(batches), current, width))
            current, w = [], lengths[i]
        current.append(i)
        width = w
    if current:
        batches.append(Batch(len(batches), current, width))
    return batches


# ----------------------------------------------------------------------------- models

def decoder_of(model):
    """The model body (embeddings, layers, final norm) without the LM head."""
    getter = getattr(model, "get_decoder", None)
    body = getter() if callable(getter) else None
    if body is None:
        body = getattr(model, "model", None)
    if body is None:
        raise TypeError(f"cannot find the decoder body of {type(model).__name__}")
    return body


@dataclass
class LMHead:
    """The LM head restricted to the tokenizer's vocabulary, applied with fp32 output."""

    weight: torch.Tensor  # [vocab, hidden], model dtype
    bias: torch.Tensor | None = None
    softcap: float | None = None
    rows_in_model: int = 0
    padded_rows_dropped: int = 0

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    def to(self, device) -> "LMHead":
        return LMHead(self.weight.to(device), None if self.bias is None else self.bias.to(device),
                      self.softcap, self.rows_in_model, self.padded_rows_dropped)

    def facts(self) -> dict:
        return {"vocab_size": self.vocab_size, "rows_in_model": self.rows_in_model,
                "padded_rows_dropped": self.padded_rows_dropped,
                "dtype": str(self.weight.dtype).replace("torch.", ""),
                "softcap": self.softcap, "bias": self.bias is not None}


def lm_head_of(model, vocab_size: int) -> LMHead:
    """The effective output projection (LoRA deltas included), sliced to ``vocab_size``."""
    cfg = getattr(model, "config", None)
    scale = getattr(cfg, "logit_scale", None)
    if scale not in (None, 1, 1.0):
        raise NotImplementedError(f"{type(model).__name__} scales its logits "
                                  f"(logit_scale={scale}); not supported by the engine yet")
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    base = getattr(head, "base_layer", None)
    if base is not None:  # a PEFT-wrapped head: base weight + unmerged adapter deltas
        weight, bias = base.weight, getattr(base, "bias", None)
        if not getattr(head, "merged", False) and not getattr(head, "disable_adapters", False):
            for name in getattr(head, "active_adapters", []):
                if name in getattr(head, "lora_A", {}):
                    weight = weight + head.get_delta_weight(name).to(weight.dtype)
    weight = weight.detach()
    rows = int(weight.shape[0])
    if rows < vocab_size:
        raise ValueError(f"the LM head has {rows} rows but the tokenizer has {vocab_size} "
                         "tokens: model and tokenizer do not belong together")
    softcap = getattr(cfg, "final_logit_softcapping", None)
    return LMHead(weight[:vocab_size], None if bias is None else bias.detach()[:vocab_size],
                  float(softcap) if softcap else None, rows, rows - vocab_size)


_MM_OUT_DTYPE_OK: dict[str, bool] = {}


@contextlib.contextmanager
def _exact_matmul():
    """No TF32 and no reduced-precision bf16 reductions inside the head matmul."""
    cuda = torch.backends.cuda.matmul
    saved = (cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction)
    cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction = False, False
    try:
        yield
    finally:
        cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction = saved


def head_method(h: torch.Tensor, head: LMHead) -> str:
    if head.weight.dtype == torch.float32 and h.dtype == torch.float32:
        return "fp32"
    if head.weight.dtype == torch.float64:
        return "fp64_rounded_to_fp32"  # float64 models (tests): exact logits, rounded once
    if h.device.type == "cuda" and _MM_OUT_DTYPE_OK.get("cuda", True):
        return "mm_out_dtype_fp32"
    return "upcast_fp32"


def head_logits(h: torch.Tensor, head: LMHead) -> torch.Tensor:
    """float32 logits [n, vocab] for hidden states h [n, hidden] (one chunk)."""
    w = head.weight
    if h.dtype != w.dtype:
        h = h.to(w.dtype)
    with _exact_matmul():
        method = head_method(h, head)
        out = None
        if method == "fp32":
            out = torch.mm(h, w.t())
        elif method == "fp64_rounded_to_fp32":
            out = torch.mm(h, w.t()).float()
        elif method == "mm_out_dtype_fp32":
            try:
                out = torch.mm(h, w.t(), out_dtype=torch.float32)
            except (RuntimeError, TypeError) as err:
                warnings.warn(f"torch.mm(out_dtype=float32) unavailable ({err}); upcasting "
                              "the LM head per vocabulary slice instead (exact, slower)")
                _MM_OUT_DTYPE_OK["cuda"] = False
        if out is None:  # upcast in vocabulary slices so the fp32 copy stays small
            out = torch.empty(h.shape[0], w.shape[0], dtype=torch.float32, device=h.device)
            hf = h.float()
            step = 8192
            for s in range(0, w.shape[0], step):
                torch.mm(hf, w[s:s + step].float().t(), out=out[:, s:s + step])
    if head.bias is not None:
        out += head.bias.float()
    if head.softcap:
        out = torch.tanh(out / head.softcap) * head.softcap
    return out.float()


def batch_inputs(members: Sequence[ForcedSequence], width: int, device, pad_id: int = 0):
    """Right-padded input ids, attention mask (None when nothing is padded), the flat
    indices of the rows that predict response tokens, and those tokens."""
    n = len(members)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    rows, targets = [], []
    for b, s in enumerate(members):
        length = len(s.input_ids) - 1
        ids[b, :length] = torch.tensor(s.input_ids[:length], dtype=torch.long)
        mask[b, :length] = 1
        rows.append(torch.arange(s.prompt_len - 1, length) + b * width)
        targets.extend(s.response_ids)
    padded = bool((mask == 0).any())
    dev = torch.device(device)
    pin = dev.type == "cuda"

    def move(t):
        return (t.pin_memory() if pin else t).to(dev, non_blocking=pin)

    return (move(ids), move(mask) if padded else None, move(torch.cat(rows)),
            move(torch.tensor(targets, dtype=torch.long)))


def compile_layers(model, enable: bool = True) -> int:
    """torch.compile each decoder layer of the body in place (``enable=False`` undoes it).

    Regional compilation: identical layers share one compiled graph, so it compiles in
    seconds, not the minutes of a whole-model compile; dynamic shapes, so the bucketed
    batches of varying width do not recompile. It fuses the norms, rotary embedding,
    activation and residual adds; the matmuls are the same cuBLAS calls. Hidden states
    can differ from eager in the last bf16 bit (as they do between batch sizes); the
    divergence math downstream is unchanged. Returns the number of layers.
    """
    body = decoder_of(model)
    layers = list(getattr(body, "layers", []))
    if not layers:
        raise TypeError(f"cannot find the decoder layers of {type(model).__name__}")
    for module in layers + [m for m in (getattr(body, "norm", None),) if m is not None]:
        if enable:
            module.compile(dynamic=True)
        else:
            module._compiled_call_impl = None
    return len(layers)


def layers_compiled(model) -> bool:
    """Whether any decoder layer of the model is compiled (by compile_layers or the user)."""
    body = decoder_of(model)
    return any(getattr(m, "_compiled_call_impl", None) is not None
               for m in getattr(body, "layers", []))


def forward_hidden(model, ids: torch.Tensor, mask: torch.Tensor | None,
                   rows: torch.Tensor) -> torch.Tensor:
    """Final normed hidden states [n_rows, hidden] at the given flat positions (body only:
    the LM head is never applied to the whole batch)."""
    body = decoder_of(model)
    with torch.inference_mode():
        out = body(input_ids=ids, attention_mask=mask, use_cache=False)
    h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return h.reshape(-1, h.shape[-1]).index_select(0, rows)


def pair_metrics(h_p: torch.Tensor, h_q: torch.Tensor, head_p: LMHead, head_q: LMHead,
                 targets: torch.Tensor, chunk_positions: int, topk: int,
                 row_fn=None) -> torch.Tensor:
    """Every metric for n rows, as one float32 [n, 12 + 4*topk] tensor on the device (see
    ``METRIC_COLUMNS``; ranks and ids are exact in float32 below 2^24), computed chunk by
    chunk: two fp32 [chunk, vocab] logit blocks plus divergence's temporaries at a time."""
    if head_p.vocab_size != head_q.vocab_size:
        raise ValueError(f"vocabulary sizes differ ({head_p.vocab_size} vs "
                         f"{head_q.vocab_size}): the tokenizers cannot be the same")
    if head_p.vocab_size >= 2 ** 24:
        raise ValueError("vocabulary too large for the packed float32 result")
    n = h_p.shape[0]
    width = len(divergence.FLOAT_METRICS) + 2 + 4 * topk
    out = torch.empty((n, width), dtype=torch.float32, device=h_p.device)
    with torch.inference_mode():
        for s in range(0, n, chunk_positions):
            e = min(n, s + chunk_positions)
            lp = head_logits(h_p[s:e], head_p)
            lq = head_logits(h_q[s:e], head_q)
            m = divergence.token_metrics(lp, lq, targets[s:e], topk, row_fn=row_fn)
            del lp, lq
            col = 0
            for name in divergence.FLOAT_METRICS:
                out[s:e, col] = m[name]
                col += 1
            for name in divergence.INT_METRICS:
                out[s:e, col] = m[name].float()
                col += 1
            if topk:
                for name in divergence.TOPK_METRICS:
                    out[s:e, col:col + topk] = m[name].float()
                    col += topk
    return out


METRIC_COLUMNS = divergence.FLOAT_METRICS + divergence.INT_METRICS


_COPY_STREAMS: dict[int, Any] = {}


def _copy_stream(device: torch.device):
    """One side stream per GPU for host<->device copies, so they overlap the compute."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _COPY_STREAMS:
        _COPY_STREAMS[index] = torch.cuda.Stream(device=index)
    return _COPY_STREAMS[index]


class _HostCopy:
    """A device tensor on its way to pinned host memory on the copy stream, without
    blocking the caller or the compute stream."""

    def __init__(self, t: torch.Tensor):
        if t.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
            stream = _copy_stream(t.device)
            stream.wait_event(ready)
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            with torch.cuda.stream(stream):
                self.host.copy_(t, non_blocking=True)
                t.record_stream(stream)  # keep t's memory until the copy is done
                self.event = torch.cuda.Event()
                self.event.record(stream)
        else:
            self.host, self.event = t, None

    def get(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host


def _host_slices(t: torch.Tensor, slice_bytes: int = 64 << 20):
    """A device tensor that does not change while the run goes on (the LM head, 1 GB at
    8B) as consecutive CPU slices, streamed through one pinned 64 MB buffer on a stream of
    its own: the forward's stream and the per-batch copy stream never wait for it, and no
    GB-sized pinned allocation is made. Each slice is valid until the next is asked for."""
    flat = t.reshape(-1)
    step = max(1, slice_bytes // t.element_size())
    if t.device.type != "cuda":
        yield from (flat[s:s + step] for s in range(0, flat.numel(), step))
        return
    stream = torch.cuda.Stream(device=t.device)
    buf = torch.empty(min(step, flat.numel()), dtype=t.dtype, pin_memory=True)
    for s in range(0, flat.numel(), step):
        n = min(step, flat.numel() - s)
        with torch.cuda.stream(stream):
            buf[:n].copy_(flat[s:s + n], non_blocking=True)
        stream.synchronize()
        yield buf[:n]


class _DeviceCopy:
    """A (pinned) host tensor on its way to the device on the copy stream; ``get()``
    makes the compute stream wait for it and returns the device tensor."""

    def __init__(self, host: torch.Tensor, device: torch.device):
        self.event = None
        if device.type == "cuda" and host.is_pinned():
            with torch.cuda.stream(_copy_stream(device)):
                self.tensor = host.to(device, non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record()
        else:
            self.tensor = host.to(device)

    def get(self) -> torch.Tensor:
        if self.event is not None:
            compute = torch.cuda.current_stream(self.tensor.device)
            compute.wait_event(self.event)
            self.tensor.record_stream(compute)  # freed after the compute stream's use
            self.event = None
        return self.tensor


# ----------------------------------------------------------------------------- hidden cache

class HiddenCache:
    """Final hidden states of one model over forced sequences, content-addressed by batch.

    Files: model.json (identity: name, dtype, hidden size, tokenizer), head.safetensors,
    h-<hash>.safetensors (tensor "hidden" [rows, hidden] + header metadata: rollout ids,
    row counts, sequence hashes), index.json (written by finish(): the rollouts covered).
    A shard holds exactly one batch; any later run can read any rollout from it, whatever
    its own batching, after checking the sequence hash.
    """

    MODEL = "model.json"
    HEAD = "head.safetensors"
    INDEX = "index.json"

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self._index: dict[str, tuple[str, int, int, str]] | None = None
        self._handles: dict[str, Any] = {}

    # identity ----------------------------------------------------------------
    def exists(self) -> bool:
        return (self.folder / self.MODEL).exists()

    def identity(self) -> dict:
        if not self.exists():
            raise FileNotFoundError(
                f"no hidden-state cache at {self.folder}: this model has not been forwarded "
                "over these rollouts yet (run notebook 03 for it, or pass its model)")
        return storage.read_json(self.folder / self.MODEL)

    def begin(self, identity: dict, overwrite: bool = False) -> None:
        if self.exists():
            old = self.identity()
            diff = tokenizers.identity_diff(old, identity)
            if diff and not overwrite:
                raise RuntimeError(f"{self.folder} caches another model or setting (differs "
                                   f"in {diff}); pass overwrite=True to discard it")
            if diff:
                for f in self.folder.glob("*"):
                    if f.is_file():
                        f.unlink()
        self.folder.mkdir(parents=True, exist_ok=True)
        for tmp in self.folder.glob(".*.tmp*"):  # litter of a killed run
            tmp.unlink()
        if not (self.folder / self.MODEL).exists():
            storage.atomic_write_json(self.folder / self.MODEL, identity)

    # head ----------------------------------------------------------------------
    def has_head(self) -> bool:
        return (self.folder / self.HEAD).exists()

    def save_head(self, head: LMHead) -> None:
        """The sliced LM head (1 GB at 8B; the engine saves it from a background thread)."""
        path = self.folder / self.HEAD
        if path.exists():
            return
        tensors = {"weight": head.weight.detach()}
        if head.bias is not None:
            tensors["bias"] = head.bias.detach()
        storage.write_tensors(path, tensors, {k: json.dumps(v) for k, v in head.facts().items()},
                              host_slices=_host_slices)

    def load_head(self, device) -> LMHead:
        path = self.folder / self.HEAD
        if not path.exists():
            raise FileNotFoundError(f"{path} missing: the cache holds no LM head; pass the "
                                    "model of this side instead")
        # pageable, not pinned: pinning 1 GB once costs more (~0.4 s) than it saves
        tensors, meta = storage.read_tensors(path)
        meta = {k: json.loads(v) for k, v in meta.items()}
        head = LMHead(tensors["weight"], tensors.get("bias"), meta.get("softcap"),
                      meta.get("rows_in_model", 0), meta.get("padded_rows_dropped", 0))
        return head.to(device)

    # shards ---------------------------------------------------------------------
    @staticmethod
    def shard_name(members: Sequence[ForcedSequence]) -> str:
        blob = json.dumps([s.content_hash() for s in members])
        return f"h-{hashlib.sha256(blob.encode()).hexdigest()[:20]}.safetensors"

    def has(self, members: Sequence[ForcedSequence]) -> bool:
        return (self.folder / self.shard_name(members)).exists()

    def save(self, members: Sequence[ForcedSequence], hidden: torch.Tensor) -> None:
        meta = {
            "rollout_ids": json.dumps([s.rollout_id for s in members]),
            "rows": json.dumps([s.n_rows for s in members]),
            "hashes": json.dumps([s.content_hash() for s in members]),
        }
        storage.write_tensors(self.folder / self.shard_name(members), {"hidden": hidden}, meta)
        self._index = None

    def index(self) -> dict[str, tuple[str, int, int, str]]:
        """rollout id -> (shard file, first row, rows, sequence hash), from shard headers."""
        if self._index is None:
            from safetensors import safe_open
            idx: dict[str, tuple[str, int, int, str]] = {}
            for path in sorted(self.folder.glob("h-*.safetensors")):
                with safe_open(str(path), framework="pt", device="cpu") as f:
                    meta = f.metadata() or {}
                start = 0
                for rid, n, hsh in zip(json.loads(meta["rollout_ids"]), json.loads(meta["rows"]),
                                       json.loads(meta["hashes"])):
                    idx.setdefault(rid, (path.name, start, n, hsh))
                    start += n
            self._index = idx
        return self._index

    def missing(self, members: Iterable[ForcedSequence]) -> list[str]:
        idx = self.index()
        return [s.rollout_id for s in members
                if s.rollout_id not in idx or idx[s.rollout_id][3] != s.content_hash()]

    def rows(self, members: Sequence[ForcedSequence], pin_memory: bool = False) -> torch.Tensor:
        """Hidden rows of these sequences, concatenated in order (CPU tensor, pinned for a
        non-blocking copy to the GPU if asked)."""
        from safetensors import safe_open
        if self.has(members):  # the common case: the same batch was cached whole
            path = self.folder / self.shard_name(members)
            return storage.read_tensors(path, ["hidden"], pin_memory=pin_memory)[0]["hidden"]
        idx = self.index()
        parts = []
        for s in members:
            name, start, n, hsh = idx[s.rollout_id]
            if hsh != s.content_hash() or n != s.n_rows:
                raise RuntimeError(f"cached hidden states of {s.rollout_id!r} in {self.folder} "
                                   "belong to another forced sequence")
            if name not in self._handles:
                self._handles[name] = safe_open(str(self.folder / name), framework="pt",
                                                device="cpu")
            parts.append(self._handles[name].get_slice("hidden")[start:start + n])
        out = torch.cat(parts)
        return out.pin_memory() if pin_memory else out

    def finish(self, seqs: SequenceSet, facts: dict) -> None:
        idx = self.index()
        covered = sorted(r for r in idx)
        storage.atomic_write_json(self.folder / self.INDEX, {
            **facts, "rollouts": len(covered), "shards": len({v[0] for v in idx.values()}),
            "sequences_fingerprint": seqs.fingerprint(), "complete": True})
        self._handles.clear()


# ----------------------------------------------------------------------------- engine

@dataclass
class Side:
    """One model of a compared pair: forwarded if ``model`` is given (hidden states saved
    to ``cache_dir`` when given), else read from ``cache_dir``."""

    name: str
    model: Any = None
    tokenizer: Any = None
    cache_dir: str | os.PathLike | None = None

    def cache(self) -> HiddenCache | None:
        return HiddenCache(self.cache_dir) if self.cache_dir is not None else None


def hidden_dir(suite: str, model_name: str) -> Path:
    return paths.table_dir(suite, f"hidden/{model_name}")


def pair_dir(suite: str, checkpoint: str, reference: str) -> Path:
    return paths.table_dir(suite, f"tokens/{checkpoint}__vs__{reference}")


def _model_identity(side: Side, seqs: SequenceSet) -> dict:
    p = next(side.model.parameters())
    return {"name": side.name, "dtype": str(p.dtype).replace("torch.", ""),
            "hidden_size": getattr(getattr(side.model, "config", None), "hidden_size", None),
            "tokenizer": seqs.tokenizer}


def _prepare_side(side: Side, seqs: SequenceSet, device, longest: int) -> tuple[LMHead, dict]:
    """Every check of one side, before any forward; returns its head on the device."""
    cache = side.cache()
    facts: dict[str, Any] = {"name": side.name}
    if side.tokenizer is not None:
        tokenizers.check_identities(tokenizers.tokenizer_identity(side.tokenizer), seqs.tokenizer,
                          (side.name, "the forced sequences"))
    if side.model is not None:
        ctx = model_context(side.model)
        if ctx is not None and longest > ctx:
            raise ValueError(f"{side.name}: a forced sequence has {longest} tokens, more than "
                             f"its context {ctx}; build the sequences with max_context={ctx}")
        head = lm_head_of(side.model, seqs.tokenizer["size"])
        ident = _model_identity(side, seqs)
        if cache is not None:
            cache.begin(ident)  # its head is saved by run_pair, in the background
        facts.update(ident, source="forward", device=str(next(side.model.parameters()).device))
    else:
        if cache is None:
            raise ValueError(f"side {side.name!r} has neither a model nor a cache_dir")
        ident = cache.identity()
        tokenizers.check_identities(ident.get("tokenizer", {}), seqs.tokenizer,
                          (f"{side.name} (cache)", "the forced sequences"))
        missing = cache.missing(seqs.sequences)
        if missing:
            raise FileNotFoundError(
                f"the hidden-state cache of {side.name!r} at {cache.folder} lacks "
                f"{len(missing)} of {len(seqs)} rollouts (e.g. {missing[:3]}): forward "
                f"{side.name} over these rollouts first (pass its model)")
        head = cache.load_head(device)
        facts.update(ident, source="cache", cache=str(cache.folder))
    if head.vocab_size != seqs.tokenizer["size"]:
        raise ValueError(f"{side.name}: LM head vocabulary {head.vocab_size} != tokenizer "
                         f"size {seqs.tokenizer['size']}")
    facts["head"] = head.facts()
    return head.to(device), facts


def _rows_table(members: Sequence[ForcedSequence], host: np.ndarray, suite: str,
                checkpoint: str, reference: str, topk: int) -> pa.Table:
    """One batch of the per-token table, built column by column in Arrow (no per-row
    Python objects but the token strings), so writing keeps up with the GPU."""
    lengths = [s.n_rows for s in members]
    n = int(sum(lengths))
    if host.shape[0] != n:
        raise RuntimeError(f"internal: {host.shape[0]} metric rows for {n} response tokens")
    finite_cols = [j for j, name in enumerate(divergence.FLOAT_METRICS) if name != "k3"]
    bad = ~np.isfinite(host[:, finite_cols]).all(axis=1) | np.isnan(host[:, :len(METRIC_COLUMNS)]).any(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        seq = np.repeat(np.arange(len(members)), lengths)[i]
        raise FloatingPointError(f"non-finite metrics at rollout {members[seq].rollout_id!r} "
                                 f"pos {i - int(np.sum(lengths[:seq]))}: the logits were not finite")
    cols: dict[str, Any] = {
        "suite": pa.array([suite] * n, pa.string()),
        "checkpoint": pa.array([checkpoint] * n, pa.string()),
        "reference": pa.array([reference] * n, pa.string()),
        "problem_id": pa.array(np.repeat([s.problem_id for s in members], lengths), pa.string()),
        "rollout_id": pa.array(np.repeat([s.rollout_id for s in members], lengths), pa.string()),
        "pos": np.concatenate([np.arange(k, dtype=np.int32) for k in lengths]),
        "token_id": np.concatenate([np.asarray(s.response_ids, dtype=np.int32) for s in members]),
        "token": pa.array([t for s in members for t in s.tokens], pa.string()),
        "char_start": np.concatenate([np.asarray(s.char_start, dtype=np.int32) for s in members]),
        "char_end": np.concatenate([np.asarray(s.char_end, dtype=np.int32) for s in members]),
    }
    for j, name in enumerate(METRIC_COLUMNS):
        col = host[:, j]
        cols[name] = col.astype(np.int32) if name in divergence.INT_METRICS else col.astype(np.float32)
    base = len(METRIC_COLUMNS)
    offsets = pa.array(np.arange(0, (n + 1) * topk, topk, dtype=np.int32))
    for j, name in enumerate(divergence.TOPK_METRICS):
        block = host[:, base + j * topk: base + (j + 1) * topk]
        block = block.astype(np.int32 if "ids" in name else np.float32).reshape(-1)
        cols[name] = pa.ListArray.from_arrays(offsets, pa.array(block))
    return pa.Table.from_pydict(cols, schema=schemas.TOKENS)


def run_pair(seqs: SequenceSet, ckpt: Side, ref: Side, out_dir: str | os.PathLike | None, *,
             suite: str, batch_tokens: int = 8192, chunk_positions: int = 1024, topk: int = 5,
             device: str | torch.device = "cpu", provenance: dict | None = None,
             overwrite: bool = False, compile: bool | None = None,
             compile_body: bool | None = None,
             max_sequences: int | None = None, progress: bool = True) -> Path | None:
    """Per-token table of (ckpt vs ref) over ``seqs``, plus the hidden-state caches of any
    forwarded side. Resumable; returns the table folder. ``out_dir=None`` only fills the
    caches (forward_to_cache).

    compile: fused/compiled metric math (default: yes). compile_body: torch.compile the
    forwarded models' decoder layers for this run (``compile_layers``; default: on CUDA),
    undone afterwards; if compiling fails, the run goes on eager with a warning."""
    if chunk_positions < 1 or topk < 0:
        raise ValueError("chunk_positions must be >= 1 and topk >= 0")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but CUDA is not available")
    if len(seqs) == 0:
        raise ValueError("no forced sequences")
    longest = max(len(s.input_ids) for s in seqs.sequences)
    sides = [ckpt] if out_dir is None else [ckpt, ref]
    if out_dir is not None and ckpt.tokenizer is not None and ref.tokenizer is not None:
        tokenizers.check_same_tokenizer(ckpt.tokenizer, ref.tokenizer, (ckpt.name, ref.name))
    prepared = [_prepare_side(s, seqs, device, longest) for s in sides]
    heads = [p[0] for p in prepared]
    side_facts = [p[1] for p in prepared]
    caches = [s.cache() for s in sides]
    batches = plan_batches(seqs, batch_tokens, max_sequences)
    members_of = [[seqs.sequences[i] for i in b.members] for b in batches]
    row_fn = divergence.compiled_row_fn(device) if compile in (None, True) else None
    if compile is True and row_fn is None and device.type == "cuda":
        warnings.warn("compile=True but torch.compile is unavailable: eager math")
    settings = {"batch_tokens": batch_tokens, "max_sequences": max_sequences,
                "chunk_positions": chunk_positions, "topk": topk,
                "device": device.type, "metric_kernel": divergence.row_fn_kind(row_fn),
                "compiled_layers": (device.type == "cuda" if compile_body is None
                                    else bool(compile_body))}
    table = None
    if out_dir is not None:
        table = storage.ShardedTable(out_dir, schemas.TOKENS)
        run_fp = storage.fingerprint({
            "suite": suite, "checkpoint": ckpt.name, "reference": ref.name,
            "sequences": seqs.fingerprint(), **settings,
            "sides": [{k: f.get(k) for k in ("name", "dtype", "hidden_size")} for f in side_facts],
            "models": (provenance or {}).get("models")})
        table.begin(run_fp, overwrite=overwrite)
        done = table.done()
    else:
        done = set()

    todo = [k for k, b in enumerate(batches)
            if (table is not None and b.key not in done)
            or any(s.model is not None and c is not None and not c.has(members_of[k])
                   for s, c in zip(sides, caches))]
    pad_id = 0
    t0 = time.perf_counter()
    rows_done = 0
    loader = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlprobe-load")
    writer = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlprobe-write")
    pending: list[cf.Future] = []
    # LM heads of forwarded sides go to their caches alongside the first batches (1 GB at
    # 8B); the cache is only marked complete (finish) once its head is there
    head_saver = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlprobe-head")
    head_saves = [head_saver.submit(c.save_head, h) for s, c, h in zip(sides, caches, heads)
                  if s.model is not None and c is not None and not c.has_head()]

    def load_cached(k: int):
        out = []
        for s, c in zip(sides, caches):
            if s.model is None or (c is not None and c.has(members_of[k])):
                out.append(c.rows(members_of[k], pin_memory=device.type == "cuda"))
            else:
                out.append(None)
        return out

    def write_batch(k, hidden_copies, metric_copy):
        for c, hc in zip(caches, hidden_copies):
            if hc is not None:
                c.save(members_of[k], hc.get())
        if metric_copy is not None:
            host = metric_copy.get().numpy()
            table.write_shard(batches[k].key,
                              _rows_table(members_of[k], host, suite, ckpt.name, ref.name, topk))

    # models whose layers the caller compiled already are left as they are
    compiled = {id(s.model): s.model for s in sides
                if s.model is not None and settings["compiled_layers"]
                and not layers_compiled(s.model)}
    waits = {"reads": 0.0, "writes": 0.0}

    def forward(model, ids, mask, rows):
        try:
            return forward_hidden(model, ids, mask, rows)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # noqa: BLE001 - a compiler failure: go on eager
            if id(model) not in compiled:
                raise
            warnings.warn(f"compiled decoder layers failed ({err!r}); forwarding eager")
            compile_layers(compiled.pop(id(model)), enable=False)
            return forward_hidden(model, ids, mask, rows)

    try:
        for model in compiled.values():
            compile_layers(model)
        future = loader.submit(load_cached, todo[0]) if todo else None
        bar = tqdm(todo, desc=f"forcing {ckpt.name}" + ("" if out_dir is None else f" vs {ref.name}"),
                   unit="batch", disable=not progress)
        for pos, k in enumerate(bar):
            batch, members = batches[k], members_of[k]
            t_wait = time.perf_counter()
            cached = future.result()
            waits["reads"] += time.perf_counter() - t_wait
            future = loader.submit(load_cached, todo[pos + 1]) if pos + 1 < len(todo) else None
            ids = mask = rows = None
            targets = None
            hidden, copies = [], []
            for s, c, h_cached in zip(sides, caches, cached):
                if h_cached is not None:
                    hidden.append(_DeviceCopy(h_cached, device))
                    copies.append(None)
                    continue
                if ids is None:
                    ids, mask, rows, targets = batch_inputs(members, batch.width, device, pad_id)
                h = forward(s.model, ids, mask, rows)
                hidden.append(h)
                copies.append(_HostCopy(h) if c is not None else None)
            metric_copy = None
            if table is not None and batch.key not in done:
                if targets is None:
                    targets = torch.tensor([t for s in members for t in s.response_ids],
                                           dtype=torch.long).to(device)
                hidden = [h.get() if isinstance(h, _DeviceCopy) else h for h in hidden]
                packed = pair_metrics(hidden[0], hidden[1], heads[0], heads[1], targets,
                                      chunk_positions, topk, row_fn)
                metric_copy = _HostCopy(packed)
            t_wait = time.perf_counter()
            while len(pending) >= 2:
                pending.pop(0).result()
            waits["writes"] += time.perf_counter() - t_wait
            pending.append(writer.submit(write_batch, k, copies, metric_copy))
            rows_done += sum(s.n_rows for s in members)
            bar.set_postfix(tok_s=f"{rows_done / max(time.perf_counter() - t0, 1e-9):.0f}")
        t_wait = time.perf_counter()
        for f in pending + head_saves:
            f.result()
        waits["writes"] += time.perf_counter() - t_wait
    finally:
        loader.shutdown(wait=True)
        writer.shutdown(wait=True)
        head_saver.shutdown(wait=True)
        for model in compiled.values():
            compile_layers(model, enable=False)
    elapsed = time.perf_counter() - t0
    facts = {
        **seqs.facts(), **settings, "sides": side_facts,
        "head_matmul": head_method(torch.empty(1, 1, dtype=heads[0].weight.dtype, device=device),
                                   heads[0]),
        "batches": len(batches), "batches_computed_this_run": len(todo),
        "seconds_this_run": round(elapsed, 3),
        # the forward loop waiting on the disk (reading cached hidden states / writing)
        "seconds_waiting_for_reads": round(waits["reads"], 3),
        "seconds_waiting_for_writes": round(waits["writes"], 3),
        "compiled_layers_used": bool(compiled),
        "response_tokens_per_s_this_run": round(rows_done / elapsed, 1) if elapsed > 0 else None,
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "clamp": "KL clamped to >= 0, JS to [0, ln 2] (rounding-level moves only)",
    }
    for s, c, f in zip(sides, caches, side_facts):
        if s.model is not None and c is not None:
            c.finish(seqs, {"model": f, "settings": settings})
    if table is None:
        return None
    manifest = {**(provenance or {}), "table": "tokens", "suite": suite, "checkpoint": ckpt.name,
                "reference": ref.name, "engine": facts}
    return table.finish(manifest, [b.key for b in batches])


def run_checkpoint(seqs: SequenceSet, ckpt: Side, ref: Side, out_dir, **kw) -> Path:
    """One more checkpoint: forward ``ckpt`` (saving its hidden states) and compare it with
    the reference (normally cache-only: ``Side(name, cache_dir=...)``)."""
    if ckpt.model is None:
        raise ValueError(f"run_checkpoint forwards the checkpoint: give {ckpt.name!r} a model "
                         "(or use compare_cached for two cached models)")
    return run_pair(seqs, ckpt, ref, out_dir, **kw)


def compare_cached(seqs: SequenceSet, ckpt: str | Side, ref: str | Side, out_dir, *,
                   suite: str, **kw) -> Path:
    """A pair from two hidden-state caches and their stored LM heads: no forward at all."""
    sides = []
    for s in (ckpt, ref):
        side = s if isinstance(s, Side) else Side(s, cache_dir=hidden_dir(suite, s))
        if side.model is not None:
            side = Side(side.name, None, side.tokenizer, side.cache_dir)
        sides.append(side)
    return run_pair(seqs, sides[0], sides[1], out_dir, suite=suite, **kw)


def forward_to_cache(seqs: SequenceSet, side: Side, **kw) -> None:
    """Forward one model over the sequences into its hidden-state cache (e.g. the
    reference, once). Resumable like everything else."""
    if side.model is None or side.cache_dir is None:
        raise ValueError("forward_to_cache needs a model and a cache_dir")
    kw.setdefault("suite", "")
    run_pair(seqs, side, side, None, **kw)

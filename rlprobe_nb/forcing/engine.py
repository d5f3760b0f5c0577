"""The device loop: forward each model of a pair once, compare the two next-token
distributions at every response token, write the table and the hidden-state caches.

A ``Side`` is one model of a pair: with ``model`` it is forwarded (and its final hidden
states are saved to ``cache_dir``, batch by batch); without a model its hidden states and
LM head come from ``cache_dir``, which must already hold every rollout. So:
  - the reference is forwarded once (``forward_to_cache`` or its first pair);
  - "one more checkpoint" = ``run_checkpoint``: forward the checkpoint, and while its
    hidden states are on the device compute every metric against the cached reference;
  - any further pair (rlvr_step_1200 vs rlvr_step_400, dpo vs sft) = ``compare_cached``:
    two caches, two LM heads, no forward at all.

``run_pair`` goes in named steps (``_PairRun``): prepare (every check of both sides, before
any forward; the table's writer lock and key), plan (the sequences whose rows or cached
states are missing, in length-bucketed batches), the loop (cached states prefetched on a
thread, copies on a side stream, shards written on a thread so the device never waits),
finish (caches indexed, the manifest written last). Everything is resumable: shards and
cache files are named by their content, so a rerun at any batch size computes only what
is missing. An out-of-memory error halves ``batch_tokens`` and goes on
(accelerate's ``find_executable_batch_size``); finished shards are kept. Rows move with
the batches by float32 rounding of the model body (``precision.BATCH_TOLERANCE``), so
every shard and cache file records the batch_tokens it was computed at and the manifest
names them all (``engine.batch_tokens``, and per cached side).

A run can be shared among processes (``forcing.sharded.run_pair``): the coordinator takes the
locks, plans the batches over every missing sequence (``pending`` and ``plan_batches``)
and gives each worker whole batches; a worker's ``run_pair(..., share=Share(...))``
computes only its sequences (planned over them alone, its batches are the coordinator's),
writes their shards and cache files, and leaves its facts for the coordinator, which
writes the manifest and the caches' index.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlprobe_nb.forcing import metrics
from rlprobe_nb.forcing.batching import Batch, batch_inputs, plan_batches
from rlprobe_nb.forcing.body import compile_layers, forward_hidden, layers_compiled, model_context
from rlprobe_nb.forcing.heads import LMHead, check_padded_mass, head_method, lm_head_of, pair_metrics
from rlprobe_nb.forcing.hidden_cache import HiddenCache
from rlprobe_nb.forcing.shared_prompts import forward_shared, shares_prompts
from rlprobe_nb.forcing.sequences import ForcedSequence, SequenceSet
from rlprobe_nb.forcing.token_table import UNIQUE, batch_sizes, covered_rollouts, rows_table
from rlprobe_nb.forcing.token_table import table_key, with_batch_tokens
from rlprobe_nb.forcing.transfer import DeviceCopy, HostCopy
from rlprobe_nb.generation.out_of_memory import halving_on_oom, is_out_of_memory
from rlprobe_nb.progress import tqdm
from rlprobe_nb.suite import paths, tokenizers
from rlprobe_nb.tables import keys, lineage, schemas, storage

# The code a model's cached hidden states depend on: the forward of the body, the cache.
HIDDEN_CODE = ("forcing/body.py", "forcing/hidden_cache.py", "forcing/batching.py",
               "forcing/shared_prompts.py")


@dataclass
class Side:
    """One model of a compared pair: forwarded if ``model`` is given (hidden states saved
    to ``cache_dir`` when given), else read from ``cache_dir``. ``identity``: what the
    model's outputs depend on (``models.model_identity``), recorded in its cache so a
    cache is never reused for changed weights."""

    name: str
    model: Any = None
    tokenizer: Any = None
    cache_dir: str | os.PathLike | None = None
    identity: dict | None = None

    def cache(self) -> HiddenCache | None:
        return HiddenCache(self.cache_dir) if self.cache_dir is not None else None


@dataclass(frozen=True)
class Share:
    """This process's part of a run that another process coordinates: the rollouts it
    computes, whether it saves the forwarded sides' LM heads (one worker does), and the
    file where it leaves its facts for the coordinator's manifest."""

    rollouts: frozenset
    saves_heads: bool
    facts_file: Path


def hidden_dir(suite: str, model_name: str, identity: dict | None = None) -> Path:
    """A model's hidden-state cache; with its identity, a folder of its own per identity
    (changed weights get a fresh cache, never the old states)."""
    folder = paths.table_dir(suite, f"hidden/{model_name}")
    return folder / keys.key_sha(identity) if identity is not None else folder


def pair_dir(suite: str, checkpoint: str, reference: str) -> Path:
    return paths.table_dir(suite, paths.token_table_name(checkpoint, reference))


def _cache_identity(side: Side, seqs: SequenceSet) -> dict:
    p = next(side.model.parameters())
    return {"name": side.name, "dtype": str(p.dtype).replace("torch.", ""),
            "hidden_size": getattr(getattr(side.model, "config", None), "hidden_size", None),
            "tokenizer": seqs.tokenizer, "model": side.identity,
            "code": lineage.code_hashes(None, HIDDEN_CODE)["files"]}


def pending(seqs: SequenceSet, out_dir: Path | None, forwarded: list[HiddenCache]
            ) -> tuple[list[ForcedSequence], list[ForcedSequence]]:
    """The sequences whose rows the table in ``out_dir`` lacks (none without a table), and
    the others that one of the ``forwarded`` sides' caches lacks."""
    covered: set[str] = set()
    if out_dir is not None:
        for rollouts in covered_rollouts(storage.parts_on_disk(storage.work_dir(out_dir))).values():
            covered |= rollouts
    need_rows = [s for s in seqs.sequences if out_dir is not None and s.rollout_id not in covered]
    rest = [s for s in seqs.sequences if out_dir is None or s.rollout_id in covered]
    return need_rows, [s for s in rest if any(c.missing([s]) for c in forwarded)]


def _join_cache(cache: HiddenCache, identity: dict) -> None:
    """A worker's side of ``HiddenCache.begin``: the coordinator holds the lock; the cache
    must be of this identity (the first worker records it)."""
    if not cache.exists():
        storage.atomic_write_json(cache.folder / cache.MODEL, identity)
    elif keys.key_sha(cache.identity()) != keys.key_sha(identity):
        raise storage.StaleTableError(
            f"{cache.folder} caches another model or setting "
            f"({keys.describe_difference(cache.identity(), identity)})")


def _prepare_side(side: Side, cache: HiddenCache | None, seqs: SequenceSet, device,
                  longest: int, shared: bool = False, overwrite: bool = False
                  ) -> tuple[LMHead, dict]:
    """Every check of one side, before any forward; returns its head on the device. A
    forwarded side's cache of another identity is refused, or discarded with ``overwrite``."""
    facts: dict[str, Any] = {"name": side.name}
    if side.tokenizer is not None:
        tokenizers.check_identities(tokenizers.tokenizer_identity(side.tokenizer),
                                    seqs.tokenizer, (side.name, "the forced sequences"))
    if side.model is not None:
        ctx = model_context(side.model)
        if ctx is not None and longest > ctx:
            raise ValueError(f"{side.name}: a forced sequence has {longest} tokens, more than "
                             f"its context {ctx}; build the sequences with max_context={ctx}")
        head = lm_head_of(side.model, seqs.tokenizer["size"])
        ident = _cache_identity(side, seqs)
        if cache is not None and shared:
            _join_cache(cache, ident)
        elif cache is not None:
            cache.begin(ident, overwrite)  # its head is saved by run_pair, in the background
        facts.update(ident, source="forward", device=str(next(side.model.parameters()).device))
    else:
        if cache is None:
            raise ValueError(f"side {side.name!r} has neither a model nor a cache_dir")
        ident = cache.identity()
        tokenizers.check_identities(ident.get("tokenizer", {}), seqs.tokenizer,
                                    (f"{side.name} (cache)", "the forced sequences"))
        if side.identity is not None and ident.get("model") != side.identity:
            raise storage.StaleTableError(
                f"the hidden-state cache of {side.name!r} at {cache.folder} was made by "
                f"another model ({keys.describe_difference(ident.get('model'), side.identity)}): "
                f"forward {side.name} again")
        missing = cache.missing(seqs.sequences)
        if missing:
            raise FileNotFoundError(
                f"the hidden-state cache of {side.name!r} at {cache.folder} lacks "
                f"{len(missing)} of {len(seqs)} rollouts (e.g. {missing[:3]}): forward "
                f"{side.name} over these rollouts first (pass its model)")
        head = cache.load_head(device)
        facts.update(ident, source="cache", cache=str(cache.folder),
                     batch_tokens=cache.batch_tokens(seqs.sequences))
    if head.vocab_size != seqs.tokenizer["size"]:
        raise ValueError(f"{side.name}: LM head vocabulary {head.vocab_size} != tokenizer "
                         f"size {seqs.tokenizer['size']}")
    return head.to(device), facts


class _PairRun:
    """One call of ``run_pair``, in named steps (see the module docstring)."""

    def __init__(self, seqs: SequenceSet, ckpt: Side, ref: Side, out_dir, *, suite: str,
                 chunk_positions: int, topk: int, device, provenance: dict | None,
                 overwrite: bool, compile: bool | None, compile_body: bool | None,
                 max_sequences: int | None, progress: bool, key: dict | None,
                 share: Share | None = None):
        if chunk_positions < 1 or topk < 0:
            raise ValueError("chunk_positions must be >= 1 and topk >= 0")
        self.t_created, self.device = time.perf_counter(), torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but CUDA is not available")
        if len(seqs) == 0:
            raise ValueError("no forced sequences")
        self.seqs, self.ckpt, self.ref, self.suite = seqs, ckpt, ref, suite
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.chunk_positions, self.topk = chunk_positions, topk
        self.provenance, self.overwrite, self.progress = provenance, overwrite, progress
        self.max_sequences, self.key, self.share = max_sequences, key, share
        self.sides = [ckpt] if out_dir is None else [ckpt, ref]
        self.compile, self.compile_body = compile, compile_body
        self.batch_sizes: list[int] = []
        self.computed, self.rows_done = 0, 0
        self.waits = {"reads": 0.0, "writes": 0.0, "heads": 0.0}
        self.table: storage.ShardedTable | None = None
        self.caches: list[HiddenCache | None] = []

    # step 1 ----------------------------------------------------------------------
    def prepare(self) -> bool:
        """Check both sides and take the table; True when the table is already complete."""
        if self.out_dir is not None and self.ckpt.tokenizer is not None and self.ref.tokenizer is not None:
            tokenizers.check_same_tokenizer(self.ckpt.tokenizer, self.ref.tokenizer,
                                            (self.ckpt.name, self.ref.name))
        longest = max(len(s.input_ids) for s in self.seqs.sequences)
        self.caches = [s.cache() for s in self.sides]
        prepared = [_prepare_side(s, c, self.seqs, self.device, longest, self.share is not None,
                                  self.overwrite) for s, c in zip(self.sides, self.caches)]
        self.heads = [p[0] for p in prepared]
        self.side_facts = [p[1] for p in prepared]
        self.row_fn = (metrics.compiled_row_fn(self.device)
                       if self.compile in (None, True) else None)
        self.compiled_layers = (self.device.type == "cuda" if self.compile_body is None
                                else bool(self.compile_body))
        if self.out_dir is None:
            return False
        self.table = storage.ShardedTable(self.out_dir, schemas.TOKENS, unique=UNIQUE)
        if self.share is not None:  # the coordinator began the table
            return False
        key = table_key(self.seqs, self.ckpt.name, self.ref.name, self.topk, self.key)
        what = f"(teacher forcing {self.ckpt.name} vs {self.ref.name})"
        return self.table.begin(key, overwrite=self.overwrite, what=what)

    # step 2 ----------------------------------------------------------------------
    def plan(self, batch_tokens: int) -> tuple[list[Batch], list[list[ForcedSequence]], int]:
        """Batches of the sequences still to do: first those whose rows are missing (they
        get metrics), then those only a forwarded side's cache lacks. Returns the batches,
        their members, and how many of the batches are of the first kind."""
        need_rows, need_cache = pending(
            self.seqs, self.out_dir if self.table is not None else None,
            [c for side, c in zip(self.sides, self.caches) if side.model is not None and c is not None])
        if self.share is not None:
            need_rows = [s for s in need_rows if s.rollout_id in self.share.rollouts]
            need_cache = [s for s in need_cache if s.rollout_id in self.share.rollouts]
        first = plan_batches(need_rows, batch_tokens, self.max_sequences) if need_rows else []
        second = plan_batches(need_cache, batch_tokens, self.max_sequences) if need_cache else []
        members = ([[need_rows[i] for i in b.members] for b in first]
                   + [[need_cache[i] for i in b.members] for b in second])
        return first + second, members, len(first)

    # step 3 ----------------------------------------------------------------------
    def loop(self, batch_tokens: int) -> None:
        """Compute every missing batch at this batch size (called again, smaller, after
        an out-of-memory error)."""
        batches, members, n_rows_batches = self.plan(batch_tokens)
        self.batch_sizes.append(batch_tokens)
        if not batches:
            return
        loader = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlprobe-load")
        writer = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlprobe-write")
        pending: list[cf.Future] = []
        try:
            future = loader.submit(self._load_cached, members[0])
            bar = tqdm(range(len(batches)), unit="batch", disable=not self.progress,
                       desc=f"forcing {self.ckpt.name}"
                       + ("" if self.out_dir is None else f" vs {self.ref.name}"))
            t0 = time.perf_counter()
            for k in bar:
                t_wait = time.perf_counter()
                cached = future.result()
                self.waits["reads"] += time.perf_counter() - t_wait
                if k + 1 < len(batches):
                    future = loader.submit(self._load_cached, members[k + 1])
                copies, metric_copy = self._compute(batches[k], members[k], cached,
                                                    with_rows=k < n_rows_batches)
                t_wait = time.perf_counter()
                while len(pending) >= 2:
                    pending.pop(0).result()
                self.waits["writes"] += time.perf_counter() - t_wait
                pending.append(writer.submit(self._write, batches[k], members[k], copies,
                                             metric_copy, batch_tokens))
                self.computed += 1
                self.rows_done += sum(s.n_rows for s in members[k])
                bar.set_postfix(tok_s=f"{self.rows_done / max(time.perf_counter() - t0, 1e-9):.0f}")
            t_wait = time.perf_counter()
            for f in pending:
                f.result()
            self.waits["writes"] += time.perf_counter() - t_wait
        finally:
            loader.shutdown(wait=True)
            writer.shutdown(wait=True)

    def _load_cached(self, members: list[ForcedSequence]) -> list:
        pin = self.device.type == "cuda"
        return [c.rows(members, pin_memory=pin)
                if s.model is None or (c is not None and c.has(members)) else None
                for s, c in zip(self.sides, self.caches)]

    def _compute(self, batch: Batch, members, cached, with_rows: bool):
        """Forward (or fetch) both sides' hidden states; the packed metrics if wanted."""
        ids = mask = rows = targets = None
        hidden, copies = [], []
        for side, cache, head, h_cached in zip(self.sides, self.caches, self.heads, cached):
            if h_cached is not None:
                hidden.append(DeviceCopy(h_cached, self.device))
                copies.append(None)
                continue
            if ids is None:
                ids, mask, rows, targets = batch_inputs(members, batch.width, self.device)
            h = self._forward(side.model, members, ids, mask, rows)
            check_padded_mass(h, head, side.name)
            hidden.append(h)
            copies.append(HostCopy(h) if cache is not None else None)
        if not with_rows:
            return copies, None
        if targets is None:
            targets = torch.tensor([t for s in members for t in s.response_ids],
                                   dtype=torch.long).to(self.device)
        hidden = [h.get() if isinstance(h, DeviceCopy) else h for h in hidden]
        packed = pair_metrics(hidden[0], hidden[1], self.heads[0], self.heads[1], targets,
                              self.chunk_positions, self.topk, self.row_fn)
        return copies, HostCopy(packed)

    def _forward(self, model, members, ids, mask, rows) -> torch.Tensor:
        """The batch's hidden states: each shared prompt forwarded once where the batch
        has one (``shared_prompts``) and the layers run eagerly, else every sequence
        whole (compiled layers are traced for the whole-sequence call; a call with a
        key/value cache would trace them again)."""
        def forward():
            if not layers_compiled(model) and shares_prompts(members):
                return forward_shared(model, members, self.device)
            return forward_hidden(model, ids, mask, rows)

        try:
            return forward()
        except Exception as err:  # noqa: BLE001 - a compiler failure: go on eager
            if is_out_of_memory(err) or id(model) not in self.compiled:
                raise
            warnings.warn(f"compiled decoder layers failed ({err!r}); forwarding eager")
            compile_layers(self.compiled.pop(id(model)), enable=False)
            return forward()

    def _write(self, batch: Batch, members, copies, metric_copy, batch_tokens: int) -> None:
        for cache, copy in zip(self.caches, copies):
            if copy is not None:
                cache.save(members, copy.get(), batch_tokens)
        if metric_copy is not None:
            self.table.write_shard(batch.key, with_batch_tokens(rows_table(
                members, metric_copy.get().numpy(), self.suite, self.ckpt.name, self.ref.name,
                self.topk, self.seqs.shared_contexts()), batch_tokens))

    # the whole run -----------------------------------------------------------------
    def run(self, batch_tokens: int) -> None:
        """The loop with head saving alongside, compiled layers, and the OOM back-off."""
        # models whose layers the caller compiled already are left as they are
        self.compiled = {id(s.model): s.model for s in self.sides
                         if s.model is not None and self.compiled_layers
                         and not layers_compiled(s.model)}
        saver = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlprobe-head")
        # LM heads of forwarded sides go to their caches alongside the first batches (1 GB
        # at 8B); a cache is only marked complete (finish) once its head is there
        saves = [saver.submit(c.save_head, h) for s, c, h in zip(self.sides, self.caches, self.heads)
                 if s.model is not None and c is not None and not c.has_head()
                 and (self.share is None or self.share.saves_heads)]
        def halved(old: int, new: int) -> str:
            return f"out of memory at batch_tokens={old}: retrying at {new} (finished shards are kept)"

        try:
            for model in self.compiled.values():
                compile_layers(model)
            self.t0 = time.perf_counter()
            halving_on_oom(self.loop, batch_tokens, halved)
            self.t_loop_end = time.perf_counter()
            for f in saves:
                f.result()
            self.waits["heads"] = time.perf_counter() - self.t_loop_end
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            raise MemoryError(f"out of memory even at batch_tokens=1 (one sequence a batch): "
                              f"lower chunk_positions ({self.chunk_positions}) or use a device "
                              "with more memory") from None
        finally:
            saver.shutdown(wait=True)
            for model in self.compiled.values():
                compile_layers(model, enable=False)

    # step 4 ----------------------------------------------------------------------
    def finish(self) -> Path | None:
        elapsed = self.t_loop_end - self.t0
        facts = {
            **self.seqs.facts(), "chunk_positions": self.chunk_positions, "topk": self.topk,
            "max_sequences": self.max_sequences, "device": self.device.type,
            "metric_kernel": metrics.row_fn_kind(self.row_fn),
            "compiled_layers": self.compiled_layers, "compiled_layers_used": bool(self.compiled),
            "sides": [{**f, "head": h.facts()} for f, h in zip(self.side_facts, self.heads)],
            "head_matmul": head_method(torch.empty(1, 1, dtype=self.heads[0].weight.dtype,
                                                   device=self.device), self.heads[0]),
            "batch_tokens_tried_this_run": self.batch_sizes,
            "batches_computed_this_run": self.computed,
            "rows_computed_this_run": self.rows_done,
            "seconds_this_run": round(elapsed, 3),
            # the forward loop waiting on the disk (reading cached hidden states / writing)
            "seconds_waiting_for_reads": round(self.waits["reads"], 3),
            "seconds_waiting_for_writes": round(self.waits["writes"], 3),
            # around the loop: checks, heads, key (before); heads still on their way to the caches
            "seconds_before_loop": round(self.t0 - self.t_created, 3),
            "seconds_waiting_for_head_saves": round(self.waits["heads"], 3),
            "response_tokens_per_s_this_run": (round(self.rows_done / elapsed, 1)
                                               if elapsed > 0 else None),
            "torch": torch.__version__,
            "cuda_device": (torch.cuda.get_device_name(self.device)
                            if self.device.type == "cuda" else None),
            "clamp": "KL clamped to >= 0, JS to [0, ln 2] (rounding-level moves only)",
        }
        if self.share is not None:  # the coordinator writes the index and the manifest
            storage.atomic_write_json(self.share.facts_file, facts)
            return None
        for s, c, f in zip(self.sides, self.caches, facts["sides"]):
            if s.model is not None and c is not None:
                c.finish(self.seqs, {"model": f})
        if self.table is None:
            return None
        facts.update(batch_sizes(self.table.parts()))
        manifest = {**(self.provenance or {}), "table": "tokens", "suite": self.suite,
                    "checkpoint": self.ckpt.name, "reference": self.ref.name, "engine": facts}
        return self.table.finish(manifest, sorted(self.table.done()))

    def release(self) -> None:
        for c in self.caches:
            if c is not None:
                c.release()
        if self.table is not None:
            self.table.release()


def run_pair(seqs: SequenceSet, ckpt: Side, ref: Side, out_dir: str | os.PathLike | None, *,
             suite: str, batch_tokens: int = 8192, chunk_positions: int = 1024, topk: int = 5,
             device: str | torch.device = "cpu", provenance: dict | None = None,
             overwrite: bool = False, compile: bool | None = None,
             compile_body: bool | None = None, max_sequences: int | None = None,
             progress: bool = True, key: dict | None = None,
             share: Share | None = None) -> Path | None:
    """Per-token table of (ckpt vs ref) over ``seqs``, plus the hidden-state caches of any
    forwarded side. Resumable; returns the table folder. ``out_dir=None`` only fills the
    caches (forward_to_cache). ``share``: this process's part of a coordinated run (see
    the module docstring); it returns None.

    key: the caller's inputs the rows depend on (model identities, parameters, upstream
    tables); with the sequences and top-k it keys the table (``table_key``). A complete
    table with the same key is returned as it is; another key is refused, naming the
    differences, unless ``overwrite``. Batch and chunk sizes are not in the key: rows move
    with them only within ``precision.BATCH_TOLERANCE``, so a resume at another size
    continues, and the manifest names every size.
    compile: fused/compiled metric math (default: yes). compile_body: torch.compile the
    forwarded models' decoder layers for this run (``compile_layers``; default: on CUDA),
    undone afterwards; if compiling fails, the run goes on eager with a warning."""
    run = _PairRun(seqs, ckpt, ref, out_dir, suite=suite, chunk_positions=chunk_positions,
                   topk=topk, device=device, provenance=provenance, overwrite=overwrite,
                   compile=compile, compile_body=compile_body, max_sequences=max_sequences,
                   progress=progress, key=key, share=share)
    try:
        if run.prepare():
            return run.out_dir
        run.run(batch_tokens)
        return run.finish()
    finally:
        run.release()


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
            side = Side(side.name, None, side.tokenizer, side.cache_dir, side.identity)
        sides.append(side)
    return run_pair(seqs, sides[0], sides[1], out_dir, suite=suite, **kw)


def forward_to_cache(seqs: SequenceSet, side: Side, **kw) -> None:
    """Forward one model over the sequences into its hidden-state cache (e.g. the
    reference, once). Resumable like everything else."""
    if side.model is None or side.cache_dir is None:
        raise ValueError("forward_to_cache needs a model and a cache_dir")
    kw.setdefault("suite", "")
    run_pair(seqs, side, side, None, **kw)

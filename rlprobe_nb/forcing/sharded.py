"""Teacher forcing shared among worker processes (``distributed``): the coordinator takes
the table's and the caches' locks, plans the batches over all the work, lets each worker
compute its share with ``forcing.run_pair``, then writes the caches' index and the
table's manifest with the workers' facts merged."""

from __future__ import annotations

import time
from typing import Any, Callable

from rlprobe_nb import distributed
from rlprobe_nb.forcing.batching import plan_batches
from rlprobe_nb.forcing.engine import Share, pending, table_key
from rlprobe_nb.forcing.engine import run_pair as run_here
from rlprobe_nb.forcing.hidden_cache import HiddenCache
from rlprobe_nb.forcing.token_table import UNIQUE, batch_sizes
from rlprobe_nb.tables import schemas, storage


def run_pair(seqs, names: tuple[str, str], out_dir, load: Callable[[], tuple], *,
             forwarded: dict[str, Any], workers: int | None = None, batch_tokens: int = 8192,
             max_sequences: int | None = None, topk: int = 5, key: dict | None = None,
             overwrite: bool = False, provenance: dict | Callable[[], dict] | None = None,
             suite: str = "", **engine) -> Any:
    """``forcing.run_pair`` with the batches shared among worker processes.

    names: (checkpoint, reference). load(): the two ``forcing.Side`` of a worker, models
    loaded on its device (called in each worker). forwarded: name -> hidden-state cache
    folder of each side the workers forward (the coordinator takes its lock and writes its
    index). ``out_dir=None`` fills the caches only (``forward_to_cache``). provenance: the
    manifest's base, or a function that returns it once the models are loaded. The other
    arguments are ``run_pair``'s (``compile_body=None``: compiled layers on CUDA, in
    inductor's deterministic mode, so every worker compiles the same kernels).
    Returns the table folder (None without a table)."""
    kw = dict(batch_tokens=batch_tokens, max_sequences=max_sequences, topk=topk, key=key,
              overwrite=overwrite, suite=suite, **engine)
    n = distributed.processes() if workers is None else int(workers)
    if n <= 1:
        sides = load()
        return run_here(seqs, *sides, out_dir, provenance=_value(provenance), **kw)
    table, releases = None, []
    try:
        if out_dir is not None:
            table = storage.ShardedTable(out_dir, schemas.TOKENS, unique=UNIQUE)
            key_now = table_key(seqs, names[0], names[1], topk, key)
            if table.begin(key_now, overwrite=overwrite,
                           what=f"(teacher forcing {names[0]} vs {names[1]}, coordinator)"):
                return table.folder
        caches = {name: HiddenCache(folder) for name, folder in forwarded.items()}
        for cache in caches.values():
            releases.append(storage.acquire_lock(cache.folder, "(hidden-state cache, coordinator)"))
            for tmp in cache.folder.glob(".*.tmp*"):  # litter of a killed writer
                tmp.unlink()
        need_rows, need_cache = pending(seqs, table.folder if table is not None else None,
                                                list(caches.values()))
        batches = [[s.rollout_id for s in part]
                   for group in (need_rows, need_cache) if group
                   for part in ([group[i] for i in b.members]
                                for b in plan_batches(group, batch_tokens, max_sequences))]
        facts_dir = table.work if table is not None else next(iter(caches.values())).folder

        def task(share, state):
            ckpt, ref = load()
            index = state.process_index if state is not None else 0  # None: ran here
            mine = Share(frozenset(r for batch in share for r in batch),
                                 saves_heads=index == 0,
                                 facts_file=facts_dir / f"_share-{index:03d}.json")
            run_here(seqs, ckpt, ref, out_dir, progress=False, share=mine, **kw)

        start = time.perf_counter()
        ran = distributed.run_sharded(task, batches, n)
        _finish_pair(seqs, names, table, caches, facts_dir, _value(provenance), suite, ran,
                     time.perf_counter() - start)
        return None if table is None else table.folder
    finally:
        for release in releases:
            release()
        if table is not None:
            table.release()


def _value(provenance):
    return provenance() if callable(provenance) else provenance


def _finish_pair(seqs, names, table, caches, facts_dir, provenance, suite, ran: int,
                 seconds: float) -> None:
    """The coordinator's end of a shared run: the caches' index, then the manifest, with
    the workers' facts merged (the first worker's, plus each worker's counts)."""
    files = sorted(facts_dir.glob("_share-*.json"))
    shares = [storage.read_json(f) for f in files]
    rows = sum(f.get("rows_computed_this_run", 0) for f in shares)
    merged = {**(shares[0] if shares else {}), "processes": ran, "seconds_this_run": round(seconds, 3),
              "batches_computed_this_run": sum(f.get("batches_computed_this_run", 0) for f in shares),
              "rows_computed_this_run": rows,
              "response_tokens_per_s_this_run": round(rows / seconds, 1) if seconds > 0 else None,
              "workers": [{k: f.get(k) for k in ("cuda_device", "batch_tokens_tried_this_run",
                                                 "batches_computed_this_run", "seconds_this_run")}
                          for f in shares]}
    side_facts = {f["name"]: f for f in merged.get("sides", [])}
    for name, cache in caches.items():
        cache.finish(seqs, {"model": side_facts.get(name, {"name": name})})
    for f in files:  # read: gone before the working folder becomes the table
        f.unlink()
    if table is not None:
        merged.update(batch_sizes(table.parts()))
        table.finish({**(provenance or {}), "table": "tokens", "suite": suite,
                      "checkpoint": names[0], "reference": names[1], "engine": merged},
                     sorted(table.done()))

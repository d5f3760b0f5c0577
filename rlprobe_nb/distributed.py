"""Sharded stages: one worker process per device, started through accelerate, writing the
same tables a single process writes.

Who does what
-------------
The *coordinator* is the process that calls a sharded stage: the kernel of the notebook
(under papermill or JupyterLab) or a plain script. For each table it:

1. takes the table's writer lock and records the key of its inputs
   (``storage.ShardedTable.begin``): a table computed from other inputs is refused before
   any work, a complete one is read back;
2. lists the units of work still missing (shards of a table, batches of the teacher-forcing
   engine, whole checkpoints), in a fixed order, before any worker starts;
3. starts one worker per device with ``accelerate.notebook_launcher`` (fork, the
   coordinator itself stays free of CUDA; a torch.distributed group over NCCL on GPUs,
   gloo on CPUs). Each worker takes its contiguous share of the list
   (``PartialState.split_between_processes``), loads the models it needs on its own
   device and writes its shards;
4. once every worker has exited cleanly, checks that every shard exists, writes the
   manifest (``finish``) and releases the lock.

Workers write shards and hidden-state files, which are named by their content and written
atomically, so any process can write any of them; they never write a manifest and never
take the table's lock. A unit's content depends only on the unit (seeds are per problem
and sample, batches are planned over all the work before it is shared out), so the table
is the same for 1 and N workers. If a worker fails or is killed, the launcher stops the
others and the coordinator raises with the shards written so far kept: a rerun, with any
number of workers, computes the missing ones only.

How many workers: ``RLPROBE_PROCESSES`` if set, else the number of visible CUDA devices
(counted through NVML, without initializing CUDA), else 1. One worker runs in the calling
process itself, as does a stage with a single unit of work, and so does everything when
this process has initialized CUDA already (a forked child could not use it; a warning says
to restart the kernel).

From a shell, ``accelerate launch --multi_gpu --num_processes N -m rlprobe_nb.book ...``
starts N processes: rank 0 runs the book (the notebooks, one kernel at a time) with N
workers per sharded stage, the other ranks exit at once (``book.launched_rank``). So the
notebooks run once and every device works; ``python -m rlprobe_nb.book`` on an N-GPU host
does the same.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import warnings
from typing import Any, Callable, Sequence

from rlprobe_nb import cores

# Ask NVML, not the CUDA runtime, whether CUDA devices exist (``torch.cuda.is_available``
# reads this at each call): the coordinator must not initialize CUDA before it forks.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

PROCESSES_ENV = "RLPROBE_PROCESSES"
# what a launcher (torchrun, accelerate launch) leaves in the environment of its processes
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE")


def processes() -> int:
    """Workers per sharded stage (see the module docstring)."""
    import torch

    if os.environ.get(PROCESSES_ENV):
        n = int(os.environ[PROCESSES_ENV])
        if n < 1:
            raise ValueError(f"{PROCESSES_ENV} must be >= 1, got {n}")
        return n
    return max(1, torch.cuda.device_count())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sharded(task: Callable[[list, Any], None], items: Sequence, workers: int | None = None
                ) -> int:
    """``task(share, state)`` over ``items``, shared among ``workers`` processes (default
    ``processes()``); ``state`` is the worker's ``accelerate.PartialState`` (None when the
    work runs in this process). Returns the number of processes that ran."""
    import torch

    items = list(items)
    n = min(processes() if workers is None else int(workers), len(items))
    if n > 1 and torch.cuda.is_initialized():
        warnings.warn("this process has initialized CUDA already, so it cannot start one "
                      "worker per device; running on one device (restart the kernel, and "
                      "run the sharded stage before anything that uses the GPU)")
        n = 1
    if n <= 1:
        if items:
            task(items, None)
        return 1
    from accelerate import notebook_launcher

    saved = {k: os.environ.pop(k) for k in LAUNCHER_ENV if k in os.environ}
    # torch elastic, under the launcher, puts its own handlers on SIGINT and SIGTERM and
    # leaves them: a later Ctrl-C of this process would raise its SignalException, not
    # KeyboardInterrupt (handlers can be set from the main thread only)
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        notebook_launcher(_worker, args=(task, items), num_processes=n,
                          use_port=str(_free_port()))
    finally:
        os.environ.update(saved)
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
    return n


def _fresh_compile_pools() -> None:
    """After a fork: torch inductor's compile thread pool, if the coordinator made one, has
    no threads here (torch resets its process pool after a fork, not this one), so a
    compilation handed to it would wait forever. This worker compiles in its own thread,
    through pools it makes itself."""
    compiling = sys.modules.get("torch._inductor.async_compile")
    if compiling is None:
        return  # nothing compiled before the fork: the pools are made here, fresh
    compiling.AsyncCompile.pool.cache_clear()
    compiling.after_fork()
    sys.modules["torch._inductor.config"].compile_threads = 1


def _worker(task: Callable[[list, Any], None], items: list) -> None:
    """One forked worker: its device and process group, then its share of ``items``."""
    import torch
    from accelerate import PartialState

    # Inherited state that belongs to the coordinator: any accelerate state and torch's
    # compile pools (modules holding subprocesses of their own, like the grader's pool,
    # forget them after a fork through os.register_at_fork).
    PartialState._reset_state()
    _fresh_compile_pools()
    os.environ[PROCESSES_ENV] = "1"  # a sharded call inside a worker runs in the worker
    state = PartialState(cpu=not torch.cuda.is_available())
    if state.device.type == "cuda":
        torch.cuda.set_device(state.device)  # "cuda" means this worker's own GPU
    # the host's cores shared among the workers, not each worker on all of them
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // state.num_processes))
    try:
        with state.split_between_processes(items) as share:
            task(list(share), state)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def run_shards(table, jobs: list[tuple[str, Callable[[], Any]]], manifest,
               workers: int | None = None, progress: bool = True) -> list[str]:
    """``storage.run_shards`` for a begun table, its missing shards shared among worker
    processes: the coordinator holds the lock and writes the manifest once every shard
    exists. Returns the keys computed this time."""
    from rlprobe_nb.progress import tqdm

    try:
        done = table.done()
        todo = [(k, fn) for k, fn in jobs if k not in done]

        def task(share, state):
            bar = tqdm(share, desc=f"{table.folder.name} shards", leave=False,
                       disable=not progress or state is not None)
            for key, fn in bar:
                if state is None:  # the book may have given this notebook more or fewer cores
                    cores.adopt()
                table.write_shard(key, fn())

        run_sharded(task, todo, workers)
        table.finish(manifest() if callable(manifest) else manifest, [k for k, _ in jobs])
    finally:
        table.release()
    return [k for k, _ in todo]

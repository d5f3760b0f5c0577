"""A forked worker compiles even when the coordinator compiled before the fork: torch
inductor's compile thread pool has no threads in a forked child, and a worker that handed
it a kernel waited forever (a CI run hung so in the sharding tests)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import multiprocessing, os, sys, torch
from rlprobe_nb import distributed
def f(x):
    return (x.sin() * 3 + x.cos()).sum(-1)
def g(x):  # a constant of its own each run: no kernel cached on disk to load instead
    return (x.exp() * float(sys.argv[2]) - x).mean(-1)
torch.compile(f)(torch.randn(64, 32))
from torch._inductor.async_compile import AsyncCompile
AsyncCompile.pool().submit(lambda: None).result()  # the coordinator's compile thread pool
pid = os.fork()
if pid == 0:
    multiprocessing.current_process()._config["daemon"] = True  # as launcher workers are
    torch.set_num_threads(1)
    if sys.argv[1] == "fresh":
        distributed._fresh_compile_pools()
    print("compiled", torch.compile(g)(torch.randn(64, 32)).shape[0], flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _child(mode: str, timeout: float) -> tuple[int, str]:
    """(exit code, output) of the script; TimeoutExpired once its whole process group (the
    forked child too) has been killed."""
    constant = str(1 + random.random())
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode, constant], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out


def test_a_forked_worker_compiles_after_the_coordinator_did():
    code, out = _child("fresh", timeout=300)
    assert code == 0 and "compiled 64" in out, out[-2000:]


def test_without_fresh_pools_the_forked_compile_waits_forever():
    try:  # the failure this guards against, shown once: it must not finish
        _child("inherited", timeout=45)
    except subprocess.TimeoutExpired:
        return
    raise AssertionError("the inherited compile pool worked: the guard may be unneeded now")

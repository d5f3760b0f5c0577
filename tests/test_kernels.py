"""The book's kernels: IPC sockets named for each kernel alone, outside the checkout."""

import asyncio
import os
import signal
from pathlib import Path

import pytest
from jupyter_core.paths import jupyter_runtime_dir

from rlprobe_nb.kernels import LocalKernelManager

pytestmark = pytest.mark.skipif(os.name == "nt", reason="Windows kernels use TCP")


def test_two_managers_in_one_folder_get_sockets_of_their_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # jupyter_client's own default named them here: kernel-ipc-<n>
    a, b = LocalKernelManager(), LocalKernelManager()
    assert a.transport == b.transport == "ipc"
    assert a.ip != b.ip
    for manager in (a, b):
        assert Path(manager.ip).parent == Path(jupyter_runtime_dir())
        assert len(f"{manager.ip}-99") < 100  # a Unix socket's path limit


def test_two_kernels_started_at_once_each_answer_their_own_client(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    async def start_and_ask():
        managers = [LocalKernelManager(kernel_name="python3") for _ in range(2)]
        await asyncio.gather(*(m.start_kernel() for m in managers))
        try:
            clients = [m.client() for m in managers]
            for c in clients:
                c.start_channels()
            await asyncio.gather(*(c.wait_for_ready(timeout=60) for c in clients))
            pids = []
            for c in clients:
                reply = await c.execute_interactive("import os; print(os.getpid())", timeout=60,
                                                    output_hook=lambda msg: pids.append(
                                                        msg["content"].get("text", "").strip()))
                assert reply["content"]["status"] == "ok"
                c.stop_channels()
            return [p for p in pids if p]
        finally:
            await asyncio.gather(*(m.shutdown_kernel(now=True) for m in managers))

    pids = asyncio.run(start_and_ask())
    assert len(set(pids)) == 2, pids
    assert not list(tmp_path.glob("kernel-ipc*")), "socket files left in the working folder"


def test_a_shutdown_sends_no_interrupt_but_an_asked_interrupt_is_sent(tmp_path, monkeypatch):
    """jupyter_client interrupts before a shutdown; the book's kernels are shut down idle, and
    the interrupt printed "KeyboardInterrupt caught in kernel." on the book's terminal."""
    monkeypatch.chdir(tmp_path)
    sent = []

    async def run():
        manager = LocalKernelManager(kernel_name="python3")
        original = manager._async_signal_kernel

        async def record(sig):
            sent.append(sig)
            await original(sig)

        manager._async_signal_kernel = record
        await manager.start_kernel()
        client = manager.client()
        client.start_channels()
        await client.wait_for_ready(timeout=60)
        await manager.interrupt_kernel()
        asked = list(sent)
        client.stop_channels()
        await manager.shutdown_kernel()
        return asked

    asked = asyncio.run(run())
    assert asked == [signal.SIGINT], "an interrupt asked for is sent"
    assert sent == [signal.SIGINT], f"the shutdown sent {sent[1:]} too"

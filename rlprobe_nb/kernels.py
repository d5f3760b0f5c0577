"""The kernels the book starts (through papermill) talk to it over local sockets.

jupyter_client's default transport is TCP on 127.0.0.1, and ipykernel then warns, once per
kernel, that it is "running over TCP without encryption": 13 times in one ``make demo``,
in the middle of the book's own report. The kernel and the book are on the same machine,
so the cause is fixed rather than the warning hidden: on POSIX systems the book's kernels
use IPC transport (Unix domain sockets), which keeps the traffic off the network stack and
the warning away. On Windows, which has no IPC transport, kernels stay on TCP.

Each kernel's sockets get a name of their own in Jupyter's private runtime folder. Left to
jupyter_client, a manager asked for its address before it has a connection file names
them ``kernel-ipc-<n>`` in the current folder, with n the first number whose file does
not exist yet: two kernels started at once from the same folder (two test workers, two
books) then took the same sockets, and one's client talked to the other's kernel
("Invalid Signature"), besides leaving socket files in the checkout.
"""

from __future__ import annotations

import os
import signal
import uuid
import weakref
from pathlib import Path

from jupyter_client import AsyncKernelManager
from jupyter_core.paths import jupyter_runtime_dir
from traitlets import default


_STARTED: "weakref.WeakSet[LocalKernelManager]" = weakref.WeakSet()


def signal_kernels(sig: int = signal.SIGINT) -> int:
    """Send ``sig`` to every kernel this process started that still runs (the book's
    Ctrl-C: SIGINT stops the running cell, SIGKILL a kernel that ignored it); returns how
    many were signalled."""
    n = 0
    for km in list(_STARTED):
        pid = getattr(getattr(km, "provisioner", None), "pid", None)
        if pid:
            try:
                os.kill(pid, sig)
                n += 1
            except (ProcessLookupError, PermissionError):
                pass
    return n


class LocalKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels use IPC transport where the system has it, each on
    sockets named for it alone; its kernels can be signalled all at once
    (``signal_kernels``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _STARTED.add(self)

    @default("transport")
    def _default_transport(self) -> str:
        return "tcp" if os.name == "nt" else "ipc"

    async def _async_interrupt_kernel(self) -> None:
        """No interrupt on the way to a shutdown. jupyter_client interrupts a kernel before
        asking it to shut down, to stop a running cell; the book shuts a kernel down once
        its notebook is done, and an interrupt that lands while the kernel still handles a
        message printed "ERROR | KeyboardInterrupt caught in kernel." on the book's
        terminal (two in one ``make demo``). A kernel still busy then is killed after the
        shutdown wait; an interrupt asked for (``interrupt_kernel``) is sent as always."""
        if self.shutting_down:
            return
        await super()._async_interrupt_kernel()

    @default("ip")
    def _default_ip(self) -> str:
        if self.transport != "ipc":
            return super()._ip_default()
        runtime = Path(jupyter_runtime_dir())
        runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
        # short: a Unix socket's path must stay under ~100 bytes
        return str(runtime / f"rp-{uuid.uuid4().hex[:12]}-ipc")

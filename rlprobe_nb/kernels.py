"""The kernels the book starts (through papermill) talk to it over local sockets.

jupyter_client's default transport is TCP on 127.0.0.1, and ipykernel then warns, once per
kernel, that it is "running over TCP without encryption": 13 times in one ``make demo``,
in the middle of the book's own report. The kernel and the book are on the same machine,
so the cause is fixed rather than the warning hidden: on POSIX systems the book's kernels
use IPC transport (Unix domain sockets beside the connection file, in Jupyter's private
runtime folder), which keeps the traffic off the network stack and the warning away. On
Windows, which has no IPC transport, kernels stay on TCP.
"""

from __future__ import annotations

import os

from jupyter_client import AsyncKernelManager
from traitlets import default


class LocalKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels use IPC transport where the system has it."""

    @default("transport")
    def _default_transport(self) -> str:
        return "tcp" if os.name == "nt" else "ipc"

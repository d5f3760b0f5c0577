"""Host <-> device copies that overlap the compute: per-batch results go to pinned host
memory on a side stream, cached hidden states come back the same way, and the 1 GB LM
head of an 8B model streams to its cache through one small pinned buffer."""

from __future__ import annotations

from typing import Any

import torch

_COPY_STREAMS: dict[int, Any] = {}


def _copy_stream(device: torch.device):
    """One side stream per GPU for host<->device copies, so they overlap the compute."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _COPY_STREAMS:
        _COPY_STREAMS[index] = torch.cuda.Stream(device=index)
    return _COPY_STREAMS[index]


class HostCopy:
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


def host_slices(t: torch.Tensor, slice_bytes: int = 64 << 20):
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


class DeviceCopy:
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

"""Running out of device memory: recognise it, and go on with half the batch, keeping
what finished.

An allocation that fails inside torch's caching allocator raises ``torch.OutOfMemoryError``
("CUDA out of memory. Tried to allocate ..."); one that fails inside a kernel launch or a
library (cuBLAS workspaces, NCCL buffers) surfaces as a plain RuntimeError reading
"CUDA error: out of memory" or "CUBLAS_STATUS_ALLOC_FAILED". All three are the device
running out of memory, and all three are met by a smaller batch.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

OUT_OF_MEMORY_TEXTS = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
                       "DefaultCPUAllocator: can't allocate memory")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` says the device (or the host allocator) ran out of memory."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    if isinstance(err, RuntimeError) and err.args and isinstance(err.args[0], str):
        return any(text in err.args[0] for text in OUT_OF_MEMORY_TEXTS)
    return False


def halving_on_oom(attempt: Callable[[int], None], size: int,
                   describe: Callable[[int, int], str] | None = None) -> None:
    """``attempt(size)``, halving ``size`` after each out-of-memory error (what it finished
    is kept); the error of an attempt at size 1 is raised. Not accelerate's
    ``find_executable_batch_size``: that collects garbage before every call, which costs
    up to a second a call once a model has been compiled, and it does not recognise
    "CUDA error: out of memory"."""
    while True:
        try:
            return attempt(size)
        except Exception as err:  # noqa: BLE001 - only out-of-memory errors are handled
            if not is_out_of_memory(err) or size == 1:
                raise
            new = size // 2
            torch.cuda.empty_cache()
            warnings.warn(describe(size, new) if describe is not None
                          else f"out of GPU memory: decoding again with {new} slots")
            size = new

"""Running out of device memory: go on with half the batch, keeping what finished."""

from __future__ import annotations

import warnings
from typing import Callable

import torch


def halving_on_oom(attempt: Callable[[int], None], size: int) -> None:
    """``attempt(size)``, halving ``size`` after each out-of-memory error (what it finished
    is kept). Not accelerate's ``find_executable_batch_size``: that collects garbage before
    every call, which costs up to a second a call once a model has been compiled."""
    while True:
        try:
            return attempt(size)
        except torch.cuda.OutOfMemoryError:
            if size == 1:
                raise
            size //= 2
            torch.cuda.empty_cache()
            warnings.warn(f"out of GPU memory: decoding again with {size} slots")

"""Out of device memory, however it is reported, halves the batch (issue 22 item 7): a
failed kernel launch or cuBLAS workspace reports "CUDA error: out of memory" as a plain
RuntimeError, which the back-off did not recognise."""

from __future__ import annotations

import pytest
import torch

from rlprobe_nb.generation.out_of_memory import halving_on_oom, is_out_of_memory

REPORTS = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
                 "reported at some other API call"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
]


@pytest.mark.parametrize("err", REPORTS, ids=["allocator", "cuda_error", "cublas"])
def test_every_report_of_out_of_memory_halves_the_batch(err):
    sizes = []

    def attempt(size):
        sizes.append(size)
        if size > 8:
            raise err

    with pytest.warns(UserWarning, match="out of GPU memory"):
        halving_on_oom(attempt, 64)
    assert sizes == [64, 32, 16, 8]


def test_other_errors_pass_through():
    assert not is_out_of_memory(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_out_of_memory(ValueError("out of memory"))

    def attempt(size):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        halving_on_oom(attempt, 64)


def test_out_of_memory_at_one_is_raised():
    def attempt(size):
        raise REPORTS[1]
    with pytest.raises(RuntimeError, match="out of memory"), pytest.warns(UserWarning):
        halving_on_oom(attempt, 4)

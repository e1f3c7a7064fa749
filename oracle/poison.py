"""Poisoned allocations: memory a kernel obtains during a call holds NaN, not zeros or stale values.

An output or workspace that a kernel never writes, or never zeroes before adding into it (split-K
partial sums added atomically into `torch.empty`), then shows up as NaN instead of passing by luck
because fresh memory happened to be zero. Two layers:

* PyTorch's own switch: with deterministic algorithms on (warn-only, so no op is refused),
  `torch.utils.deterministic.fill_uninitialized_memory` fills every tensor that torch's empty
  functions return with NaN (floating point) or the dtype's largest value (integers), on CPU and
  GPU, from Python or C++ extensions alike.
* On CUDA, the caching allocator's free blocks are written with NaN first (one large slab, then
  released), for memory obtained without torch's empty functions.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

# Bytes of the NaN slab written through the CUDA caching allocator before each call.
CUDA_SLAB_BYTES = 256 << 20


def poison_cuda_cache(device: torch.device, nbytes: int = CUDA_SLAB_BYTES) -> None:
    """Fill up to `nbytes` of the caching allocator's memory on `device` with NaN and free it,
    so blocks it hands out next hold NaN."""
    free, _ = torch.cuda.mem_get_info(device)
    size = min(nbytes, free // 4) // 2
    if size > 0:
        slab = torch.full((size,), float("nan"), dtype=torch.float16, device=device)
        del slab


@contextlib.contextmanager
def poisoned(device: torch.device | str) -> Iterator[None]:
    """Within the block, fresh tensors hold NaN (see the module docstring); restores the
    deterministic-algorithm settings afterwards."""
    device = torch.device(device)
    if device.type == "cuda":
        poison_cuda_cache(device)
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    with warnings.catch_warnings():
        # warn-only mode warns for every op without a deterministic implementation: the kernel's business.
        warnings.filterwarnings("ignore", message=".*deterministic.*")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
            torch.utils.deterministic.fill_uninitialized_memory = fill

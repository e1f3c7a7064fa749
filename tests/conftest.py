"""Fixtures shared by several test modules, and the threads of an xdist worker."""

import os

import pytest
import torch

from tests.support.skinny_emulator import build_emulator

# xdist workers share the machine's cores: each takes its share of intra-op threads, or the workers'
# thread pools oversubscribe the cores and small CPU ops (the oracle's reference of a probe chunk)
# run a hundred times slower.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.fixture(scope="session")
def emulator():
    """The skinny kernels' CPU emulation, with AddressSanitizer (built once per run)."""
    return build_emulator()

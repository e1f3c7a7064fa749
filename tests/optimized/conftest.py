"""Fixtures the tests of optimized/ share."""

from __future__ import annotations

import pytest
import torch

from optimized import dispatch


@pytest.fixture(autouse=True)
def choose_automatically(monkeypatch):
    """A $W4A16_IMPL set where the suite runs would force every call; tests that force set it."""
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread. Under xdist, with a worker per core, more threads only
    contend (it made the module and model tests several times slower on a 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

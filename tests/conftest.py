"""Fixtures shared by several test modules."""

import pytest

from tests.test_skinny_compile import build_emulator


@pytest.fixture(scope="session")
def plain_emulator(tmp_path_factory):
    """The skinny kernel's CPU emulation (csrc/skinny_emulate.cpp) without AddressSanitizer, built
    once per session (per xdist worker): for tests that run it many times."""
    return build_emulator(tmp_path_factory.mktemp("skinny_emulator"), sanitize=False)

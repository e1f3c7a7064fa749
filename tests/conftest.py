"""Fixtures shared by several test modules."""

import pytest

from tests.support.skinny_emulator import build_emulator


@pytest.fixture(scope="session")
def plain_emulator():
    """The skinny kernel's CPU emulation without AddressSanitizer, for tests that run it many times."""
    return build_emulator(sanitize=False)

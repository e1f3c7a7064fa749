"""Fixtures shared by several test modules, the threads of an xdist worker, and the compiled
programs the selected tests need, started in the background as soon as they are known."""

import os
import threading

import pytest
import torch

from tests.support import skinny_sass
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


# A fixture name -> the build behind it (tests/support/compilers.py built_once: one build a run,
# shared by every worker), longest first.
PREBUILT = {"sm90": skinny_sass.build_sm90, "hip": skinny_sass.build_hip, "emulator": build_emulator}


def _build_quietly(builds) -> None:
    for build in builds:
        try:
            build()
        except BaseException:  # a missing compiler or a failed build: the test that needs it reports it
            pass


def pytest_collection_finish(session):
    """Starts the builds of the selected tests' compiled programs, one after another in a background
    thread, so that the long ones run beside the tests from the start; a test that needs a program
    waits for its build or, where the thread has not reached it yet, builds it (never twice)."""
    needed = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    builds = [build for name, build in PREBUILT.items() if name in needed]
    if builds:
        threading.Thread(target=_build_quietly, args=(builds,), name="prebuild", daemon=True).start()

"""Compilers for the CPU-side kernel checks, and a build cache that compiles each artefact once.

A missing compiler skips its cell, unless W4A16_REQUIRE_COMPILERS=1 (CI) makes it a failure.

`built_once` keys an artefact by the bytes of everything that goes into it (command, sources,
headers), so every xdist worker of a run, and later runs on the same machine, share one build: the
first worker compiles under a file lock, the others wait and reuse it. A changed source is a new
key, so a stale artefact is never used.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

REQUIRE_COMPILERS = os.environ.get("W4A16_REQUIRE_COMPILERS") == "1"
CACHE = Path(tempfile.gettempdir()) / "w4a16-oracle-build"


def find_compiler(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        reason = f"{name} is not on PATH"
        if REQUIRE_COMPILERS:
            pytest.fail(f"{reason}, and W4A16_REQUIRE_COMPILERS=1 requires it")
        pytest.skip(reason)
    return path


def compile_or_fail(cmd: list[str], env: dict[str, str] | None = None) -> str:
    """Runs a compile command; returns its output (stdout + stderr)."""
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        log = (result.stdout + result.stderr)[-6000:]
        pytest.fail(f"compile failed ({result.returncode}): {' '.join(cmd)}\n{log}")
    return result.stdout + result.stderr


def built_once(name: str, inputs: Iterable[Path], recipe: str, build: Callable[[Path], None]) -> Path:
    """The folder holding artefact `name`, built by `build(folder)` unless an identical build exists.

    inputs: every file the build reads (sources and headers); recipe: the command line or anything
    else that changes the result. A build that fails leaves no folder behind, so the next caller
    retries and reports the same failure.
    """
    digest = hashlib.sha256(recipe.encode())
    for path in sorted(Path(p) for p in inputs):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    folder = CACHE / f"{name}-{digest.hexdigest()[:16]}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".done").exists():
            work = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=CACHE))
            try:
                build(work)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
            (work / ".done").touch()
            shutil.rmtree(folder, ignore_errors=True)
            work.rename(folder)
    return folder

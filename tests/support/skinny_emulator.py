"""The skinny kernel on its CPU emulation (optimized/csrc/skinny_emulate.cpp, skinny_emu.h): built
once per test run (tests/support/compilers.py), called through files."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import torch

from optimized import skinny
from tests.support.compilers import built_once, compile_or_fail, find_compiler

CSRC = Path(skinny.__file__).resolve().parent / "csrc"
EMULATOR = CSRC / "skinny_emulate.cpp"


def build_emulator(sanitize: bool = True) -> Path:
    """g++ build of skinny_emulate.cpp (with AddressSanitizer by default); returns the binary."""
    gxx = find_compiler("g++")
    name = "skinny_emulate_asan" if sanitize else "skinny_emulate"
    flags = ["-fsanitize=address", "-fno-omit-frame-pointer"] if sanitize else []

    def build(folder: Path) -> None:
        compile_or_fail([gxx, "-std=c++20", "-O1", "-g", *flags, "-DW4_EMU=1", f"-I{CSRC}", str(EMULATOR), "-o",
                         str(folder / name), "-lpthread"])

    sources = [*CSRC.glob("*.h"), *CSRC.glob("*.cuh"), EMULATOR]
    return built_once(name, sources, " ".join([gxx, *flags]), build) / name


def emulate_call(binary: Path, work: Path, x: torch.Tensor, kw, bias: torch.Tensor | None, *, variant: int,
                 engine: str, num_sms: int = 132, split: int = 0, scale_offset: int = 0, row_pad: int = 0,
                 timeout: float = 600) -> tuple[torch.Tensor, dict[str, int]]:
    """(y, {"variant", "split", "stages", "blocks"} that ran) from the emulated kernel for x [M, K] and kernel-layout
    weights kw (oracle.layouts). variant -1 is the default policy; num_sms steers plan_split,
    split (1, 2, 4, 8) overrides it; scale_offset shifts the scales by that many elements (2-byte
    aligned only); row_pad (a multiple of 8) gives x a row stride of K + row_pad."""
    import numpy as np

    m, k = x.shape
    n = kw.qweight.shape[0]
    padded = torch.zeros(m, k + row_pad, dtype=x.dtype)
    padded[:, :k] = x
    header = [m, n, k, kw.group_size, int(x.dtype == torch.bfloat16), int(kw.zeros is None), int(bias is not None),
              k + row_pad, variant, int(engine == "mma"), num_sms, scale_offset, split]
    parts = [np.asarray(header, dtype="<i8").tobytes(), padded.view(torch.int16).numpy().tobytes(),
             kw.qweight.contiguous().view(torch.int32).numpy().tobytes(),
             kw.scales.contiguous().view(torch.int16).numpy().tobytes()]
    if kw.zeros is not None:
        parts.append(kw.zeros.contiguous().view(torch.int32).numpy().tobytes())
    if bias is not None:
        parts.append(bias.contiguous().view(torch.int16).numpy().tobytes())
    src, dst = work / "in.bin", work / "out.bin"
    src.write_bytes(b"".join(parts))
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"}
    result = subprocess.run([str(binary), str(src), str(dst)], capture_output=True, text=True, env=env,
                            timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"emulator failed ({result.returncode}): {result.stderr[-4000:]}")
    y = torch.frombuffer(bytearray(dst.read_bytes()), dtype=torch.int16).view(x.dtype)
    ran = re.search(r"variant (-?\d+) split (\d+) stages (\d+) blocks (\d+)\s*$", result.stderr)
    return y.reshape(m, n).clone(), {key: int(ran.group(i + 1))
                                     for i, key in enumerate(("variant", "split", "stages", "blocks"))}

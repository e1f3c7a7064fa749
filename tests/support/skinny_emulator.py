"""The skinny kernel without a GPU (optimized/csrc/skinny_emulate.cpp): the C++ plan of a call, and
the call itself on the CPU emulation (skinny_emu.h), both through files and subprocesses. Each
program is built once per test run (tests/support/compilers.py built_once).

* `emulated_plan(...)`: the SkinnyPlan that csrc/skinny_plan.h plan_call makes, the same function
  the extension's plan op calls, from a plan-only build of skinny_emulate.cpp (the host compiler
  alone, warnings as errors: the plan needs no CUDA, HIP or torch header).
* `emulate_call(...)`: y and the plan that ran, from the emulated kernels.

The device is an H100 / H200 unless told otherwise (EMULATED_DEVICE), the thresholds those of the
H200 policy file (default_policy()).
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from optimized import skinny
from optimized.policy import policy_for
from tests.support.compilers import built_once, compile_or_fail, find_compiler

CSRC = skinny.CSRC
EMULATOR = CSRC / "skinny_emulate.cpp"
# num_sms, warp_size, max_shared (opt-in, a block), smem_per_sm, compute_capability: an H100 / H200.
EMULATED_DEVICE = (132, 32, 227 * 1024, 228 * 1024, 90)
# The emulator's translation units: the extension's own, compiled by the host compiler with
# -DW4_EMU=1, and the driver.
EMULATOR_UNITS = (EMULATOR, CSRC / "skinny_launch.cu", *(CSRC / unit for unit in skinny.FAMILY_UNITS))


class EmulatedPlanError(RuntimeError):
    """plan_call refused the request; the message is its error."""


def default_policy() -> list[float]:
    """The H200 policy file's skinny thresholds, as the ops take them."""
    return policy_for("NVIDIA H200").skinny.values()


def _sources() -> list[Path]:
    return [*CSRC.glob("*.h"), *CSRC.glob("*.cuh"), *CSRC.glob("*.cu"), EMULATOR]


def build_planner() -> Path:
    """skinny_emulate.cpp's plan mode alone (-DW4_PLAN_ONLY=1: skinny_plan.h and nothing else),
    built with the host compiler, warnings as errors; returns the binary."""
    gxx = find_compiler("g++")
    command = [gxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-DW4_PLAN_ONLY=1", f"-I{CSRC}"]

    def build(folder: Path) -> None:
        compile_or_fail([*command, str(EMULATOR), "-o", str(folder / "skinny_plan")])

    return built_once("skinny_plan", [CSRC / "skinny_plan.h", EMULATOR], " ".join(command), build) / "skinny_plan"


def build_emulator() -> Path:
    """The emulator with AddressSanitizer: the extension's units and the driver, each compiled with
    -DW4_EMU=1 on its own (in parallel), then linked; returns the binary. Unoptimized: the
    sanitizer's checks, not the compiler's speed-ups, are what the emulated runs are for, and -O0
    builds in a third of the time."""
    gxx = find_compiler("g++")
    flags = ["-O0", "-fsanitize=address", "-fno-omit-frame-pointer"]
    command = [gxx, "-std=c++20", *flags, "-DW4_EMU=1", f"-I{CSRC}", "-x", "c++"]

    def build(folder: Path) -> None:
        objects = [folder / f"{unit.name}.o" for unit in EMULATOR_UNITS]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(lambda job: compile_or_fail([*command, "-c", str(job[0]), "-o", str(job[1])]),
                          zip(EMULATOR_UNITS, objects)))
        compile_or_fail([gxx, *flags, *map(str, objects), "-o", str(folder / "skinny_emulate"), "-lpthread"])

    return built_once("skinny_emulate_asan", _sources(), " ".join(command), build) / "skinny_emulate"


def request_line(m: int, n: int, k: int, group_size: int, symmetric: bool, *, engine: str = "auto",
                 kernel: str = "auto", split: int = 0, num_sms: int | None = None,
                 device: Sequence[int] = EMULATED_DEVICE, policy: Sequence[float] | None = None) -> str:
    """One request as skinny_emulate reads it (see its header comment)."""
    limits = list(device)
    if num_sms is not None:
        limits[0] = num_sms
    values = [m, n, k, group_size, int(symmetric), engine, kernel, split, *limits,
              *(default_policy() if policy is None else policy)]
    return " ".join(map(str, values))


def parse_plan_line(line: str) -> skinny.SkinnyPlan:
    if line.startswith("plan "):
        return skinny.SkinnyPlan.from_values(line.split()[1:])
    raise EmulatedPlanError(line.removeprefix("error ").strip())


@functools.cache
def _planned(lines: tuple[str, ...]) -> tuple[str, ...]:
    out = subprocess.run([str(build_planner()), "--plan"], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True, timeout=120).stdout.splitlines()
    assert len(out) == len(lines), (lines, out)
    return tuple(out)


def emulated_plans(requests: Iterable[dict]) -> list[skinny.SkinnyPlan | EmulatedPlanError]:
    """The plan of each request (request_line's arguments as a dict), in one run of the planner;
    a refused request gives its EmulatedPlanError in its place."""
    lines = tuple(request_line(**r) for r in requests)
    plans: list[skinny.SkinnyPlan | EmulatedPlanError] = []
    for line in _planned(lines):
        try:
            plans.append(parse_plan_line(line))
        except EmulatedPlanError as e:
            plans.append(e)
    return plans


def emulated_plan(m: int, n: int, k: int, group_size: int, symmetric: bool, **options) -> skinny.SkinnyPlan:
    """The plan of one call (request_line's arguments); raises EmulatedPlanError where plan_call
    refuses it."""
    plan = emulated_plans([dict(m=m, n=n, k=k, group_size=group_size, symmetric=symmetric, **options)])[0]
    if isinstance(plan, EmulatedPlanError):
        raise plan
    return plan


def emulate_call(binary: Path, work: Path, x: torch.Tensor, kw, bias: torch.Tensor | None, *, kernel: str = "auto",
                 engine: str = "auto", split: int = 0, num_sms: int | None = None,
                 device: Sequence[int] = EMULATED_DEVICE, policy: Sequence[float] | None = None,
                 scale_offset: int = 0, row_pad: int = 0, timeout: float = 600) -> tuple[torch.Tensor, skinny.SkinnyPlan]:
    """(y, the plan that ran) from the emulated kernels for x [M, K] and kernel-layout weights kw
    (oracle.layouts), with skinny_matmul's kernel, engine and split arguments on the emulated device
    (num_sms overrides its SMs) and policy (default_policy()); scale_offset shifts the scales by that
    many elements (2-byte aligned only); row_pad (a multiple of 8) gives x a row stride of K +
    row_pad. Raises EmulatedPlanError where the plan refuses the call."""
    m, k = x.shape
    n = kw.qweight.shape[0]
    padded = torch.zeros(m, k + row_pad, dtype=x.dtype)
    padded[:, :k] = x
    request = request_line(m, n, k, kw.group_size, kw.zeros is None, engine=engine, kernel=kernel, split=split,
                           num_sms=num_sms, device=device, policy=policy)
    layout = f"{int(x.dtype == torch.bfloat16)} {int(bias is not None)} {k + row_pad} {scale_offset}"
    parts = [f"{request}\n{layout}\n".encode(), padded.view(torch.int16).numpy().tobytes(),
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
    last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    if result.returncode == 4:
        raise EmulatedPlanError(last.removeprefix("error ").strip())
    if result.returncode != 0:
        raise AssertionError(f"emulator failed ({result.returncode}): {result.stderr[-4000:]}")
    y = torch.frombuffer(bytearray(dst.read_bytes()), dtype=torch.int16).view(x.dtype)
    return y.reshape(m, n).clone(), parse_plan_line(last)

"""The skinny kernel without a GPU: its torch-free core compiles for NVIDIA (nvcc, sm_90) and AMD
(hipcc, wave32 gfx1030 and wave64 gfx90a), and its Python side (op schema, fake implementation,
contract checks) works on CPU without building anything.

A missing compiler skips its cell, unless W4A16_REQUIRE_COMPILERS=1 (CI) makes it a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from optimized import skinny
from optimized.contract import ContractError

CSRC = Path(skinny.__file__).resolve().parent / "csrc"
INSTANTIATE = CSRC / "skinny_instantiate.cu"
REQUIRE_COMPILERS = os.environ.get("W4A16_REQUIRE_COMPILERS") == "1"
# The flags torch.utils.cpp_extension adds, so the check sees what an extension build sees.
TORCH_HALF_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]


def find_compiler(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        reason = f"{name} is not on PATH"
        if REQUIRE_COMPILERS:
            pytest.fail(f"{reason}, and W4A16_REQUIRE_COMPILERS=1 requires it")
        pytest.skip(reason)
    return path


def compile_or_fail(cmd: list[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0:
        log = (result.stdout + result.stderr)[-6000:]
        pytest.fail(f"compile failed ({result.returncode}): {' '.join(cmd)}\n{log}")


# ---------------------------------------------------------------------------------------------
# Compilers


def test_nvcc_compiles_core_for_sm90(tmp_path):
    nvcc = find_compiler("nvcc")
    compile_or_fail([nvcc, "-std=c++17", "-O3", "-gencode", "arch=compute_90,code=sm_90", *TORCH_HALF_FLAGS,
                     "-c", str(INSTANTIATE), "-o", str(tmp_path / "skinny.o")])


@pytest.mark.parametrize("arch,wave", [
    pytest.param("gfx1030", 32, id="hipcc-gfx1030-wave32"),
    pytest.param("gfx90a", 64, id="hipcc-gfx90a-wave64"),
])
def test_hipcc_compiles_core(tmp_path, arch, wave):
    hipcc = find_compiler("hipcc")
    source = tmp_path / "skinny_instantiate.hip"
    # The warp size compat.h reports must be the target's, or rows and lanes would not match.
    source.write_text(f'#include "{INSTANTIATE.name}"\n'
                      "#if defined(__HIP_DEVICE_COMPILE__)\n"
                      f'static_assert(W4_WARP_SIZE == {wave}, "compat.h warp size on {arch}");\n'
                      "#endif\n")
    env = {**os.environ, "HIP_PLATFORM": "amd"}
    compile_or_fail([hipcc, "-std=c++17", "-O3", f"--offload-arch={arch}", f"-I{CSRC}", "-c", str(source),
                     "-o", str(tmp_path / "skinny.o")], env=env)


# ---------------------------------------------------------------------------------------------
# Python side on CPU


def test_python_limits_match_the_kernel():
    core = (CSRC / "skinny_core.cuh").read_text()
    assert int(re.search(r"kMaxM = (\d+);", core).group(1)) == skinny.MAX_M


def test_is_available_reports_a_reason_without_compiling(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a device is present; this checks the CPU-only report")
    from torch.utils import cpp_extension

    def forbidden(*args, **kwargs):
        raise AssertionError("is_available() compiled on a machine without a device")
    monkeypatch.setattr(cpp_extension, "load", forbidden)
    ok, reason = skinny.is_available()
    assert not ok
    assert "torch.cuda.is_available() is False" in reason


def weights(n: int, k: int, g: int, dtype: torch.dtype, symmetric: bool, weight_dtype: torch.dtype = torch.int32,
            device: str = "cpu"):
    per_elem = 8 if weight_dtype == torch.int32 else 2
    qweight = torch.zeros(n, k // per_elem, dtype=weight_dtype, device=device)
    scales = torch.ones(n, k // g, dtype=dtype, device=device)
    zeros = None if symmetric else torch.zeros(n // 8, k // g, dtype=torch.int32, device=device)
    return qweight, scales, zeros


FAKE_CASES = [
    pytest.param(m, dtype, sym, wdt, id=f"M{m}-{str(dtype)[6:]}-{'sym' if sym else 'asym'}-{str(wdt)[6:]}")
    for m in (1, 16)
    for dtype in (torch.float16, torch.bfloat16)
    for sym in (True, False)
    for wdt in (torch.int32, torch.int8)
]


@pytest.mark.parametrize("m,dtype,symmetric,weight_dtype", FAKE_CASES)
def test_fake_gives_output_shape_and_dtype(m, dtype, symmetric, weight_dtype):
    n, k, g = 64, 256, 128
    with FakeTensorMode():
        x = torch.empty(m, k, dtype=dtype)
        qweight, scales, zeros = weights(n, k, g, dtype, symmetric, weight_dtype)
        bias = torch.empty(n, dtype=dtype)
        y = torch.ops.w4a16.skinny_matmul(x, qweight, scales, zeros, g, bias)
    assert tuple(y.shape) == (m, n) and y.dtype == dtype


def test_fake_on_meta_tensors():
    x = torch.empty(5, 512, dtype=torch.bfloat16, device="meta")
    qweight, scales, zeros = weights(32, 512, 64, torch.bfloat16, False, device="meta")
    y = torch.ops.w4a16.skinny_matmul(x, qweight, scales, zeros, 64, None, "simt")
    assert y.device.type == "meta" and tuple(y.shape) == (5, 32) and y.dtype == torch.bfloat16


def test_fake_rejects_m_beyond_max():
    with FakeTensorMode(), pytest.raises(RuntimeError, match=f"at most {skinny.MAX_M}"):
        x = torch.empty(skinny.MAX_M + 1, 256, dtype=torch.float16)
        torch.ops.w4a16.skinny_matmul(x, *weights(64, 256, 128, torch.float16, True), 128)


@pytest.fixture
def no_build(monkeypatch):
    """Contract checks must fire before any compile: building here fails the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("skinny_matmul tried to build the extension before rejecting its arguments")
    monkeypatch.setattr(skinny, "build", forbidden)


def call(m=1, n=64, k=256, g=128, dtype=torch.float16, symmetric=False, weight_dtype=torch.int32, **overrides):
    x = torch.randn(m, k).to(dtype)
    qweight, scales, zeros = weights(n, k, g, dtype, symmetric, weight_dtype)
    args = {"x": x, "qweight": qweight, "scales": scales, "zeros": zeros, "group_size": g, **overrides}
    return skinny.skinny_matmul(**args)


REJECTED = [
    pytest.param(dict(zeros=torch.zeros(64, 2, dtype=torch.float16)),
                 r"^Zero points must be int32 or uint32 \(packed 8x uint4 along dim 0\)", id="unpacked-zero-points"),
    pytest.param(dict(m=skinny.MAX_M + 1), rf"M <= {skinny.MAX_M}, got M={skinny.MAX_M + 1}", id="M-above-max"),
    pytest.param(dict(g=256, k=512), r"group_size must be one of \(32, 64, 128\)", id="group-size-256"),
    pytest.param(dict(k=48, g=32), "K must be a multiple of group_size", id="K-not-multiple-of-group"),
    pytest.param(dict(k=100, g=32), "K must be a multiple of 8", id="K-not-multiple-of-8"),
    pytest.param(dict(n=12), "Zero points must be int32 or uint32", id="asym-N-not-multiple-of-8"),
    pytest.param(dict(engine="tensor"), "engine must be one of", id="unknown-engine"),
]


@pytest.mark.parametrize("overrides,message", REJECTED)
def test_wrapper_rejects_before_build(no_build, overrides, message):
    with pytest.raises(ContractError, match=message):
        call(**overrides)


@pytest.mark.parametrize("weight_dtype", [torch.int32, torch.int8], ids=["int32-N-K/8", "int8-N-K/2"])
def test_valid_cpu_call_passes_the_contract_then_is_unavailable(no_build, weight_dtype):
    with pytest.raises(skinny.SkinnyUnavailable, match="CUDA/ROCm devices"):
        call(weight_dtype=weight_dtype)

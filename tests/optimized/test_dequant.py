"""The transient dequantization kernel (optimized/dequant.py) under Triton's interpreter: the same
bits as the prepared weight's dense form, on every layout edge."""

import pytest
import torch

from optimized.contract import ContractError
from optimized.dequant import dequantize_into, transient_dense, workspace
from optimized.prepared import dequantize_dense
from oracle import random_quantized, to_kernel_layout

# (N, K, G): tiles of 32 rows and 256 columns with partial last tiles in both, a group inside a
# tile and tiles of several groups, one group spanning K, K not a multiple of a tile.
SHAPES = [(40, 512, 32), (24, 256, 128), (72, 320, 64), (8, 200, -1), (48, 1024, -1)]


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
@pytest.mark.parametrize("symmetric", (False, True), ids=("asym", "sym"))
@pytest.mark.parametrize("n, k, g", SHAPES, ids=[f"N{n}-K{k}-G{g}" for n, k, g in SHAPES])
def test_dequantized_bits_equal_the_dense_form(n, k, g, symmetric, dtype):
    w = random_quantized(n, k, g, symmetric, dtype, generator=torch.Generator().manual_seed(n + k))
    kw = to_kernel_layout(w, dtype)
    got = dequantize_into(kw.qweight, kw.scales, kw.zeros, g, torch.empty(n, k, dtype=dtype))
    want = dequantize_dense(w.with_scales(w.scales.to(dtype)), dtype)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_workspace_is_shared_and_grows():
    a = workspace(100, torch.float16, torch.device("cpu"))
    b = workspace(50, torch.float16, torch.device("cpu"))
    assert b.data_ptr() == a.data_ptr()
    c = workspace(1000, torch.float16, torch.device("cpu"))
    assert c.numel() >= 1000 and workspace(10, torch.bfloat16, torch.device("cpu")).dtype == torch.bfloat16


def test_transient_dense_is_a_view_of_the_workspace():
    w = random_quantized(16, 256, 64, False, torch.float16)
    kw = to_kernel_layout(w, torch.float16)
    dense = transient_dense(kw.qweight, kw.scales, kw.zeros, 64)
    assert dense.shape == (16, 256) and dense.data_ptr() == workspace(1, torch.float16, torch.device("cpu")).data_ptr()


def test_wrong_output_buffer_is_named():
    w = random_quantized(16, 256, 64, False, torch.float16)
    kw = to_kernel_layout(w, torch.float16)
    with pytest.raises(ContractError, match=r"out must be contiguous float16 \[N, K\] = \[16, 256\], got bfloat16"):
        dequantize_into(kw.qweight, kw.scales, kw.zeros, 64, torch.empty(16, 256, dtype=torch.bfloat16))


COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from optimized import dequant
backend, arch, warp = sys.argv[1].split(":")
for dtype in ("fp16", "bf16"):
    for zeros in (True, False):
        fn = dequant._dequant_kernel
        constexprs = dict(HAS_ZEROS=zeros, BLOCK_N=dequant.BLOCK_N, BLOCK_K=dequant.BLOCK_K)
        sig = {a: "constexpr" if a in constexprs else "i32" if a in ("N", "K", "G", "stride_gn")
               else "*i32" if a in ("qweight_ptr", "zeros_ptr") else f"*{dtype}" for a in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if sig[a].startswith("*")}
        target = GPUTarget(backend, int(arch) if arch.isdigit() else arch, int(warp))
        triton.compile(ASTSource(fn, sig, constexprs, attrs), target=target, options={"num_warps": 4})
print("ok")
"""


@pytest.mark.parametrize("target, backend", (("cuda:90:32", "nvidia"), ("hip:gfx942:64", "amd")),
                         ids=("sm90", "gfx942"))
def test_kernel_compiles_for_real_targets(target, backend):
    """The dequantization kernel as a GPU compiles it, on this CPU-only machine (a subprocess: the
    interpreter must be off when the kernel is defined)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    if backend not in triton.backends.backends:
        if os.environ.get("W4A16_REQUIRE_COMPILERS") == "1":
            pytest.fail(f"this triton build has no {backend} backend, and W4A16_REQUIRE_COMPILERS=1 requires it")
        pytest.skip(f"this triton build has no {backend} backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", COMPILE, target], cwd=Path(__file__).resolve().parents[2], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]

"""The kernels' rows of docs/bad_inputs.md: each class of bad input to each public entry point.

A rejected input must raise the documented exception type with a message naming both what was
expected and what was given. An accepted unusual input (strides, M = 0 in the reference, NaN in a
checkpoint) must give what its contiguous / ordinary twin gives. NaN and Inf in activations or
scales must come out of every kernel exactly where the fp64 reference (oracle/reference.py) puts
them: NaN where it has NaN, +Inf and -Inf where it has them, finite elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from optimized import hybrid, skinny, triton_w4a16
from optimized.contract import ContractError
from optimized.triton_w4a16 import w4a16_matmul
from oracle import LayoutError, QuantizedWeight, judge, random_quantized, reference_matmul
from oracle.cases import parity_cases
from oracle.check import check_case
from oracle.kernel_spec import KernelSpec
from oracle.layouts import KernelWeights, to_kernel_layout
from tests.support.bad_inputs import BIAS, KW, META, G, K, N, Q, S, W, X, Z, row, with_one
from tests.support.skinny_emulator import emulate_call

# NaN and Inf inputs are the point here: numpy's warnings about them under the interpreter are noise.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


# ------------------------------------------------------------------------------------------------
# The kernels' shared contract (optimized/contract.py): checked before any launch or build.

class _NoLaunch:
    def __getitem__(self, grid):
        raise AssertionError("a kernel was launched before the arguments were rejected")


@pytest.fixture
def no_launch(monkeypatch):
    monkeypatch.setattr(triton_w4a16, "_w4a16_kernel", _NoLaunch())
    monkeypatch.setattr(triton_w4a16, "_split_k_reduce_kernel", _NoLaunch())

    def forbidden(*args, **kwargs):
        raise AssertionError("skinny_matmul tried to build the extension before rejecting its arguments")
    monkeypatch.setattr(skinny, "build", forbidden)


KERNELS = {"triton": w4a16_matmul, "skinny": skinny.skinny_matmul}
ARGS = dict(x=X, qweight=KW.qweight, scales=KW.scales, zeros=KW.zeros, group_size=G, bias=BIAS)
SYM12 = to_kernel_layout(random_quantized(12, K, G, True, torch.float16), torch.float16)

# (id, argument overrides, expected, given); every row raises ContractError in both kernels.
CONTRACT_REJECTED = [
    ("dtype-x-fp32", dict(x=X.float()), "x must be float16 or bfloat16 [M, K]", "got float32 [3, 64]"),
    ("dtype-x-not-a-tensor", dict(x=X.tolist()), "x must be float16 or bfloat16 [M, K]", "got list"),
    ("dtype-scales-not-x-dtype", dict(x=X.bfloat16()), "scales must be bfloat16 [N, K/G] = [16, 2]",
     "got float16 [16, 2]"),
    ("dtype-qweight-int64", dict(qweight=KW.qweight.long()), "qweight must be int32 [N, K/8] = [N, 8]",
     "got int64 [16, 8]"),
    ("dtype-scales-fp32", dict(scales=KW.scales.float()), "scales must be float16 [N, K/G] = [16, 2]",
     "got float32 [16, 2]"),
    ("dtype-bias-fp32", dict(bias=BIAS.float()), "bias must be float16 [N] = [16]", "got float32 [16]"),
    ("zero-layout-unpacked-float", dict(zeros=Z.half()),
     "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0) [N/8, groups] = [2, 2]", "got float16 [16, 2]"),
    ("zero-layout-unpacked-uint8", dict(zeros=Z),
     "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0) [N/8, groups] = [2, 2]", "got uint8 [16, 2]"),
    ("zero-layout-int64", dict(zeros=KW.zeros.long()), "Zero points must be int32 or uint32", "got int64 [2, 2]"),
    ("shape-x-1d", dict(x=X[0]), "x must be float16 or bfloat16 [M, K]", "got float16 [64]"),
    ("shape-x-3d", dict(x=X[None]), "x must be float16 or bfloat16 [M, K]", "got float16 [1, 3, 64]"),
    ("shape-x-K-mismatch", dict(x=torch.zeros(3, 128).half()), "qweight must be int32 [N, K/8] = [N, 16]",
     "got int32 [16, 8]"),
    ("shape-qweight-transposed", dict(qweight=KW.qweight.t().contiguous()), "qweight must be int32 [N, K/8] = [N, 8]",
     "got int32 [8, 16]"),
    ("shape-scales-transposed", dict(scales=KW.scales.t().contiguous()), "scales must be float16 [N, K/G] = [16, 2]",
     "got float16 [2, 16]"),
    ("shape-zeros-groups", dict(zeros=KW.zeros[:, :1].contiguous()), "[N/8, groups] = [2, 2]", "got int32 [2, 1]"),
    ("shape-bias-N+1", dict(bias=torch.zeros(N + 1).half()), "bias must be float16 [N] = [16]", "got float16 [17]"),
    ("stride-x-column-major", dict(x=X.t().contiguous().t()), "x must be contiguous along K (stride(1) == 1)",
     "got strides [1, 3]"),
    ("stride-qweight", dict(qweight=KW.qweight.t().contiguous().t()), "qweight must be contiguous", "got strides [1, 16]"),
    ("stride-scales", dict(scales=KW.scales.t().contiguous().t()), "scales must be contiguous", "got strides [1, 16]"),
    ("stride-zeros", dict(zeros=KW.zeros.t().contiguous().t()), "zero points must be contiguous", "got strides [1, 2]"),
    ("stride-bias", dict(bias=torch.zeros(2 * N).half()[::2]), "bias must be contiguous", "got strides [2]"),
    ("K-alignment-8", dict(x=torch.zeros(3, 60).half()), "K must be a multiple of 8", "got K=60"),
    ("K-alignment-group", dict(x=torch.zeros(3, 48).half(), qweight=torch.zeros(N, 6, dtype=torch.int32)),
     "K must be a multiple of group_size", "got K=48, group_size=32"),
    ("N-alignment-asymmetric", dict(qweight=SYM12.qweight, scales=SYM12.scales, zeros=torch.zeros(1, 2, dtype=torch.int32),
                                    bias=None),
     "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0) [N/8, groups] = [1.5, 2]", "got int32 [1, 2]"),
    ("group-size-16", dict(group_size=16), "group_size must be one of", "got 16 (int)"),
    ("group-size-float", dict(group_size=32.0), "group_size must be one of", "got 32.0 (float)"),
    ("group-size-numpy", dict(group_size=np.int64(32)), "group_size must be one of", "(int64)"),
    ("group-size-tensor", dict(group_size=torch.tensor(32)), "group_size must be one of", "got tensor(32) (Tensor)"),
    ("M0", dict(x=X[:0]), "x must have M >= 1 rows", "got float16 [0, 64]"),
    ("mixed-devices-x", dict(x=X.to(META)), "all tensors must be on one device", "got ['cpu', 'meta']"),
    ("mixed-devices-bias", dict(bias=BIAS.to(META)), "all tensors must be on one device", "got ['cpu', 'meta']"),
]
# Rows where one kernel's limits differ from the shared contract.
KERNEL_REJECTED = [
    ("triton", "group-size-256", dict(group_size=256), "group_size must be one of (32, 64, 128, -1)", "got 256"),
    ("triton", "dtype-qweight-uint8-N-K/2", dict(qweight=KW.qweight.view(torch.uint8)),
     "qweight must be int32 [N, K/8] = [N, 8]", "got uint8 [16, 32]"),
    ("skinny", "group-size-channelwise", dict(group_size=-1, scales=KW.scales[:, :1].contiguous(),
                                              zeros=KW.zeros[:, :1].contiguous()),
     "group_size must be one of (32, 64, 128)", "got -1"),
    # Above skinny.MAX_M only the tile kernel runs, on whole skinny.TILE_K pieces of K (K = 64 is one half).
    ("skinny", "M17-K64", dict(x=torch.zeros(17, K).half()),
     "skinny_matmul cannot take this call: M=17 above 16 runs on the tile kernel, which needs K % 128 == 0",
     "got K=64"),
]


def contract_rows():
    rows = [pytest.param(kernel, overrides, expected, given, id=f"{kernel}-{name}")
            for kernel in KERNELS for name, overrides, expected, given in CONTRACT_REJECTED]
    rows += [pytest.param(kernel, overrides, expected, given, id=f"{kernel}-{name}")
             for kernel, name, overrides, expected, given in KERNEL_REJECTED]
    return rows


@pytest.mark.parametrize("kernel, overrides, expected, given", contract_rows())
def test_kernel_rejects_before_launch(no_launch, kernel, overrides, expected, given):
    with pytest.raises(ContractError) as info:
        KERNELS[kernel](**{**ARGS, **overrides})
    assert expected in str(info.value) and given in str(info.value), str(info.value)


ALL_META = {name: t.to(META) if isinstance(t, torch.Tensor) else t for name, t in ARGS.items()}


@pytest.mark.parametrize("kernel, exc, expected", [
    pytest.param("triton", RuntimeError, "runs on CUDA/ROCm devices, or on CPU under Triton's interpreter",
                 id="triton-device-meta"),
    pytest.param("skinny", skinny.SkinnyUnavailable, "runs on CUDA/ROCm devices", id="skinny-device-meta"),
])
def test_kernel_on_an_unsupported_device(no_launch, kernel, exc, expected):
    with pytest.raises(exc) as info:
        KERNELS[kernel](**ALL_META)
    assert expected in str(info.value) and "meta" in str(info.value), str(info.value)


# Inputs the contract accepts though they look unusual. The Triton kernel must give its plain
# twin's output bit for bit; the skinny wrapper must get past its contract (on this machine it
# then reports that it needs a GPU).
TRITON_ACCEPTED = {
    "stride-x-row-strided": (dict(x=torch.cat([X, X], 1)[:, :K]), dict()),
    "stride-x-rows-broadcast": (dict(x=X[:1].expand(3, K)), dict(x=X[:1].repeat(3, 1))),
    "dtype-qweight-uint32": (dict(qweight=KW.qweight.view(torch.uint32), zeros=KW.zeros.view(torch.uint32)), dict()),
}


@pytest.mark.parametrize("overrides, twin", TRITON_ACCEPTED.values(), ids=TRITON_ACCEPTED.keys())
def test_triton_accepts(overrides, twin):
    assert torch.equal(w4a16_matmul(**{**ARGS, **overrides}), w4a16_matmul(**{**ARGS, **twin}))


def test_triton_N_not_multiple_of_8_symmetric():
    w12 = random_quantized(12, K, G, True, torch.float16, generator=torch.Generator().manual_seed(3))
    kw = to_kernel_layout(w12, torch.float16)
    v = judge(w4a16_matmul(X, kw.qweight, kw.scales, None, G), reference_matmul(X, w12), dequant_dtype=torch.float16)
    assert v.passed, v.summary()


@pytest.mark.parametrize("overrides", [
    pytest.param(dict(qweight=KW.qweight.view(torch.uint8)), id="dtype-qweight-uint8-N-K/2"),
    pytest.param(dict(x=X[:1].expand(3, K)), id="stride-x-rows-broadcast"),
    pytest.param(dict(qweight=SYM12.qweight, scales=SYM12.scales, zeros=None, bias=None), id="N-alignment-symmetric"),
])
def test_skinny_accepts(no_launch, overrides):
    with pytest.raises(skinny.SkinnyUnavailable, match="runs on CUDA/ROCm devices"):
        skinny.skinny_matmul(**{**ARGS, **overrides})


K128 = to_kernel_layout(random_quantized(N, 128, G, False, torch.float16, generator=torch.Generator().manual_seed(4)),
                        torch.float16)
ARGS_K128 = dict(ARGS, x=torch.zeros(17, 128).half(), qweight=K128.qweight, scales=K128.scales, zeros=K128.zeros)


def test_skinny_takes_m_above_16_on_whole_tile_pieces(no_launch):
    """M = 17 with K = 128 is the tile kernel's: past the contract (then no device here)."""
    with pytest.raises(skinny.SkinnyUnavailable, match="runs on CUDA/ROCm devices"):
        skinny.skinny_matmul(**ARGS_K128)


def test_skinny_rejects_m_above_16_on_rocm(no_launch, monkeypatch):
    """The tile kernel, the only one above M = 16, is CUDA-only: on a ROCm build of torch the same
    call is refused before any build."""
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    with pytest.raises(ContractError) as info:
        skinny.skinny_matmul(**ARGS_K128)
    assert ("skinny_matmul cannot take this call: M=17 above 16 runs on the tile kernel, which is CUDA-only"
            in str(info.value)), str(info.value)
    with pytest.raises(skinny.SkinnyUnavailable, match="runs on CUDA/ROCm devices"):
        skinny.skinny_matmul(**{**ARGS_K128, "x": torch.zeros(16, 128).half()})


# ------------------------------------------------------------------------------------------------
# NaN and Inf: the kernels against the fp64 reference.

SPECIALS = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def nonfinite_masks(y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return y.isnan(), y.isposinf(), y.isneginf()


def assert_nonfinite_like_reference(out: torch.Tensor, ref: torch.Tensor) -> None:
    for name, got, want in zip(("NaN", "+Inf", "-Inf"), nonfinite_masks(out), nonfinite_masks(ref)):
        assert torch.equal(got, want), (f"{name} at {got.nonzero().tolist()[:8]}, the reference has it at "
                                        f"{want.nonzero().tolist()[:8]}")


def planted(where: str, value: float, m: int, n: int, k: int, group: int, dtype: torch.dtype, seed: int):
    """(x, weight): random data with one special value in x (row m // 2) or in one scale."""
    gen = torch.Generator().manual_seed(seed)
    w = random_quantized(n, k, group, False, dtype, generator=gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    if where == "x":
        x[m // 2, 37] = value
    else:
        w = w.with_scales(with_one(w.scales, (5, 1), value))
    return x, w


# The interpreter table's paths: GEMV (M = 1), split-K tensor cores (2..16), tensor cores (17..64),
# half-precision dequant (65+).
TRITON_PATHS = {"gemv": (1, torch.bfloat16), "splitk-dot": (4, torch.float16), "dot": (32, torch.bfloat16),
                "half-dot": (80, torch.float16)}
# The GEMV sums x * (q - z) over a word's eight weights and multiplies by s once, so with s = +-Inf
# a word gives +-Inf (NaN only when its sum is 0) where the reference, which forms each
# W = (q - z) * s first, has 0 * Inf = NaN for every q == z. The output is non-finite exactly where
# the reference's is, but NaN and Inf can trade places, depending on the data.
def gemv_inf_scale(m: int, where: str, value: float) -> bool:
    return m == TRITON_PATHS["gemv"][0] and where == "scale" and math.isinf(value)


def triton_special_cases():
    return [pytest.param(m, dtype, where, value, id=f"{path}-M{m}-{str(dtype)[6:]}-{name}-in-{where}")
            for path, (m, dtype) in TRITON_PATHS.items() for where in ("x", "scale") for name, value in SPECIALS.items()]


@pytest.mark.parametrize("m, dtype, where, value", triton_special_cases())
def test_triton_nonfinite_like_reference(m, dtype, where, value):
    x, w = planted(where, value, m, 72, 256, 64, dtype, seed=m)
    kw = to_kernel_layout(w, dtype)
    out = w4a16_matmul(x, kw.qweight, kw.scales, kw.zeros, 64)
    ref = reference_matmul(x, w).y_out
    if gemv_inf_scale(m, where, value):
        assert ref.isnan().any(), "the planted Inf scale must give the reference a NaN to compare against"
        assert torch.equal(~out.isfinite(), ~ref.isfinite()), (
            f"non-finite at {(~out.isfinite()).nonzero().tolist()[:8]}, the reference has them at "
            f"{(~ref.isfinite()).nonzero().tolist()[:8]}")
    else:
        assert_nonfinite_like_reference(out, ref)


# (engine, M, dtype) under the default plan: a segmented kernel (tensor cores, M = 1), the ring
# (CUDA cores, M = 1) and the batch kernel (tensor cores, M = 12).
SKINNY_PATHS = (("mma", 1, torch.float16), ("simt", 1, torch.bfloat16), ("mma", 12, torch.bfloat16))


@pytest.mark.parametrize("engine, m, dtype, where, value", [
    pytest.param(engine, m, dtype, where, value, id=f"{engine}-M{m}-{str(dtype)[6:]}-{name}-in-{where}")
    for engine, m, dtype in SKINNY_PATHS for where in ("x", "scale") for name, value in SPECIALS.items()
])
def test_skinny_emulated_nonfinite_like_reference(emulator, tmp_path, engine, m, dtype, where, value):
    x, w = planted(where, value, m, 64, 256, 64, dtype, seed=m)
    y, _ = emulate_call(emulator, tmp_path, x, to_kernel_layout(w, dtype), None, engine=engine)
    assert_nonfinite_like_reference(y, reference_matmul(x, w).y_out)


# ------------------------------------------------------------------------------------------------
# The hybrid op: `prepare` once, then `matmul` (optimized/hybrid.py).

PW = hybrid.prepare(W, torch.float16, "cpu")

HYBRID_REJECTED = [
    row("prepare-dtype-fp32", lambda: hybrid.prepare(W, torch.float32, "cpu"), ContractError,
        "dtype must be float16 or bfloat16", "got torch.float32"),
    row("prepare-type-list", lambda: hybrid.prepare([Q, S, Z], torch.float16, "cpu"), ContractError,
        "weight must be an oracle QuantizedWeight, KernelWeights or a mapping", "got list"),
    row("prepare-group-size-16", lambda: hybrid.prepare(QuantizedWeight(Q, S.repeat_interleave(2, 1),
                                                                        Z.repeat_interleave(2, 1), 16),
                                                        torch.float16, "cpu"),
        ContractError, "group_size must be one of", "got 16"),
    row("prepare-zero-layout-unpacked-float", lambda: hybrid.prepare(KernelWeights(KW.qweight, KW.scales, Z.half(), G),
                                                                     torch.float16, "cpu"),
        LayoutError, "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0)", "got float16 [16, 2]"),
    row("matmul-type-w", lambda: hybrid.matmul(X, (KW.qweight, KW.scales)), ContractError,
        "w must be a PreparedWeight", "got tuple"),
    row("matmul-dtype-x-fp32", lambda: hybrid.matmul(X.float(), PW), ContractError,
        "x must be float16 (the dtype the weight was prepared for)", "got float32 [3, 64]"),
    row("matmul-shape-x-K", lambda: hybrid.matmul(X[:, :32], PW), ContractError,
        "x must be a tensor [..., K] with K=64", "got float16 [3, 32]"),
    row("matmul-stride-x-column-major", lambda: hybrid.matmul(X.t().contiguous().t(), PW), ContractError,
        "x must be contiguous along K (stride(1) == 1)", "got strides [1, 3]"),
    row("matmul-dtype-bias-fp32", lambda: hybrid.matmul(X, PW, BIAS.float()), ContractError,
        "bias must be float16 [N] = [16]", "got float32 [16]"),
    row("matmul-impl-unknown", lambda: hybrid.matmul(X, PW, impl="marlin"), ContractError,
        "impl must be 'auto' or one of", "got 'marlin'"),
    row("matmul-impl-skinny-forced-on-cpu", lambda: hybrid.matmul(X, PW, impl="skinny"),
        hybrid.ImplementationUnavailable, "implementation 'skinny' was forced but cannot run this call",
        "needs a CUDA or ROCm device"),
]
HYBRID_REJECTED += [
    row("matmul-mixed-devices-x", lambda: hybrid.matmul(X.to(META), PW), ContractError, "must be on one device",
        "meta"),
    row("matmul-mixed-devices-bias", lambda: hybrid.matmul(X, PW, BIAS.to(META)), ContractError,
        "must be on one device", "meta"),
]


@pytest.mark.parametrize("call, exc, expected, given", HYBRID_REJECTED)
def test_hybrid_rejects(call, exc, expected, given):
    with pytest.raises(exc) as info:
        call()
    assert expected in str(info.value) and given in str(info.value), str(info.value)


def test_hybrid_M0_gives_an_empty_result():
    y = hybrid.matmul(X[:0], PW, BIAS)
    assert y.dtype == torch.float16 and tuple(y.shape) == (0, N)


@pytest.mark.parametrize("where", ("x", "scale"))
@pytest.mark.parametrize("name, value", SPECIALS.items(), ids=SPECIALS.keys())
def test_hybrid_nonfinite_like_reference(where, name, value):
    """M = 4 (Triton's tensor-core tiles on this machine, since skinny cannot run here)."""
    x, w = planted(where, value, 4, 72, 256, 64, torch.float16, seed=4)
    assert_nonfinite_like_reference(hybrid.matmul(x, hybrid.prepare(w, torch.float16, "cpu")),
                                    reference_matmul(x, w).y_out)


# ------------------------------------------------------------------------------------------------
# The harness on our kernel: the bug class this project exists for, end to end. A harness told the
# kernel takes unpacked zero points hands x.dtype [N, groups] to our Triton kernel, whose contract
# names the mistake.

def test_harness_names_unpacked_zero_points_given_to_a_packed_kernel():
    case = next(c for c in parity_cases("cpu", keep=lambda c: c.m == 1 and c.k == 256) if not c.symmetric)
    report = check_case(KernelSpec("triton-told-unpacked", w4a16_matmul, zero_layout="unpacked"), case, device="cpu")
    assert not report.passed
    assert "ContractError: Zero points must be int32 or uint32 (packed 8x uint4 along dim 0)" in report.error
    assert "got float16 [8, 8]" in report.error, report.error

"""Every row of docs/bad_inputs.md: each class of bad input to each public entry point.

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
from safetensors.torch import save_file

from optimized import hybrid, skinny, triton_w4a16
from optimized.contract import ContractError
from optimized.triton_w4a16 import w4a16_matmul
from oracle import CheckpointError, LayoutError, QuantizedWeight, judge, random_quantized, reference_matmul
from oracle.cases import parity_cases
from oracle.check import check_case, check_kernel
from oracle.checkpoint import read_checkpoint, write_checkpoint
from oracle.kernel_spec import KernelSpec
from oracle.layouts import (
    KernelWeights,
    from_awq,
    from_compressed_tensors,
    from_gptq,
    from_kernel_layout,
    from_tinygemm,
    pack_exllama,
    pack_zero_points,
    to_awq,
    to_compressed_tensors,
    to_gptq,
    to_kernel_layout,
    to_tinygemm,
    unpack_exllama,
    unpack_zero_points,
    zero_points_from_float,
    zero_points_to_float,
)
from tests.test_skinny_compile import emulate_call

# NaN and Inf inputs are the point here: numpy's warnings about them under the interpreter are noise.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

# One small asymmetric weight (N = 16, K = 64, G = 32: two groups) and everything derived from it.
N, K, G = 16, 64, 32
W = random_quantized(N, K, G, False, torch.float16, generator=torch.Generator().manual_seed(0))
Q, S, Z = W.q, W.scales, W.zeros
GIDX = torch.arange(K) // G
X = torch.randn(3, K, generator=torch.Generator().manual_seed(1)).half()
BIAS = torch.randn(N, generator=torch.Generator().manual_seed(2)).half()
REF = reference_matmul(X, W)
KW = to_kernel_layout(W, torch.float16)
AWQ = to_awq(W)
GPTQ = to_gptq(W, 2)
CT = to_compressed_tensors(W)
TINY = to_tinygemm(W.with_scales(S.bfloat16()))
META = "meta"  # the second device on a CPU-only machine


def with_one(t: torch.Tensor, index: tuple, value: float) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def tiny_with_scale_zero(scale: float, zero: float) -> dict[str, torch.Tensor]:
    sz = TINY["scales_and_zeros"].clone()
    sz[0, 0] = torch.tensor([scale, zero])
    return {**TINY, "scales_and_zeros": sz}


def float_zero_points(value: float) -> torch.Tensor:
    return with_one(Z.half(), (0, 0), value)


def row(id: str, call, exc: type[Exception], expected: str, given: str):
    return pytest.param(call, exc, expected, given, id=id)


# ------------------------------------------------------------------------------------------------
# The oracle: canonical weight, layouts, reference, judge.

ORACLE_REJECTED = [
    # QuantizedWeight
    row("QuantizedWeight-dtype-q-int32", lambda: QuantizedWeight(Q.int(), S, Z, G), LayoutError,
        "q: expected dtype uint8", "got int32 [16, 64]"),
    row("QuantizedWeight-dtype-scales-int32", lambda: QuantizedWeight(Q, S.int(), Z, G), LayoutError,
        "scales: expected dtype float16 or bfloat16 or float32", "got int32 [16, 2]"),
    row("QuantizedWeight-zero-layout-float-zeros", lambda: QuantizedWeight(Q, S, Z.half(), G), LayoutError,
        "zeros: expected dtype uint8", "got float16 [16, 2]"),
    row("QuantizedWeight-zero-layout-packed-zeros", lambda: QuantizedWeight(Q, S, KW.zeros, G), LayoutError,
        "zeros: expected dtype uint8 (unpacked uint4 [N, K/G] = [16, 2])", "got int32 [2, 2]"),
    row("QuantizedWeight-shape-q-3d", lambda: QuantizedWeight(Q[None], S, Z, G), LayoutError,
        "q: expected a 2-D tensor [N, K]", "got uint8 [1, 16, 64]"),
    row("QuantizedWeight-shape-scales-transposed", lambda: QuantizedWeight(Q, S.t(), Z, G), LayoutError,
        "scales: expected shape [16, 2]", "got float16 [2, 16]"),
    row("QuantizedWeight-shape-N0", lambda: QuantizedWeight(Q[:0], S[:0], Z[:0], G), LayoutError,
        "q: expected non-empty [N, K]", "got uint8 [0, 64]"),
    row("QuantizedWeight-group-size-not-dividing-K", lambda: QuantizedWeight(Q, S, Z, 24), LayoutError,
        "group_size: expected a divisor of K=64", "got 24"),
    row("QuantizedWeight-group-size-0", lambda: QuantizedWeight(Q, S, Z, 0), LayoutError,
        "group_size: expected -1 or a positive size", "got 0"),
    row("QuantizedWeight-group-size-float", lambda: QuantizedWeight(Q, S, Z, 32.0), LayoutError,
        "group_size: expected an int", "got 32.0"),
    row("QuantizedWeight-range-q-nibble-16", lambda: QuantizedWeight(with_one(Q, (3, 5), 16), S, Z, G), LayoutError,
        "q: expected values 0..15", "got 1 value(s) up to 16"),
    row("QuantizedWeight-range-zeros-nibble-16", lambda: QuantizedWeight(Q, S, with_one(Z, (0, 1), 16), G),
        LayoutError, "zeros: expected values 0..15", "got 1 value(s) up to 16"),
    row("QuantizedWeight-g_idx-out-of-range", lambda: QuantizedWeight(Q, S, Z, G, GIDX + 1), LayoutError,
        "g_idx: expected values in 0..1", "got values 1..2"),
    row("QuantizedWeight-g_idx-negative", lambda: QuantizedWeight(Q, S, Z, G, GIDX - 1), LayoutError,
        "g_idx: expected values in 0..1", "got values -1..0"),
    row("QuantizedWeight-g_idx-group-counts", lambda: QuantizedWeight(Q, S, Z, G, torch.zeros(K, dtype=torch.long)),
        LayoutError, "g_idx: expected every group to hold G=32 channels", "got group 0 with 64"),
    row("QuantizedWeight-g_idx-dtype-float", lambda: QuantizedWeight(Q, S, Z, G, GIDX.float()), LayoutError,
        "g_idx: expected dtype int32 or int64", "got float32 [64]"),
    row("QuantizedWeight-g_idx-shape", lambda: QuantizedWeight(Q, S, Z, G, GIDX[:-1]), LayoutError,
        "g_idx: expected shape [64]", "got int64 [63]"),
    row("QuantizedWeight-mixed-devices-scales", lambda: QuantizedWeight(Q, S.to(META), Z, G), LayoutError,
        "tensors must be on one device", "scales on meta"),
    row("QuantizedWeight-mixed-devices-g_idx", lambda: QuantizedWeight(Q, S, Z, G, GIDX.to(META)), LayoutError,
        "tensors must be on one device", "g_idx on meta"),
    row("QuantizedWeight-device-meta", lambda: QuantizedWeight(Q.to(META), S.to(META), Z.to(META), G), LayoutError,
        "q: expected a tensor with data", "uint8 [16, 64] on meta"),
    # layout converters
    row("from_awq-dtype-qweight-uint8", lambda: from_awq({**AWQ, "qweight": AWQ["qweight"].to(torch.uint8)}, G),
        LayoutError, "AutoAWQ GEMM qweight: expected dtype int32 or uint32", "got uint8 [64, 2]"),
    row("from_awq-zero-layout-unpacked-qzeros", lambda: from_awq({**AWQ, "qzeros": Z.t().contiguous().half()}, G),
        LayoutError, "AutoAWQ GEMM qzeros: expected dtype int32 or uint32", "got float16 [2, 16]"),
    row("from_awq-shape-scales-transposed", lambda: from_awq({**AWQ, "scales": AWQ["scales"].t()}, G), LayoutError,
        "AutoAWQ GEMM scales: expected shape [*, 16]", "got float16 [16, 2]"),
    row("from_awq-group-size-mismatch", lambda: from_awq(AWQ, -1), LayoutError,
        "scales: expected shape [16, 1]", "got float16 [16, 2]"),
    row("from_awq-missing-qzeros", lambda: from_awq({"qweight": AWQ["qweight"], "scales": AWQ["scales"]}, G),
        LayoutError, "expected tensors qweight, qzeros, scales", "missing qzeros"),
    row("from_awq-mixed-devices", lambda: from_awq({**AWQ, "scales": AWQ["scales"].to(META)}, G), LayoutError,
        "tensors must be on one device", "scales on meta"),
    row("to_awq-N-alignment", lambda: to_awq(QuantizedWeight(Q[:12], S[:12], Z[:12], G)), LayoutError,
        "AutoAWQ GEMM: expected N divisible by 8", "got N=12"),
    row("from_gptq-version-3", lambda: from_gptq(GPTQ, G, version=3), LayoutError,
        "GPTQ version: expected 1", "got 3"),
    row("from_gptq-zero-layout-unpacked-qzeros", lambda: from_gptq({**GPTQ, "qzeros": Z.t().contiguous().half()}, G, 2),
        LayoutError, "GPTQ v2 qzeros: expected dtype int32 or uint32", "got float16 [2, 16]"),
    row("from_gptq-range-v1-zero-point-0", lambda: from_gptq({**GPTQ, "qzeros": torch.full_like(GPTQ["qzeros"], -1)}, G),
        CheckpointError, "v1 cannot store", "zero-point nibble 0xF"),
    row("from_gptq-g_idx-group-counts", lambda: from_gptq({**GPTQ, "g_idx": with_one(GPTQ["g_idx"], 0, 1)}, G, 2),
        LayoutError, "g_idx: expected every group to hold G=32 channels", "got group 0 with 31"),
    row("from_gptq-g_idx-dtype-float", lambda: from_gptq({**GPTQ, "g_idx": GPTQ["g_idx"].float()}, G, 2), LayoutError,
        "GPTQ v2 g_idx: expected dtype int32 or int64", "got float32 [64]"),
    row("from_gptq-mixed-devices-g_idx", lambda: from_gptq({**GPTQ, "g_idx": GPTQ["g_idx"].to(META)}, G, 2),
        LayoutError, "tensors must be on one device", "g_idx on meta"),
    row("from_compressed_tensors-zero-layout-unpacked",
        lambda: from_compressed_tensors({**CT, "weight_zero_point": Z.half()}, G), LayoutError,
        "weight_zero_point: expected dtype int32 or uint32", "got float16 [16, 2]"),
    row("from_compressed_tensors-shape-weight_shape",
        lambda: from_compressed_tensors({**CT, "weight_shape": torch.tensor([N, K + 8])}, G), LayoutError,
        "expected weight_shape [N, K] = [16, 64]", "got [16, 72]"),
    row("from_compressed_tensors-g_idx-group-counts",
        lambda: from_compressed_tensors({**CT, "weight_g_idx": torch.zeros(K, dtype=torch.int32)}, G), LayoutError,
        "g_idx: expected every group to hold G=32 channels", "got group 0 with 64"),
    row("from_kernel_layout-zero-layout-unpacked-float",
        lambda: from_kernel_layout(KernelWeights(KW.qweight, KW.scales, Z.half(), G)), LayoutError,
        "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0) [2, 2]", "got float16 [16, 2]"),
    row("from_kernel_layout-zero-layout-unpacked-uint8",
        lambda: from_kernel_layout(KernelWeights(KW.qweight, KW.scales, Z, G)), LayoutError,
        "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0) [2, 2]", "got uint8 [16, 2]"),
    row("from_kernel_layout-mixed-devices",
        lambda: from_kernel_layout(KernelWeights(KW.qweight, KW.scales.to(META), KW.zeros, G)), LayoutError,
        "tensors must be on one device", "scales on meta"),
    row("to_kernel_layout-dtype-fp32", lambda: to_kernel_layout(W, torch.float32), LayoutError,
        "activation dtype: expected dtype float16 or bfloat16", "got float32"),
    row("to_kernel_layout-g_idx-act-order", lambda: to_kernel_layout(QuantizedWeight(Q, S, Z, G, GIDX.flip(0)),
                                                                      torch.float16),
        LayoutError, "expected groups of consecutive K channels", "got an act-order g_idx"),
    row("to_kernel_layout-K-alignment", lambda: to_kernel_layout(QuantizedWeight(Q[:, :60], S, Z, 30), torch.float16),
        LayoutError, "kernel layout: expected K divisible by 8", "got K=60"),
    row("pack_zero_points-zero-layout-float", lambda: pack_zero_points(Z.half()), LayoutError,
        "zero points to pack: expected dtype uint8", "got float16 [16, 2]"),
    row("pack_zero_points-N-alignment", lambda: pack_zero_points(Z[:12]), LayoutError,
        "packed zero points: expected N divisible by 8", "got N=12"),
    row("pack_zero_points-range-nibble-16", lambda: pack_zero_points(with_one(Z, (0, 0), 16)), LayoutError,
        "expected values 0..15", "got 1 value(s) up to 16"),
    row("unpack_zero_points-zero-layout-float", lambda: unpack_zero_points(Z.half()), LayoutError,
        "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0)", "got float16 [16, 2]"),
    row("zero_points_from_float-range-not-integral", lambda: zero_points_from_float(float_zero_points(2.5)),
        LayoutError, "expected integers 0..15", "e.g. 2.5"),
    row("zero_points_from_float-range-16", lambda: zero_points_from_float(float_zero_points(16.0)), LayoutError,
        "expected integers 0..15", "e.g. 16.0"),
    row("zero_points_from_float-range-negative", lambda: zero_points_from_float(float_zero_points(-1.0)),
        LayoutError, "expected integers 0..15", "e.g. -1.0"),
    row("zero_points_from_float-nan", lambda: zero_points_from_float(float_zero_points(float("nan"))), LayoutError,
        "expected integers 0..15", "e.g. nan"),
    row("zero_points_from_float-inf", lambda: zero_points_from_float(float_zero_points(float("inf"))), LayoutError,
        "expected integers 0..15", "e.g. inf"),
    row("zero_points_from_float-dtype-int32", lambda: zero_points_from_float(Z.int()), LayoutError,
        "expected dtype float16 or bfloat16", "got int32 [16, 2]"),
    row("zero_points_to_float-range-nibble-16", lambda: zero_points_to_float(with_one(Z, (0, 0), 16), torch.float16),
        LayoutError, "zero points: expected values 0..15", "up to 16"),
    row("zero_points_to_float-dtype-fp32", lambda: zero_points_to_float(Z, torch.float32), LayoutError,
        "expected dtype float16 or bfloat16", "got float32"),
    row("pack_exllama-K-alignment", lambda: pack_exllama(Q[:, :60]), LayoutError,
        "ExLlama shuffle: expected K divisible by 8", "got K=60"),
    row("pack_exllama-range-nibble-16", lambda: pack_exllama(with_one(Q, (0, 0), 16)), LayoutError,
        "expected values 0..15", "up to 16"),
    row("unpack_exllama-dtype-uint8", lambda: unpack_exllama(Q), LayoutError,
        "packed words: expected dtype int32 or uint32", "got uint8 [16, 64]"),
    row("to_tinygemm-dtype-fp16-scales", lambda: to_tinygemm(W), LayoutError,
        "tinygemm scales: expected dtype bfloat16", "got float16 [16, 2]"),
    row("from_tinygemm-dtype-fp16", lambda: from_tinygemm({**TINY, "scales_and_zeros": TINY["scales_and_zeros"].half()}, G),
        LayoutError, "scales_and_zeros: expected dtype bfloat16", "got float16 [2, 16, 2]"),
    row("from_tinygemm-range-zero-not-integral", lambda: from_tinygemm(tiny_with_scale_zero(1.0, 0.5), G),
        CheckpointError, "8 - z for an integer z in 0..15", "z = 7.5"),
    row("from_tinygemm-range-z-16", lambda: from_tinygemm(tiny_with_scale_zero(1.0, -8.0), G), CheckpointError,
        "8 - z for an integer z in 0..15", "z = 16.0"),
    # reference_matmul
    row("reference_matmul-dtype-x-fp32", lambda: reference_matmul(X.float(), W), LayoutError,
        "x: expected dtype float16 or bfloat16", "got float32 [3, 64]"),
    row("reference_matmul-shape-x-K", lambda: reference_matmul(X[:, :32], W), LayoutError,
        "x: expected shape [*, 64]", "got float16 [3, 32]"),
    row("reference_matmul-shape-x-1d", lambda: reference_matmul(X[0], W), LayoutError,
        "x: expected shape [*, 64]", "got float16 [64]"),
    row("reference_matmul-dtype-bias-fp32", lambda: reference_matmul(X, W, BIAS.float()), LayoutError,
        "bias: expected dtype float16", "got float32 [16]"),
    row("reference_matmul-shape-bias", lambda: reference_matmul(X, W, torch.zeros(N + 1).half()), LayoutError,
        "bias: expected shape [16]", "got float16 [17]"),
    row("reference_matmul-weight-not-canonical", lambda: reference_matmul(X, (Q, S, Z)), LayoutError,
        "weight: expected a QuantizedWeight", "got tuple"),
    row("reference_matmul-accumulate-fp16", lambda: reference_matmul(X, W, accumulate=torch.float16), LayoutError,
        "accumulate: expected torch.float64 or torch.float32", "got torch.float16"),
    row("reference_matmul-mixed-devices-x", lambda: reference_matmul(X.to(META), W), LayoutError,
        "tensors must be on one device", "x on meta"),
    row("reference_matmul-mixed-devices-bias", lambda: reference_matmul(X, W, BIAS.to(META)), LayoutError,
        "tensors must be on one device", "bias on meta"),
    # judge
    row("judge-dtype-out-fp32", lambda: judge(REF.y_out.float(), REF, dequant_dtype=torch.float16), LayoutError,
        "kernel output: expected float16 [3, 16]", "got float32 [3, 16]"),
    row("judge-shape-out", lambda: judge(REF.y_out[:2], REF, dequant_dtype=torch.float16), LayoutError,
        "kernel output: expected float16 [3, 16]", "got float16 [2, 16]"),
    row("judge-out-not-a-tensor", lambda: judge(None, REF, dequant_dtype=torch.float16), LayoutError,
        "kernel output: expected float16 [3, 16]", "got NoneType"),
    row("judge-device-out-meta", lambda: judge(REF.y_out.to(META), REF, dequant_dtype=torch.float16), LayoutError,
        "kernel output: expected a tensor with data", "on meta"),
    row("judge-dequant-dtype-int32", lambda: judge(REF.y_out, REF, dequant_dtype=torch.int32), LayoutError,
        "dequant_dtype: expected None or a floating-point torch.dtype", "got torch.int32"),
    row("judge-criterion", lambda: judge(REF.y_out, REF, dequant_dtype=torch.float16, criterion="loose"), LayoutError,
        "criterion: expected 'tight' or 'hard'", "got 'loose'"),
]


@pytest.mark.parametrize("call, exc, expected, given", ORACLE_REJECTED)
def test_oracle_rejects(call, exc, expected, given):
    with pytest.raises(exc) as info:
        call()
    assert type(info.value) is exc
    assert expected in str(info.value) and given in str(info.value), str(info.value)


ORACLE_ACCEPTED = [
    # (id, call, the twin it must equal bit for bit)
    pytest.param(lambda: QuantizedWeight(Q.t().contiguous().t(), S.t().contiguous().t(), Z, G).dequantize(),
                 lambda: W.dequantize(), id="QuantizedWeight-stride-column-major-q-and-scales"),
    pytest.param(lambda: reference_matmul(torch.cat([X, X], 1)[:, :K], W).y, lambda: REF.y,
                 id="reference_matmul-stride-row-strided-x"),
    pytest.param(lambda: reference_matmul(X[:0], W).y, lambda: torch.empty(0, N, dtype=torch.float64),
                 id="reference_matmul-M0-empty-output"),
    pytest.param(lambda: from_awq({k: v.t().contiguous().t() for k, v in AWQ.items()}, G).dequantize(),
                 lambda: W.dequantize(), id="from_awq-stride-column-major-tensors"),
]


@pytest.mark.parametrize("call, twin", ORACLE_ACCEPTED)
def test_oracle_accepts(call, twin):
    got, want = call(), twin()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


# The fp64 reference defines NaN / Inf propagation: elementwise IEEE arithmetic on W = (q - z) * s
# and x, with no shortcut. These pin that definition down on hand-computed cases.
def test_reference_nan_in_x_fills_its_row():
    y = reference_matmul(with_one(X, (1, 7), float("nan")), W).y
    assert y[1].isnan().all() and torch.isfinite(y[[0, 2]]).all()


def test_reference_nan_scale_fills_its_column():
    y = reference_matmul(X, W.with_scales(with_one(S, (4, 1), float("nan")))).y
    assert y[:, 4].isnan().all() and torch.isfinite(y[:, [n for n in range(N) if n != 4]]).all()


def test_reference_inf_in_x_is_nan_where_the_weight_is_zero():
    k = 7
    y = reference_matmul(with_one(X, (1, k), float("inf")), W).y
    w_col = W.dequantize()[:, k]
    assert torch.equal(y[1].isnan(), w_col == 0)
    assert torch.equal(y[1].isposinf(), w_col > 0) and torch.equal(y[1].isneginf(), w_col < 0)


def test_reference_inf_scale_is_nan_where_any_product_is_zero():
    """s = Inf makes W = (q - z) * Inf: NaN where q == z, so the whole output column is NaN if its
    group has any q == z (or any zero x); a kernel that scales a group's sum once gives Inf instead."""
    n, grp = 4, 1
    q = Q.clone()
    q[n, grp * G] = Z[n, grp]  # one q == z in the group
    w = QuantizedWeight(q, with_one(S, (n, grp), float("inf")), Z, G)
    assert reference_matmul(X, w).y[:, n].isnan().all()


def test_judge_nonfinite_output():
    """NaN where the reference is finite fails (with infinite error); NaN where the reference has
    NaN passes."""
    bad = with_one(REF.y_out, (0, 0), float("nan"))
    v = judge(bad, REF, dequant_dtype=torch.float16)
    assert not v.passed and v.violations == 1 and v.worst_at == (0, 0)
    w_nan = W.with_scales(with_one(S, (0, 0), float("nan")))
    ref_nan = reference_matmul(X, w_nan)
    assert judge(ref_nan.y_out.clone(), ref_nan, dequant_dtype=torch.float16).passed


# ------------------------------------------------------------------------------------------------
# check_kernel / check_case: the harness raises on a bad spec or case list, and reports (never
# raises) what a kernel does wrong.

def torch_kernel(x, weight, scales, zeros, group_size, bias):
    """A correct packed-zero-point kernel in plain torch (the README's example)."""
    kw = KernelWeights(weight, scales, zeros, group_size)
    w = from_kernel_layout(kw).dequantize(torch.float32).to(x.dtype)
    y = x.float() @ w.float().t()
    return (y if bias is None else y + bias.float()).to(x.dtype)


ASYM_CASE = next(c for c in parity_cases("cpu", keep=lambda c: c.m == 1 and c.k == 256) if not c.symmetric)


@pytest.mark.parametrize("call, expected, given", [
    pytest.param(lambda: check_kernel(torch_kernel, [ASYM_CASE]), "spec: expected a KernelSpec", "got function",
                 id="check_kernel-spec-not-KernelSpec"),
    pytest.param(lambda: check_kernel(KernelSpec("k", torch_kernel), ["small-M1"]), "cases: expected oracle.cases.Case",
                 "got str", id="check_kernel-case-not-Case"),
    pytest.param(lambda: KernelSpec("k", torch_kernel, weight_layout="marlin"), "weight_layout: expected one of",
                 "got 'marlin'", id="KernelSpec-weight-layout-unknown"),
    pytest.param(lambda: KernelSpec("k", torch_kernel, zero_layout="packed_n"), "zero_layout: expected one of",
                 "got 'packed_n'", id="KernelSpec-zero-layout-unknown"),
])
def test_harness_rejects(call, expected, given):
    with pytest.raises(LayoutError) as info:
        call()
    assert expected in str(info.value) and given in str(info.value), str(info.value)


@pytest.mark.parametrize("spec, device, expected, given", [
    pytest.param(KernelSpec("fp32-out", lambda *a: torch_kernel(*a).float()), "cpu",
                 "LayoutError: kernel output: expected float16 [1, 8]", "got float32 [1, 8]", id="output-dtype"),
    pytest.param(KernelSpec("short-out", lambda *a: torch_kernel(*a)[:, :4]), "cpu",
                 "LayoutError: kernel output: expected float16 [1, 8]", "got float16 [1, 4]", id="output-shape"),
    pytest.param(KernelSpec("meta-out", lambda *a: torch_kernel(*a).to(META)), "cpu",
                 "LayoutError: kernel output: expected a tensor with data", "on meta", id="output-on-meta"),
    # The bug class this project exists for, end to end: a harness told the kernel takes unpacked
    # zero points hands x.dtype [N, groups] to our Triton kernel, whose contract names the mistake.
    pytest.param(KernelSpec("triton-told-unpacked", w4a16_matmul, zero_layout="unpacked"), "cpu",
                 "ContractError: Zero points must be int32 or uint32 (packed 8x uint4 along dim 0)",
                 "got float16 [8, 8]", id="zero-layout-unpacked-given-to-packed-kernel"),
    pytest.param(KernelSpec("k", torch_kernel), META, "LayoutError: q: expected a tensor with data", "on meta",
                 id="device-meta"),
])
def test_harness_reports_kernel_errors(spec, device, expected, given):
    report = check_case(spec, ASYM_CASE, device=device)
    assert not report.passed
    assert expected in report.error and given in report.error, report.error


# ------------------------------------------------------------------------------------------------
# read_checkpoint

LAYER = "model.layers.0.self_attn.q_proj"


@pytest.fixture
def awq_file(tmp_path):
    """(path, config) of a one-layer AutoAWQ checkpoint of W."""
    path = tmp_path / "model.safetensors"
    return path, write_checkpoint(path, {LAYER: W}, "awq")


def resave(path, **replace):
    tensors = {f"{LAYER}.{name}": t for name, t in {**AWQ, **replace}.items()}
    save_file(tensors, str(path))
    return path


def corrupt(path):
    path.write_bytes(b"not a safetensors header")
    return path


CHECKPOINT_REJECTED = {
    "missing-path": (lambda p, qc: read_checkpoint(p.parent / "absent.safetensors", qc),
                     "expected a .safetensors file or a directory", "found nothing there"),
    "corrupt-file": (lambda p, qc: read_checkpoint(corrupt(p), qc),
                     "model.safetensors: expected a safetensors file", "could not read it"),
    "config-not-a-dict": (lambda p, qc: read_checkpoint(p, [qc]), "config: expected a dict", "got list"),
    "config-bits-8": (lambda p, qc: read_checkpoint(p, {**qc, "bits": 8}), "expected bits 4", "found 8"),
    "config-group-size-str": (lambda p, qc: read_checkpoint(p, {**qc, "group_size": "32"}),
                              "expected group_size -1 or a positive int", "found '32'"),
    "group-size-mismatch": (lambda p, qc: read_checkpoint(p, {**qc, "group_size": 64}),
                            f"layer '{LAYER}': scales: expected shape [16, 1]", "got float16 [16, 2]"),
    "format-mismatch": (lambda p, qc: read_checkpoint(p, {**qc, "quant_method": "compressed-tensors"}),
                        "expected tensors '<layer>.weight_packed'", "found '<layer>.qweight'"),
    "zero-layout-unpacked-qzeros": (lambda p, qc: read_checkpoint(resave(p, qzeros=Z.t().contiguous().half()), qc),
                                    f"layer '{LAYER}': AutoAWQ GEMM qzeros: expected dtype int32 or uint32",
                                    "got float16 [2, 16]"),
    "dtype-qweight-int64": (lambda p, qc: read_checkpoint(resave(p, qweight=AWQ["qweight"].long()), qc),
                            "AutoAWQ GEMM qweight: expected dtype int32 or uint32", "got int64 [64, 2]"),
}


@pytest.mark.parametrize("call, expected, given", CHECKPOINT_REJECTED.values(), ids=CHECKPOINT_REJECTED.keys())
def test_read_checkpoint_rejects(awq_file, call, expected, given):
    with pytest.raises(CheckpointError) as info:
        call(*awq_file)
    assert expected in str(info.value) and given in str(info.value), str(info.value)


def test_read_checkpoint_inconsistent_g_idx(tmp_path):
    path = tmp_path / "gptq.safetensors"
    qc = write_checkpoint(path, {LAYER: W}, "gptq", version=2)
    tensors = {f"{LAYER}.{name}": t for name, t in GPTQ.items()}
    tensors[f"{LAYER}.g_idx"] = with_one(GPTQ["g_idx"], 0, 1)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path, {**qc, "desc_act": True})
    assert f"layer '{LAYER}': g_idx: expected every group to hold G=32" in str(info.value)
    assert "got group 0 with 31" in str(info.value)


def test_read_checkpoint_keeps_nan_scales(awq_file):
    """NaN is a value like any other to a reader: kept bit for bit, for the reference to propagate."""
    path, qc = awq_file
    scales = with_one(AWQ["scales"], (1, 4), float("nan"))
    got = read_checkpoint(resave(path, scales=scales), qc)[LAYER]
    assert got.scales.isnan().sum() == 1 and got.scales[4, 1].isnan()


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
    ("skinny", "M17", dict(x=torch.zeros(17, K).half()), "skinny_matmul handles M <= 16", "got M=17"),
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


# (engine, M, dtype): tensor-core and CUDA-core engines, the register-ring variant (M <= 8) and
# the base variant (M > 8) under the default policy.
SKINNY_PATHS = (("mma", 1, torch.float16), ("simt", 1, torch.bfloat16), ("mma", 12, torch.bfloat16))


@pytest.mark.parametrize("engine, m, dtype, where, value", [
    pytest.param(engine, m, dtype, where, value, id=f"{engine}-M{m}-{str(dtype)[6:]}-{name}-in-{where}")
    for engine, m, dtype in SKINNY_PATHS for where in ("x", "scale") for name, value in SPECIALS.items()
])
def test_skinny_emulated_nonfinite_like_reference(plain_emulator, tmp_path, engine, m, dtype, where, value):
    x, w = planted(where, value, m, 64, 256, 64, dtype, seed=m)
    y, _ = emulate_call(plain_emulator, tmp_path, x, to_kernel_layout(w, dtype), None, variant=-1, engine=engine)
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

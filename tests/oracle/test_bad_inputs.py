"""The oracle's rows of docs/bad_inputs.md: each class of bad input to each public entry point.

A rejected input must raise the documented exception type with a message naming both what was
expected and what was given. An accepted unusual input (strides, M = 0 in the reference, NaN in a
checkpoint) must give what its contiguous / ordinary twin gives. NaN and Inf in activations or
scales must come out of every kernel exactly where the fp64 reference (oracle/reference.py) puts
them: NaN where it has NaN, +Inf and -Inf where it has them, finite elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from oracle import CheckpointError, LayoutError, QuantizedWeight, judge, reference_matmul
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
    to_kernel_layout,
    to_tinygemm,
    unpack_exllama,
    unpack_zero_points,
    zero_points_from_float,
    zero_points_to_float,
)
from tests.support.bad_inputs import (AWQ, BIAS, CT, GIDX, GPTQ, KW, META, REF, TINY, G, K, N, Q, S, W, X, Z,
                                      float_zero_points, row, tiny_with_scale_zero, with_one)

# NaN and Inf inputs are the point here: numpy's warnings about them under the interpreter are noise.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


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
                            f"layer '{LAYER}': AutoAWQ: config group_size=64 gives ceil(K/G) = 1 group(s) for K = 64",
                            "scales [2, 16], qzeros [2, 2] hold 2"),
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



"""Diagnosis: each deliberately broken kernel is explained by its own mistake, correct ones by none."""

import pytest
import torch

from fixtures.variants import CORRECT
from oracle import random_quantized, reference_matmul
from oracle.diagnose import CONVENTIONS, diagnose

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = random_quantized(64, 1024, 64, False, dtype, generator=g)
    x = torch.randn(4, 1024, generator=g).to(dtype)
    bias = (0.1 * torch.randn(64, generator=g)).to(dtype)
    return x, w, bias


def applicable():
    """Every convention with every dtype where the mistake changes something (rounding scales
    through bf16 changes nothing when they are bf16 already)."""
    return [pytest.param(c, dtype, id=f"{c.name}-{name}") for c in CONVENTIONS for name, dtype in DTYPES.items()
            if c.apply(*inputs(dtype)) is not None]


@pytest.mark.parametrize("convention, dtype", applicable())
def test_each_known_mistake_is_named(convention, dtype):
    """A kernel making exactly this mistake (computed exactly, then rounded once) is explained by it."""
    x, w, bias = inputs(dtype)
    seen = convention.apply(x, w, bias)
    out = reference_matmul(*seen).y_out
    d = diagnose(out, x, w, bias, dequant_dtype=dtype)
    assert d.names and d.names[0] == convention.name, d
    assert convention.name in d.summary()


def test_unpacked_zeros_misread_is_named_with_an_odd_group_count():
    """K / G = 3: the float zero array's rows are not whole int32 words, only the whole array is."""
    g = torch.Generator().manual_seed(2)
    w = random_quantized(16, 192, 64, False, torch.float16, generator=g)
    x = torch.randn(2, 192, generator=g).to(torch.float16)
    convention = next(c for c in CONVENTIONS if c.name == "unpacked_zeros_as_packed")
    seen = convention.apply(x, w, None)
    assert seen is not None
    d = diagnose(reference_matmul(*seen).y_out, x, w, None, dequant_dtype=torch.float16)
    assert d.names[:1] == [convention.name], d


@pytest.mark.parametrize("variant", CORRECT, ids=lambda v: v.name)
def test_correct_kernels_need_no_explanation(variant):
    x, w, bias = inputs(torch.bfloat16, 1)
    d = diagnose(variant.fn(x, w, bias), x, w, bias, dequant_dtype=variant.dequant_dtype(x.dtype),
                 dequant_roundings=variant.roundings)
    assert d.explained_by == [] and d.unwritten is None


def test_unwritten_rows_and_columns_are_located():
    x, w, bias = inputs(torch.float16)
    out = reference_matmul(x, w, bias).y_out.clone()
    out[:, -3:] = 0
    out[1] = float("nan")
    d = diagnose(out, x, w, bias, dequant_dtype=torch.float16)
    assert d.unwritten == ([1], [61, 62, 63])
    assert "left unwritten" in d.summary()


def test_an_unknown_bug_is_said_to_be_unknown():
    x, w, bias = inputs(torch.float16)
    out = reference_matmul(x, w, bias).y_out.clone()
    out[0, 0] += 1
    d = diagnose(out, x, w, bias, dequant_dtype=torch.float16)
    assert not d.explained_by and "no known wrong convention" in d.summary()


def test_the_converged_kernels_bug_is_diagnosed_through_the_harness():
    """A Python side handing activation-dtype [N, groups] zero points to code that reads packed
    int32 [N/8, groups]: the bytes are reinterpreted, the output is wrong, and the report says why."""
    from oracle.baselines import torch_dequant
    from oracle.cases import parity_cases
    from oracle.check import check_case
    from oracle.kernel_spec import KernelSpec

    def reads_packed(x, weight, scales, zeros, group_size, bias):
        n, groups = zeros.shape
        words = zeros.contiguous().view(torch.int32).flatten()[: (n // 8) * groups].reshape(n // 8, groups)
        return torch_dequant.fn(x, weight, scales, words, group_size, bias)

    spec = KernelSpec(name="converged", fn=reads_packed, zero_layout="unpacked")
    case = next(c for c in parity_cases("cpu") if not c.symmetric and c.n == 96 and c.group_size == 64 and c.m == 3)
    report = check_case(spec, case)
    assert not report.passed
    assert report.diagnosis.startswith("explained by unpacked_zeros_as_packed"), report.diagnosis

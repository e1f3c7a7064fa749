"""The error model in both directions: legitimate implementations pass on hundreds of seeds,
planted bugs fail."""

import pytest
import torch

from fixtures.variants import BUGGY, CORRECT, Variant
from oracle import judge, random_quantized, reference_matmul
from oracle.error_model import error_bounds, unit_roundoff
from oracle.errors import LayoutError
from oracle.quantize import WEIGHT_KINDS

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
N, M = 64, 8
# K from 16 to 16384; fewer seeds where one seed already covers many long dot products.
SEEDS_PER_K = {16: 100, 64: 100, 256: 100, 1024: 100, 4096: 20, 16384: 6}


def make_case(k: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = random_quantized(N, k, min(128, k), seed % 2 == 0, dtype, WEIGHT_KINDS[seed % 3], g)
    x = torch.randn(M, k, generator=g).to(dtype)
    bias = (0.1 * torch.randn(N, generator=g)).to(dtype) if seed % 4 < 2 else None
    return x, w, bias


def verdict_of(v: Variant, x, w, bias, criterion: str = "tight"):
    ref = reference_matmul(x, w, bias)
    return judge(v.fn(x, w, bias), ref, dequant_dtype=v.dequant_dtype(x.dtype), dequant_roundings=v.roundings,
                 criterion=criterion)


@pytest.mark.parametrize("k", SEEDS_PER_K, ids=lambda k: f"K{k}")
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("variant", CORRECT, ids=lambda v: v.name)
def test_correct_implementations_pass(variant, dtype, k):
    seeds = SEEDS_PER_K[k] if variant.name != "sequential_fp32" or k <= 1024 else 4
    worst = 0.0
    for seed in range(seeds):
        x, w, bias = make_case(k, dtype, seed)
        v = verdict_of(variant, x, w, bias)
        assert v.passed, f"seed {seed}: {v.summary()}"
        assert v.hard_violations == 0, f"seed {seed}: {v.summary()}"
        worst = max(worst, v.worst_ratio)
    print(f"{variant.name} K={k} {dtype}: worst error/bound {worst:.3f} over {seeds} seeds")


# Each bug at the K where the random-data verdict must see it (zero point and nibble bugs hide
# under output rounding at large K, which is what the exact probes are for).
BUG_K = {"accumulate_16bit": 4096, "zero_point_off_by_one": 128, "swapped_nibble_pair": 128,
         "bias_dropped": 1024, "last_columns_unwritten": 16384}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("variant", BUGGY, ids=lambda v: v.name)
def test_planted_bugs_fail(variant, dtype):
    k = BUG_K[variant.name]
    seeds = 5 if k >= 4096 else 50
    for seed in range(seeds):
        x, w, bias = make_case(k, dtype, seed)
        if bias is None and variant.name == "bias_dropped":
            bias = torch.ones(N, dtype=dtype)
        v = verdict_of(variant, x, w, bias)
        assert not v.passed, f"seed {seed}: bug not seen: {v.summary()}"
        assert v.violations > 0 and v.worst_ratio > 1 and v.examples


def test_unwritten_nan_output_fails_everywhere():
    x, w, bias = make_case(256, torch.float16, 0)
    out = CORRECT[0].fn(x, w, bias)
    out[2, 5] = float("nan")
    v = judge(out, reference_matmul(x, w, bias), dequant_dtype=torch.float16)
    assert not v.passed and v.worst_at == (2, 5) and v.worst_ratio == float("inf")


def test_hard_bound_contains_tight_and_both_scale_with_k():
    x, w, bias = make_case(1024, torch.bfloat16, 3)
    b = error_bounds(reference_matmul(x, w, bias), torch.bfloat16, 2)
    assert bool((b.hard >= b.tight).all())
    x2, w2, _ = make_case(16, torch.bfloat16, 3)
    b2 = error_bounds(reference_matmul(x2, w2), torch.bfloat16, 2)
    assert float(b.tight.mean()) > float(b2.tight.mean())


def test_fp32_reference_mode_widens_the_bounds():
    x, w, bias = make_case(4096, torch.float16, 1)
    b64 = error_bounds(reference_matmul(x, w, bias), torch.float16)
    b32 = error_bounds(reference_matmul(x, w, bias, accumulate=torch.float32), torch.float16)
    assert bool((b32.tight > b64.tight).all()) and bool((b32.hard > b64.hard).all())


def test_overflow_to_inf_is_expected_exactly():
    w = random_quantized(8, 64, 32, False, torch.float16)
    w = w.with_scales(torch.full_like(w.scales, 60000.0))
    x = torch.full((1, 64), 100.0, dtype=torch.float16)
    ref = reference_matmul(x, w)
    assert not bool(torch.isfinite(ref.y_out).all())
    assert judge(ref.y_out.clone(), ref, dequant_dtype=None).passed
    wrong = ref.y_out.clone()
    wrong[~torch.isfinite(wrong)] = 65504.0
    assert not judge(wrong, ref, dequant_dtype=None).passed


def test_baseline_error_is_reported():
    x, w, bias = make_case(1024, torch.float16, 5)
    ref = reference_matmul(x, w, bias)
    out = CORRECT[0].fn(x, w, bias)
    v = judge(out, ref, dequant_dtype=torch.float16, baseline=CORRECT[4].fn(x, w, bias))
    assert v.baseline_worst_ratio is not None and 0 < v.baseline_worst_ratio < 1
    assert "plain torch" in v.summary()


@pytest.mark.parametrize("bad", ["fp32", "shape"])
def test_output_of_the_wrong_layout_is_an_error(bad):
    x, w, bias = make_case(64, torch.float16, 0)
    ref = reference_matmul(x, w, bias)
    out = ref.y_out.float() if bad == "fp32" else ref.y_out.t()
    with pytest.raises(LayoutError, match="kernel output: expected float16"):
        judge(out, ref, dequant_dtype=torch.float16)


def test_unit_roundoffs():
    assert unit_roundoff(torch.float16) == 2.0**-11
    assert unit_roundoff(torch.bfloat16) == 2.0**-8

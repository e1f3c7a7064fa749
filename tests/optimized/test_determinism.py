"""Determinism and batch invariance of every kernel that runs on this machine: the Triton kernel
(under its interpreter), the skinny kernel (its CPU emulation, csrc/skinny_emu.h) and the oracle
reference.

Three properties, each checked by one function that the last section proves against planted bugs:

* determinism: repeated calls on the same inputs give the same bits;
* row independence: row i of the output keeps its bits whatever the other rows of x hold
  (other random values, huge values, NaN and Inf);
* M invariance: row i keeps its bits whatever M is, over the M that share one configuration.

What each kernel promises about M (and so what is tested):
* Triton (optimized/triton_w4a16.py, "Batch invariance"): bit-identical within one M bucket of
  its tile table; across a bucket edge only within the error bound.
* skinny (optimized/csrc): deterministic; rows are computed independently, and M changes a row's
  bits only where it changes the plan's summation order (SkinnyPlan.summation: the kernel, its
  M-dependent tile and its split), so M invariance is tested within each run of M that shares one;
  the stream kernel's within each of its M buckets.
* the reference: fp64 torch matmul, row by row independent of M.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from optimized import skinny
from optimized.policy import INTERPRETER, policy_for
from optimized.tile_configs import select_config
from optimized.triton_w4a16 import w4a16_matmul
from oracle import judge, random_quantized, reference_matmul
from oracle.canonical import bit_equal
from oracle.layouts import to_kernel_layout
from tests.support.skinny_emulator import emulate_call, emulated_plans

# Other rows filled with NaN and Inf are part of the row-independence check: numpy's warnings
# about them under the interpreter are noise.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

from tests.support.invariance import Run, assert_deterministic, assert_rows_independent, assert_same_rows_for_every_m, first_difference

def problem(n: int, k: int, group: int, m: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = random_quantized(n, k, group, False, dtype, generator=gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    bias = (torch.randn(n, generator=gen) * 0.5).to(dtype)
    return w, x, bias


# ------------------------------------------------------------------------------------------------
# Triton, under the interpreter

TK, TN, TG = 256, 72, 64


def triton_run(dtype: torch.dtype, seed: int = 0) -> tuple[Run, torch.Tensor]:
    w, x, bias = problem(TN, TK, TG, 129, dtype, seed)
    kw = to_kernel_layout(w, dtype)
    return (lambda xx: w4a16_matmul(xx, kw.qweight, kw.scales, kw.zeros, TG, bias)), x


def buckets() -> list[tuple[int, int]]:
    """(first M, last M) of each interpreter-table bucket; the open last one cut at 129."""
    out, lo = [], 1
    for max_m, _ in policy_for(INTERPRETER).triton.buckets:
        hi = 129 if max_m is None else max_m
        out.append((lo, hi))
        lo = hi + 1
    return out


def config_id(m: int) -> str:
    return select_config(m, TN, TK, TG, policy_for(INTERPRETER).triton).id


# One M per bucket: GEMV with split-K and its reduction kernel, split-K tensor cores, tensor
# cores, tensor cores with the half-precision dequant.
TRITON_MS = [lo for lo, _ in buckets()]
TRITON_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.mark.parametrize("m, dtype", [pytest.param(m, dtype, id=f"M{m}-{config_id(m)}-{name}")
                                      for m, (name, dtype) in zip(TRITON_MS, itertools.cycle(TRITON_DTYPES.items()))])
def test_triton_deterministic(m, dtype):
    run, x = triton_run(dtype, seed=m)
    assert_deterministic(run, x[:m])


@pytest.mark.parametrize("m, dtype", [pytest.param(m, dtype, id=f"M{m}-{config_id(m)}-{name}")
                                      for m, (name, dtype) in zip((3, 20, 70), itertools.cycle(TRITON_DTYPES.items()))])
def test_triton_rows_independent(m, dtype):
    run, x = triton_run(dtype, seed=m)
    assert_rows_independent(run, x[:m], keep=m // 2, seed=m)


@pytest.mark.parametrize("lo, hi", [pytest.param(lo, hi, id=f"M{lo}-{hi}") for lo, hi in buckets() if hi > lo])
def test_triton_same_rows_within_a_bucket(lo, hi):
    """Both ends and the middle of every bucket that holds more than one M."""
    assert config_id(lo) == config_id(hi)
    run, x = triton_run(torch.float16, seed=hi)
    assert_same_rows_for_every_m(run, x, tuple(sorted({lo, (lo + hi) // 2, hi})))


@pytest.mark.parametrize("last", [pytest.param(hi, id=f"M{hi}-to-{hi + 1}") for _, hi in buckets()[:-1]])
def test_triton_across_a_bucket_edge_within_the_hard_bound(last):
    """Across a bucket edge the promise is only the error bound: the rows computed at M = last and
    at M = last + 1 each stay within the hard (never flaky) bound of the reference."""
    w, x, bias = problem(TN, TK, TG, last + 1, torch.bfloat16, seed=last)
    kw = to_kernel_layout(w, torch.bfloat16)
    ref = reference_matmul(x[:last], w, bias)
    for m in (last, last + 1):
        y = w4a16_matmul(x[:m], kw.qweight, kw.scales, kw.zeros, TG, bias)[:last]
        v = judge(y, ref, dequant_dtype=torch.bfloat16, criterion="hard")
        assert v.passed, f"M={m} ({config_id(m)}): {v.summary()}"


# ------------------------------------------------------------------------------------------------
# skinny, on its CPU emulation

SK, SN, SG = 512, 64, 64


def skinny_run(binary, work, engine: str, dtype: torch.dtype, seed: int) -> tuple[Run, torch.Tensor]:
    w, x, bias = problem(SN, SK, SG, skinny.MAX_M, dtype, seed)
    kw = to_kernel_layout(w, dtype)
    return (lambda xx: emulate_call(binary, work, xx, kw, bias, engine=engine)[0]), x


def same_summation_ranges(engine: str, n: int = SN, k: int = SK, group_size: int = SG) -> list[tuple[int, int]]:
    """(first M, last M) of each run of M whose default plans share their summation order (asymmetric
    weights, as problem() makes)."""
    plans = emulated_plans([dict(m=m, n=n, k=k, group_size=group_size, symmetric=False, engine=engine)
                            for m in range(1, skinny.MAX_M + 1)])
    ranges: list[tuple[int, int]] = []
    for m, plan in enumerate(plans, 1):
        if ranges and plan.summation == plans[ranges[-1][0] - 1].summation:
            ranges[-1] = (ranges[-1][0], m)
        else:
            ranges.append((m, m))
    return ranges


ENGINES = {"mma-fp16": ("mma", torch.float16), "simt-bf16": ("simt", torch.bfloat16)}
# The M ranges that share one summation order on this shape: the segmented kernels' padded M (1, 2,
# 3..4), the ring to ring_max_m and the batch kernel above it on the tensor cores; the simt ring at
# M = 1 adds as the batch kernel does at its split (test_same_rows_ranges_are_the_plans checks the
# plan agrees).
SAME_ROWS = {"mma": [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16)], "simt": [(1, 8), (9, 16)]}
RANGES = [pytest.param(engine, dtype, lo, hi, id=f"{name}-M{lo}-{hi}") for name, (engine, dtype) in ENGINES.items()
          for lo, hi in SAME_ROWS[engine]]


def test_same_rows_ranges_are_the_plans():
    for engine, ranges in SAME_ROWS.items():
        assert same_summation_ranges(engine) == ranges, engine


@pytest.mark.parametrize("engine, dtype", ENGINES.values(), ids=ENGINES.keys())
@pytest.mark.parametrize("m", (1, skinny.MAX_M), ids=lambda m: f"M{m}")
def test_skinny_deterministic(emulator, tmp_path, engine, dtype, m):
    run, x = skinny_run(emulator, tmp_path, engine, dtype, seed=m)
    assert_deterministic(run, x[:m])


@pytest.mark.parametrize("engine, dtype, lo, hi", [r for r in RANGES if r.values[3] > 1])  # M = 1 has no other rows
def test_skinny_rows_independent(emulator, tmp_path, engine, dtype, lo, hi):
    run, x = skinny_run(emulator, tmp_path, engine, dtype, seed=hi)
    assert_rows_independent(run, x[:hi], keep=lo - 1 + (hi - lo) // 2, seed=hi)


@pytest.mark.parametrize("engine, dtype, lo, hi", [r for r in RANGES if r.values[3] > r.values[2]])
def test_skinny_same_rows_within_a_range(emulator, tmp_path, engine, dtype, lo, hi):
    run, x = skinny_run(emulator, tmp_path, engine, dtype, seed=lo)
    assert_same_rows_for_every_m(run, x, tuple(sorted({lo, (lo + hi) // 2, hi})))


@pytest.mark.parametrize("lo, hi", [(1, 2), (3, 4), (5, 8), (9, 16)], ids=lambda v: str(v))
def test_skinny_stream_same_rows_within_a_bucket(emulator, tmp_path, lo, hi):
    """The stream kernel plans its split for its bucket of M (1..2, 3..4, 5..8, 9..16), not for M,
    so both ends of a bucket share a summation order and rows keep their bits. At K = 4096 on one
    SM, x of M = 9 fits the shared memory of split 1 and M = 16 does not: a plan that followed M
    would split them differently. The ring depth may follow M (M = 16 gets 2 slots there, M = 9
    keeps 4): it only schedules the loads, so the rows must keep their bits across it too."""
    w, x, bias = problem(SN, 4096, SG, skinny.MAX_M, torch.bfloat16, seed=hi)
    kw = to_kernel_layout(w, torch.bfloat16)
    runs = {m: emulate_call(emulator, tmp_path, x[:m], kw, bias, kernel="stream", num_sms=1) for m in (lo, hi)}
    assert runs[lo][1].summation == runs[hi][1].summation, f"M={lo} ran {runs[lo][1]}, M={hi} ran {runs[hi][1]}"
    assert bit_equal(runs[lo][0], runs[hi][0][:lo]), first_difference(runs[lo][0], runs[hi][0][:lo])

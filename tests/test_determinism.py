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
* skinny (csrc/skinny_core.cuh): deterministic; rows are computed independently, and the kernel,
  split and mma tile depend on M only through default_variant and the segmented kernel's padded
  M, so M invariance is tested within each of optimized.skinny.same_rows_ranges; its "stream"
  variant within each of optimized.skinny.STREAM_BUCKETS.
* the reference: fp64 torch matmul, row by row independent of M.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from optimized import skinny
from optimized.tile_configs import INTERPRETED, INTERPRETER, select_config
from optimized.triton_w4a16 import w4a16_matmul
from oracle import judge, random_quantized, reference_matmul
from oracle.canonical import bit_equal
from oracle.layouts import to_kernel_layout
from tests.test_skinny_compile import emulate_call

# Other rows filled with NaN and Inf are part of the row-independence check: numpy's warnings
# about them under the interpreter are noise.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

Run = Callable[[torch.Tensor], torch.Tensor]  # x [M, K] -> y [M, N]


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    diff = (a.double() != b.double()) & ~(a.double().isnan() & b.double().isnan())
    where = diff.nonzero()[:4].tolist()
    return f"{int(diff.sum())} element(s) differ, first at {where}"


def assert_deterministic(run: Run, x: torch.Tensor, repeats: int = 3) -> None:
    first = run(x)
    for i in range(2, repeats + 1):
        again = run(x)
        assert bit_equal(again, first), f"call {i} differs from call 1: {first_difference(again, first)}"


def other_rows(x: torch.Tensor, keep: int, seed: int) -> list[torch.Tensor]:
    """Copies of x whose rows other than `keep` hold other random values, huge values, and NaN /
    Inf (a special value must not leak into a row that never saw it)."""
    gen = torch.Generator().manual_seed(seed)
    fills = [torch.randn(x.shape, generator=gen), torch.randn(x.shape, generator=gen) * 1000,
             torch.full(x.shape, float("nan")), torch.full(x.shape, float("inf"))]
    out = []
    for fill in fills:
        y = fill.to(x.dtype)
        y[keep] = x[keep]
        out.append(y)
    return out


def assert_rows_independent(run: Run, x: torch.Tensor, keep: int, seed: int = 0) -> None:
    want = run(x)[keep]
    for i, x2 in enumerate(other_rows(x, keep, seed)):
        got = run(x2)[keep]
        assert bit_equal(got, want), f"row {keep} changed with other rows (filling {i}): {first_difference(got, want)}"


def assert_same_rows_for_every_m(run: Run, x: torch.Tensor, ms: tuple[int, ...]) -> None:
    """run(x[:m]) is the first m rows of run(x[:max(ms)]) for every m in ms."""
    full = run(x[:max(ms)])
    for m in ms:
        got = run(x[:m])
        assert bit_equal(got, full[:m]), f"M={m} differs from the first {m} rows at M={max(ms)}: " \
                                         f"{first_difference(got, full[:m])}"


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
    for max_m, _ in INTERPRETED.buckets:
        hi = 129 if max_m is None else max_m
        out.append((lo, hi))
        lo = hi + 1
    return out


def config_id(m: int) -> str:
    return select_config(m, TN, TK, TG, INTERPRETER).id


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
    return (lambda xx: emulate_call(binary, work, xx, kw, bias, variant=-1, engine=engine)[0]), x


ENGINES = {"mma-fp16": ("mma", torch.float16), "simt-bf16": ("simt", torch.bfloat16)}
# M ranges that run one configuration under the default policy (problem() makes asymmetric weights).
RANGES = [pytest.param(engine, dtype, lo, hi, id=f"{name}-M{lo}-{hi}") for name, (engine, dtype) in ENGINES.items()
          for lo, hi in skinny.same_rows_ranges(engine=engine)]



def test_same_rows_ranges_split_at_the_segmented_tile():
    assert skinny.same_rows_ranges() == [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16)]
    assert skinny.same_rows_ranges(engine="simt") == [(1, 8), (9, 16)]


@pytest.mark.parametrize("engine, dtype", ENGINES.values(), ids=ENGINES.keys())
@pytest.mark.parametrize("m", (1, skinny.MAX_M), ids=lambda m: f"M{m}")
def test_skinny_deterministic(plain_emulator, tmp_path, engine, dtype, m):
    run, x = skinny_run(plain_emulator, tmp_path, engine, dtype, seed=m)
    assert_deterministic(run, x[:m])


@pytest.mark.parametrize("engine, dtype, lo, hi", [r for r in RANGES if r.values[3] > 1])  # M = 1 has no other rows
def test_skinny_rows_independent(plain_emulator, tmp_path, engine, dtype, lo, hi):
    run, x = skinny_run(plain_emulator, tmp_path, engine, dtype, seed=hi)
    assert_rows_independent(run, x[:hi], keep=lo - 1 + (hi - lo) // 2, seed=hi)


@pytest.mark.parametrize("engine, dtype, lo, hi", [r for r in RANGES if r.values[3] > r.values[2]])
def test_skinny_same_rows_within_a_range(plain_emulator, tmp_path, engine, dtype, lo, hi):
    run, x = skinny_run(plain_emulator, tmp_path, engine, dtype, seed=lo)
    assert_same_rows_for_every_m(run, x, tuple(sorted({lo, (lo + hi) // 2, hi})))


@pytest.mark.parametrize("lo, hi", skinny.STREAM_BUCKETS, ids=lambda v: str(v))
def test_skinny_stream_same_rows_within_a_bucket(plain_emulator, tmp_path, lo, hi):
    """The stream variant plans its split for the bucket, not for M, so both ends of a bucket run
    the same split and rows keep their bits. At K = 4096 on one SM, x of M = 9 fits the shared
    memory of split 1 and M = 16 does not: a plan that followed M would split them differently.
    The ring depth may follow M (M = 16 gets 2 slots there, M = 9 keeps 4): it only schedules the
    loads, so the rows must keep their bits across it too."""
    w, x, bias = problem(SN, 4096, SG, skinny.MAX_M, torch.bfloat16, seed=hi)
    kw = to_kernel_layout(w, torch.bfloat16)
    stream = skinny.VARIANTS.index("stream")
    runs = {m: emulate_call(plain_emulator, tmp_path, x[:m], kw, bias, variant=stream, engine="mma", num_sms=1)
            for m in (lo, hi)}
    assert runs[lo][1]["split"] == runs[hi][1]["split"], f"M={lo} ran {runs[lo][1]}, M={hi} ran {runs[hi][1]}"
    assert bit_equal(runs[lo][0], runs[hi][0][:lo]), first_difference(runs[lo][0], runs[hi][0][:lo])


# ------------------------------------------------------------------------------------------------
# The oracle reference (its unrounded fp64 y and its rounded y_out)

def reference_run(field: str) -> tuple[Run, torch.Tensor]:
    w, x, bias = problem(200, 512, 128, 40, torch.bfloat16, seed=5)
    return (lambda xx: getattr(reference_matmul(xx, w, bias), field)), x


@pytest.mark.parametrize("field", ("y", "y_out"))
def test_reference_deterministic(field):
    run, x = reference_run(field)
    assert_deterministic(run, x)


@pytest.mark.parametrize("field", ("y", "y_out"))
def test_reference_rows_independent(field):
    run, x = reference_run(field)
    assert_rows_independent(run, x, keep=7)


@pytest.mark.parametrize("field", ("y", "y_out"))
def test_reference_same_rows_for_every_m(field):
    run, x = reference_run(field)
    assert_same_rows_for_every_m(run, x, (1, 2, 7, 16, 17, 40))


# ------------------------------------------------------------------------------------------------
# The checks catch real bugs: plain-torch kernels with one planted flaw each.

def planted_problem():
    w, x, _ = problem(24, 256, 64, 9, torch.float16, seed=11)
    return w.dequantize(torch.float32), x


def exact_rows(w: torch.Tensor) -> Run:
    """Correct: fp32 products and sums per row, one rounding."""
    return lambda x: (x.float() @ w.t()).half()


def row_coupled(w: torch.Tensor) -> Run:
    """Bug: a batch statistic (here the mean of all rows) leaks into each row, as a shared
    workspace or a reduction over the wrong axis would."""
    return lambda x: (x.float() @ w.t() + 1e-2 * x.float().mean(0).sum()).half()


def split_by_m(w: torch.Tensor) -> Run:
    """Bug: K split into min(M, 4) slices whose partial sums are rounded to fp16, so the rounding
    of every row depends on how many rows came with it."""
    def run(x):
        slices = torch.chunk(torch.arange(x.shape[1]), min(x.shape[0], 4))
        return sum((x[:, s].float() @ w[:, s].t()).half().float() for s in slices).half()
    return run


def order_by_call(w: torch.Tensor) -> Run:
    """Bug: fp16 partial sums added in an order that changes from call to call, as atomics do."""
    calls = itertools.count()

    def run(x):
        partials = [(x[:, s].float() @ w[:, s].t()).half() for s in torch.chunk(torch.arange(x.shape[1]), 8)]
        shift = next(calls) % len(partials)
        total = torch.zeros_like(partials[0])
        for p in partials[shift:] + partials[:shift]:
            total = total + p
        return total
    return run


@pytest.mark.parametrize("check", [
    pytest.param(lambda run, x: assert_deterministic(run, x), id="deterministic"),
    pytest.param(lambda run, x: assert_rows_independent(run, x, keep=4), id="rows-independent"),
    pytest.param(lambda run, x: assert_same_rows_for_every_m(run, x, (1, 2, 3, 9)), id="same-rows-for-every-m"),
])
def test_checks_pass_a_correct_kernel(check):
    w, x = planted_problem()
    check(exact_rows(w), x)


@pytest.mark.parametrize("check, buggy", [
    pytest.param(lambda run, x: assert_deterministic(run, x), order_by_call, id="deterministic-catches-call-order"),
    pytest.param(lambda run, x: assert_rows_independent(run, x, keep=4), row_coupled,
                 id="rows-independent-catches-row-coupling"),
    pytest.param(lambda run, x: assert_same_rows_for_every_m(run, x, (1, 2, 3, 9)), split_by_m,
                 id="same-rows-catches-m-dependent-split"),
])
def test_checks_catch_a_planted_bug(check, buggy):
    w, x = planted_problem()
    with pytest.raises(AssertionError, match="differ|changed"):
        check(buggy(w), x)

"""Determinism and batch invariance of the oracle reference, and proof that the checks catch
planted bugs (tests/support/invariance.py holds the checks)."""

from __future__ import annotations

import itertools

import pytest
import torch

from oracle import random_quantized, reference_matmul
from tests.support.invariance import Run, assert_deterministic, assert_rows_independent, assert_same_rows_for_every_m

def problem(n: int, k: int, group: int, m: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = random_quantized(n, k, group, False, dtype, generator=gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    bias = (torch.randn(n, generator=gen) * 0.5).to(dtype)
    return w, x, bias


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

"""Determinism and batch-invariance assertions shared by the kernel and reference tests."""

from __future__ import annotations

from collections.abc import Callable

import torch

from oracle.canonical import bit_equal

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

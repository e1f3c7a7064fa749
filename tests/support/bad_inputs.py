"""The small weight the bad-input tables of tests/oracle and tests/optimized share, its layouts,
and helpers that spoil one value of it."""

from __future__ import annotations

import pytest
import torch

from oracle import random_quantized, reference_matmul
from oracle.layouts import to_awq, to_compressed_tensors, to_gptq, to_kernel_layout, to_tinygemm

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
    """One table row: call() must raise exc, its message naming `expected` and `given`."""
    return pytest.param(call, exc, expected, given, id=id)

"""The exact reference `y = x @ W^T + bias`, with the magnitudes the error model needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .canonical import ACTIVATION_DTYPES, QuantizedWeight
from .errors import expect, expect_same_device, expect_tensor

# Rows of W dequantized at once: bounds the reference's extra memory to about this many fp64 values
# (256 MiB) whatever N and K are.
CHUNK_ELEMENTS = 1 << 25


@dataclass(frozen=True)
class Reference:
    """The reference result for one call.

    y:         float64 (or float32 in fp32 mode) [M, N], the unrounded x @ W^T + bias.
    y_out:     activation dtype [M, N], y rounded once.
    abs_dot:   A = |x| @ |W|^T, same dtype as y [M, N]; scales the accumulation error.
    rms_dot:   Q = sqrt(x^2 @ (W^2)^T), same dtype as y [M, N]; scales random-sign roundoff.
    abs_scale_dot, rms_scale_dot: the same with |s[n, g(k)]| in place of |W[n, k]|; they scale
               the error of dequant forms whose intermediates (q * s, z * s) are larger than W.
    k:         the reduction length K.
    accumulate: torch.float64 (exact to well under one fp32 ulp) or torch.float32 (fast GPU mode;
               its own error is added to the bounds by the error model).
    """

    y: torch.Tensor
    y_out: torch.Tensor
    abs_dot: torch.Tensor
    rms_dot: torch.Tensor
    abs_scale_dot: torch.Tensor
    rms_scale_dot: torch.Tensor
    k: int
    accumulate: torch.dtype


def check_activations(x: torch.Tensor, k: int) -> None:
    expect_tensor(x, "x", dtypes=ACTIVATION_DTYPES, shape=(None, k), layout_hint=f"activations [M, K={k}]")


def check_bias(bias: torch.Tensor | None, n: int, dtype: torch.dtype) -> None:
    if bias is not None:
        expect_tensor(bias, "bias", dtypes=(dtype,), shape=(n,), layout_hint=f"[N={n}] in the activation dtype")


def reference_matmul(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None,
                     accumulate: torch.dtype = torch.float64) -> Reference:
    """x: fp16/bf16 [M, K] (any strides). bias: activation dtype [N] or None.

    Runs on whatever device the inputs are on; chunks over N so peak extra memory stays near
    CHUNK_ELEMENTS values (K = 28672, N = 57344, M = 16 fits easily in 24 GiB).
    """
    expect(isinstance(weight, QuantizedWeight), "weight", "a QuantizedWeight (convert with oracle.layouts)",
           type(weight).__name__)
    check_activations(x, weight.k)
    check_bias(bias, weight.n, x.dtype)
    expect_same_device(x=x, q=weight.q, bias=bias)
    expect(accumulate in (torch.float64, torch.float32), "accumulate", "torch.float64 or torch.float32",
           str(accumulate))
    m, n = x.shape[0], weight.n
    xa = x.to(accumulate)
    x_abs, x_sq = xa.abs(), xa * xa
    y = torch.empty(m, n, dtype=accumulate, device=x.device)
    abs_dot, sq_dot = torch.empty_like(y), torch.empty_like(y)
    step = max(1, CHUNK_ELEMENTS // max(1, weight.k))
    for start in range(0, n, step):
        stop = min(n, start + step)
        w = weight.dequantize_rows(start, stop, accumulate)
        y[:, start:stop] = xa @ w.t()
        abs_dot[:, start:stop] = x_abs @ w.abs().t()
        sq_dot[:, start:stop] = x_sq @ (w * w).t()
    if bias is not None:
        y += bias.to(accumulate)
        abs_dot += bias.to(accumulate).abs()
    # Per-group sums of |x| and x^2 turn the scale terms into [M, groups] @ [groups, N] products.
    gi = weight.group_index()
    x_abs_g = torch.zeros(m, weight.num_groups, dtype=accumulate, device=x.device).index_add_(1, gi, x_abs)
    x_sq_g = torch.zeros_like(x_abs_g).index_add_(1, gi, x_sq)
    s = weight.scales.to(accumulate).abs()
    return Reference(y, y.to(x.dtype), abs_dot, sq_dot.sqrt(), x_abs_g @ s.t(), (x_sq_g @ (s * s).t()).sqrt(),
                     weight.k, accumulate)


def plain_torch_matmul(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What a careful user would write without a kernel: dequantize into the activation dtype,
    then one same-precision matmul. The error model reports its error for comparison."""
    w = weight.dequantize(torch.float32).to(x.dtype)
    y = x @ w.t()
    return y if bias is None else y + bias



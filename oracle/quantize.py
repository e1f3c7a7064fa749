"""Round-to-nearest group quantization, and float weights shaped like real ones."""

from __future__ import annotations

import torch

from .canonical import SCALE_DTYPES, QuantizedWeight, resolve_group_size
from .errors import LayoutError, expect, expect_tensor

WEIGHT_KINDS = ("gaussian", "heavy_tailed", "outlier_channels")


def quantize_rtn(w: torch.Tensor, group_size: int, symmetric: bool,
                 scale_dtype: torch.dtype = torch.float16) -> QuantizedWeight:
    """Quantize a float weight [N, K] group by group along K.

    Asymmetric: min/max per group, s = (max - min) / 15, integer z = round(-min / s) in 0..15.
    Symmetric: absmax per group, s = 2 * absmax / 15 and implicit z = 8 (GPTQ's convention).
    q = clamp(round(w / s) + z, 0, 15), with s already rounded to `scale_dtype`.
    """
    expect_tensor(w, "weight to quantize", dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
                  shape=(None, None), layout_hint="float [N, K]")
    expect_tensor(torch.empty(0, dtype=scale_dtype), "scale dtype", dtypes=SCALE_DTYPES)
    n, k = w.shape
    g = resolve_group_size(group_size, k)
    expect(k % g == 0, "group_size", f"a divisor of K={k} (or -1)", str(group_size))
    groups = w.double().reshape(n, k // g, g)
    if symmetric:
        absmax = groups.abs().amax(-1).clamp_min(1e-8)
        s = (2 * absmax / 15).to(scale_dtype)
        z = torch.full_like(s, 8, dtype=torch.float64)
    else:
        lo = groups.amin(-1).clamp_max(0)
        hi = groups.amax(-1).clamp_min(0)
        s = ((hi - lo).clamp_min(1e-8) / 15).to(scale_dtype)
        z = (-lo / s.double()).round().clamp(0, 15)
    q = (groups / s.double().unsqueeze(-1)).round() + z.unsqueeze(-1)
    q = q.clamp(0, 15).reshape(n, k).to(torch.uint8)
    zeros = None if symmetric else z.to(torch.uint8)
    return QuantizedWeight(q, s, zeros, group_size)


def random_weight(n: int, k: int, kind: str = "gaussian", generator: torch.Generator | None = None,
                  std: float = 0.02) -> torch.Tensor:
    """float32 [N, K] with the statistics of a trained linear layer.

    gaussian:         i.i.d. normal.
    heavy_tailed:     Student-t with 3 degrees of freedom (a few large entries per group).
    outlier_channels: normal, with ~1% of input channels (columns) scaled up 20x, as in LLMs.
    """
    if kind not in WEIGHT_KINDS:
        raise LayoutError(f"weight kind: expected one of {WEIGHT_KINDS}, got {kind!r}")
    base = torch.randn(n, k, generator=generator)
    if kind == "heavy_tailed":
        chi2 = (torch.randn(3, n, k, generator=generator) ** 2).sum(0)
        base = base / (chi2 / 3).sqrt() / 3**0.5
    elif kind == "outlier_channels":
        cols = torch.rand(k, generator=generator) < 0.01
        base[:, cols] *= 20
    return base * std


def random_quantized(n: int, k: int, group_size: int, symmetric: bool, scale_dtype: torch.dtype = torch.float16,
                     kind: str = "gaussian", generator: torch.Generator | None = None) -> QuantizedWeight:
    return quantize_rtn(random_weight(n, k, kind, generator), group_size, symmetric, scale_dtype)

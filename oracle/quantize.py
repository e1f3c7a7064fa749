"""Round-to-nearest group quantization, and float weights shaped like real ones."""

from __future__ import annotations

import torch

from .canonical import SCALE_DTYPES, QuantizedWeight, resolve_group_size
from .errors import LayoutError, expect, expect_tensor

WEIGHT_KINDS = ("gaussian", "heavy_tailed", "outlier_channels")


def device_of(generator: torch.Generator | None) -> torch.device:
    """Where tensors drawn from `generator` are made: its own device (the CPU without one), so a
    CUDA generator builds inputs on the GPU that judges them."""
    return torch.device("cpu") if generator is None else generator.device


def quantize_rtn(w: torch.Tensor, group_size: int, symmetric: bool,
                 scale_dtype: torch.dtype = torch.float16, g_idx: torch.Tensor | None = None) -> QuantizedWeight:
    """Quantize a float weight [N, K] group by group along K.

    Asymmetric: min/max per group, s = (max - min) / 15, integer z = round(-min / s) in 0..15.
    Symmetric: absmax per group, s = 2 * absmax / 15 and implicit z = 8 (GPTQ's convention).
    q = clamp(round(w / s) + z, 0, 15), with s already rounded to `scale_dtype`.
    g_idx: int32 [K] act-order groups (group g holds G channels, the last one the rest, as
    QuantizedWeight requires); then K need not be a multiple of G.
    """
    expect_tensor(w, "weight to quantize", dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
                  shape=(None, None), layout_hint="float [N, K]")
    expect_tensor(torch.empty(0, dtype=scale_dtype), "scale dtype", dtypes=SCALE_DTYPES)
    n, k = w.shape
    g = resolve_group_size(group_size, k)
    if g_idx is not None:
        # Channels sorted by group, zero-padded to whole groups (a zero never moves min, max or absmax).
        order = torch.argsort(g_idx.long(), stable=True)
        padded = torch.nn.functional.pad(w.double()[:, order], (0, -k % g))
        sorted_w = quantize_rtn(padded, group_size if group_size != -1 else padded.shape[1], symmetric, scale_dtype)
        q = torch.empty_like(w, dtype=torch.uint8)
        q[:, order] = sorted_w.q[:, :k]
        return QuantizedWeight(q, sorted_w.scales, sorted_w.zeros, group_size, g_idx)
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
    device = device_of(generator)
    base = torch.randn(n, k, generator=generator, device=device)
    if kind == "heavy_tailed":
        chi2 = (torch.randn(3, n, k, generator=generator, device=device) ** 2).sum(0)
        base = base / (chi2 / 3).sqrt() / 3**0.5
    elif kind == "outlier_channels":
        cols = torch.rand(k, generator=generator, device=device) < 0.01
        base[:, cols] *= 20
    return base * std


def act_order_g_idx(k: int, group_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """int32 [K] as GPTQ's act-order builds it: channels visited in a random order perm, group of
    channel perm[i] = i // G (the last group holds the remainder when G does not divide K)."""
    g = resolve_group_size(group_size, k)
    device = device_of(generator)
    perm = torch.randperm(k, generator=generator, device=device)
    g_idx = torch.empty(k, dtype=torch.int32, device=device)
    g_idx[perm] = (torch.arange(k, device=device) // g).to(torch.int32)
    return g_idx


def random_quantized(n: int, k: int, group_size: int, symmetric: bool, scale_dtype: torch.dtype = torch.float16,
                     kind: str = "gaussian", generator: torch.Generator | None = None,
                     act_order: bool = False) -> QuantizedWeight:
    """A weight of `kind` (WEIGHT_KINDS) quantized by `quantize_rtn`; with act_order, its groups
    follow a random act-order g_idx (`act_order_g_idx`)."""
    w = random_weight(n, k, kind, generator)
    g_idx = act_order_g_idx(k, group_size, generator) if act_order else None
    return quantize_rtn(w, group_size, symmetric, scale_dtype, g_idx)

"""Random canonical weights for layout and checkpoint tests."""

from __future__ import annotations

import math

import torch

from oracle.canonical import QuantizedWeight


def act_order_g_idx(k: int, group: int, gen: torch.Generator) -> torch.Tensor:
    """As GPTQ builds it: channels are visited in a random order perm, g_idx[perm[i]] = i // G."""
    perm = torch.randperm(k, generator=gen)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group).to(torch.int32)
    return g_idx


def make_weight(n: int, k: int, group_size: int, symmetric: bool, *, scale_dtype=torch.float16,
                act_order: bool = False, min_zero: int = 0, seed: int = 0,
                raw_scale_bits: bool = False) -> QuantizedWeight:
    """Random canonical weight. raw_scale_bits draws every bit pattern (NaN, inf, -0.0, subnormals):
    pure layouts must carry them unchanged."""
    gen = torch.Generator().manual_seed(seed)
    group = k if group_size == -1 else group_size
    groups = math.ceil(k / group)
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    zeros = None if symmetric else torch.randint(min_zero, 16, (n, groups), generator=gen, dtype=torch.uint8)
    if raw_scale_bits:
        as_int = torch.int32 if scale_dtype == torch.float32 else torch.int16
        info = torch.iinfo(as_int)
        scales = torch.randint(info.min, info.max, (n, groups), generator=gen, dtype=torch.int64)
        scales = scales.to(as_int).view(scale_dtype)
    else:
        # Signed magnitudes over a wide exponent range (2^-20 .. 2^4), finite in every scale dtype.
        mag = torch.exp2(torch.rand(n, groups, generator=gen) * 24 - 20)
        sign = torch.where(torch.rand(n, groups, generator=gen) < 0.5, -1.0, 1.0)
        scales = (mag * sign).to(scale_dtype)
    g_idx = act_order_g_idx(k, group, gen) if act_order else None
    return QuantizedWeight(q, scales, zeros, group_size, g_idx)

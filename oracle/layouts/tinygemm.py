"""torch's tinygemm (`aten._weight_int4pack_mm`) inputs.

weight_uint8:     uint8 [N, K/2], even k in the high nibble; `aten._convert_weight_to_int4pack(
                  weight_uint8, innerKTiles)` then makes the opaque tiled tensor.
scales_and_zeros: bfloat16 [K/G, N, 2]: (scale, zero) with a float zero in the weight domain,
                  W = (q - 8) * s + zero, so zero = (8 - z) * s rounded to bf16.
The bf16 rounding of zero loses bits, but z stays recoverable: |8 - z| <= 8 and bf16 rounds with
relative error <= 2^-8, so the error of (8 - z) * s is at most 7 * 2^-8 * |s| (8 * s is exact), far
under the |s| / 2 that separates neighbouring z. (s = 0, or s so large that 7 * s overflows, loses z.)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..canonical import QuantizedWeight
from ..errors import CheckpointError, expect_tensor
from .common import reject_act_order, require_multiple, require_tensors, symmetric_zeros

NAME = "tinygemm"


def to_tinygemm(w: QuantizedWeight) -> dict[str, torch.Tensor]:
    reject_act_order(w, NAME)
    require_multiple(w.k, 2, "K", NAME)
    expect_tensor(w.scales, f"{NAME} scales", dtypes=(torch.bfloat16,), layout_hint="tinygemm takes bf16 scales only")
    q = w.q
    weight_uint8 = (q[:, 0::2] << 4) | q[:, 1::2]
    s = w.scales.t()
    zero = ((8 - w.zeros_or_default().t().to(torch.float64)) * s.to(torch.float64)).to(torch.bfloat16)
    return {"weight_uint8": weight_uint8.contiguous(), "scales_and_zeros": torch.stack([s, zero], -1).contiguous()}


def from_tinygemm(tensors: Mapping[str, torch.Tensor], group_size: int, symmetric: bool = False) -> QuantizedWeight:
    require_tensors(tensors, ("weight_uint8", "scales_and_zeros"), NAME)
    wu8 = expect_tensor(tensors["weight_uint8"], f"{NAME} weight_uint8", dtypes=(torch.uint8,), shape=(None, None),
                        layout_hint="[N, K/2], even k in the high nibble")
    n = wu8.shape[0]
    sz = expect_tensor(tensors["scales_and_zeros"], f"{NAME} scales_and_zeros", dtypes=(torch.bfloat16,),
                       shape=(None, n, 2), layout_hint=f"[K/G, N={n}, 2]")
    q = torch.stack([wu8 >> 4, wu8 & 0xF], -1).reshape(n, -1)
    s, zero = sz[..., 0].t().contiguous(), sz[..., 1].t()
    z_real = 8 - zero.double() / s.double()
    z = z_real.round()
    bad = ((z_real - z).abs() > 0.25) | (z < 0) | (z > 15)
    if bool(bad.any()):
        raise CheckpointError(f"{NAME}: zero / scale must be 8 - z for an integer z in 0..15; "
                              f"{int(bad.sum())} group(s) are not, e.g. z = {z_real[bad][0].item()}")
    zeros = z.to(torch.uint8).contiguous()
    if symmetric:
        symmetric_zeros(zeros, NAME)
        zeros = None
    return QuantizedWeight(q.contiguous(), s, zeros, group_size)


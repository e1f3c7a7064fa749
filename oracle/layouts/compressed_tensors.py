"""compressed-tensors `pack-quantized` layout (4-bit int, group strategy).

weight_packed:     int32 [N, K/8], packed along K in natural order; nibble = signed value + 8.
weight_scale:      [N, K/G].
weight_zero_point: int32 [N/8, K/G] (asymmetric only), packed along N (dim 0), natural order;
                   nibble = unsigned z (signed zero point + 8).
weight_shape:      int64 [2] = [N, K].
weight_g_idx:      int32 [K] when act-order was used.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..canonical import QuantizedWeight
from ..errors import LayoutError, expect_tensor
from . import nibbles
from .common import require_multiple, require_tensors

NAME = "compressed-tensors pack-quantized"


def to_compressed_tensors(w: QuantizedWeight) -> dict[str, torch.Tensor]:
    require_multiple(w.k, 8, "K", NAME)
    out = {
        "weight_packed": nibbles.pack(w.q, 1),
        "weight_scale": w.scales.contiguous(),
        "weight_shape": torch.tensor([w.n, w.k], dtype=torch.int64),
    }
    if w.zeros is not None:
        require_multiple(w.n, 8, "N", NAME)
        out["weight_zero_point"] = nibbles.pack(w.zeros, 0)
    if w.has_act_order:
        out["weight_g_idx"] = w.g_idx.to(torch.int32)
    return out


def from_compressed_tensors(tensors: Mapping[str, torch.Tensor], group_size: int) -> QuantizedWeight:
    """Asymmetric when weight_zero_point is present, symmetric (z = 8) otherwise."""
    require_tensors(tensors, ("weight_packed", "weight_scale"), NAME)
    packed = expect_tensor(tensors["weight_packed"], f"{NAME} weight_packed", dtypes=nibbles.PACKED_DTYPES,
                           shape=(None, None), layout_hint="[N, K/8] packed along K")
    n, k = packed.shape[0], packed.shape[1] * 8
    if "weight_shape" in tensors:
        shape = [int(v) for v in tensors["weight_shape"].flatten().tolist()]
        if shape != [n, k]:
            raise LayoutError(f"{NAME}: expected weight_shape [N, K] = {[n, k]} matching weight_packed, got {shape}")
    scales = expect_tensor(tensors["weight_scale"], f"{NAME} weight_scale", shape=(n, None), layout_hint=f"[N={n}, K/G]")
    zeros = None
    if "weight_zero_point" in tensors:
        zp = expect_tensor(tensors["weight_zero_point"], f"{NAME} weight_zero_point", dtypes=nibbles.PACKED_DTYPES,
                           shape=(n // 8, scales.shape[1]), layout_hint="[N/8, K/G] packed along N (dim 0)")
        zeros = nibbles.unpack(zp, 0)
    return QuantizedWeight(nibbles.unpack(packed, 1), scales.contiguous(), zeros, group_size,
                           tensors.get("weight_g_idx"))

"""The layout W4A16 kernels take (ours and vLLM-style ones).

qweight:      int32 [N, K/8], packed along K in natural order (the compressed-tensors bytes).
scales:       activation dtype [N, K/G].
zero points, one of two forms that are easy to confuse (both 2-D, compatible extents):
  packed:     int32 [N/8, K/G], row n at bits 4*(n % 8) of word n // 8 (packed along dim 0).
  unpacked:   activation dtype [N, K/G] holding z as a float (0.0 .. 15.0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..canonical import ACTIVATION_DTYPES, QuantizedWeight
from ..errors import LayoutError, describe, expect_nibbles, expect_same_device, expect_tensor
from . import nibbles
from .common import reject_act_order, require_multiple

NAME = "kernel layout"


@dataclass(frozen=True, eq=False)
class KernelWeights:
    """A weight in the kernel layout (see the module docstring for each tensor)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int


def pack_zero_points(zeros: torch.Tensor) -> torch.Tensor:
    """uint8 [N, groups] -> int32 [N/8, groups], packed along N."""
    expect_tensor(zeros, "zero points to pack", dtypes=(torch.uint8,), shape=(None, None),
                  layout_hint="unpacked uint4 [N, groups]")
    require_multiple(zeros.shape[0], 8, "N", "packed zero points")
    return nibbles.pack(zeros, 0)


def unpack_zero_points(packed: torch.Tensor) -> torch.Tensor:
    """int32 [N/8, groups] -> uint8 [N, groups]."""
    check_packed_zero_points(packed)
    return nibbles.unpack(packed, 0)


def check_packed_zero_points(packed: object, n: int | None = None, groups: int | None = None) -> None:
    """The error that stops unpacked zero points from reaching code that expects packed ones."""
    ok = (isinstance(packed, torch.Tensor) and packed.dtype in nibbles.PACKED_DTYPES and packed.dim() == 2
          and (n is None or packed.shape[0] * 8 == n) and (groups is None or packed.shape[1] == groups))
    if not ok:
        want = f"[{n // 8 if n is not None else 'N/8'}, {groups if groups is not None else 'groups'}]"
        got = describe(packed) if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise LayoutError(f"Zero points must be int32 or uint32 (packed 8x uint4 along dim 0) {want}, got {got}")


def zero_points_to_float(zeros: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 [N, groups] -> the unpacked activation-dtype form [N, groups]."""
    expect_tensor(zeros, "zero points", dtypes=(torch.uint8,), shape=(None, None))
    expect_nibbles(zeros, "zero points")
    expect_tensor(torch.empty(0, dtype=dtype), "unpacked zero-point dtype", dtypes=ACTIVATION_DTYPES)
    return zeros.to(dtype)


def zero_points_from_float(zeros: torch.Tensor) -> torch.Tensor:
    """The unpacked activation-dtype form [N, groups] -> uint8 [N, groups]; values must be integers 0..15."""
    expect_tensor(zeros, "unpacked zero points", dtypes=ACTIVATION_DTYPES, shape=(None, None),
                  layout_hint="activation dtype [N, groups]")
    as_int = zeros.round()
    bad = (as_int != zeros) | (as_int < 0) | (as_int > 15) | zeros.isnan()
    if bool(bad.any()):
        raise LayoutError(f"unpacked zero points: expected integers 0..15, got {int(bad.sum())} other value(s), "
                          f"e.g. {zeros[bad][0].item()}")
    return as_int.to(torch.uint8)


def to_kernel_layout(w: QuantizedWeight, act_dtype: torch.dtype) -> KernelWeights:
    """Scales are cast to `act_dtype`; judge the kernel against `w.with_scales(kw.scales)`."""
    expect_tensor(torch.empty(0, dtype=act_dtype), "activation dtype", dtypes=ACTIVATION_DTYPES)
    reject_act_order(w, NAME)
    require_multiple(w.k, 8, "K", NAME)
    zeros = None if w.zeros is None else pack_zero_points(w.zeros)
    return KernelWeights(nibbles.pack(w.q, 1), w.scales.to(act_dtype).contiguous(), zeros, w.group_size)


def from_kernel_layout(kw: KernelWeights) -> QuantizedWeight:
    expect_tensor(kw.qweight, f"{NAME} qweight", dtypes=nibbles.PACKED_DTYPES, shape=(None, None),
                  layout_hint="[N, K/8] packed along K")
    expect_same_device(qweight=kw.qweight, scales=kw.scales, zeros=kw.zeros)
    zeros = None
    if kw.zeros is not None:
        check_packed_zero_points(kw.zeros, kw.qweight.shape[0], kw.scales.shape[1])
        zeros = nibbles.unpack(kw.zeros, 0)
    return QuantizedWeight(nibbles.unpack(kw.qweight, 1), kw.scales, zeros, kw.group_size)

"""AutoAWQ GEMM layout.

qweight: int32 [K, N/8], W^T packed along N with the AWQ nibble interleave.
qzeros:  int32 [K/G, N/8], unsigned z packed the same way.
scales:  [K/G, N] (fp16 in AutoAWQ checkpoints; the dtype is kept as given).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..canonical import QuantizedWeight
from ..errors import expect_tensor
from . import nibbles
from .common import reject_act_order, require_multiple, require_tensors, symmetric_zeros

NAME = "AutoAWQ GEMM"


def to_awq(w: QuantizedWeight) -> dict[str, torch.Tensor]:
    reject_act_order(w, NAME)
    require_multiple(w.n, 8, "N", NAME)
    return {
        "qweight": nibbles.pack(w.q.t(), 1, nibbles.AWQ_ORDER),
        "qzeros": nibbles.pack(w.zeros_or_default().t(), 1, nibbles.AWQ_ORDER),
        "scales": w.scales.t().contiguous(),
    }


def from_awq(tensors: Mapping[str, torch.Tensor], group_size: int, symmetric: bool = False) -> QuantizedWeight:
    """qzeros may be absent only when `symmetric` (asymmetric without it would read as z = 8)."""
    require_tensors(tensors, ("qweight", "scales") if symmetric else ("qweight", "qzeros", "scales"), NAME)
    qweight = expect_tensor(tensors["qweight"], f"{NAME} qweight", dtypes=nibbles.PACKED_DTYPES,
                            shape=(None, None), layout_hint="[K, N/8] packed along N")
    n = qweight.shape[1] * 8
    scales = expect_tensor(tensors["scales"], f"{NAME} scales", shape=(None, n), layout_hint=f"[K/G, N={n}]")
    groups = scales.shape[0]
    q = nibbles.unpack(qweight, 1, nibbles.AWQ_ORDER).t().contiguous()
    zeros = None
    if "qzeros" in tensors:
        qzeros = expect_tensor(tensors["qzeros"], f"{NAME} qzeros", dtypes=nibbles.PACKED_DTYPES,
                               shape=(groups, n // 8), layout_hint="[K/G, N/8] packed along N")
        zeros = nibbles.unpack(qzeros, 1, nibbles.AWQ_ORDER).t().contiguous()
        if symmetric:
            symmetric_zeros(zeros, NAME)
            zeros = None
    return QuantizedWeight(q, scales.t().contiguous(), zeros, group_size)

"""GPTQ layouts, v1 (`checkpoint_format: gptq`) and v2 (`gptq_v2`).

qweight: int32 [K/8, N], W^T packed along K in natural nibble order.
qzeros:  int32 [ceil(K/G), N/8], packed along N in natural order. v1 stores z - 1 (so z = 0
         cannot be stored: AutoGPTQ's v1 packer ORs the sign bits of -1 into the following
         nibbles, and v1 kernels decode nibble 0xF as z = 16); v2 stores z.
scales:  [ceil(K/G), N].
g_idx:   int32 [K], group of each input channel (act-order when not k // G).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..canonical import QuantizedWeight
from ..errors import CheckpointError, LayoutError, expect_tensor
from . import nibbles
from .common import require_multiple, require_tensors, symmetric_zeros

NAME = "GPTQ"


def to_gptq(w: QuantizedWeight, version: int = 1) -> dict[str, torch.Tensor]:
    check_version(version)
    layout = f"{NAME} v{version}"
    require_multiple(w.k, 8, "K", layout)
    require_multiple(w.n, 8, "N", layout)
    z = w.zeros_or_default()
    if version == 1:
        if bool((z == 0).any()):
            raise LayoutError(f"{layout}: stores z - 1, so z = 0 cannot be stored; got "
                              f"{int((z == 0).sum())} zero point(s) equal to 0 (write GPTQ v2)")
        z = z - 1
    return {
        "qweight": nibbles.pack(w.q.t(), 0),
        "qzeros": nibbles.pack(z.t().contiguous(), 1),
        "scales": w.scales.t().contiguous(),
        "g_idx": w.group_index().to(torch.int32),
    }


def from_gptq(tensors: Mapping[str, torch.Tensor], group_size: int, version: int = 1,
              symmetric: bool = False) -> QuantizedWeight:
    check_version(version)
    layout = f"{NAME} v{version}"
    require_tensors(tensors, ("qweight", "qzeros", "scales"), layout)
    qweight = expect_tensor(tensors["qweight"], f"{layout} qweight", dtypes=nibbles.PACKED_DTYPES,
                            shape=(None, None), layout_hint="[K/8, N] packed along K")
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    scales = expect_tensor(tensors["scales"], f"{layout} scales", shape=(None, n), layout_hint=f"[ceil(K/G), N={n}]")
    groups = scales.shape[0]
    qzeros = expect_tensor(tensors["qzeros"], f"{layout} qzeros", dtypes=nibbles.PACKED_DTYPES,
                           shape=(groups, n // 8), layout_hint="[ceil(K/G), N/8] packed along N")
    stored = nibbles.unpack(qzeros, 1)
    if version == 1:
        if bool((stored == 0xF).any()):
            where = (stored == 0xF).nonzero()[0].tolist()
            raise CheckpointError(
                f"{layout}: zero-point nibble 0xF (z - 1 = -1, i.e. z = 0, which v1 cannot store) at "
                f"[group, n] = {where} and {int((stored == 0xF).sum()) - 1} more; v1 kernels read it as "
                "z = 16 and AutoGPTQ's packer corrupts the following nibbles: requantize or use GPTQ v2"
            )
        stored = (stored + 1) & 0xF
    zeros = stored.t().contiguous()
    if symmetric:
        symmetric_zeros(zeros, layout)
        zeros = None
    g_idx = tensors.get("g_idx")
    if g_idx is not None:
        expect_tensor(g_idx, f"{layout} g_idx", dtypes=(torch.int32, torch.int64), shape=(k,))
        g = k if group_size == -1 else group_size
        # Trivial g_idx is dropped, unless K % G != 0: canonical form then needs it for ceil(K/G) groups.
        if k % g == 0 and torch.equal(g_idx.long().cpu(), torch.arange(k) // g):
            g_idx = None
    return QuantizedWeight(nibbles.unpack(qweight, 0).t().contiguous(), scales.t().contiguous(), zeros,
                        group_size, g_idx)


def check_version(version: int) -> None:
    if version not in (1, 2):
        raise LayoutError(f"GPTQ version: expected 1 (checkpoint_format gptq) or 2 (gptq_v2), got {version!r}")

"""The weight the hybrid op runs on, built once by `prepare` from any layout the oracle reads.

Every implementation behind the hybrid op receives a `PreparedWeight`, and a `PreparedWeight`
can only hold the kernel layout: its constructor rejects anything else (in particular unpacked
activation-dtype zero points [N, groups], which have the same rank and compatible extents as the
packed int32 [N/8, groups] form and would otherwise be read as garbage zero points).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from oracle.canonical import QuantizedWeight
from oracle.checkpoint import read_checkpoint
from oracle.layouts import (
    KernelWeights,
    from_awq,
    from_compressed_tensors,
    from_gptq,
    from_kernel_layout,
    pack_zero_points,
)
from oracle.layouts import nibbles

from .contract import ACTIVATION_DTYPES, GROUP_SIZES, PACKED_DTYPES, ContractError, _desc

ROW_PAD = 8  # packed zero points hold 8 rows per int32 word, so N is padded to a multiple of 8
DENSE_CHUNK_ROWS = 4096  # rows dequantized at a time for the dense cache (bounds the fp32 temporary)

# Checkpoint tensor layouts `prepare` accepts as a mapping of one layer's tensors (see oracle.layouts).
FORMATS = {
    "awq": lambda t, g, sym: from_awq(t, g, symmetric=sym),
    "gptq": lambda t, g, sym: from_gptq(t, g, 1, symmetric=sym),
    "gptq_v2": lambda t, g, sym: from_gptq(t, g, 2, symmetric=sym),
    "compressed-tensors": lambda t, g, sym: from_compressed_tensors(t, g),
}


@dataclass(frozen=True, eq=False)
class PreparedWeight:
    """A W4 weight in the kernel layout, ready for `optimized.matmul`.

    qweight:    int32 [N_pad, K/8], packed along K in natural nibble order (optimized/contract.py).
    scales:     float16/bfloat16 [N_pad, K/G], contiguous; the activation dtype calls must use.
    zeros:      int32 [N_pad/8, K/G], packed along N (row n at bits 4*(n % 8) of word n // 8);
                None for symmetric weights (z = 8).
    group_size: 32, 64, 128 or -1 (one group spanning K).
    n:          the weight's N. N_pad = n rounded up to a multiple of 8; padded rows have q = z = 0
                and s = 0, and their outputs are never returned.
    perm:       int64 [K] or None. Act-order weights: column j of qweight is input channel perm[j],
                so calls gather x[:, perm] first. None when channels are in order.
    dense:      scales.dtype [n, K] or None: the dequantized prefill cache, (q - z) * s rounded once
                into the activation dtype, in the original channel order. 4x the bytes of qweight.

    The tensors are read-only once the PreparedWeight exists: the skinny kernel starts reading them
    before the previous kernel on the stream has finished (`optimized.skinny.OVERLAPS` "weights").
    `prepare` waits for the kernels that wrote them; a PreparedWeight built from tensors some kernel
    has just written needs a torch.cuda.synchronize() (or any other kernel) before its first call.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int
    n: int
    perm: torch.Tensor | None = None
    dense: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check_prepared(self.qweight, self.scales, self.zeros, self.group_size, self.n, self.perm, self.dense)

    @property
    def k(self) -> int:
        return self.qweight.shape[1] * 8

    @property
    def n_padded(self) -> int:
        return self.qweight.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    @property
    def nbytes(self) -> int:
        """Device bytes held, the dense cache included."""
        return sum(t.numel() * t.element_size()
                   for t in (self.qweight, self.scales, self.zeros, self.perm, self.dense) if t is not None)

    def canonical(self) -> QuantizedWeight:
        """The weight this computes with (scales in the activation dtype), for judging by the oracle."""
        q = nibbles.unpack(self.qweight[:self.n], 1)
        zeros = None if self.zeros is None else nibbles.unpack(self.zeros, 0)[:self.n]
        g_idx = None
        if self.perm is not None:
            inverse = torch.argsort(self.perm)
            q = q[:, inverse]
            g_idx = (torch.arange(self.k, device=self.device) // (self.k if self.group_size == -1 else self.group_size))[inverse]
        return QuantizedWeight(q.contiguous(), self.scales[:self.n], zeros, self.group_size, g_idx)


def check_prepared(qweight: object, scales: object, zeros: object, group_size: object, n: object,
                   perm: object = None, dense: object = None) -> None:
    """Raise ContractError unless the tensors are exactly the kernel layout `prepare` makes.

    Shape and dtype checks only (no pass over the data), so the op can afford it on every call.
    """
    if not isinstance(qweight, torch.Tensor) or qweight.dtype not in PACKED_DTYPES or qweight.dim() != 2 \
            or qweight.shape[0] % ROW_PAD or not qweight.is_contiguous():
        raise ContractError(f"prepared qweight must be contiguous int32 [N_pad, K/8] with N_pad a multiple of "
                            f"{ROW_PAD}, got {_desc(qweight)}")
    n_pad, k = qweight.shape[0], qweight.shape[1] * 8
    if group_size not in GROUP_SIZES or isinstance(group_size, bool):
        raise ContractError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    group = k if group_size == -1 else group_size
    if k % group:
        raise ContractError(f"K must be a multiple of group_size, got K={k}, group_size={group_size}")
    groups = k // group
    if not isinstance(scales, torch.Tensor) or scales.dtype not in ACTIVATION_DTYPES \
            or tuple(scales.shape) != (n_pad, groups) or not scales.is_contiguous():
        raise ContractError(f"prepared scales must be contiguous float16 or bfloat16 [N_pad, K/G] = "
                            f"[{n_pad}, {groups}], got {_desc(scales)}")
    if zeros is not None and (not isinstance(zeros, torch.Tensor) or zeros.dtype not in PACKED_DTYPES
                              or tuple(zeros.shape) != (n_pad // 8, groups) or not zeros.is_contiguous()):
        raise ContractError(f"Zero points must be int32 or uint32 (packed 8x uint4 along dim 0) "
                            f"[N/8, groups] = [{n_pad // 8}, {groups}], got {_desc(zeros)}")
    if not isinstance(n, int) or isinstance(n, bool) or not n_pad - ROW_PAD < n <= n_pad:
        raise ContractError(f"n must be the weight's N, with N_pad = {n_pad} its multiple of {ROW_PAD} "
                            f"rounded up, got n={n!r}")
    if perm is not None and (not isinstance(perm, torch.Tensor) or perm.dtype != torch.int64
                             or tuple(perm.shape) != (k,)):
        raise ContractError(f"perm must be int64 [K] = [{k}] or None, got {_desc(perm)}")
    if dense is not None and (not isinstance(dense, torch.Tensor) or dense.dtype != scales.dtype
                              or tuple(dense.shape) != (n, k) or not dense.is_contiguous()):
        raise ContractError(f"dense must be contiguous {str(scales.dtype).removeprefix('torch.')} [N, K] = "
                            f"[{n}, {k}] or None, got {_desc(dense)}")
    devices = {t.device for t in (qweight, scales, zeros, perm, dense) if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ContractError(f"prepared tensors must be on one device, got {sorted(str(d) for d in devices)}")


def prepare(weight: QuantizedWeight | KernelWeights | Mapping[str, torch.Tensor], dtype: torch.dtype,
            device: torch.device | str | None = None, *, dense_cache: bool = False, fmt: str | None = None,
            group_size: int | None = None, symmetric: bool = False) -> PreparedWeight:
    """The kernel layout of `weight`, once, for calls with activations of `dtype`.

    weight:  a canonical oracle.QuantizedWeight (act-order g_idx allowed: K is permuted once and x
             gathered per call), an oracle KernelWeights, or one layer's checkpoint tensors with
             `fmt` ("awq", "gptq", "gptq_v2", "compressed-tensors") and `group_size`
             (`symmetric` for AWQ/GPTQ files that store z = 8).
    dtype:   float16 or bfloat16, the activation dtype; scales are rounded into it.
    device:  where the prepared tensors live (default: where `weight` is).
    dense_cache: also keep W dequantized into `dtype` ([N, K], 2 bytes per weight: 4x the packed
             weight) so that large-M calls run the dense GEMM (`dispatch` thresholds). Off by default.
    Raises ContractError or oracle.LayoutError naming what was expected and what was given.
    """
    if dtype not in ACTIVATION_DTYPES:
        raise ContractError(f"dtype must be float16 or bfloat16 (the activation dtype), got {dtype!r}")
    w = canonical_weight(weight, fmt, group_size, symmetric)
    if device is not None:
        w = w.to(device)
    if w.group_size not in GROUP_SIZES:
        raise ContractError(f"group_size must be one of {GROUP_SIZES} for the kernels, got {w.group_size}")
    if w.k % 8:
        raise ContractError(f"K must be a multiple of 8 (packed int32 words along K), got K={w.k}")
    w = w.with_scales(w.scales.to(dtype))
    perm = act_order_permutation(w)
    q = w.q if perm is None else w.q[:, perm]
    pad = -w.n % ROW_PAD
    qweight = nibbles.pack(torch.nn.functional.pad(q, (0, 0, 0, pad)), 1)
    scales = torch.nn.functional.pad(w.scales, (0, 0, 0, pad)).contiguous()
    zeros = None if w.zeros is None else pack_zero_points(torch.nn.functional.pad(w.zeros, (0, 0, 0, pad)))
    dense = dequantize_dense(w, dtype) if dense_cache else None
    if qweight.device.type == "cuda":
        torch.cuda.synchronize(qweight.device)  # read-only from here on (see PreparedWeight)
    return PreparedWeight(qweight, scales, zeros, w.group_size, w.n, perm, dense)


def prepare_checkpoint(path: str | Path, dtype: torch.dtype, device: torch.device | str | None = None, *,
                       dense_cache: bool = False, config: Mapping | None = None) -> dict[str, PreparedWeight]:
    """Every quantized layer of an AWQ, GPTQ or compressed-tensors checkpoint (oracle.read_checkpoint)."""
    return {name: prepare(w, dtype, device, dense_cache=dense_cache)
            for name, w in read_checkpoint(path, config).items()}


def canonical_weight(weight: object, fmt: str | None, group_size: int | None, symmetric: bool) -> QuantizedWeight:
    if isinstance(weight, QuantizedWeight):
        return weight
    if isinstance(weight, KernelWeights):
        return from_kernel_layout(weight)
    if isinstance(weight, Mapping):
        if fmt not in FORMATS or group_size is None:
            raise ContractError(f"checkpoint tensors need fmt in {sorted(FORMATS)} and group_size, "
                                f"got fmt={fmt!r}, group_size={group_size!r}")
        return FORMATS[fmt](weight, group_size, symmetric)
    raise ContractError(f"weight must be an oracle QuantizedWeight, KernelWeights or a mapping of checkpoint "
                        f"tensors, got {type(weight).__name__}")


def act_order_permutation(w: QuantizedWeight) -> torch.Tensor | None:
    """int64 [K] sorting input channels by group, or None when they are already in group order.

    GPTQ's g_idx gives every group exactly G channels, so after the sort group g is the contiguous
    channels g*G .. g*G + G - 1 and the plain kernel layout applies.
    """
    if w.g_idx is None or not w.has_act_order:
        return None
    if w.k % w.group:
        raise ContractError(f"act-order weights need K a multiple of group_size, got K={w.k}, G={w.group}")
    return torch.argsort(w.g_idx.long(), stable=True)


def dequantize_dense(w: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] rounded once into `dtype`, computed in fp32 (exact for fp16/bf16 scales) by row chunks."""
    dense = torch.empty(w.n, w.k, dtype=dtype, device=w.q.device)
    for start in range(0, w.n, DENSE_CHUNK_ROWS):
        stop = min(start + DENSE_CHUNK_ROWS, w.n)
        dense[start:stop] = w.dequantize_rows(start, stop, torch.float32)
    return dense

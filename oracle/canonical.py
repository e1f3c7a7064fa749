"""The canonical quantized weight: the one in-memory form every layout converts through."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import LayoutError, describe, expect, expect_nibbles, expect_same_device, expect_tensor

SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
SYMMETRIC_ZERO = 8


def resolve_group_size(group_size: int, k: int) -> int:
    """-1 means one group spanning all of K."""
    if not isinstance(group_size, int) or isinstance(group_size, bool):
        raise LayoutError(f"group_size: expected an int (-1 or a positive size), got {group_size!r}")
    if group_size == -1:
        return k
    if group_size <= 0:
        raise LayoutError(f"group_size: expected -1 or a positive size, got {group_size}")
    return group_size


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A W4 weight `W[n, k] = (q[n, k] - z[n, g(k)]) * s[n, g(k)]`.

    q:          uint8 [N, K], values 0..15, row n is output channel n.
    scales:     float16, bfloat16 or float32 [N, groups].
    zeros:      uint8 [N, groups], values 0..15; None means symmetric (z = 8 everywhere).
    group_size: G, the number of consecutive K values sharing a scale; -1 means G = K.
    g_idx:      int32/int64 [K] or None. Act-order: the group of input channel k (need not be
                monotone). None means g(k) = k // G. With g_idx, groups = ceil(K / G) and group g
                holds exactly G channels (the last one the remainder), as GPTQ writes it.
    """

    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int
    g_idx: torch.Tensor | None = None

    def __post_init__(self) -> None:
        q = expect_tensor(self.q, "q", dtypes=(torch.uint8,), layout_hint="unpacked uint4 [N, K]")
        expect(q.dim() == 2, "q", "a 2-D tensor [N, K]", describe(q))
        n, k = q.shape
        expect(n > 0 and k > 0, "q", "non-empty [N, K]", describe(q))
        # The value checks below need data; a meta tensor would fail inside them unexplained.
        expect(q.device.type != "meta", "q", "a tensor with data (not on the meta device)", describe(q))
        expect_same_device(q=q, scales=self.scales, zeros=self.zeros, g_idx=self.g_idx)
        g = resolve_group_size(self.group_size, k)
        if self.g_idx is None:
            expect(k % g == 0, "group_size", f"a divisor of K={k} (or -1)", str(self.group_size))
        groups = math.ceil(k / g)
        expect_tensor(self.scales, "scales", dtypes=SCALE_DTYPES, shape=(n, groups),
                      layout_hint=f"[N, K/G] = [{n}, {groups}]")
        if self.zeros is not None:
            expect_tensor(self.zeros, "zeros", dtypes=(torch.uint8,), shape=(n, groups),
                          layout_hint=f"unpacked uint4 [N, K/G] = [{n}, {groups}]")
            expect_nibbles(self.zeros, "zeros")
        expect_nibbles(q, "q")
        if self.g_idx is not None:
            validate_g_idx(self.g_idx, k, g)

    @property
    def n(self) -> int:
        return self.q.shape[0]

    @property
    def k(self) -> int:
        return self.q.shape[1]

    @property
    def group(self) -> int:
        """The group size G with -1 resolved to K."""
        return resolve_group_size(self.group_size, self.k)

    @property
    def num_groups(self) -> int:
        return self.scales.shape[1]

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    @property
    def has_act_order(self) -> bool:
        return self.g_idx is not None and not torch.equal(
            self.g_idx.long().cpu(), torch.arange(self.k) // self.group
        )

    def group_index(self) -> torch.Tensor:
        """int64 [K]: the group of each input channel."""
        if self.g_idx is not None:
            return self.g_idx.long()
        return torch.arange(self.k, device=self.q.device) // self.group

    def zeros_or_default(self) -> torch.Tensor:
        """uint8 [N, groups]: the zero points, 8 where symmetric."""
        if self.zeros is not None:
            return self.zeros
        return torch.full_like(self.scales, SYMMETRIC_ZERO, dtype=torch.uint8)

    def dequantize(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """W [N, K] in `dtype`. float64 is exact for every scale dtype; float32 is exact for
        fp16/bf16 scales ((q - z) has 5 bits, the scale at most 11)."""
        return self.dequantize_rows(0, self.n, dtype)

    def dequantize_rows(self, start: int, stop: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Rows start..stop of W, so callers can bound memory by chunking over N."""
        gi = self.group_index()
        q = self.q[start:stop].to(torch.int16)
        z = self.zeros_or_default()[start:stop].to(torch.int16)[:, gi]
        s = self.scales[start:stop].to(dtype)[:, gi]
        return (q - z).to(dtype) * s

    def to(self, device: torch.device | str) -> "QuantizedWeight":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return QuantizedWeight(move(self.q), move(self.scales), move(self.zeros), self.group_size,
                               move(self.g_idx))

    def with_scales(self, scales: torch.Tensor) -> "QuantizedWeight":
        return QuantizedWeight(self.q, scales, self.zeros, self.group_size, self.g_idx)

    def equal(self, other: "QuantizedWeight") -> bool:
        """Bit-exact equality of every field (scales compared as raw bits, dtype included)."""
        gi_a = None if self.g_idx is None else self.g_idx.long()
        gi_b = None if other.g_idx is None else other.g_idx.long()
        return (
            self.group == other.group
            and bit_equal(self.q, other.q)
            and bit_equal(self.scales, other.scales)
            and bit_equal(self.zeros, other.zeros)
            and bit_equal(gi_a, gi_b)
        )


def bit_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Same dtype, shape and bits (so -0.0 != 0.0 and NaN == NaN with the same payload)."""
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.contiguous().view(as_int), b.contiguous().view(as_int)
    return torch.equal(a.cpu(), b.cpu())


def validate_g_idx(g_idx: torch.Tensor, k: int, group: int) -> None:
    """A GPTQ act-order index: every group g < ceil(K/G) holds exactly G channels, the last the rest."""
    expect_tensor(g_idx, "g_idx", dtypes=INDEX_DTYPES, shape=(k,), layout_hint="group of each input channel [K]")
    groups = math.ceil(k / group)
    lo, hi = int(g_idx.min()), int(g_idx.max())
    expect(lo >= 0 and hi < groups, "g_idx", f"values in 0..{groups - 1} (ceil(K/G) groups)", f"values {lo}..{hi}")
    counts = torch.bincount(g_idx.long().cpu(), minlength=groups)
    want = torch.full((groups,), group, dtype=torch.long)
    want[-1] = k - group * (groups - 1)
    if not torch.equal(counts, want):
        g = int((counts != want).nonzero()[0])
        raise LayoutError(
            f"g_idx: expected every group to hold G={group} channels (last one {int(want[-1])}), "
            f"got group {g} with {int(counts[g])}"
        )

"""Packing eight 4-bit values into one int32 word, in a given nibble order, along a given dim."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import expect, expect_nibbles, expect_tensor, describe

NATURAL_ORDER = (0, 1, 2, 3, 4, 5, 6, 7)
# AutoAWQ's interleave: nibble p of a word holds element AWQ_ORDER[p] of its 8-group.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PACKED_DTYPES = (torch.int32, torch.uint32)


def pack(values: torch.Tensor, dim: int, order: Sequence[int] = NATURAL_ORDER) -> torch.Tensor:
    """uint8 values 0..15 -> int32 words, 8 values along `dim` per word.

    Nibble p (bits 4p..4p+3) of word j holds element 8j + order[p] of the packed dim.
    """
    expect_tensor(values, "values to pack", dtypes=(torch.uint8,), layout_hint="unpacked uint4")
    expect_nibbles(values, "values to pack")
    dim = dim % values.dim()
    extent = values.shape[dim]
    expect(extent % 8 == 0, "values to pack", f"a multiple of 8 along dim {dim}", describe(values))
    v = values.movedim(dim, -1).to(torch.int64)
    v = v.reshape(*v.shape[:-1], extent // 8, 8)[..., list(order)]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=v.device)
    words = (v << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def unpack(words: torch.Tensor, dim: int, order: Sequence[int] = NATURAL_ORDER) -> torch.Tensor:
    """int32 (or uint32) words -> uint8 values 0..15, the inverse of `pack`."""
    expect_tensor(words, "packed words", dtypes=PACKED_DTYPES, layout_hint="8x uint4 per word")
    dim = dim % words.dim()
    # Work in int64: int32 `>>` is arithmetic and would smear the sign bit into nibble 7.
    w = words.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=w.device)
    nibs = (w.unsqueeze(-1) >> shifts) & 0xF
    inverse = [0] * 8
    for p, e in enumerate(order):
        inverse[e] = p
    nibs = nibs[..., inverse]
    out = nibs.reshape(*w.shape[:-1], w.shape[-1] * 8).to(torch.uint8)
    return out.movedim(-1, dim).contiguous()

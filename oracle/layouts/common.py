"""Checks shared by the layout converters."""

from __future__ import annotations

import torch

from ..canonical import QuantizedWeight
from ..errors import CheckpointError, LayoutError


def reject_act_order(w: QuantizedWeight, layout: str) -> None:
    if w.has_act_order:
        raise LayoutError(
            f"{layout}: expected groups of consecutive K channels, got an act-order g_idx; "
            "this layout has no g_idx (permute the K dimension of W and x first)"
        )


def require_multiple(value: int, of: int, what: str, layout: str) -> None:
    if value % of:
        raise LayoutError(f"{layout}: expected {what} divisible by {of}, got {what}={value}")


def symmetric_zeros(zeros: torch.Tensor, layout: str) -> None:
    """A layer declared symmetric must store z = 8 everywhere; anything else would be silently dropped."""
    if not bool((zeros == 8).all()):
        bad = int((zeros != 8).sum())
        raise CheckpointError(
            f"{layout}: declared symmetric, so every zero point must be 8, got {bad} other value(s)"
        )

"""Checks shared by the layout converters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..canonical import QuantizedWeight
from ..errors import CheckpointError, LayoutError, expect_same_device


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


def require_tensors(tensors: Mapping[str, torch.Tensor], names: Sequence[str], layout: str) -> None:
    """Every named tensor is present (a missing one would otherwise be a bare KeyError or, worse, a
    silently different reading), and all given tensors share one device."""
    missing = [name for name in names if name not in tensors]
    if missing:
        raise LayoutError(f"{layout}: expected tensors {', '.join(names)}, missing {', '.join(missing)} "
                          f"(got {', '.join(sorted(tensors)) or 'none'})")
    expect_same_device(**{name: t for name, t in tensors.items() if isinstance(t, torch.Tensor)})

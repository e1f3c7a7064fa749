"""Errors raised on bad input: each names what was expected and what was given."""

from __future__ import annotations

import torch


class LayoutError(ValueError):
    """A tensor does not have the dtype, shape, value range or device a layout requires."""


class CheckpointError(ValueError):
    """A checkpoint cannot be read faithfully (unknown format, or a value its format cannot hold)."""


def describe(t: torch.Tensor | None) -> str:
    if t is None:
        return "None"
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)} on {t.device}"


def expect(ok: bool, what: str, expected: str, got: str) -> None:
    if not ok:
        raise LayoutError(f"{what}: expected {expected}, got {got}")


def expect_tensor(
    t: object,
    what: str,
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
    shape: tuple[int | None, ...] | None = None,
    layout_hint: str = "",
) -> torch.Tensor:
    """Check a tensor's dtype and shape (None in `shape` matches any extent)."""
    hint = f" ({layout_hint})" if layout_hint else ""
    if not isinstance(t, torch.Tensor):
        raise LayoutError(f"{what}: expected a torch.Tensor{hint}, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise LayoutError(f"{what}: expected dtype {names}{hint}, got {describe(t)}")
    if shape is not None:
        ok = t.dim() == len(shape) and all(e is None or e == s for e, s in zip(shape, t.shape))
        if not ok:
            want = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
            raise LayoutError(f"{what}: expected shape {want}{hint}, got {describe(t)}")
    return t


def expect_nibbles(t: torch.Tensor, what: str) -> None:
    """Unpacked 4-bit values must lie in 0..15."""
    if t.numel() and int(t.max()) > 15:
        bad = int((t > 15).sum())
        raise LayoutError(
            f"{what}: expected values 0..15 (unpacked uint4), got {bad} value(s) up to {int(t.max())}"
        )


def expect_same_device(**tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise LayoutError(f"tensors must be on one device, got {listing}")

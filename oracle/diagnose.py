"""Diagnosis: when a kernel's output fails, find the known wrong convention that explains it.

Each convention recomputes the exact reference as a kernel making that one mistake would, and
the output is judged against it with the same error model. A convention "explains" the output
when that verdict passes; when none does, the diagnosis says so (and which came closest).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .canonical import QuantizedWeight
from .error_model import Verdict, element_errors, error_bounds, judge
from .layouts import nibbles
from .reference import Reference, reference_matmul

# (x, weight, bias) -> (x, weight, bias) as the mistaken kernel sees them; None when the mistake
# cannot be expressed for these sizes.
Mistake = Callable[[torch.Tensor, QuantizedWeight, torch.Tensor | None],
                   "tuple[torch.Tensor, QuantizedWeight, torch.Tensor | None] | None"]


@dataclass(frozen=True)
class Convention:
    name: str
    description: str
    apply: Mistake


def _weight(w: QuantizedWeight, q=None, scales=None, zeros=None) -> QuantizedWeight:
    return QuantizedWeight(w.q if q is None else q, w.scales if scales is None else scales,
                           w.zeros if zeros is None else zeros, w.group_size, w.g_idx)


def _nibble_order(write: tuple[int, ...], read: tuple[int, ...]) -> Mistake:
    def apply(x, w, bias):
        if w.k % 8:
            return None
        return x, _weight(w, q=nibbles.unpack(nibbles.pack(w.q, 1, write), 1, read)), bias
    return apply


def _zero_shift(delta: int) -> Mistake:
    def apply(x, w, bias):
        if w.zeros is None:
            return None
        return x, _weight(w, zeros=((w.zeros.to(torch.int16) + delta) & 0xF).to(torch.uint8)), bias
    return apply


def _constant_zero(value: int) -> Mistake:
    def apply(x, w, bias):
        if w.zeros is not None and bool((w.zeros == value).all()):
            return None
        z = torch.full_like(w.scales, value, dtype=torch.uint8)
        return x, _weight(w, zeros=z), bias
    return apply


def _zeros_packed_along_k(x, w, bias):
    """Packed [N/8, groups] words read as if packed along the groups: word n * groups/8 + g/8."""
    if w.zeros is None or w.n % 8 or w.num_groups % 8:
        return None
    flat = nibbles.pack(w.zeros, 0).flatten()
    words = flat.reshape(w.n, w.num_groups // 8)
    return x, _weight(w, zeros=nibbles.unpack(words, 1)), bias


def _unpacked_zeros_as_packed(x, w, bias):
    """Activation-dtype [N, groups] zero points handed to code reading packed int32 [N/8, groups]:
    the bytes of the float array, read as words, row n at nibble n % 8 of word (n // 8, g)."""
    if w.zeros is None or w.n % 8 or (w.n * w.num_groups) % 2:
        return None
    raw = w.zeros.to(x.dtype).flatten().view(torch.int32)[: (w.n // 8) * w.num_groups]
    return x, _weight(w, zeros=nibbles.unpack(raw.reshape(w.n // 8, w.num_groups), 0)), bias


def _scales_transposed(x, w, bias):
    """[K/G, N] memory read as [N, K/G] (or the reverse): same bytes, wrong rows."""
    if w.num_groups == 1:
        return None
    return x, _weight(w, scales=w.scales.t().contiguous().reshape(w.n, w.num_groups)), bias


def _group_shift(delta: int) -> Mistake:
    def apply(x, w, bias):
        if w.num_groups == 1:
            return None
        idx = (torch.arange(w.num_groups, device=w.scales.device) + delta).clamp(0, w.num_groups - 1)
        zeros = None if w.zeros is None else w.zeros[:, idx]
        return x, _weight(w, scales=w.scales[:, idx], zeros=zeros), bias
    return apply


def _no_bias(x, w, bias):
    return None if bias is None else (x, w, None)


def _double_bias(x, w, bias):
    return None if bias is None else (x, w, (bias.double() * 2).to(bias.dtype))


def _reinterpret_x(x, w, bias):
    other = torch.bfloat16 if x.dtype == torch.float16 else torch.float16
    xr = x.contiguous().view(other).float()
    if not bool(torch.isfinite(xr).all()):
        return None
    return xr.to(x.dtype), w, bias


CONVENTIONS = [
    Convention("awq_nibble_order", "weights packed in natural nibble order were read with the AWQ interleave "
               "[0,2,4,6,1,3,5,7]", _nibble_order(nibbles.NATURAL_ORDER, nibbles.AWQ_ORDER)),
    Convention("natural_nibble_order", "weights packed with the AWQ interleave were read in natural order",
               _nibble_order(nibbles.AWQ_ORDER, nibbles.NATURAL_ORDER)),
    Convention("zeros_packed_along_k", "packed zero points [N/8, groups] were read as packed along groups",
               _zeros_packed_along_k),
    Convention("unpacked_zeros_as_packed", "activation-dtype zero points [N, groups] were read as packed int32 "
               "[N/8, groups]", _unpacked_zeros_as_packed),
    Convention("z_minus_1", "zero points read one too low (GPTQ v1 z-1 stored, decoded as v2)", _zero_shift(-1)),
    Convention("z_plus_1", "zero points read one too high (v2 zeros decoded as GPTQ v1)", _zero_shift(1)),
    Convention("zero_is_8", "zero points ignored: symmetric z = 8 assumed", _constant_zero(8)),
    Convention("zero_is_0", "zero point taken as 0 (unsigned weights without offset)", _constant_zero(0)),
    Convention("scales_transposed", "scales [K/G, N] and [N, K/G] confused (same bytes, other shape)",
               _scales_transposed),
    Convention("group_index_plus_1", "group index off by one: k uses the scales of group k // G + 1",
               _group_shift(1)),
    Convention("group_index_minus_1", "group index off by one: k uses the scales of group k // G - 1",
               _group_shift(-1)),
    Convention("bias_missing", "bias not added", _no_bias),
    Convention("bias_twice", "bias added twice", _double_bias),
    Convention("fp16_bf16_reinterpreted", "activations read as the other 16-bit float format", _reinterpret_x),
]


@dataclass(frozen=True)
class Diagnosis:
    """explained_by: conventions whose recomputed reference the output passes (best first);
    unwritten: (rows, cols) left unwritten, if the mismatches are exactly whole rows/columns of
    zeros or NaN; closest: the convention with the lowest worst error/bound when none explains."""

    explained_by: list[str]
    unwritten: tuple[list[int], list[int]] | None
    closest: tuple[str, float] | None

    def summary(self) -> str:
        if self.unwritten is not None:
            rows, cols = self.unwritten
            what = (f"rows {rows[:8]}" if rows else "") + (" and " if rows and cols else "") + \
                (f"columns {cols[:8]}" if cols else "")
            return f"output {what} left unwritten (zero or NaN where the reference is not)"
        if self.explained_by:
            first = next(c for c in CONVENTIONS if c.name == self.explained_by[0])
            return f"explained by {first.name}: {first.description}"
        if self.closest is not None:
            return (f"no known wrong convention explains the output (closest: {self.closest[0]}, "
                    f"worst error/bound {self.closest[1]:.3g})")
        return "no known wrong convention explains the output"


def _unwritten(out: torch.Tensor, verdict_over: torch.Tensor) -> tuple[list[int], list[int]] | None:
    blank = (out == 0) | torch.isnan(out)
    bad = verdict_over
    if not bool(bad.any()) or not bool((blank | ~bad).all()):
        return None
    rows = [r for r in range(out.shape[0]) if bool(blank[r].all()) and bool(bad[r].any())]
    cols = [c for c in range(out.shape[1]) if bool(blank[:, c].all()) and bool(bad[:, c].any())]
    covered = torch.zeros_like(bad)
    covered[rows, :] = True
    covered[:, cols] = True
    return (rows, cols) if (rows or cols) and bool((covered | ~bad).all()) else None


def diagnose(out: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None, *,
             dequant_dtype: torch.dtype | None, dequant_roundings: int = 1,
             ref: Reference | None = None) -> Diagnosis:
    """out: the kernel's x.dtype [M, N] output for inputs x [M, K], weight, bias [N] | None."""
    ref = ref or reference_matmul(x, weight, bias)
    bounds_kw = dict(dequant_dtype=dequant_dtype, dequant_roundings=dequant_roundings)
    base = judge(out, ref, **bounds_kw)
    unwritten = _unwritten(out, element_errors(out, ref) > error_bounds(ref, **bounds_kw).tight)
    explained: list[tuple[float, str]] = []
    closest: tuple[str, float] | None = None
    for conv in CONVENTIONS:
        seen = conv.apply(x, weight, bias)
        if seen is None:
            continue
        v: Verdict = judge(out, reference_matmul(*seen), **bounds_kw)
        if v.passed and not base.passed:
            explained.append((v.worst_ratio, conv.name))
        if closest is None or v.worst_ratio < closest[1]:
            closest = (conv.name, v.worst_ratio)
    return Diagnosis([name for _, name in sorted(explained)], unwritten, None if explained else closest)

"""How a kernel under test describes itself to the oracle.

Calling convention, for every kernel: `fn(x, weight, scales, zeros, group_size, bias) -> y`
  x:          float16/bfloat16 [M, K] (a fresh copy; the kernel may not corrupt the oracle's).
  weight, scales, zeros: the weight in the layout the spec names (see `prepare`).
  group_size: 32, 64, 128 or -1 (one group over K).
  bias:       x.dtype [N] or None.
  y:          x.dtype [M, N].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .canonical import QuantizedWeight
from .cases import Case
from .errors import LayoutError
from .layouts import nibbles, to_awq, to_gptq
from .layouts.kernel import pack_zero_points, zero_points_to_float

# weight layouts a spec may ask for:
#   "kernel":    int32 [N, K/8] packed along K, natural order (compressed-tensors bytes)
#   "exllama":   int32 [N, K/8] packed along K, AWQ interleave
#   "canonical": uint8 [N, K], values 0..15
#   "awq":       the AutoAWQ GEMM triple (qweight [K, N/8], scales [K/G, N], qzeros [K/G, N/8])
#   "gptq":      the GPTQ v2 triple (qweight [K/8, N], scales [K/G, N], qzeros [K/G, N/8])
# For "awq" and "gptq" the zero points come in that format's own layout; zero_layout is ignored.
WEIGHT_LAYOUTS = ("kernel", "exllama", "canonical", "awq", "gptq")
# zero-point layouts: "packed" int32 [N/8, groups]; "unpacked" x.dtype [N, groups] holding z as
# a float; "canonical" uint8 [N, groups]. Symmetric weights always pass zeros=None.
ZERO_LAYOUTS = ("packed", "unpacked", "canonical")


@dataclass(frozen=True)
class KernelSpec:
    """A kernel and what it accepts.

    dequant_dtype: the dtype the kernel rounds W into before multiplying ("activation" for x.dtype,
                   None if it keeps W exact, e.g. scaling after an integer dot); sets u_w.
    dequant_roundings: c_w, 1 for (q - z) * s, 2 for q * s + (-z * s) or float-zero forms; None
                   (the default) when not declared: a case that fails the one-rounding bound but
                   passes the two-rounding one passes, with a note naming the declaration to make.
    can_implement: optional extra gate, case -> (ok, reason).
    writes_out:    the kernel takes a keyword `out` (x.dtype [M, N]) and fills it; the harness
                   fills it with NaN first, so an element the kernel never writes cannot pass.
    deterministic: repeated calls give the same bits (the harness calls twice and compares); False
                   for kernels that add partial sums with atomics by design.
    batch_invariant: opt in to checking that each row of an M-row call equals that row called alone.
    act_order:     the kernel takes act-order weights: it is called with a keyword `g_idx` (int32
                   [K], the group of each input channel, as GPTQ stores it) and the weight and
                   zero points in the channel order of x; act-order cases go to such kernels only.
    """

    name: str
    fn: Callable[..., torch.Tensor]
    weight_layout: str = "kernel"
    zero_layout: str = "packed"
    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
    group_sizes: tuple[int, ...] = (32, 64, 128, -1)
    max_m: int | None = None
    dequant_dtype: torch.dtype | str | None = "activation"
    dequant_roundings: int | None = None
    can_implement: Callable[[Case], tuple[bool, str]] | None = None
    writes_out: bool = False
    deterministic: bool = True
    batch_invariant: bool = False
    act_order: bool = False

    def __post_init__(self) -> None:
        if self.weight_layout not in WEIGHT_LAYOUTS:
            raise LayoutError(f"{self.name}: weight_layout: expected one of {WEIGHT_LAYOUTS}, got {self.weight_layout!r}")
        if self.zero_layout not in ZERO_LAYOUTS:
            raise LayoutError(f"{self.name}: zero_layout: expected one of {ZERO_LAYOUTS}, got {self.zero_layout!r}")
        if self.dequant_roundings not in (None, 1, 2):
            raise LayoutError(f"{self.name}: dequant_roundings: expected None (not declared), 1 or 2, "
                              f"got {self.dequant_roundings!r}")

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.act_order and not self.act_order:
            return False, "act-order weights (declare act_order=True to take g_idx)"
        if case.dtype not in self.dtypes:
            return False, f"dtype {case.dtype} not in {self.dtypes}"
        if case.group_size not in self.group_sizes:
            return False, f"group size {case.group_size} not in {self.group_sizes}"
        if self.max_m is not None and case.m > self.max_m:
            return False, f"M={case.m} above max_m={self.max_m}"
        if self.can_implement is not None:
            return self.can_implement(case)
        return True, ""

    def dequant(self, act_dtype: torch.dtype) -> torch.dtype | None:
        return act_dtype if self.dequant_dtype == "activation" else self.dequant_dtype

    def prepare(self, w: QuantizedWeight, act_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(weight, scales, zeros) in this spec's layouts; scales in `act_dtype`. An act-order
        weight keeps the channel order of x (its g_idx goes to the kernel separately)."""
        if w.has_act_order and not self.act_order:
            raise LayoutError(f"{self.name}: act-order weights need a spec with act_order=True (the kernel then "
                              "takes g_idx)")
        scales = w.scales.to(act_dtype).contiguous()
        if self.weight_layout in ("awq", "gptq"):
            t = to_awq(w.with_scales(scales)) if self.weight_layout == "awq" else to_gptq(w.with_scales(scales), 2)
            return t["qweight"], t["scales"], None if w.zeros is None else t["qzeros"]
        weight = {
            "kernel": lambda: nibbles.pack(w.q, 1),
            "exllama": lambda: nibbles.pack(w.q, 1, nibbles.AWQ_ORDER),
            "canonical": lambda: w.q.clone(),
        }[self.weight_layout]()
        zeros = None
        if w.zeros is not None:
            zeros = {
                "packed": lambda: pack_zero_points(w.zeros),
                "unpacked": lambda: zero_points_to_float(w.zeros, act_dtype),
                "canonical": lambda: w.zeros.clone(),
            }[self.zero_layout]()
        return weight, scales, zeros

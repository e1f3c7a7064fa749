"""Per-element error bounds for a W4A16 matmul and the verdict built on them (DESIGN.md section 3).

With A = |x| @ |W|^T, Q = sqrt(x^2 @ (W^2)^T), u_o the output dtype's unit roundoff, u_w that of
the dtype the kernel dequantizes into (0 when exact), c_w the roundings in its dequant chain and
u_a = 2^-23 for fp32 accumulation:

    hard  = u_o |y| + (1 + u_o) (u_w D_A + K u_a A) + eta              (never flakes)
    tight = u_o |y| + (1 + u_o) 6 (u_w D_Q + sqrt(K) u_a A) + eta      (the default verdict)

D is the dequant chain's error magnitude. For (q - z) * s (c_w = 1) it is one rounding of W:
D_A = A, D_Q = Q. Forms with more roundings (c_w >= 2: q * s + (-z * s), float zeros) round
intermediates up to 15 |s| each, which can dwarf W when q and z nearly cancel, so
D_A = A + 30 (c_w - 1) A_s and D_Q = Q + 30 (c_w - 1) Q_s, with A_s, Q_s the same sums over |s|.
(DESIGN.md's c_w u_w A is this with the cancellation ignored; seeds with q ~ z break it.)

The (1 + u_o) factor is there because the kernel rounds its own inexact sum, not y. eta covers
underflow in the output dtype. In fp32 reference mode the reference's own error is added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .errors import LayoutError, describe
from .reference import Reference

U_ACC = 2.0**-23  # u_a of fp32 accumulation: one ulp, twice the unit roundoff
TIGHT_SIGMAS = 6.0


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


@dataclass(frozen=True)
class Bounds:
    """float64 [M, N] each: the hard (worst case) and tight (statistical) bound per element."""

    hard: torch.Tensor
    tight: torch.Tensor


def error_bounds(ref: Reference, dequant_dtype: torch.dtype | None, dequant_roundings: int = 1,
                 accumulate: torch.dtype = torch.float32) -> Bounds:
    """dequant_dtype: the dtype W is rounded into before the products (None: exact, e.g. a
    kernel that scales after an integer dot). dequant_roundings: c_w, 1 for (q - z) * s, 2 for
    q * s + (-z * s) or float-zero forms. accumulate: the dtype the kernel sums in (u_a is its
    unit roundoff; the diagnosis tries the activation dtype)."""
    out_dtype = ref.y_out.dtype
    u_o = unit_roundoff(out_dtype)
    u_w = 0.0 if dequant_dtype is None else unit_roundoff(dequant_dtype)
    fi = torch.finfo(out_dtype)
    eta = fi.tiny * fi.eps + ref.k * 2.0**-149
    y, a, q = ref.y.double().abs(), ref.abs_dot.double(), ref.rms_dot.double()
    k = ref.k
    u_a = 2 * unit_roundoff(accumulate)  # one ulp: U_ACC for fp32
    spread = 30 * (dequant_roundings - 1)
    d_a = a + spread * ref.abs_scale_dot.double() if spread else a
    d_q = q + spread * ref.rms_scale_dot.double() if spread else q
    hard_acc = u_w * d_a + k * u_a * a
    tight_acc = TIGHT_SIGMAS * (u_w * d_q + math.sqrt(k) * u_a * a)
    if ref.accumulate == torch.float32:
        hard_acc = hard_acc + k * U_ACC * a
        tight_acc = tight_acc + TIGHT_SIGMAS * math.sqrt(k) * U_ACC * a
    hard = u_o * y + (1 + u_o) * hard_acc + eta
    tight = u_o * y + (1 + u_o) * tight_acc + eta
    return Bounds(hard, tight)


@dataclass(frozen=True)
class Mismatch:
    row: int
    col: int
    got: float
    expected: float
    bound: float

    def __str__(self) -> str:
        return f"[{self.row}, {self.col}] got {self.got:.6g} expected {self.expected:.6g} (bound {self.bound:.3g})"


@dataclass(frozen=True)
class Verdict:
    """The judgement of one output against the reference.

    worst_ratio:  max over elements of |out - y| / tight bound (inf for a wrong non-finite value).
    violations:   elements over the tight bound; hard_violations: over the hard bound.
    baseline_*:   the same numbers for a plain same-precision torch computation, for comparison.
    """

    passed: bool
    criterion: str
    worst_ratio: float
    worst_at: tuple[int, int]
    violations: int
    hard_violations: int
    max_abs_error: float
    examples: list[Mismatch] = field(default_factory=list)
    baseline_worst_ratio: float | None = None
    baseline_max_abs_error: float | None = None

    def summary(self) -> str:
        head = "PASS" if self.passed else "FAIL"
        text = (f"{head} ({self.criterion} bound): worst error/bound {self.worst_ratio:.3g} at {list(self.worst_at)}, "
                f"{self.violations} over tight, {self.hard_violations} over hard, max |err| {self.max_abs_error:.3g}")
        if self.baseline_worst_ratio is not None:
            text += (f"; plain torch: worst error/bound {self.baseline_worst_ratio:.3g}, "
                     f"max |err| {self.baseline_max_abs_error:.3g}")
        if self.examples:
            text += "\n  " + "\n  ".join(str(e) for e in self.examples)
        return text


def element_errors(out: torch.Tensor, ref: Reference) -> torch.Tensor:
    """float64 [M, N]: |out - y|, 0 where a non-finite expectation is met exactly and inf where the
    output is non-finite (or wrongly finite)."""
    got = out.double()
    want = ref.y.double()
    want_out = ref.y_out.double()
    nonfinite_expected = ~torch.isfinite(want_out)
    err = (got - want).abs()
    err = torch.where(torch.isfinite(got), err, torch.full_like(err, math.inf))
    met = (got == want_out) | (torch.isnan(got) & torch.isnan(want_out))
    special = torch.where(met, torch.zeros_like(err), torch.full_like(err, math.inf))
    return torch.where(nonfinite_expected, special, err)


def judge(out: torch.Tensor, ref: Reference, *, dequant_dtype: torch.dtype | None, dequant_roundings: int = 1,
          baseline: torch.Tensor | None = None, criterion: str = "tight", max_examples: int = 8,
          accumulate: torch.dtype = torch.float32) -> Verdict:
    """Judge a kernel's output (activation dtype [M, N]) against the reference."""
    if criterion not in ("tight", "hard"):
        raise LayoutError(f"criterion: expected 'tight' or 'hard', got {criterion!r}")
    want = f"{str(ref.y_out.dtype).removeprefix('torch.')} {list(ref.y_out.shape)}"
    if not isinstance(out, torch.Tensor) or out.dtype != ref.y_out.dtype or out.shape != ref.y_out.shape:
        got = describe(out) if isinstance(out, torch.Tensor) else type(out).__name__
        raise LayoutError(f"kernel output: expected {want}, got {got}")
    if out.device.type == "meta":
        raise LayoutError(f"kernel output: expected a tensor with data, got {describe(out)}")
    if dequant_dtype is not None and not (isinstance(dequant_dtype, torch.dtype) and dequant_dtype.is_floating_point):
        raise LayoutError(f"dequant_dtype: expected None or a floating-point torch.dtype, got {dequant_dtype!r}")
    bounds = error_bounds(ref, dequant_dtype, dequant_roundings, accumulate)
    err = element_errors(out.to(ref.y.device), ref)
    ratio = err / bounds.tight
    over_tight = ratio > 1
    over_hard = err > bounds.hard
    over = over_tight if criterion == "tight" else over_hard
    flat = int(ratio.argmax()) if ratio.numel() else 0
    worst_at = divmod(flat, ratio.shape[1]) if ratio.numel() else (0, 0)
    examples = []
    limit = bounds.tight if criterion == "tight" else bounds.hard
    for r, c in over.nonzero()[:max_examples].tolist():
        examples.append(Mismatch(r, c, float(out[r, c]), float(ref.y[r, c]), float(limit[r, c])))
    base_ratio = base_err = None
    if baseline is not None:
        b_err = element_errors(baseline.to(ref.y.device), ref)
        base_ratio = float((b_err / bounds.tight).max()) if b_err.numel() else 0.0
        base_err = float(b_err.max()) if b_err.numel() else 0.0
    return Verdict(
        passed=not bool(over.any()),
        criterion=criterion,
        worst_ratio=float(ratio.max()) if ratio.numel() else 0.0,
        worst_at=tuple(int(v) for v in worst_at),
        violations=int(over_tight.sum()),
        hard_violations=int(over_hard.sum()),
        max_abs_error=float(err.max()) if err.numel() else 0.0,
        examples=examples,
        baseline_worst_ratio=base_ratio,
        baseline_max_abs_error=base_err,
    )

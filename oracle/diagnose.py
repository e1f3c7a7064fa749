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


def _reorder_rows(t: torch.Tensor) -> torch.Tensor:
    """Rows of an [N, *] uint4 tensor as a reader sees them that takes AutoAWQ's words (packed
    along N with the interleave) for natural order: its row 8c + p is row 8c + AWQ_ORDER[p]."""
    return nibbles.unpack(nibbles.pack(t, 0, nibbles.AWQ_ORDER), 0, nibbles.NATURAL_ORDER)


def _awq_interleave_ignored(on_q: bool, on_zeros: bool) -> Mistake:
    def apply(x, w, bias):
        if w.n % 8 or (on_zeros and w.zeros is None):
            return None
        q = _reorder_rows(w.q) if on_q else None
        zeros = _reorder_rows(w.zeros) if on_zeros else None
        return x, _weight(w, q=q, zeros=zeros), bias
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


def _zeros_transposed(x, w, bias):
    """[K/G, N] zero points and [N, K/G] confused (same bytes, other shape)."""
    if w.zeros is None or w.num_groups == 1:
        return None
    return x, _weight(w, zeros=w.zeros.t().contiguous().reshape(w.n, w.num_groups)), bias


def _last_group_previous_scale(x, w, bias):
    if w.num_groups == 1:
        return None
    scales = w.scales.clone()
    scales[:, -1] = scales[:, -2]
    return x, _weight(w, scales=scales), bias


@dataclass(frozen=True, eq=False)
class OffsetWeight(QuantizedWeight):
    """(q - z) * s + offset[n, g(k)]: a weight no (q, z, s) triple expresses, for mistakes in the
    dequant formula itself. offset: float64 [N, groups]."""

    offset: torch.Tensor | None = None

    def dequantize_rows(self, start: int, stop: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        w = super().dequantize_rows(start, stop, dtype)
        return w + self.offset[start:stop].to(dtype)[:, self.group_index()]


def _zero_not_scaled(x, w, bias):
    """W = q * s - z = (q - z) * s + z * (s - 1): the zero point subtracted without its scale."""
    z = w.zeros_or_default().double()
    offset = z * (w.scales.double() - 1)
    return x, OffsetWeight(w.q, w.scales, w.zeros, w.group_size, w.g_idx, offset), bias


def _x_row_0(x, w, bias):
    if x.shape[0] < 2:
        return None
    return x[:1].expand_as(x).contiguous(), w, bias


def _scales_through_bf16(x, w, bias):
    if w.scales.dtype == torch.bfloat16:
        return None
    scales = w.scales.to(torch.bfloat16).to(w.scales.dtype)
    if torch.equal(scales, w.scales):
        return None
    return x, _weight(w, scales=scales), bias


def k_tails(k: int) -> list[int]:
    """The tails a kernel tiling K by a power-of-two block from 16 to 1024 would drop."""
    return sorted({k % b for b in (16, 32, 64, 128, 256, 512, 1024) if 0 < k % b < k})


def _drop_tail(tail: int) -> Mistake:
    def apply(x, w, bias):
        x = x.clone()
        x[:, x.shape[1] - tail:] = 0
        return x, w, bias
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
    Convention("awq_interleave_ignored", "AutoAWQ's qweight and qzeros (packed along N with the interleave "
               "[0,2,4,6,1,3,5,7]) were read in natural order: output column 8c+p got column 8c+[0,2,4,6,1,3,5,7][p]'s "
               "weights and zero points", _awq_interleave_ignored(True, True)),
    Convention("awq_interleave_ignored_on_qweight", "AutoAWQ's qweight (packed along N with the interleave) was "
               "read in natural order; its zero points were read right", _awq_interleave_ignored(True, False)),
    Convention("awq_interleave_ignored_on_qzeros", "AutoAWQ's qzeros (packed along N with the interleave) were "
               "read in natural order; the weights were read right", _awq_interleave_ignored(False, True)),
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
    Convention("zeros_transposed", "zero points [K/G, N] and [N, K/G] confused (same bytes, other shape)",
               _zeros_transposed),
    Convention("zero_not_scaled", "the zero point subtracted without its scale: W = q * s - z instead of (q - z) * s",
               _zero_not_scaled),
    Convention("last_group_previous_scale", "the last group used the previous group's scale",
               _last_group_previous_scale),
    Convention("scales_through_bf16", "scales rounded through bfloat16 (8 significant bits) before use",
               _scales_through_bf16),
    Convention("x_row_0_for_every_row", "every output row was computed from row 0 of x", _x_row_0),
    Convention("group_index_plus_1", "group index off by one: k uses the scales of group k // G + 1",
               _group_shift(1)),
    Convention("group_index_minus_1", "group index off by one: k uses the scales of group k // G - 1",
               _group_shift(-1)),
    Convention("bias_missing", "bias not added", _no_bias),
    Convention("bias_twice", "bias added twice", _double_bias),
    Convention("fp16_bf16_reinterpreted", "activations read as the other 16-bit float format", _reinterpret_x),
]


def attempts(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None):
    """(name, description, inputs as the mistaken kernel sees them) for every convention that
    applies here, K tails included."""
    for conv in CONVENTIONS:
        seen = conv.apply(x, w, bias)
        if seen is not None:
            yield conv.name, conv.description, seen
    for tail in k_tails(w.k):
        yield (f"k_tail_dropped_{tail}", f"the last {tail} channels of K were ignored (K = {w.k} is not a multiple "
               f"of the kernel's K block)", _drop_tail(tail)(x, w, bias))


@dataclass(frozen=True)
class Diagnosis:
    """explained_by: (name, description) of what makes the output pass, best first: a wrong
    convention, a located single-value mistake, or 16-bit accumulation; unwritten: (rows, cols)
    left unwritten, if the mismatches are exactly whole rows/columns of zeros or NaN; closest: the
    convention with the lowest worst error/bound when none explains."""

    explained_by: list[tuple[str, str]]
    unwritten: tuple[list[int], list[int]] | None
    closest: tuple[str, float] | None

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.explained_by]

    @property
    def global_mistake(self) -> bool:
        """Whether the output is explained by a mistake of the whole computation (a convention, a
        dropped K tail, 16-bit sums) or left unwritten, rather than by one located value."""
        return self.unwritten is not None or bool(self.explained_by) and self.explained_by[0][0] not in LOCATED

    def summary(self) -> str:
        if self.unwritten is not None:
            rows, cols = self.unwritten
            what = (f"rows {rows[:8]}" if rows else "") + (" and " if rows and cols else "") + \
                (f"columns {cols[:8]}" if cols else "")
            return f"output {what} left unwritten (zero or NaN where the reference is not)"
        if self.explained_by:
            name, description = self.explained_by[0]
            return f"explained by {name}: {description}"
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


# The explanations a search fits to single values (one zero point, one nibble pair), as opposed to
# a mistake of the whole computation.
LOCATED = ("single_zero_point", "swapped_nibbles")
# At most this many output columns are searched for a single wrong zero point or nibble pair.
MAX_SEARCH_COLUMNS = 64


def _single_zero_points(out, x, w, bias, bad_cols):
    """Per failing column n, the group g and integer d such that z[n, g] + d explains it: the
    residual out - y is d times -s[n, g] times the group's sum of x, fitted by least squares."""
    ref = reference_matmul(x, w, bias).y
    resid = out.double() - ref
    gi = w.group_index()
    xg = torch.zeros(x.shape[0], w.num_groups, dtype=torch.float64, device=x.device).index_add_(1, gi, x.double())
    zeros = w.zeros_or_default().clone()
    found = []
    for n in bad_cols:
        a = -w.scales[n].double().unsqueeze(0) * xg                      # [M, groups]: effect of d = 1
        norm = (a * a).sum(0)
        d = torch.where(norm > 0, (a * resid[:, n:n + 1]).sum(0) / norm.clamp_min(1e-300), torch.zeros_like(norm))
        d = d.round()
        err = ((resid[:, n:n + 1] - a * d) ** 2).sum(0) + (d == 0) * 1e300
        g = int(err.argmin())
        z = int(zeros[n, g]) + int(d[g])
        if int(d[g]) == 0 or not 0 <= z <= 15:
            return None
        zeros[n, g] = z
        found.append((n, g, int(d[g])))
    if not found:
        return None
    where = "; ".join(f"row {n}, group {g}: the zero point acts as z{d:+d}" for n, g, d in found[:4])
    return "single_zero_point", f"{where} (one zero point off, the rest right)", (
        x, _weight(w, zeros=zeros), bias)


def _single_nibble_swaps(out, x, w, bias, bad_cols):
    """Per failing column n, the two nibbles of one packed word of row n (along K) whose swap
    explains it: the residual is (W[n, j] - W[n, i]) (x_i - x_j)."""
    if w.k % 8:
        return None
    ref = reference_matmul(x, w, bias).y
    resid = out.double() - ref
    wd = w.dequantize(torch.float64)
    xd = x.double()
    pairs = [(i, j) for i in range(8) for j in range(i + 1, 8)]
    ii = torch.tensor([i for i, _ in pairs], device=x.device)
    jj = torch.tensor([j for _, j in pairs], device=x.device)
    q = w.q.clone()
    found = []
    for n in bad_cols:
        wr = wd[n].reshape(-1, 8)                                        # [words, 8]
        xw = xd.reshape(x.shape[0], -1, 8)                               # [M, words, 8]
        effect = (wr[:, jj] - wr[:, ii]).unsqueeze(0) * (xw[:, :, ii] - xw[:, :, jj])  # [M, words, 28]
        err = ((resid[:, n].reshape(-1, 1, 1) - effect) ** 2).sum(0)
        best = int(err.argmin())
        word, pair = divmod(best, len(pairs))
        i, j = 8 * word + pairs[pair][0], 8 * word + pairs[pair][1]
        if bool(wr[word, pairs[pair][0]] == wr[word, pairs[pair][1]]):
            return None
        q[n, i], q[n, j] = w.q[n, j], w.q[n, i]
        found.append((n, i, j))
    where = "; ".join(f"k {i} and {j} swapped in row {n}" for n, i, j in found[:4])
    return "swapped_nibbles", f"{where} (two nibbles of one packed word exchanged)", (x, _weight(w, q=q), bias)


def diagnose(out: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None, *,
             dequant_dtype: torch.dtype | None, dequant_roundings: int = 1,
             ref: Reference | None = None) -> Diagnosis:
    """out: the kernel's x.dtype [M, N] output for inputs x [M, K], weight, bias [N] | None."""
    ref = ref or reference_matmul(x, weight, bias)
    bounds_kw = dict(dequant_dtype=dequant_dtype, dequant_roundings=dequant_roundings)
    base = judge(out, ref, **bounds_kw)
    over = element_errors(out, ref) > error_bounds(ref, **bounds_kw).tight
    unwritten = _unwritten(out, over)
    explained: list[tuple[float, str, str]] = []
    closest: tuple[str, float] | None = None
    for name, description, seen in attempts(x, weight, bias):
        v: Verdict = judge(out, reference_matmul(*seen), **bounds_kw)
        if v.passed and not base.passed:
            explained.append((v.worst_ratio, name, description))
        if closest is None or v.worst_ratio < closest[1]:
            closest = (name, v.worst_ratio)
    if not explained and not base.passed and unwritten is None:
        # Rounding every partial sum spreads error over most rows and many columns; one bad value does not.
        spread = bool(over.any(1).float().mean() >= 0.5) and bool(over.any(0).float().mean() >= 0.2)
        if spread and judge(out, ref, accumulate=x.dtype, **bounds_kw).passed:
            explained.append((0.0, "accumulate_16bit", f"the sums were kept in {str(x.dtype).removeprefix('torch.')}, "
                              "not fp32 (within the bound of 16-bit accumulation)"))
        bad_cols = [int(c) for c in over.any(0).nonzero().flatten()[:MAX_SEARCH_COLUMNS]]
        for search in (_single_zero_points, _single_nibble_swaps):
            found = search(out, x, weight, bias, bad_cols) if bad_cols else None
            if found is not None:
                v = judge(out, reference_matmul(*found[2]), **bounds_kw)
                if v.passed:
                    explained.append((v.worst_ratio, found[0], found[1]))
    return Diagnosis([(name, d) for _, name, d in sorted(explained)], unwritten, None if explained else closest)

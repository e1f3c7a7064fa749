"""Exact probes: inputs for which every correct kernel's output is known exactly.

Scales are m * 2^e with m in 8..15 (4 significant bits), so each weight (q - z) * s has at most
8 significant bits and is exact in fp16 and bf16, and so is every product with an activation of
1. A one-hot row at k then gives y = W[:, k] exactly, whatever the accumulation order; a
group-indicator row gives s * sum(q - z) over the group, exact in fp32 (at most 24 bits) and
rounded once; a zero row gives y = bias. A probe mismatch is a bug, never rounding.

A second weight (`fine_scale_probe_weight`, fp16 only) has scales with all 11 significant bits of
fp16 and q, z in {0, 4, 8}, so every intermediate of every correct dequant form ((q - z) * s,
q * s + (-z * s), (q - 8) * s + (8 - z) * s) is exact in fp16 but not in bf16: a kernel that rounds
scales through bf16 fails it. A mismatch pins the output row, the input channel and the
group, and `localize` turns the pattern into words ("row 37, group 5: the zero point acts as z+1").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .canonical import QuantizedWeight, resolve_group_size
from .errors import LayoutError, describe
from .quantize import act_order_g_idx, device_of
from .reference import reference_matmul

# One-hot rows cost an [R, N] output each; above this many output elements the sweep samples K.
FULL_SWEEP_ELEMENTS = 1 << 26


def probe_scales(n: int, groups: int, group_size: int, dtype: torch.dtype,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """[N, groups] scales m * 2^e, m in 8..15, with e low enough that a whole group's sum
    (G * 225 * 2^e) stays below 2^14 and so finite in fp16."""
    e_max = min(-4, math.floor(14 - math.log2(group_size * 225)))
    device = device_of(generator)
    mant = torch.randint(8, 16, (n, groups), generator=generator, device=device).double()
    exp = torch.randint(e_max - 3, e_max + 1, (n, groups), generator=generator, device=device).double()
    return (mant * torch.exp2(exp)).to(dtype)


def _groups(k: int, group_size: int, act_order: bool,
            generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
    """(number of groups, act-order g_idx or None) of a probe weight."""
    g = resolve_group_size(group_size, k)
    if act_order:
        return math.ceil(k / g), act_order_g_idx(k, group_size, generator)
    if k % g:
        raise LayoutError(f"group_size: expected a divisor of K={k} (or -1), got {group_size}")
    return k // g, None


def probe_weight(n: int, k: int, group_size: int, symmetric: bool, scale_dtype: torch.dtype,
                 generator: torch.Generator | None = None, act_order: bool = False) -> QuantizedWeight:
    """Random q and z with 4-significant-bit scales (`probe_scales`); act_order: groups follow a
    random act-order g_idx."""
    groups, g_idx = _groups(k, group_size, act_order, generator)
    device = device_of(generator)
    q = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.uint8, device=device)
    zeros = None if symmetric else torch.randint(0, 16, (n, groups), generator=generator, dtype=torch.uint8,
                                                 device=device)
    scales = probe_scales(n, groups, resolve_group_size(group_size, k), scale_dtype, generator)
    return QuantizedWeight(q, scales, zeros, group_size, g_idx)


# q and z of the fine-scale probe: q, z, q - z, q - 8 and 8 - z are all 0 or a power of two, so each
# of them times s keeps s's significant bits.
FINE_VALUES = (0, 4, 8)


def fine_scale_probe_weight(n: int, k: int, group_size: int, symmetric: bool,
                            generator: torch.Generator | None = None, act_order: bool = False) -> QuantizedWeight:
    """fp16 scales with 11 significant bits (exact in fp16, not in bf16) and q, z in FINE_VALUES, so
    every weight and every intermediate of the common dequant forms is exact in fp16; the group sums
    (at most 8 G |s|) stay finite and exact in fp32."""
    g = resolve_group_size(group_size, k)
    groups, g_idx = _groups(k, group_size, act_order, generator)
    device = device_of(generator)
    values = torch.tensor(FINE_VALUES, dtype=torch.uint8, device=device)
    zeros = torch.full((n, groups), 8, dtype=torch.uint8, device=device) if symmetric else \
        values[torch.randint(0, len(FINE_VALUES), (n, groups), generator=generator, device=device)]
    q = values[torch.randint(0, len(FINE_VALUES), (n, k), generator=generator, device=device)]
    e_max = min(-4, math.floor(14 - math.log2(g * 8 * 2048)))
    mant = torch.randint(1024, 2048, (n, groups), generator=generator, device=device).double()
    exp = torch.randint(e_max - 3, e_max + 1, (n, groups), generator=generator, device=device).double()
    scales = (mant * torch.exp2(exp - 10)).to(torch.float16)
    return QuantizedWeight(q, scales, None if symmetric else zeros, group_size, g_idx)


def one_hot_channels(weight: QuantizedWeight, generator: torch.Generator | None = None,
                     sample: bool = False) -> torch.Tensor:
    """int64 [R] on the weight's device: the input channels to probe. Every channel when the
    [K, N] sweep is affordable (and `sample` is off); otherwise, per group, its first and last
    channel and one aligned run of 8 (every nibble position of one packed word), so every zero
    point and scale is still reached."""
    k, device = weight.k, weight.q.device
    if k * weight.n <= FULL_SWEEP_ELEMENTS and not sample:
        return torch.arange(k, device=device)
    gi = weight.group_index()
    order = torch.argsort(gi, stable=True)                       # each group's channels, contiguous
    counts = torch.bincount(gi, minlength=weight.num_groups)
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    runs = (counts // 8).clamp_min(1)
    pick = (torch.rand(weight.num_groups, generator=generator, device=device_of(generator)).to(device) * runs).long()
    run = (starts + 8 * pick).unsqueeze(1) + torch.arange(8, device=device)
    run = torch.minimum(run, (ends - 1).unsqueeze(1))
    positions = torch.cat([starts, ends - 1, run.flatten()])
    return torch.unique(order[positions])


@dataclass(frozen=True)
class ProbeMismatch:
    """One wrong output element: probe kind ("one-hot", "group", "bias", with "fine-scale " before
    it for the fine-scale weight), its channel k or group g (-1 for the bias row), output row n."""

    kind: str
    index: int
    col: int
    got: float
    expected: float

    def __str__(self) -> str:
        what = {"one-hot": f"one-hot k={self.index}", "group": f"group indicator g={self.index}"}.get(
            self.kind.removeprefix("fine-scale "), "zero row + bias")
        prefix = "fine-scale " if self.kind.startswith("fine-scale ") else ""
        return f"{prefix}{what}, n={self.col}: got {self.got!r} expected {self.expected!r}"


# Mismatches kept per probe run for localization (the count is always exact).
MAX_KEPT = 4096


@dataclass(frozen=True)
class ProbeResult:
    """rows: probe rows run; mismatches: output elements that differ from the exact value;
    examples: the first few; located: what the mismatch pattern pins down, in words."""

    rows: int
    mismatches: int
    examples: list[ProbeMismatch] = field(default_factory=list)
    located: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.mismatches == 0

    def summary(self) -> str:
        head = "PASS" if self.passed else "FAIL"
        text = f"{head}: {self.rows} probe rows, {self.mismatches} mismatching elements"
        if self.located:
            text += "\n  located: " + "\n  located: ".join(self.located)
        if self.examples:
            text += "\n  " + "\n  ".join(str(e) for e in self.examples)
        return text

    def merged(self, other: "ProbeResult", max_examples: int = 8) -> "ProbeResult":
        return ProbeResult(self.rows + other.rows, self.mismatches + other.mismatches,
                           (self.examples + other.examples)[:max_examples], self.located + other.located)


@dataclass(frozen=True)
class ProbeSet:
    """x: activation dtype [R, K]; kind: "one-hot", "group" or "bias"; index: int64 [R], each
    row's channel k (one-hot), group g (group) or -1; bias: [N] or None."""

    x: torch.Tensor
    kind: str
    index: torch.Tensor
    bias: torch.Tensor | None

    @property
    def channels(self) -> torch.Tensor | None:
        return self.index if self.kind == "one-hot" else None

    def expected(self, weight: QuantizedWeight, start: int, stop: int) -> torch.Tensor:
        """The exact outputs of rows start..stop, rounded once to x.dtype. A one-hot row's output
        is the weight's column, read directly rather than through an [R, K] x [K, N] product."""
        if self.channels is None:
            return reference_matmul(self.x[start:stop], weight, self.bias).y_out
        columns = self.channels[start:stop].to(weight.q.device)
        gi = weight.group_index()[columns]
        q = weight.q[:, columns].to(torch.int16)
        z = weight.zeros_or_default().to(torch.int16)[:, gi]
        return ((q - z).double() * weight.scales.double()[:, gi]).t().to(self.x.dtype)


def build_probes(weight: QuantizedWeight, dtype: torch.dtype, bias: torch.Tensor | None = None,
                 generator: torch.Generator | None = None, sample: bool = False) -> list[ProbeSet]:
    """One-hot rows (no bias), group-indicator rows (no bias), and a zero row with the bias."""
    device = weight.q.device
    ks = one_hot_channels(weight, generator, sample)
    one_hot = torch.zeros(ks.numel(), weight.k, dtype=dtype, device=device)
    one_hot[torch.arange(ks.numel()), ks.to(device)] = 1
    gi = weight.group_index()
    groups = torch.arange(weight.num_groups, device=device)
    indicator = (gi.unsqueeze(0) == groups.unsqueeze(1)).to(dtype)
    sets = [ProbeSet(one_hot, "one-hot", ks, None), ProbeSet(indicator, "group", groups.cpu(), None)]
    if bias is not None:
        sets.append(ProbeSet(torch.zeros(1, weight.k, dtype=dtype, device=device), "bias", torch.tensor([-1]), bias))
    return sets


def run_probes(kernel: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor], weight: QuantizedWeight,
               dtype: torch.dtype, bias: torch.Tensor | None = None, max_m: int = 4096,
               generator: torch.Generator | None = None, max_examples: int = 8, sample: bool = False,
               label: str = "") -> ProbeResult:
    """Run every probe through `kernel(x [R, K], bias [N] | None) -> [R, N]`, at most `max_m`
    rows per call, and compare each element with the exact value (-0.0 equals 0.0). sample: probe
    a sample of the channels (`one_hot_channels`) even where the full sweep is affordable; label:
    put before each mismatch's kind ("fine-scale ")."""
    rows = mismatches = 0
    kept: list[ProbeMismatch] = []
    for ps in build_probes(weight, dtype, bias, generator, sample):
        for start in range(0, ps.x.shape[0], max_m):
            x = ps.x[start:start + max_m]
            expected = ps.expected(weight, start, start + x.shape[0])
            got = kernel(x.clone(), None if ps.bias is None else ps.bias.clone())
            if not isinstance(got, torch.Tensor) or got.dtype != expected.dtype or got.shape != expected.shape:
                raise LayoutError(f"kernel output on probes: expected {describe(expected)}, got "
                                  f"{describe(got) if isinstance(got, torch.Tensor) else type(got).__name__}")
            same = (got == expected) | (torch.isnan(got) & torch.isnan(expected))
            rows += x.shape[0]
            mismatches += int((~same).sum())
            for r, c in (~same).nonzero()[: MAX_KEPT - len(kept)].tolist():
                kept.append(ProbeMismatch(label + ps.kind, int(ps.index[start + r]), c, float(got[r, c]),
                                          float(expected[r, c])))
    return ProbeResult(rows, mismatches, kept[:max_examples], localize(kept, weight, dtype))


def _classify(n: int, g: int, ks: list[int], got: dict[int, float], want: dict[int, float],
              weight: QuantizedWeight) -> tuple[str, str]:
    """(kind, words) for the mismatching probed channels `ks` of output row n in group g."""
    if len(ks) == 2 and ks[0] // 8 == ks[1] // 8 and got[ks[0]] == want[ks[1]] and got[ks[1]] == want[ks[0]]:
        return "swap", f"k {ks[0]} and {ks[1]} swapped in row {n} (two nibbles of one packed word)"
    s = float(weight.scales[n, g])
    steps = {round((want[k] - got[k]) / s, 6) for k in ks} if s else set()
    if len(steps) == 1 and (d := steps.pop()) == int(d) and d != 0:
        return "zero", f"row {n}, group {g}: the zero point acts as z{int(d):+d}"
    ratios = {got[k] / want[k] for k in ks if want[k] != 0}
    if len(ratios) == 1 and all((got[k] == 0) == (want[k] == 0) for k in ks):
        # The scale in use is one of the scale dtype's values: rounding recovers it from the ratio.
        used = float(torch.tensor(s * ratios.pop(), dtype=torch.float64).to(weight.scales.dtype))
        if used == float(torch.tensor(s).to(torch.bfloat16)):
            return "bf16", f"row {n}, group {g}: the scale acts as {used!r}, its bfloat16 rounding, instead of {s!r}"
        return "scale", f"row {n}, group {g}: the scale acts as {used!r} instead of {s!r}"
    shown = ", ".join(f"k {k} gave {got[k]!r} for {want[k]!r}" for k in ks[:3])
    return "other", f"row {n}, group {g}: {len(ks)} channel(s) wrong: {shown}"


def ulps(got: float, want: float, dtype: torch.dtype) -> float:
    """|got - want| in units of the last place of `want` in `dtype`."""
    info = torch.finfo(dtype)
    exponent = max(math.frexp(abs(want))[1] - 1, math.frexp(info.tiny)[1] - 1)
    return abs(got - want) / (info.eps * 2.0 ** exponent)


def localize(mismatches: list[ProbeMismatch], weight: QuantizedWeight, dtype: torch.dtype,
             max_lines: int = 8) -> list[str]:
    """The mismatch pattern in words: per output row and group, a zero point off by d (every probed
    channel of the group off by d * s), two channels of one word exchanged, a scale off by a factor
    (and whether that is its rounding to bfloat16), a wrong bias or group sum; otherwise the channels
    at fault. dtype: the probes' activation dtype. When every wrong group is a scale rounded to
    bfloat16, one line says so; so too when every wrong group sum is off by a unit or two in the
    last place of `dtype` while every probed channel is right (a sum rounded to `dtype` twice)."""
    lines: list[str] = []
    cells: dict[tuple[str, int, int], list[ProbeMismatch]] = {}
    one_hot_cols = {m.col for m in mismatches if m.kind.endswith("one-hot")}
    gi = weight.group_index().cpu()
    sums: list[tuple[str, ProbeMismatch]] = []
    for m in mismatches:
        prefix = "fine-scale " if m.kind.startswith("fine-scale ") else ""
        if m.kind.endswith("one-hot"):
            cells.setdefault((prefix, m.col, int(gi[m.index])), []).append(m)
        elif m.kind.endswith("bias"):
            lines.append(f"{prefix}row {m.col}: the bias came out as {m.got!r} instead of {m.expected!r}")
        elif m.col not in one_hot_cols:
            sums.append((prefix, m))
    off = [ulps(m.got, m.expected, dtype) for _, m in sums]
    if sums and not cells and max(off) <= 2:
        name = str(dtype).removeprefix("torch.")
        prefix, m = sums[0]
        lo, hi = f"{min(off):.0f}", f"{max(off):.0f}"
        lines.insert(0, f"{len(sums)} group sum(s) off by {lo if lo == hi else f'{lo}-{hi}'} unit(s) in the last place of "
                        f"{name} though every probed channel alone is right: partial sums were rounded to {name} "
                        f"before the last add (16-bit accumulation, or split partials added in {name}); e.g. "
                        f"{prefix}row {m.col}, group {m.index}: got {m.got!r} for {m.expected!r}")
    else:
        lines += [f"{prefix}row {m.col}, group {m.index}: the group's sum is wrong though every probed channel "
                  "alone is right (a reduction or the scale of a sum)" for prefix, m in sums]
    found = []
    for (prefix, n, g), items in cells.items():
        ks = sorted(m.index for m in items)
        kind, text = _classify(n, g, ks, {m.index: m.got for m in items}, {m.index: m.expected for m in items},
                               weight)
        found.append((kind, prefix + text))
    if found and all(kind == "bf16" for kind, _ in found):
        rows = sorted({n for _, n, _ in cells})
        lines.insert(0, f"scales act as their bfloat16 rounding in {len(found)} group(s) of {len(rows)} row(s), "
                        f"e.g. {found[0][1]}")
    else:
        lines += [text for _, text in found]
    return lines[:max_lines]

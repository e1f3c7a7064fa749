"""Exact probes: inputs for which every correct kernel's output is known exactly.

Scales are m * 2^e with m in 8..15 (4 significant bits), so each weight (q - z) * s has at most
8 significant bits and is exact in fp16 and bf16, and so is every product with an activation of
1. A one-hot row at k then gives y = W[:, k] exactly, whatever the accumulation order; a
group-indicator row gives s * sum(q - z) over the group, exact in fp32 (at most 24 bits) and
rounded once; a zero row gives y = bias. A probe mismatch is a bug, never rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .canonical import QuantizedWeight, resolve_group_size
from .errors import LayoutError, describe
from .reference import reference_matmul

# One-hot rows cost an [R, N] output each; above this many output elements the sweep samples K.
FULL_SWEEP_ELEMENTS = 1 << 26


def probe_scales(n: int, groups: int, group_size: int, dtype: torch.dtype,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """[N, groups] scales m * 2^e, m in 8..15, with e low enough that a whole group's sum
    (G * 225 * 2^e) stays below 2^14 and so finite in fp16."""
    e_max = min(-4, math.floor(14 - math.log2(group_size * 225)))
    mant = torch.randint(8, 16, (n, groups), generator=generator).double()
    exp = torch.randint(e_max - 3, e_max + 1, (n, groups), generator=generator).double()
    return (mant * torch.exp2(exp)).to(dtype)


def probe_weight(n: int, k: int, group_size: int, symmetric: bool, scale_dtype: torch.dtype,
                 generator: torch.Generator | None = None) -> QuantizedWeight:
    g = resolve_group_size(group_size, k)
    if k % g:
        raise LayoutError(f"group_size: expected a divisor of K={k} (or -1), got {group_size}")
    q = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.uint8)
    zeros = None if symmetric else torch.randint(0, 16, (n, k // g), generator=generator, dtype=torch.uint8)
    return QuantizedWeight(q, probe_scales(n, k // g, g, scale_dtype, generator), zeros, group_size)


def one_hot_channels(weight: QuantizedWeight, generator: torch.Generator | None = None) -> torch.Tensor:
    """int64 [R]: the input channels to probe. Every channel when the [K, N] sweep is affordable;
    otherwise, per group, its first and last channel and one aligned run of 8 (every nibble
    position of one packed word), so every zero point and scale is still reached."""
    k = weight.k
    if k * weight.n <= FULL_SWEEP_ELEMENTS:
        return torch.arange(k)
    gi = weight.group_index().cpu()
    picks = []
    for g in range(weight.num_groups):
        members = (gi == g).nonzero().flatten()
        start = int(torch.randint(0, max(1, members.numel() // 8), (1,), generator=generator)) * 8
        picks += [members[:1], members[-1:], members[start:start + 8]]
    return torch.unique(torch.cat(picks))


@dataclass(frozen=True)
class ProbeMismatch:
    probe: str
    col: int
    got: float
    expected: float

    def __str__(self) -> str:
        return f"{self.probe}, n={self.col}: got {self.got!r} expected {self.expected!r}"


@dataclass(frozen=True)
class ProbeResult:
    """rows: probe rows run; mismatches: output elements that differ from the exact value."""

    rows: int
    mismatches: int
    examples: list[ProbeMismatch] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.mismatches == 0

    def summary(self) -> str:
        head = "PASS" if self.passed else "FAIL"
        text = f"{head}: {self.rows} probe rows, {self.mismatches} mismatching elements"
        if self.examples:
            text += "\n  " + "\n  ".join(str(e) for e in self.examples)
        return text


@dataclass(frozen=True)
class ProbeSet:
    """x: activation dtype [R, K]; labels: one description per row; bias: [N] or None;
    channels: int64 [R] for one-hot rows (row r is 1 at channel channels[r]), else None."""

    x: torch.Tensor
    labels: list[str]
    bias: torch.Tensor | None
    channels: torch.Tensor | None = None

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
                 generator: torch.Generator | None = None) -> list[ProbeSet]:
    """One-hot rows (no bias), group-indicator rows (no bias), and a zero row with the bias."""
    device = weight.q.device
    ks = one_hot_channels(weight, generator)
    one_hot = torch.zeros(ks.numel(), weight.k, dtype=dtype, device=device)
    one_hot[torch.arange(ks.numel()), ks.to(device)] = 1
    gi = weight.group_index()
    groups = torch.arange(weight.num_groups, device=device)
    indicator = (gi.unsqueeze(0) == groups.unsqueeze(1)).to(dtype)
    sets = [
        ProbeSet(one_hot, [f"one-hot k={k}" for k in ks.tolist()], None, ks),
        ProbeSet(indicator, [f"group indicator g={g}" for g in range(weight.num_groups)], None),
    ]
    if bias is not None:
        sets.append(ProbeSet(torch.zeros(1, weight.k, dtype=dtype, device=device), ["zero row + bias"], bias))
    return sets


def run_probes(kernel: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor], weight: QuantizedWeight,
               dtype: torch.dtype, bias: torch.Tensor | None = None, max_m: int = 4096,
               generator: torch.Generator | None = None, max_examples: int = 8) -> ProbeResult:
    """Run every probe through `kernel(x [R, K], bias [N] | None) -> [R, N]`, at most `max_m`
    rows per call, and compare each element with the exact value (-0.0 equals 0.0)."""
    rows = mismatches = 0
    examples: list[ProbeMismatch] = []
    for ps in build_probes(weight, dtype, bias, generator):
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
            for r, c in (~same).nonzero()[: max_examples - len(examples)].tolist():
                examples.append(ProbeMismatch(ps.labels[start + r], c, float(got[r, c]), float(expected[r, c])))
    return ProbeResult(rows, mismatches, examples)

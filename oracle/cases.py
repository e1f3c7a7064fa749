"""The parity matrix: one generator that crosses shapes, batch sizes, dtypes, symmetry and group
sizes, drops invalid combinations, and gives every case a readable id."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .canonical import QuantizedWeight, resolve_group_size
from .errors import LayoutError
from .quantize import WEIGHT_KINDS, random_quantized
from .shapes import BOUNDARY_SHAPES, DECODE_BATCHES, PREFILL_BATCHES, LinearShape, unique_shapes
from .tiers import TIERS

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}

# Small shapes that the Triton interpreter and a 2-core CPU get through in seconds, chosen to hit
# edges: N = 8 (one packed zero-point word), N not a multiple of any tile, K = G, and K spanning
# many groups.
CPU_SHAPES = [
    LinearShape("small", "n8", 256, 8),
    LinearShape("small", "odd_n", 512, 200),
    LinearShape("small", "k_eq_g", 128, 72),
    LinearShape("small", "many_groups", 1024, 96),
]
CPU_BATCHES = (1, 3, 16, 17, 33, 129)
QUICK_BATCHES = (1, 4, 16, 33, 256)


@dataclass(frozen=True)
class Case:
    shape: LinearShape
    m: int
    dtype: torch.dtype
    symmetric: bool
    group_size: int
    bias: bool

    @property
    def k(self) -> int:
        return self.shape.k

    @property
    def n(self) -> int:
        return self.shape.n

    @property
    def id(self) -> str:
        g = "Gk" if self.group_size == -1 else f"G{self.group_size}"
        parts = [self.shape.id, g, f"M{self.m}", DTYPE_NAMES[self.dtype], "sym" if self.symmetric else "asym"]
        return "-".join(parts + (["bias"] if self.bias else []))

    def valid(self) -> bool:
        """Combinations no layout can express: G not dividing K, packed zero points with N % 8."""
        group = resolve_group_size(self.group_size, self.k)
        return self.k % group == 0 and self.k % 8 == 0 and (self.symmetric or self.n % 8 == 0)


@dataclass(frozen=True)
class CaseInputs:
    """x: case dtype [M, K]; weight: canonical, scales in the case dtype; bias: [N] or None."""

    x: torch.Tensor
    weight: QuantizedWeight
    bias: torch.Tensor | None


def parity_cases(tier: str = "cpu", keep: Callable[[Case], bool] | None = None,
                 batches: Iterable[int] | None = None) -> list[Case]:
    """cpu:   small shapes x G {32, 64, 128, -1} x a few M on both sides of decode/prefill.
    quick: every real shape at G = 128 and a handful of M.
    full:  every real shape x every decode and prefill batch, plus group-size variants on the
           boundary shapes.
    Every tier crosses fp16/bf16 and sym/asym; bias is on for odd M in the cpu tier and for
    asymmetric cases elsewhere, so both paths are seen without doubling the matrix. `keep` filters cases a kernel cannot run (its M range, say)."""
    if tier not in TIERS:
        raise LayoutError(f"tier: expected one of {TIERS}, got {tier!r}")
    if tier == "cpu":
        grid = [(s, g) for s in CPU_SHAPES for g in (32, 64, 128, -1)]
        ms = CPU_BATCHES
    elif tier == "quick":
        grid = [(s, 128) for s in unique_shapes()]
        ms = QUICK_BATCHES
    else:
        grid = [(s, 128) for s in unique_shapes()] + [(s, g) for s in BOUNDARY_SHAPES for g in (32, 64, -1)]
        ms = DECODE_BATCHES + PREFILL_BATCHES
    if batches is not None:
        ms = tuple(batches)
    cases = []
    # M innermost: consecutive cases share a weight (make_inputs reuses it).
    for shape, g in grid:
        for dtype in DTYPE_NAMES:
            for symmetric in (False, True):
                for m in ms:
                    bias = m % 2 == 1 if tier == "cpu" else not symmetric
                    case = Case(shape, m, dtype, symmetric, g, bias)
                    if case.valid() and (keep is None or keep(case)):
                        cases.append(case)
    return cases


# The last weight make_inputs built, with the generator state after it: a parity run walks the
# batch sizes of one weight in a row (see parity_cases), and the full tier's largest weights take
# seconds to quantize on the CPU. Key: (n, k, group_size, symmetric, dtype, kind, seed, device).
_last_weight: dict[tuple, tuple[QuantizedWeight, torch.Tensor]] = {}


def make_inputs(case: Case, seed: int = 0, device: torch.device | str = "cpu") -> CaseInputs:
    """Realistic data: a quantized Gaussian, heavy-tailed or outlier-channel weight (by seed),
    unit-variance activations, small bias. The same (case, seed) always gives the same tensors;
    callers must not modify the weight (the next case of that weight shares it)."""
    kind = WEIGHT_KINDS[seed % len(WEIGHT_KINDS)]
    device = torch.device(device)
    key = (case.n, case.k, case.group_size, case.symmetric, case.dtype, kind, seed, str(device))
    if key not in _last_weight:
        g = torch.Generator().manual_seed(seed)
        w = random_quantized(case.n, case.k, case.group_size, case.symmetric, case.dtype, kind, g)
        _last_weight.clear()
        _last_weight[key] = (w.to(device), g.get_state())
    w, state = _last_weight[key]
    g = torch.Generator()
    g.set_state(state)
    x = torch.randn(case.m, case.k, generator=g).to(case.dtype)
    bias = (0.1 * torch.randn(case.n, generator=g)).to(case.dtype) if case.bias else None
    return CaseInputs(x.to(device), w, None if bias is None else bias.to(device))

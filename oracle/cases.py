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
# edges: N = 8 (one packed zero-point word), N not a multiple of any tile, K = G with N % 128 == 64
# (64-wide remainders of 128-wide tiles), and more groups than the group size (K = 1280 at G = 32:
# 40 groups; scale reads past the end show there).
CPU_SHAPES = [
    LinearShape("small", "n8", 256, 8),
    LinearShape("small", "odd_n", 512, 200),
    LinearShape("small", "k_eq_g", 128, 192),
    LinearShape("small", "many_groups", 1280, 96),
]
# Act-order weights (GPTQ desc_act), for kernels that declare them: whole groups, and a partial
# last group (K = 200 at G = 64: the last group holds 8 channels).
CPU_ACT_ORDER = [(LinearShape("small", "act_order", 256, 64), 64), (LinearShape("small", "act_order_tail", 200, 64), 64)]
ACT_ORDER = [(LinearShape("boundary", "act_order", 4096, 1024), 128),
             (LinearShape("boundary", "act_order_tail", 4160, 1024), 128)]
ACT_ORDER_BATCHES = (1, 17)
CPU_BATCHES = (1, 3, 16, 17, 33, 129)
QUICK_BATCHES = (1, 4, 16, 33, 256)


@dataclass(frozen=True)
class Case:
    """One parity case: x [m, shape.k] in `dtype` against a weight [shape.n, shape.k] quantized
    with `group_size` (-1: one group), symmetric or not, with a bias or not, and with an act-order
    g_idx (groups of shuffled channels) when act_order.

    Build your own with `oracle.case(k=..., n=..., m=...)`; `check_kernel` rejects an invalid one.
    """

    shape: LinearShape
    m: int
    dtype: torch.dtype
    symmetric: bool
    group_size: int
    bias: bool
    act_order: bool = False

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
        return "-".join(parts + (["bias"] if self.bias else []) + (["actorder"] if self.act_order else []))

    def problem(self) -> str | None:
        """Why no layout can express this case, or None: G not dividing K (act-order aside), K not
        a multiple of 8, packed zero points with N % 8, or a field of the wrong kind."""
        if not isinstance(self.shape, LinearShape):
            return f"shape: expected an oracle.LinearShape, got {type(self.shape).__name__}"
        if type(self.m) is not int or self.m < 1 or type(self.k) is not int or self.k < 8 or \
                type(self.n) is not int or self.n < 1:
            return f"sizes: expected integers M >= 1, K >= 8, N >= 1, got M={self.m!r}, K={self.k!r}, N={self.n!r}"
        if self.dtype not in DTYPE_NAMES:
            return f"dtype: expected torch.float16 or torch.bfloat16, got {self.dtype!r}"
        if type(self.group_size) is not int or not (self.group_size == -1 or self.group_size > 0):
            return f"group_size: expected -1 or a positive int, got {self.group_size!r}"
        if self.k % 8:
            return f"K: expected a multiple of 8 (packed int32 words), got {self.k}"
        if not self.symmetric and self.n % 8:
            return f"N: expected a multiple of 8 with zero points (packed 8 to a word), got {self.n}"
        if self.act_order and self.group_size == -1:
            return "act_order: expected a group size, got -1 (one group has no order)"
        if not self.act_order and self.k % resolve_group_size(self.group_size, self.k):
            return f"group_size: expected a divisor of K={self.k} (or act_order), got {self.group_size}"
        return None

    def valid(self) -> bool:
        return self.problem() is None


def case(k: int, n: int, m: int, *, dtype: torch.dtype = torch.float16, symmetric: bool = False,
         group_size: int = 128, bias: bool = False, act_order: bool = False, name: str = "custom") -> Case:
    """A case of your own: x [m, k] against a weight [n, k]; raises LayoutError naming what is
    wrong with it."""
    c = Case(LinearShape("custom", name, k, n, group_size), m, dtype, symmetric, group_size, bias, act_order)
    problem = c.problem()
    if problem is not None:
        raise LayoutError(f"case {c.id}: {problem}")
    return c


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
    asymmetric cases elsewhere, so both paths are seen without doubling the matrix. Each tier ends
    with act-order cases, which only kernels declaring act_order receive. `keep` filters cases a
    kernel cannot run (its M range, say)."""
    if tier not in TIERS:
        raise LayoutError(f"tier: expected one of {TIERS}, got {tier!r}")
    if tier == "cpu":
        grid = [(s, g, False) for s in CPU_SHAPES for g in (32, 64, 128, -1)]
        grid += [(s, g, True) for s, g in CPU_ACT_ORDER]
        ms = CPU_BATCHES
    elif tier == "quick":
        grid = [(s, 128, False) for s in unique_shapes()] + [(s, g, True) for s, g in ACT_ORDER]
        ms = QUICK_BATCHES
    else:
        grid = [(s, 128, False) for s in unique_shapes()] + \
            [(s, g, False) for s in BOUNDARY_SHAPES for g in (32, 64, -1)] + [(s, g, True) for s, g in ACT_ORDER]
        ms = DECODE_BATCHES + PREFILL_BATCHES
    if batches is not None:
        ms = tuple(batches)
    cases = []
    # M innermost: consecutive cases share a weight (make_inputs reuses it).
    for shape, g, act_order in grid:
        for dtype in DTYPE_NAMES:
            for symmetric in (False, True):
                for m in (ms if not act_order or batches is not None else ACT_ORDER_BATCHES):
                    bias = m % 2 == 1 if tier == "cpu" else not symmetric
                    c = Case(shape, m, dtype, symmetric, g, bias, act_order)
                    if c.valid() and (keep is None or keep(c)):
                        cases.append(c)
    return cases


# The last weight make_inputs built, with the generator state after it: a parity run walks the
# batch sizes of one weight in a row (see parity_cases), and the full tier's largest weights take
# seconds to quantize on the CPU. Key: (n, k, group_size, symmetric, dtype, kind, seed, device).
_last_weight: dict[tuple, tuple[QuantizedWeight, torch.Tensor]] = {}


def make_inputs(case: Case, seed: int = 0, device: torch.device | str = "cpu") -> CaseInputs:
    """Realistic data: a quantized Gaussian, heavy-tailed or outlier-channel weight (by seed),
    unit-variance activations, small bias, all drawn by a generator on `device` and built there
    (quantizing a 70B-sized weight on a CPU takes many seconds, on a GPU milliseconds). The same
    (case, seed, device) always gives the same tensors; another device draws other (equally
    distributed) values. Callers must not modify the weight (the next case of that weight shares it)."""
    kind = WEIGHT_KINDS[seed % len(WEIGHT_KINDS)]
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (case.n, case.k, case.group_size, case.symmetric, case.dtype, case.act_order, kind, seed, str(device))
    # Generators exist on the CPU and GPUs; inputs for another device are drawn on the CPU and moved.
    draw = device if device.type in ("cpu", "cuda") else torch.device("cpu")
    if key not in _last_weight:
        g = torch.Generator(device=draw).manual_seed(seed)
        w = random_quantized(case.n, case.k, case.group_size, case.symmetric, case.dtype, kind, g, case.act_order)
        _last_weight.clear()
        _last_weight[key] = (w.to(device), g.get_state())
    w, state = _last_weight[key]
    g = torch.Generator(device=draw)
    g.set_state(state)
    x = torch.randn(case.m, case.k, generator=g, device=draw).to(case.dtype).to(device)
    bias = (0.1 * torch.randn(case.n, generator=g, device=draw)).to(case.dtype).to(device) if case.bias else None
    return CaseInputs(x, w, bias)

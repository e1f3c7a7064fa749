"""Property-based fuzzing: random problems at the kernels' tile boundaries, judged by the oracle.

Every problem is drawn at a place where a kernel changes behaviour, and one either side: M at the
edges of the tile table's M buckets and of its M-tiles; N at one and two N-tiles (and, on a GPU,
at the N-tile count where split-K stops adding programs) +-1 and +-8; K at one to three K-tiles
+- one quant group (channelwise: +- one packed word, which drives the Triton kernel onto 8-wide
GEMV tiles). Layouts (symmetric, asymmetric), fp16/bf16, G in {32, 64, 128, -1}, the oracle's
weight kinds, bias and strided rows of x are drawn with them. Random data is judged by the error
model (tight verdict and hard bound); a second property runs the exact probes with M rows per call,
so they go through the same M bucket.

Where:  on CPU (CI) the Triton kernel runs under its interpreter with the interpreter's tile table
        and shapes it gets through in about a second; with a GPU the same properties run with the
        device's table and larger shapes, and the skinny kernel (every engine and kernel) joins.
How long: W4A16_FUZZ=ci (default: derandomized, a few examples per property, about a minute on
        2 cores) or W4A16_FUZZ=long (random, hundreds of examples: the H200 run);
        W4A16_FUZZ_EXAMPLES=N overrides every property's example count.

The last test proves the kernel property can fail: it finds each planted bug of
fixtures/variants.py.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fixtures.specs import as_spec
from fixtures.variants import BUGGY
from optimized import skinny, specs
from optimized.policy import INTERPRETER, policy_for
from optimized.tile_configs import TileTable, select_config
from optimized.triton_w4a16 import GROUP_M, device_name
from oracle import judge, plain_torch_matmul, probe_weight, random_quantized, reference_matmul, run_probes
from oracle.diagnose import diagnose
from oracle.kernel_spec import KernelSpec
from oracle.quantize import WEIGHT_KINDS

# ----------------------------------------------------------------------------------------------
# profiles and device

settings.register_profile("w4a16-fuzz-ci", deadline=None, derandomize=True, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("w4a16-fuzz-long", deadline=None, derandomize=False, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("W4A16_FUZZ", "ci")
if PROFILE not in ("ci", "long"):
    raise ValueError(f"W4A16_FUZZ must be 'ci' or 'long', got {PROFILE!r}")
EXAMPLES_OVERRIDE = os.environ.get("W4A16_FUZZ_EXAMPLES")


def fuzz_settings(ci: int, long: int, **overrides) -> settings:
    """The profile's settings with this property's example count (ci or long, or the override).
    Applied per test, never loaded globally, so other hypothesis tests keep their own settings."""
    examples = int(EXAMPLES_OVERRIDE) if EXAMPLES_OVERRIDE else (ci if PROFILE == "ci" else long)
    return settings(settings.get_profile(f"w4a16-fuzz-{PROFILE}"), max_examples=examples, **overrides)


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="the skinny kernel runs on CUDA/ROCm devices only")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

# What one example may cost. Under the interpreter: (program, K-tile) steps, about 10-20 ms each
# on one core, per kernel call. On a GPU the CPU-side quantization of the N x K weight dominates,
# and the exact probes make one call per M probe rows.
INTERPRETER_STEPS = 48
GPU_WEIGHT_ELEMENTS = 1 << 23
GPU_PROBE_CALLS = 1024

# csrc/skinny_plan.h: output rows of a batch or ring block at K-split 1 (kTileRows; split 2/4/8 gives
# 64/32/16), k per iteration (kIterK), and the ring kernel's register ring entries (kRingStages).
SKINNY_TILE_ROWS = 128
SKINNY_ITER_K = 128
SKINNY_RING_STAGES = 4


# ----------------------------------------------------------------------------------------------
# where the kernels change behaviour


def probe_rows(k: int, group: int) -> int:
    """Rows run_probes sends for a small weight: a one-hot per channel, a group indicator per
    group, and a zero row with the bias."""
    return k + k // group + 1


def interpreter_steps(m: int, n: int, k: int, group: int) -> int:
    cfg = select_config(m, n, k, group, policy_for(INTERPRETER).triton)
    return math.ceil(m / cfg.block_m) * math.ceil(n / cfg.block_n) * (k // cfg.block_k)


@dataclass(frozen=True)
class Boundaries:
    """The M, N and K values (edges and one either side) one kernel is fuzzed at.
    k_tiles: K extents whose multiples are edges (K-tiles, iterations); interpreted: cost examples
    by interpreter steps rather than by GPU budgets."""

    name: str
    group_sizes: tuple[int, ...]
    m_values: tuple[int, ...]
    n_values: tuple[int, ...]
    k_tiles: tuple[int, ...]
    interpreted: bool

    def k_values(self, group_size: int) -> list[int]:
        """One to three K-tiles (or groups) and one group either side; channelwise (G = K), one
        packed word either side, down to K = 8."""
        step = 8 if group_size == -1 else group_size
        bases = {j * t for t in self.k_tiles for j in (1, 2, 3)}
        bases |= {8} if group_size == -1 else {group_size, 2 * group_size}
        return sorted({b + d for b in bases for d in (-step, 0, step) if b + d > 0 and (b + d) % step == 0})

    def affordable(self, m: int, n: int, k: int, group: int, probes: bool) -> bool:
        calls = math.ceil(probe_rows(k, group) / m) if probes else 1
        if self.interpreted:
            return calls * interpreter_steps(m, n, k, group) <= INTERPRETER_STEPS
        return n * k <= GPU_WEIGHT_ELEMENTS and calls <= GPU_PROBE_CALLS

    @functools.cache
    def cases(self, group_size: int, symmetric: bool, probes: bool) -> tuple[tuple[int, int, int], ...]:
        """Every affordable (K, N, M), small first (hypothesis shrinks towards the front).
        Asymmetric weights need N % 8 == 0 (zero points are packed 8 rows a word)."""
        out = []
        for k in self.k_values(group_size):
            group = k if group_size == -1 else group_size
            for n in self.n_values:
                if not symmetric and n % 8:
                    continue
                out += [(k, n, m) for m in self.m_values if self.affordable(m, n, k, group, probes)]
        return tuple(sorted(out, key=lambda c: c[0] * c[1] * c[2]))


def triton_boundaries(table: TileTable, m_limit: int, n_limit: int, interpreted: bool) -> Boundaries:
    """From the tile table: each M bucket's first two and last two M, and the M where its tiles
    (block_m, two of them, a band of GROUP_M) fill up; N at one and two block_n, and around the
    N-tile count at which split-K no longer adds programs (table.target_programs / split_k);
    K at multiples of every block_k."""
    ms, ns, k_tiles = {1}, {1, 8}, set()
    lo = 1
    for max_m, cfg in table.buckets:
        hi = m_limit if max_m is None else max_m
        ms |= {lo, lo + 1, hi - 1, hi}
        ms |= {t + d for t in (cfg.block_m, 2 * cfg.block_m, GROUP_M * cfg.block_m) for d in (0, 1)
               if lo <= t + d <= hi}
        tiles = {1, 2}
        if cfg.split_k > 1:
            full = math.ceil(table.target_programs / cfg.split_k)
            tiles |= {full - 1, full, full + 1}
        ns |= {j * cfg.block_n + d for j in tiles for d in (-8, -1, 0, 1, 8)}
        k_tiles.add(cfg.block_k)
        lo = hi + 1
    return Boundaries(f"triton-{table.name}", (32, 64, 128, -1), tuple(sorted(m for m in ms if 1 <= m <= m_limit)),
                      tuple(sorted(n for n in ns if 1 <= n <= n_limit)), tuple(sorted(k_tiles)), interpreted)


def skinny_boundaries() -> Boundaries:
    """Every M up to MAX_M (the plan's kernel switches, M-tiles of 1/2/4/8/16 rows); N at
    multiples of the smallest and largest block row count +-1 and +-8; K at multiples of one
    iteration and of the ring kernel's ring."""
    ns = {1, 8} | {j * r + d for r in (SKINNY_TILE_ROWS // 8, SKINNY_TILE_ROWS) for j in (1, 2, 3)
                   for d in (-8, -1, 0, 1, 8)}
    return Boundaries("skinny", skinny.GROUP_SIZES, tuple(range(1, skinny.MAX_M + 1)), tuple(sorted(ns)),
                      (SKINNY_ITER_K, SKINNY_ITER_K * SKINNY_RING_STAGES), interpreted=False)


# The interpreter's table on CPU (shapes up to about 3 K-tiles); the device's table on a GPU, up to
# past the last bucket's band of GROUP_M M-tiles.
CPU_TRITON = triton_boundaries(policy_for(INTERPRETER).triton, m_limit=129, n_limit=400, interpreted=True)
TRITON = CPU_TRITON if not ON_GPU else triton_boundaries(policy_for(device_name(DEVICE)).triton, m_limit=2112,
                                                         n_limit=20000, interpreted=False)
SKINNY = skinny_boundaries()


# ----------------------------------------------------------------------------------------------
# problems


@dataclass(frozen=True, repr=False)
class Problem:
    m: int
    n: int
    k: int
    group_size: int
    dtype: torch.dtype
    symmetric: bool
    bias: bool
    kind: str      # oracle.quantize.WEIGHT_KINDS
    row_pad: int   # x rows are k + row_pad elements apart (3: rows not 16-byte aligned)
    seed: int

    def __repr__(self) -> str:
        dname = next(name for name, dt in DTYPES.items() if dt == self.dtype)
        g = "Gk" if self.group_size == -1 else f"G{self.group_size}"
        return (f"M{self.m}xN{self.n}xK{self.k}-{g}-{dname}-{'sym' if self.symmetric else 'asym'}"
                f"{'-bias' if self.bias else ''}-{self.kind}-pad{self.row_pad}-seed{self.seed}")


@st.composite
def problems(draw, bounds: Boundaries, probes: bool = False) -> Problem:
    group_size = draw(st.sampled_from(bounds.group_sizes))
    symmetric = draw(st.booleans())
    k, n, m = draw(st.sampled_from(bounds.cases(group_size, symmetric, probes)))
    return Problem(m, n, k, group_size, draw(st.sampled_from(list(DTYPES.values()))), symmetric, draw(st.booleans()),
                   draw(st.sampled_from(WEIGHT_KINDS)), draw(st.sampled_from((0, 3, 64))),
                   draw(st.integers(0, 2**16)))


def make_inputs(p: Problem, device: torch.device):
    """Canonical weight (scales in the activation dtype), x [M, K] with rows k + row_pad apart
    (sliced on the device: moving a strided view would make it contiguous), bias or None."""
    g = torch.Generator().manual_seed(p.seed)
    w = random_quantized(p.n, p.k, p.group_size, p.symmetric, p.dtype, p.kind, g)
    x = torch.randn(p.m, p.k + p.row_pad, generator=g).to(p.dtype).to(device)[:, :p.k]
    bias = (0.1 * torch.randn(p.n, generator=g)).to(p.dtype).to(device) if p.bias else None
    return x, w.to(device), bias


def random_data_failure(spec: KernelSpec, p: Problem, device: torch.device = DEVICE) -> str | None:
    """None when the kernel's output on random data is within the error model's tight and hard
    bounds; else the verdict and the oracle's diagnosis."""
    x, w, bias = make_inputs(p, device)
    weight, scales, zeros = spec.prepare(w, p.dtype)
    out = spec.fn(x, weight, scales, zeros, p.group_size, bias)
    ref = reference_matmul(x, w, bias)
    bounds = dict(dequant_dtype=spec.dequant(p.dtype), dequant_roundings=spec.dequant_roundings or 1)
    v = judge(out, ref, baseline=plain_torch_matmul(x, w, bias), **bounds)
    if v.passed and v.hard_violations == 0:
        return None
    try:
        why = diagnose(out, x, w, bias, ref=ref, **bounds).summary()
    except Exception as e:  # the explanation is extra: its own failure must not hide the verdict
        why = f"diagnosis failed: {type(e).__name__}: {e}"
    return f"{spec.name} {p!r}: {v.summary()}\n  diagnosis: {why}"


def probe_failure(spec: KernelSpec, p: Problem, device: torch.device = DEVICE) -> str | None:
    """None when every exact probe matches, M probe rows per call; else the mismatches."""
    g = torch.Generator().manual_seed(p.seed)
    pw = probe_weight(p.n, p.k, p.group_size, p.symmetric, p.dtype, g).to(device)
    weight, scales, zeros = spec.prepare(pw, p.dtype)
    bias = (0.5 * torch.randn(p.n, generator=g)).to(p.dtype).to(device) if p.bias else None
    r = run_probes(lambda x, b: spec.fn(x, weight, scales, zeros, p.group_size, b), pw, p.dtype, bias,
                   max_m=p.m, generator=g)
    return None if r.passed else f"{spec.name} {p!r}: {r.summary()}"


def skinny_spec(engine: str, kernel: str) -> KernelSpec:
    def fn(x, weight, scales, zeros, group_size, bias):
        return skinny.skinny_matmul(x, weight, scales, zeros, group_size, bias, engine=engine, kernel=kernel)

    return KernelSpec(name=f"skinny-{engine}-{kernel}", fn=fn, group_sizes=skinny.GROUP_SIZES, max_m=skinny.MAX_M)


SKINNY_SPECS = [skinny_spec(e, k) for e in skinny.ENGINES for k in ("auto", *skinny.KERNELS)]
skinny_specs = st.sampled_from(SKINNY_SPECS)


# ----------------------------------------------------------------------------------------------
# the kernels


@fuzz_settings(ci=32, long=200)
@given(problems(TRITON))
def test_triton_matches_oracle(problem):
    failure = random_data_failure(specs.triton, problem)
    assert failure is None, failure


@fuzz_settings(ci=8, long=40)
@given(problems(TRITON, probes=True))
def test_triton_exact_probes(problem):
    failure = probe_failure(specs.triton, problem)
    assert failure is None, failure


@needs_gpu
@fuzz_settings(ci=30, long=300)
@given(problems(SKINNY), skinny_specs)
def test_skinny_matches_oracle(problem, spec):
    failure = random_data_failure(spec, problem)
    assert failure is None, failure


@needs_gpu
@fuzz_settings(ci=8, long=60)
@given(problems(SKINNY, probes=True), skinny_specs)
def test_skinny_exact_probes(problem, spec):
    failure = probe_failure(spec, problem)
    assert failure is None, failure


# ----------------------------------------------------------------------------------------------
# the property can fail


# The planted bugs that random data shows at these K (accumulate_16bit needs K in the thousands).
SEEN_AT_SMALL_K = ("zero_point_off_by_one", "swapped_nibble_pair", "bias_dropped", "last_columns_unwritten")


@pytest.mark.parametrize("variant", [v for v in BUGGY if v.name in SEEN_AT_SMALL_K], ids=lambda v: v.name)
def test_property_finds_a_planted_bug(variant):
    """The random-data property of test_triton_matches_oracle, over the interpreter's boundaries,
    against a fixture kernel with one planted bug: hypothesis must find a failing problem."""
    spec = as_spec(variant)

    # Always the derandomized profile and the same count: this test checks the checker, not the kernel.
    @settings(settings.get_profile("w4a16-fuzz-ci"), max_examples=40, phases=[Phase.generate],
              report_multiple_bugs=False)
    @given(problems(CPU_TRITON))
    def property_on_buggy_kernel(problem):
        failure = random_data_failure(spec, problem, torch.device("cpu"))
        assert failure is None, failure

    with pytest.raises(AssertionError, match=variant.name):
        property_on_buggy_kernel()

"""Reliability of the Triton kernel and the hybrid op on the GPU in hand.

* Offsets past int32: shapes whose N*K, M*K or M*N exceed 2^32 elements, so both 2^31 (where
  int32 element offsets overflow) and 2^32 (where int32 byte offsets of the packed weight
  overflow) lie inside. The output is NaN-poisoned first (a freed buffer of the same size, which
  the caching allocator hands back), every element must be finite, and the rows and columns where
  a flat offset crosses a limit (and the first, last and a few random ones) are judged by the
  oracle against the fp64 reference of those rows and columns only. The same code also runs at a
  stand-in limit of 2^11 on tiny shapes, so that it is exercised on CPU (Triton's interpreter).
* Determinism: repeated calls on fresh copies of x give the same bits; permuting the rows of x
  permutes the output rows bit for bit; the Triton kernel keeps row i's bits for every M of one
  bucket of the device's own tile table (optimized/policies/).
* The hybrid op on the device: torch.library.opcheck for each implementation, a fullgraph
  torch.compile equal to eager, and its routing per M: the implementation `choose` names is the
  one the device's policy thresholds call for, and the op's output is that implementation's.
* `-m sanitize`: every Triton path, and the transient path, once per dtype and symmetry on shapes
  at tile boundaries with strided x, a small selection for compute-sanitizer
  (tools/gpu_checklist.sh sanitize).

Without a GPU every cell but the stand-in ones skips with the reason; the skinny kernel's own GPU
checks are in tests/optimized/test_skinny_gpu.py, long fuzzing is `W4A16_FUZZ=long pytest
tests/optimized/test_fuzz.py`, parity over the fixture shapes is the oracle's pytest plugin
(`pytest --w4a16-kernel=optimized.specs:hybrid --w4a16-tier full`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

import pytest
import torch

from optimized import dispatch, hybrid, skinny
from optimized.policy import policy_for
from optimized.prepared import PreparedWeight
from optimized.triton_w4a16 import device_name, w4a16_matmul
from oracle import QuantizedWeight, judge, random_quantized, reference_matmul
from oracle.layouts import nibbles, to_kernel_layout
from oracle.shapes import BOUNDARY_SHAPES

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GROUP = 128
NEEDS_GPU = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA or ROCm device (torch.cuda.is_available() is "
                                                  "False); on CPU the Triton kernel's tests cover this ground")
GPU_ONLY = [pytest.mark.gpu, NEEDS_GPU]


# ---------------------------------------------------------------------------------------------
# Random packed problems, drawn on the device (the large ones would take minutes through the CPU)


@dataclass
class Packed:
    """One weight in the kernel layout, and a bias.

    qweight: int32 [N, K/8], packed along K, natural nibble order (N a multiple of 8).
    scales:  fp16/bf16 [N, K/G].
    zeros:   int32 [N/8, K/G], packed along N; None for symmetric weights.
    bias:    fp16/bf16 [N] or None.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    bias: torch.Tensor | None
    group_size: int

    @property
    def n(self) -> int:
        return self.qweight.shape[0]


def random_packed(n: int, k: int, group: int, dtype: torch.dtype, symmetric: bool, bias: bool,
                  device: torch.device, generator: torch.Generator) -> Packed:
    """Random nibbles and zero points (random bytes viewed as words); scales in [2^-8, 2^-7) so
    that sums over K = 65536 stay far from fp16 overflow."""
    groups = k // group
    qweight = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device, generator=generator)
    scales = ((torch.rand(n, groups, device=device, generator=generator) + 1) * 2**-8).to(dtype)
    zeros = None if symmetric else torch.randint(0, 256, (n // 8, groups * 4), dtype=torch.uint8, device=device,
                                                 generator=generator).view(torch.int32)
    b = (0.1 * torch.randn(n, device=device, generator=generator)).to(dtype) if bias else None
    return Packed(qweight.view(torch.int32), scales, zeros, b, group)


def columns_weight(p: Packed, cols: torch.Tensor) -> QuantizedWeight:
    """The canonical weight of output columns `cols` (int64 [C]) only: row n of W is column n of y."""
    q = nibbles.unpack(p.qweight[cols], 1)
    zeros = None
    if p.zeros is not None:
        # Word n // 8 holds row n at nibble n % 8: unpacking words along dim 0 puts it at 8 i + n % 8.
        zeros = nibbles.unpack(p.zeros[cols // 8], 0)[torch.arange(len(cols), device=cols.device) * 8 + cols % 8]
    return QuantizedWeight(q, p.scales[cols], zeros, p.group_size)


def run(kernel: str, x: torch.Tensor, p: Packed) -> torch.Tensor:
    """y = x @ W^T + bias through `kernel`: "triton" (w4a16_matmul) or "hybrid" (the op, on a
    PreparedWeight holding the same tensors, so it picks its implementation by M).
    x: p.scales.dtype [M, K], rows contiguous along K. Returns p.scales.dtype [M, N]."""
    if kernel == "triton":
        return w4a16_matmul(x, p.qweight, p.scales, p.zeros, p.group_size, p.bias)
    return hybrid.matmul(x, PreparedWeight(p.qweight, p.scales, p.zeros, p.group_size, p.n), p.bias)


# ---------------------------------------------------------------------------------------------
# Offsets past int32


@dataclass(frozen=True)
class Limits:
    """limit: the flat offset the large shapes cross (2^31 on a GPU); big_k: K of the large N*K and
    M*K shapes."""

    name: str
    limit: int
    big_k: int


INT32 = Limits("int32", 2**31, 65536)
STAND_IN = Limits("stand-in", 2**11, 256)


@dataclass(frozen=True)
class LargeShape:
    """One weight and x; the M each kernel runs on them (rows of x taken from the front)."""

    name: str
    n: int
    k: int
    dtype: str
    ms: tuple[int, ...]
    symmetric: bool = False
    bias: bool = True


def large_shapes(lim: Limits) -> dict[str, LargeShape]:
    two, k = 2 * lim.limit, lim.big_k
    side = math.isqrt(two) + 8
    return {s.name: s for s in (
        LargeShape("NK", two // k + 8, k, "fp16", (1, 16, 300)),
        LargeShape("NK-sym", two // k + 8, k, "bf16", (1, 300), symmetric=True),
        LargeShape("MK", 64, k, "bf16", (two // k + 8,)),
        LargeShape("MN", side, GROUP, "bf16", (side,), bias=False),
    )}


def crossings(extent: int, stride: int, limits: tuple[int, ...]) -> set[int]:
    """Indices i < extent whose span [i * stride, (i + 1) * stride) holds one of the limits, and
    one either side: where a flat offset i * stride + j crosses it."""
    return {i + d for t in limits for i in (t // stride,) for d in (-1, 0, 1) if 0 <= i + d < extent}


def sampled_indices(m: int, n: int, k: int, limits: tuple[int, ...],
                    generator: torch.Generator) -> tuple[list[int], list[int]]:
    """Rows: first, last, where x (stride K) or y (stride N) offsets cross a limit, 4 random.
    Columns: first, last, where weight offsets cross (in elements, packed words and 32-k chunks),
    the column where a y offset crosses inside its row, 8 random."""
    rows = {0, m - 1} | crossings(m, k, limits) | crossings(m, n, limits)
    rows |= set(torch.randint(0, m, (4,), generator=generator).tolist())
    cols = {0, n - 1} | crossings(n, k, limits) | crossings(n, k // 8, limits) | crossings(n, k // 32, limits)
    cols |= {t % n + d for t in limits for d in (-1, 0, 1) if 0 <= t % n + d < n}
    cols |= set(torch.randint(0, n, (8,), generator=generator).tolist())
    return sorted(rows), sorted(cols)


def device_bytes(s: LargeShape, m: int) -> int:
    """An upper estimate of one call's device bytes: weight, scales, zeros, x, y twice (the
    poisoned buffer is freed before the call and comes back as y; the finite check's mask), and
    a split-K fp32 workspace of up to 8 splits."""
    return s.n * s.k // 2 + 4 * s.n * (s.k // GROUP) + 2 * m * s.k + 5 * m * s.n + 32 * m * s.n


def large_cases():
    for lim, (kernel, shape) in product((STAND_IN, INT32), product(("triton", "hybrid"), large_shapes(STAND_IN))):
        if kernel == "hybrid" and shape == "MN":
            continue  # M*N crosses only in y: the hybrid runs Triton there, as the "triton" cell does
        marks = GPU_ONLY if lim is INT32 else []
        yield pytest.param(lim, kernel, shape, id=f"{lim.name}-{kernel}-{shape}", marks=marks)


@pytest.mark.parametrize("lim, kernel, shape_name", large_cases())
def test_offsets_past_int32_are_right(lim: Limits, kernel: str, shape_name: str) -> None:
    s = large_shapes(lim)[shape_name]
    top = max(s.ms)
    if ON_GPU:
        free = torch.cuda.mem_get_info()[0]
        need = device_bytes(s, top)
        if need > 0.9 * free:
            pytest.skip(f"needs ~{need / 2**30:.1f} GiB of device memory, {free / 2**30:.1f} GiB free")
    gen = torch.Generator(device=DEVICE).manual_seed(len(shape_name))
    cpu_gen = torch.Generator().manual_seed(0)
    dtype = DTYPES[s.dtype]
    p = random_packed(s.n, s.k, GROUP, dtype, s.symmetric, s.bias, DEVICE, gen)
    x = torch.randn(top, s.k, device=DEVICE, generator=gen).to(dtype)
    limits = (lim.limit, 2 * lim.limit)
    assert max(s.n * s.k, top * s.k, top * s.n) > limits[1], "the shape must cross both limits"
    for m in s.ms:
        poison = torch.full((m, s.n), float("nan"), dtype=dtype, device=DEVICE)
        del poison
        y = run(kernel, x[:m], p)
        nonfinite = int((~torch.isfinite(y)).sum())
        assert nonfinite == 0, f"{kernel} {s.name} M={m}: {nonfinite} non-finite outputs"
        rows, cols = sampled_indices(m, s.n, s.k, limits, cpu_gen)
        rows_t, cols_t = (torch.tensor(v, device=DEVICE) for v in (rows, cols))
        ref = reference_matmul(x[rows_t], columns_weight(p, cols_t), None if p.bias is None else p.bias[cols_t])
        v = judge(y[rows_t][:, cols_t], ref, dequant_dtype=dtype)
        print(f"{kernel} {s.name} N={s.n} K={s.k} M={m}: {len(rows)} rows x {len(cols)} columns judged: {v.summary()}")
        assert v.passed and v.hard_violations == 0, f"{kernel} {s.name} M={m}: {v.summary()}"
        del y


def test_sampled_indices_hold_every_crossing() -> None:
    """The rows and columns judged include both sides of every place a flat offset crosses a limit."""
    limits = (2**11, 2**12)
    rows, cols = sampled_indices(40, 24, 256, limits, torch.Generator().manual_seed(0))
    assert {0, 39} <= set(rows) and {0, 23} <= set(cols)
    for t in limits:
        assert {t // 256 - 1, t // 256, t // 256 + 1} & set(range(40)) <= set(rows)  # x rows (stride K)
        assert {t // 24 - 1, t // 24, t // 24 + 1} & set(range(40)) <= set(rows)      # y rows (stride N)
        assert {t // 32 - 1, t // 32} & set(range(24)) <= set(cols)                    # packed words (K / 8)
    assert crossings(10, 100, (250,)) == {1, 2, 3}


def test_columns_weight_is_those_rows_of_the_weight() -> None:
    gen = torch.Generator().manual_seed(5)
    w = random_quantized(24, 256, GROUP, False, torch.bfloat16, generator=gen)
    kw = to_kernel_layout(w, torch.bfloat16)
    p = Packed(kw.qweight, kw.scales, kw.zeros, None, GROUP)
    cols = torch.tensor([0, 7, 8, 17, 23])
    sub = columns_weight(p, cols)
    assert torch.equal(sub.q, w.q[cols]) and torch.equal(sub.zeros, w.zeros[cols])
    assert torch.equal(sub.scales, w.scales[cols])


# ---------------------------------------------------------------------------------------------
# Determinism and batch invariance (on CPU, tests/optimized/test_triton_kernel.py and
# test_determinism.py hold these for the interpreter)

DET_SHAPES = [(s.k, s.n) for s in BOUNDARY_SHAPES] + [(4096, 14336)]
M_CAP = 4096  # where the open last bucket of the tile table is cut
REPEATS = 5


def bits(t: torch.Tensor) -> torch.Tensor:
    """t: fp16/bf16, any shape; its bits as int16 (NaN == NaN and -0.0 != 0.0 when comparing bits)."""
    return t.view(torch.int16)


def same_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """a, b: fp16/bf16 outputs of one shape; fails naming `what` and the first differing elements."""
    diff = bits(a) != bits(b)
    assert not bool(diff.any()), f"{what}: {int(diff.sum())} elements differ, first at {diff.nonzero()[:3].tolist()}"


def det_cases():
    for (k, n), dname, symmetric in product(DET_SHAPES, DTYPES, (False, True)):
        yield pytest.param(k, n, dname, symmetric, id=f"K{k}xN{n}-{dname}-{'sym' if symmetric else 'asym'}",
                           marks=GPU_ONLY)


def det_problem(k: int, n: int, dname: str, symmetric: bool) -> tuple[Packed, torch.Tensor]:
    gen = torch.Generator(device=DEVICE).manual_seed(k + n)
    p = random_packed(n, k, GROUP if k % GROUP == 0 else 32, DTYPES[dname], symmetric, not symmetric, DEVICE, gen)
    return p, torch.randn(M_CAP, k, device=DEVICE, generator=gen).to(DTYPES[dname])


def triton_ranges() -> list[tuple[int, int]]:
    """(first M, last M) of each bucket of the device's tile table, the last cut at M_CAP."""
    out, lo = [], 1
    for top, _ in policy_for(device_name(DEVICE)).triton.buckets:
        hi = M_CAP if top is None else top
        out.append((lo, hi))
        lo = hi + 1
    return out


@pytest.mark.parametrize("k, n, dname, symmetric", det_cases())
def test_triton_rows_keep_their_bits_within_a_bucket(k: int, n: int, dname: str, symmetric: bool) -> None:
    p, x = det_problem(k, n, dname, symmetric)
    for lo, hi in triton_ranges():
        full = run("triton", x[:hi], p)
        for m in sorted({lo, (lo + hi) // 2, hi}):
            y = run("triton", x[:m], p)
            same_bits(y, full[:m], f"M {lo}-{hi}: rows of M={m} against M={hi}")
            for _ in range(REPEATS - 1):
                same_bits(run("triton", x[:m].clone(), p), y, f"M={m}: repeat on a fresh copy of x")
            perm = torch.randperm(m, device=DEVICE)
            same_bits(run("triton", x[:m][perm], p), y[perm], f"M={m}: rows permuted")


@pytest.mark.parametrize("k, n, dname, symmetric", det_cases())
def test_hybrid_is_deterministic_at_every_implementation(k: int, n: int, dname: str, symmetric: bool) -> None:
    """Repeats and permuted rows at M of every implementation the hybrid op picks on this device."""
    p, x = det_problem(k, n, dname, symmetric)
    for m in (1, 3, 16, 17, 64, 300, 4096):
        y = run("hybrid", x[:m], p)
        for _ in range(REPEATS - 1):
            same_bits(run("hybrid", x[:m].clone(), p), y, f"M={m}: repeat on a fresh copy of x")
        perm = torch.randperm(m, device=DEVICE)
        same_bits(run("hybrid", x[:m][perm], p), y[perm], f"M={m}: rows permuted")


# ---------------------------------------------------------------------------------------------
# The hybrid op on the device


def small_prepared(dense_cache: bool, symmetric: bool = False) -> tuple[QuantizedWeight, PreparedWeight]:
    w = random_quantized(64, 256, 64, symmetric, torch.bfloat16, generator=torch.Generator().manual_seed(1))
    return w, hybrid.prepare(w, torch.bfloat16, DEVICE, dense_cache=dense_cache)


def opcheck_cases():
    for impl in ("triton", "torch", "dense", "skinny", "transient"):
        for m in (1, 5, 33):
            # Above MAX_M skinny is its tile kernel: CUDA only (K = 256 is whole 128-k pieces).
            if impl == "skinny" and skinny.unfit(m, 256, torch.version.hip is not None):
                continue
            yield pytest.param(impl, m, id=f"{impl}-M{m}", marks=GPU_ONLY)


@pytest.mark.parametrize("impl, m", opcheck_cases())
def test_hybrid_opcheck_on_the_device(impl: str, m: int) -> None:
    if impl == "skinny":
        ok, why = skinny.is_available()
        if not ok:
            pytest.fail(f"the skinny kernel must build on a GPU machine: {why}")
    _, pw = small_prepared(dense_cache=True)
    x = torch.randn(m, 256, device=DEVICE).to(torch.bfloat16)
    bias = torch.randn(64, device=DEVICE).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.w4a16.matmul.default,
                          (x, pw.qweight, pw.scales, pw.zeros, pw.group_size, pw.n, pw.perm, pw.dense, bias, impl))


@pytest.mark.parametrize("m", (1, 33), ids=lambda m: f"M{m}")
@pytest.mark.gpu
@NEEDS_GPU
def test_hybrid_compiled_equals_eager_on_the_device(m: int) -> None:
    _, pw = small_prepared(dense_cache=False)
    compiled = torch.compile(lambda x: hybrid.matmul(x, pw), fullgraph=True, backend="aot_eager")
    x = torch.randn(m, 256, device=DEVICE).to(torch.bfloat16)
    assert torch.equal(compiled(x), hybrid.matmul(x, pw))


def expected_impl(m: int, dense_cache: bool, group_size: int) -> str:
    """What the device's policy thresholds call for at M = m (dispatch.PRIORITY: dense, skinny, triton)."""
    t = dispatch.thresholds_for(device_name(DEVICE))
    if dense_cache and m >= t.dense_min_m:
        return "dense"
    if skinny.is_available()[0] and m <= min(t.skinny_max_m, skinny.MAX_M) and group_size in skinny.GROUP_SIZES:
        return "skinny"
    return "triton"


@pytest.mark.parametrize("dense_cache", (False, True), ids=("plain", "dense-cache"))
@pytest.mark.gpu
@NEEDS_GPU
def test_hybrid_routes_each_m_as_the_device_policy_says(dense_cache: bool) -> None:
    """For every M from 1 to past both thresholds: choose() names the implementation the device's
    policy file calls for, and the op's output is bit for bit that implementation's."""
    name = device_name(DEVICE)
    t = dispatch.thresholds_for(name)
    assert t.source == policy_for(name).source
    w, pw = small_prepared(dense_cache)
    top = max(t.skinny_max_m, t.dense_min_m, skinny.MAX_M) + 2
    x = torch.randn(top, 256, device=DEVICE).to(torch.bfloat16)
    seen = set()
    for m in range(1, top + 1):
        choice = hybrid.choose(m, pw)
        assert choice.name == expected_impl(m, dense_cache, w.group_size), f"M={m}: {choice}"
        same_bits(hybrid.matmul(x[:m], pw), hybrid.matmul(x[:m], pw, impl=choice.name), f"M={m} {choice.name}")
        seen.add(choice.name)
    print(f"{name}: {t}; implementations chosen: {sorted(seen)}")
    assert ("dense" if dense_cache else "triton") in seen


# ---------------------------------------------------------------------------------------------
# For compute-sanitizer: every Triton path once per dtype and symmetry


SANITIZE_SHAPES = ((8, 4096, 128), (4096, 128, 128), (200, 320, 64), (1024, 9856, 128), (72, 200, -1))  # (N, K, G)
SANITIZE_M = (1, 7, 16, 33, 129, 257)  # 129 and 257: one row past a 128- and a 256-row tile


def sanitize_cases():
    for (n, k, g), dname, symmetric in product(SANITIZE_SHAPES, DTYPES, (False, True)):
        yield pytest.param(n, k, g, dname, symmetric, id=f"N{n}-K{k}-G{g}-{dname}-{'sym' if symmetric else 'asym'}",
                           marks=[pytest.mark.sanitize, *GPU_ONLY])


@pytest.mark.parametrize("n, k, group, dname, symmetric", sanitize_cases())
def test_triton_paths_for_the_sanitizer(n: int, k: int, group: int, dname: str, symmetric: bool) -> None:
    """N = 8, K = G, a K of an odd number of groups, N of no tile's multiple, channelwise; x rows
    k + 64 apart starting 64 bytes in (aligned, not contiguous); GEMV, split-K and prefill tiles."""
    dtype = DTYPES[dname]
    gen = torch.Generator().manual_seed(n + k)
    w = random_quantized(n, k, group, symmetric, dtype, generator=gen).to(DEVICE)
    kw = to_kernel_layout(w, dtype)
    bias = (0.5 * torch.randn(n, generator=gen)).to(dtype).to(DEVICE)
    for m in SANITIZE_M:
        x = torch.randn(m, k + 64, generator=gen).to(dtype).to(DEVICE)[:, 32:32 + k]
        y = w4a16_matmul(x, kw.qweight, kw.scales, kw.zeros, kw.group_size, bias)
        torch.cuda.synchronize()
        v = judge(y, reference_matmul(x, w, bias), dequant_dtype=dtype)
        assert v.passed, f"M={m}: {v.summary()}"


@pytest.mark.parametrize("n, k, group, dname, symmetric", sanitize_cases())
def test_transient_path_for_the_sanitizer(n: int, k: int, group: int, dname: str, symmetric: bool) -> None:
    """The transient path forced on the same boundary shapes: its dequantization kernel masks the
    last row and word tiles (N and K/8 of no tile's multiple), and the shared workspace is reused
    across shapes of every size, so a stale tail would show in the next call's result."""
    dtype = DTYPES[dname]
    gen = torch.Generator().manual_seed(n + k + 1)
    w = random_quantized(n, k, group, symmetric, dtype, generator=gen)
    pw = hybrid.prepare(w, dtype, DEVICE)
    w = w.to(DEVICE)
    bias = (0.5 * torch.randn(n, generator=gen)).to(dtype).to(DEVICE)
    for m in SANITIZE_M:
        x = torch.randn(m, k + 64, generator=gen).to(dtype).to(DEVICE)[:, 32:32 + k]
        y = hybrid.matmul(x, pw, bias, impl="transient")
        torch.cuda.synchronize()
        v = judge(y, reference_matmul(x, w, bias), dequant_dtype=dtype)
        assert v.passed, f"M={m}: {v.summary()}"


# ---------------------------------------------------------------------------------------------
# Every tile candidate the tuning sweep times, judged by the oracle (random data and exact probes)


def candidate_cases():
    from tests.benchmarks.candidates import candidates

    return [pytest.param(cfg, dname, id=f"{cfg.id}-{dname}", marks=GPU_ONLY) for cfg in candidates()
            for dname in DTYPES]


@pytest.mark.parametrize("cfg, dname", candidate_cases())
def test_tile_candidates_pass_the_oracle_on_the_device(cfg, dname: str) -> None:
    """Each candidate forced on a tile-boundary shape (N 264 = two 128-row tiles and a bit, K 1024:
    several K-tiles, both group layouts), with bias, at an M inside its range."""
    from optimized.tile_configs import fit_config
    from oracle import KernelSpec, case, check_case
    from tests.benchmarks.candidates import m_range

    lo, hi = m_range(cfg)
    m = min(max(lo, 17 if cfg.use_dot else 1), hi or 4096)
    table = policy_for(device_name(DEVICE)).triton
    fitted = fit_config(cfg, 264, 1024, GROUP, table.target_programs, table.split_below)

    def forced(x, qweight, scales, zeros, group_size, bias):
        return w4a16_matmul(x, qweight, scales, zeros, group_size, bias, config=fitted)

    spec = KernelSpec(f"triton@{cfg.id}", forced, dequant_roundings=1)
    report = check_case(spec, case(k=1024, n=264, m=m, dtype=DTYPES[dname], group_size=GROUP, bias=True),
                        device=DEVICE)
    assert report.passed, (report.error, report.verdict and report.verdict.summary(), report.diagnosis)

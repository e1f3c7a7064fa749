"""Correctness and speed of the skinny decode kernel on one GPU (written for the H200).

    python bench/skinny_h200.py --out DIR          # build, opcheck, parity matrix, timing (< ~6 min)
    python bench/skinny_h200.py --variant seg_r4 --out DIR   # the same for one kernel, not the default
    compute-sanitizer --tool memcheck python bench/skinny_h200.py --sanitize
    python bench/skinny_h200.py --dry-run --out DIR   # CPU: the pure-Python parts, a stand-in kernel
    python bench/skinny_h200.py --variants --out DIR  # both kernels and the default: parity, timing (< 4 min)
    python bench/skinny_h200.py --variants --shapes all --ms 5,8,9,16 --kernels base,regs_s4,stream --out DIR
    python bench/skinny_h200.py --variants --dry-run --out DIR

Parity: oracle.shapes.unique_shapes() x M in {1..8, 16} x fp16/bf16 x sym/asym at G=128, and a
subset at G=32/64, for both engines, judged by the oracle's error model (dequant into the
activation dtype, one rounding) against a plain torch baseline, plus exact probes on a subset.
Timing (DESIGN.md section 5): cold weights (rotating copies over 500 MiB), a CUDA graph of R
calls each on its own copy, per call = replay / R, median of replays; floor = bytes / measured
copy bandwidth. Calls overlap their predecessor with overlap "weights", as the hybrid op runs them
(bench/overlap_h200.py compares the modes). Writes DIR/skinny_h200.json and DIR/skinny_h200.md.

--variants compares the kernels of optimized.skinny.VARIANTS in one run (see run_variants): a
quick parity check of each and of the default policy (6 weights, M in {1..5, 9, 16}, exact probes
on one), then the same cold-weight graph timing on 5 large shapes at M in {1, 2, 4, 5, 8, 9, 16}
(or the fixture shapes, M and kernels that --shapes, --ms and --kernels name); prints a compact
table last (with the kernel the default policy picks, skinny.default_variant) and writes
DIR/skinny_variants.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cuda_timing import graph_seconds  # noqa: E402
from optimized import skinny  # noqa: E402
from oracle import judge, plain_torch_matmul, probe_weight, random_quantized, reference_matmul, run_probes  # noqa: E402
from oracle.canonical import QuantizedWeight  # noqa: E402
from oracle.layouts import from_kernel_layout, to_kernel_layout  # noqa: E402
from oracle.quantize import quantize_rtn  # noqa: E402
from oracle.reference import Reference  # noqa: E402
from oracle.shapes import MODEL_SHAPES, LinearShape, unique_shapes  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ENGINES = ("mma", "simt")
PARITY_M = tuple(range(1, 9)) + (16,)
SUBSET_M = (1, 3, 8, 16)  # for G = 32, 64
HEADLINE = ((4096, 28672), (8192, 57344))
COLD_BYTES = 600 << 20    # weight copies rotated per timing graph: well over the 60 MB L2
REPLAYS = 10
MAX_COPIES = 256
# Issue 4's speed targets: at M = 1, TARGET_M1_PCT % of the floor on every cell whose floor is at
# least TARGET_MIN_FLOOR_US (shorter kernels are dominated by launch and tail); and M = 16 within
# TARGET_M16_RATIO of M = 1 on every case.
TARGET_MIN_FLOOR_US = 7.0
TARGET_M1_PCT = 90.0
TARGET_M16_RATIO = 1.15


def log(msg: str) -> None:
    print(msg, flush=True)


def shape_id(k: int, n: int) -> str:
    return f"K{k}xN{n}"


# ---------------------------------------------------------------------------------------------
# Cases


@dataclass(frozen=True)
class ParityCase:
    """One weight (shape, dtype, symmetry, group) judged at several M and both engines."""

    shape: LinearShape
    dtype: str
    symmetric: bool
    group: int
    ms: tuple[int, ...]
    probes: bool

    @property
    def id(self) -> str:
        return f"{self.shape.id}-{self.dtype}-{'sym' if self.symmetric else 'asym'}-G{self.group}"


# K % 128 = 64 and N % 16 = 8: a partial last iteration and a partial row tile (G = 32, 64 only;
# every model shape has K % 128 == 0).
TAIL_SHAPE = LinearShape("boundary", "k_tail", 4032, 264)


def parity_cases() -> list[ParityCase]:
    """G=128 over every unique shape and M; G=32/64 over boundary shapes and Llama-3.1-8B at a
    few M. Exact probes (one kernel call per 16 probe rows) where that stays cheap."""
    probe_names = {128: {"boundary.n8", "boundary.k_eq_g", "llama3.1-8b.qkv"},
                   64: {"boundary.k_eq_g", "boundary.k_tail"}, 32: {"boundary.k_eq_g", "boundary.k_tail"}}
    cases = []
    for shape in unique_shapes() + [TAIL_SHAPE]:
        if shape is TAIL_SHAPE:
            groups = (64, 32)
        elif shape.model in ("boundary", "llama3.1-8b"):
            groups = (128, 64, 32)
        else:
            groups = (128,)
        for group in groups:
            for dtype in DTYPES:
                for symmetric in (True, False):
                    cases.append(ParityCase(shape, dtype, symmetric, group, PARITY_M if group == 128 else SUBSET_M,
                                            f"{shape.model}.{shape.layer}" in probe_names[group]))
    return cases


@dataclass(frozen=True)
class TimingCase:
    k: int
    n: int
    dtype: str
    symmetric: bool

    @property
    def id(self) -> str:
        return f"{shape_id(self.k, self.n)}-{self.dtype}-{'sym' if self.symmetric else 'asym'}"


def timing_cases() -> list[TimingCase]:
    """Every model shape in bf16 (sym and asym); fp16 on the headline shapes."""
    seen, cases = set(), []
    for s in MODEL_SHAPES:
        if (s.k, s.n) in seen:
            continue
        seen.add((s.k, s.n))
        for symmetric in (True, False):
            cases.append(TimingCase(s.k, s.n, "bf16", symmetric))
            if (s.k, s.n) in HEADLINE:
                cases.append(TimingCase(s.k, s.n, "fp16", symmetric))
    return cases


def floor_bytes(m: int, k: int, n: int, group: int, symmetric: bool) -> int:
    """HBM bytes one call must move: weights, scales, zero points, x and y."""
    zero_bytes = 0 if symmetric else n // 8 * (k // group) * 4
    return k * n // 2 + n * (k // group) * 2 + zero_bytes + m * k * 2 + m * n * 2


# ---------------------------------------------------------------------------------------------
# Parity


def make_weight(shape: LinearShape, group: int, symmetric: bool, dtype: torch.dtype, device: str,
                generator: torch.Generator) -> QuantizedWeight:
    """RTN-quantized Gaussian weight; drawn on the device, since the CPU path is slow at 470M values."""
    if device == "cpu":
        return random_quantized(shape.n, shape.k, group, symmetric, dtype, generator=generator)
    w = torch.randn(shape.n, shape.k, device=device, generator=generator) * 0.02
    return quantize_rtn(w, group, symmetric, dtype)


def first_rows(ref: Reference, m: int) -> Reference:
    """The reference of x[:m] is the first m rows of the reference of x: rows are independent.
    Every [M, N] field is sliced, whatever fields the oracle's Reference has."""
    rows = {f.name: getattr(ref, f.name)[:m] for f in dataclasses.fields(ref)
            if isinstance(getattr(ref, f.name), torch.Tensor) and getattr(ref, f.name).dim() == 2}
    return dataclasses.replace(ref, **rows)


KernelFn = Callable[..., torch.Tensor]


def bound_kernel(kernel: KernelFn, weight: QuantizedWeight, dtype: torch.dtype, engine: str):
    """`(x, bias) -> y` over the kernel layout of `weight`, each call on fresh copies of the inputs."""
    kw = to_kernel_layout(weight, dtype)

    def run(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        zeros = None if kw.zeros is None else kw.zeros.clone()
        return kernel(x.clone(), kw.qweight.clone(), kw.scales.clone(), zeros, kw.group_size,
                      None if bias is None else bias.clone(), engine=engine)

    return run


def run_parity(kernel: KernelFn, cases: list[ParityCase], device: str, engines=ENGINES,
               probe_max_m: int = skinny.MAX_M, tag: dict | None = None, quiet: bool = False) -> list[dict]:
    """Judge `kernel` on every case, engine and M; tag: fields added to every row."""
    tag = tag or {}
    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    for i, case in enumerate(cases):
        dtype = DTYPES[case.dtype]
        t0 = time.perf_counter()
        try:
            weight = make_weight(case.shape, case.group, case.symmetric, dtype, device, gen)
            x_all = torch.randn(max(case.ms), case.shape.k, device=device, generator=gen).to(dtype)
            bias = (torch.randn(case.shape.n, device=device, generator=gen) * 0.1).to(dtype)
            ref_all = reference_matmul(x_all, weight, bias)
            baseline_all = plain_torch_matmul(x_all, weight, bias)
        except Exception as e:  # noqa: BLE001 - recorded, the matrix goes on
            rows.append({**tag, "case": case.id, "stage": "setup", "passed": False, "error": repr(e),
                         "trace": traceback.format_exc(limit=3)})
            log(f"[parity {i + 1}/{len(cases)}] {case.id}: setup error {e!r}")
            continue
        fails = 0
        for engine in engines:
            call = bound_kernel(kernel, weight, dtype, engine)
            for m in case.ms:
                row = {**tag, "case": case.id, "engine": engine, "m": m, "kind": "random"}
                try:
                    out = call(x_all[:m], bias)
                    v = judge(out, first_rows(ref_all, m), dequant_dtype=dtype, dequant_roundings=1,
                              baseline=baseline_all[:m])
                    row.update(passed=v.passed, worst_ratio=v.worst_ratio, violations=v.violations,
                               hard_violations=v.hard_violations, max_abs_error=v.max_abs_error,
                               baseline_worst_ratio=v.baseline_worst_ratio,
                               summary=None if v.passed else v.summary())
                except Exception as e:  # noqa: BLE001
                    row.update(passed=False, error=repr(e), trace=traceback.format_exc(limit=3))
                fails += not row["passed"]
                rows.append(row)
            if case.probes:
                row = {**tag, "case": case.id, "engine": engine, "m": probe_max_m, "kind": "probes"}
                try:
                    pw = probe_weight(min(case.shape.n, 256), case.shape.k, case.group, case.symmetric, dtype,
                                      generator=torch.Generator().manual_seed(1)).to(device)
                    pbias = bias[:pw.n]
                    res = run_probes(bound_kernel(kernel, pw, dtype, engine), pw, dtype, pbias, max_m=probe_max_m)
                    row.update(passed=res.passed, rows=res.rows, mismatches=res.mismatches,
                               summary=None if res.passed else res.summary())
                except Exception as e:  # noqa: BLE001
                    row.update(passed=False, error=repr(e), trace=traceback.format_exc(limit=3))
                fails += not row["passed"]
                rows.append(row)
        if not quiet or fails:
            label = "".join(f"{k}={v} " for k, v in tag.items())
            log(f"[parity {i + 1}/{len(cases)}] {label}{case.id}: {fails} failing cells "
                f"({time.perf_counter() - t0:.1f}s)")
        del weight, ref_all, baseline_all
    return rows


def run_opcheck(device: str) -> list[dict]:
    """torch.library.opcheck: schema, fake implementation and dispatch agree with the kernel."""
    rows = []
    cases = [(1, 256, 64, 32, torch.float16, False, True, torch.int32),
             (5, 512, 128, 128, torch.bfloat16, True, False, torch.int32),
             (16, 384, 72, 64, torch.float16, True, True, torch.int8)]
    gen = torch.Generator().manual_seed(2)
    for m, k, n, g, dtype, symmetric, with_bias, wdtype in cases:
        name = f"M{m}-K{k}-N{n}-G{g}-{str(dtype)[6:]}-{'sym' if symmetric else 'asym'}-{str(wdtype)[6:]}"
        try:
            kw = to_kernel_layout(random_quantized(n, k, g, symmetric, dtype, generator=gen), dtype)
            qweight = kw.qweight if wdtype == torch.int32 else kw.qweight.view(torch.int8)
            args = (torch.randn(m, k, generator=gen).to(dtype).to(device), qweight.to(device), kw.scales.to(device),
                    None if kw.zeros is None else kw.zeros.to(device), g,
                    torch.randn(n, generator=gen).to(dtype).to(device) if with_bias else None, "auto")
            torch.library.opcheck(torch.ops.w4a16.skinny_matmul.default, args)
            rows.append({"case": name, "passed": True})
        except Exception as e:  # noqa: BLE001
            rows.append({"case": name, "passed": False, "error": repr(e), "trace": traceback.format_exc(limit=3)})
        log(f"[opcheck] {name}: {'ok' if rows[-1]['passed'] else rows[-1]['error']}")
    return rows


# ---------------------------------------------------------------------------------------------
# Timing


def copy_bandwidth(device: str) -> dict:
    """Bytes read + written per second by a 1 GiB device-to-device copy (median of 20)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(22):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    t = statistics.median(times[2:])
    del src, dst
    return {"bytes_per_s": 2 * (1 << 30) / t, "seconds": t}


def random_packs(k: int, n: int, g: int, symmetric: bool, dtype: torch.dtype, device: str, copies: int) -> list:
    """`copies` independent (qweight, scales, zeros) kernel-layout weights with random bits, for timing."""
    packs = []
    for _ in range(copies):
        q = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device=device)
        s = (torch.rand(n, k // g, device=device) * 1e-3 + 1e-4).to(dtype)
        z = None if symmetric else torch.randint(-2**31, 2**31 - 1, (n // 8, k // g), dtype=torch.int32, device=device)
        packs.append((q, s, z))
    return packs


def run_timing(cases: list[TimingCase], bandwidth: float, device: str, ms=tuple(range(1, 17)),
               variant: int = skinny.DEFAULT_VARIANT) -> list[dict]:
    rows = []
    for i, case in enumerate(cases):
        dtype = DTYPES[case.dtype]
        k, n, g = case.k, case.n, 128
        t0 = time.perf_counter()
        try:
            weight_bytes = floor_bytes(0, k, n, g, case.symmetric)
            copies = max(2, min(MAX_COPIES, math.ceil(COLD_BYTES / weight_bytes)))
            packs = random_packs(k, n, g, case.symmetric, dtype, device, copies)
            torch.cuda.synchronize()  # read-only from here on: the kernel runs with overlap "weights"
            dense = [torch.randn(n, k, device=device).to(dtype)
                     for _ in range(max(2, min(MAX_COPIES, math.ceil(COLD_BYTES / (2 * n * k)))))]
        except Exception as e:  # noqa: BLE001
            rows.append({"case": case.id, "error": repr(e)})
            log(f"[timing {i + 1}/{len(cases)}] {case.id}: setup error {e!r}")
            continue
        for m in ms:
            x = torch.randn(m, k, device=device).to(dtype)
            floor_s = floor_bytes(m, k, n, g, case.symmetric) / bandwidth
            row = {"case": case.id, "k": k, "n": n, "dtype": case.dtype, "symmetric": case.symmetric, "m": m,
                   "floor_us": floor_s * 1e6, "copies": copies}
            try:
                dense_s = graph_seconds([lambda w=w: torch.nn.functional.linear(x, w) for w in dense], replays=REPLAYS)
                row["dense_us"] = dense_s * 1e6
                for engine in ENGINES:
                    sec = graph_seconds([lambda p=p: torch.ops.w4a16.skinny_matmul(x, p[0], p[1], p[2], g, None, engine,
                                                                                   variant, "weights")
                                         for p in packs], replays=REPLAYS)
                    row[f"{engine}_us"] = sec * 1e6
                    row[f"{engine}_pct_floor"] = 100 * floor_s / sec
                    row[f"{engine}_speedup_vs_dense"] = dense_s / sec
            except Exception as e:  # noqa: BLE001
                row["error"] = repr(e)
            rows.append(row)
        best = [r.get("mma_pct_floor", 0) for r in rows if r["case"] == case.id]
        log(f"[timing {i + 1}/{len(cases)}] {case.id}: {copies} copies, mma % of floor by M: "
            f"{' '.join(f'{b:.0f}' for b in best)} ({time.perf_counter() - t0:.1f}s)")
        del packs, dense
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------
# Sanitize


def run_sanitize(device: str) -> int:
    """Each boundary once per kernel variant, engine, dtype, symmetry and M in {1, 3, 7, 16}, for
    compute-sanitizer: N=8, K=G, a K that ends mid-iteration (K % 128 != 0), K=49152, N not a
    multiple of the row tile, strided x, N 50696 with K under one iteration (seg_p's row groups
    of one iteration, the last group of 16 rows half past N), N 10248 at K 4096 (seg_p's warps
    cutting row groups, the last half past N at M 3), and a stream plan with a 2-slot ring (K 4096
    at M 7 and 16; its last block 8 rows into N)."""
    shapes = [(8, 4096, 128), (4096, 128, 128), (24, 96, 32), (1024, 49152, 128), (200, 320, 64), (50696, 256, 128),
              (10248, 4096, 128), (28680, 4096, 128)]
    errors = 0
    gen = torch.Generator().manual_seed(3)
    for n, k, g in shapes:
        for dtype in DTYPES.values():
            for symmetric in (True, False):
                kw = to_kernel_layout(random_quantized(n, k, g, symmetric, dtype, generator=gen), dtype)
                zeros = None if kw.zeros is None else kw.zeros.to(device)
                for engine, m, variant in itertools.product(ENGINES, (1, 3, 7, 16), range(len(skinny.VARIANTS))):
                    padded = torch.randn(m, k + 64, generator=gen).to(dtype).to(device)
                    x = padded[:, 32:32 + k]  # row stride k + 64, 64-byte offset: aligned but strided
                    try:
                        torch.ops.w4a16.skinny_matmul(x, kw.qweight.to(device), kw.scales.to(device), zeros, g,
                                                      None, engine, variant)
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        errors += 1
                        log(f"[sanitize] N{n} K{k} G{g} {dtype} sym={symmetric} {engine} M{m} "
                            f"{skinny.VARIANTS[variant]}: {e!r}")
    log(f"[sanitize] done, {errors} errors")
    return errors


# ---------------------------------------------------------------------------------------------
# Variants: both kernels in one run (--variants)

# Parity: the pipelined kernel with a ring that wraps (K = 16384 at 8 warps per row: 16 iterations
# a warp), partial row tiles (N % 16 = 8), N = 8, G = 32 on the pipelined path, a K tail (the base
# kernel's fallback), and exact probes on a small weight (the simt engine probes one row at a time).
# M = 5 and 9 lie each side of the default's switch (skinny.REGS_MAX_M).
VARIANT_MID = LinearShape("variants", "mid", 16384, 1032)
VARIANT_G32 = LinearShape("variants", "g32", 2048, 264)
VARIANT_PROBE = LinearShape("variants", "probe", 512, 256)
VARIANT_PARITY_M = (1, 2, 3, 4, 5, 9, 16)
# Timing: the decode shapes of Llama-3.1-8B / 3.3-70B class models, fp16 sym and bf16 asym.
VARIANT_SHAPES = ((4096, 28672), (8192, 57344), (28672, 8192), (14336, 4096), (8192, 10240))
VARIANT_M = (1, 2, 4, 5, 8, 9, 16)
VARIANT_COLD_BYTES = 1 << 30  # weight copies rotated per graph
VARIANT_MIN_COPIES = 4
VARIANT_REPLAYS = 15
VARIANT_BUDGET_S = 215  # timing cells past this many seconds since start are skipped (recorded)


def variant_parity_cases() -> list[ParityCase]:
    n8 = next(s for s in unique_shapes() if s.model == "boundary" and s.layer == "n8")
    return [  # the first two: the instances the timing runs (fp16 sym, bf16 asym at G = 128)
        ParityCase(VARIANT_MID, "fp16", True, 128, VARIANT_PARITY_M, False),
        ParityCase(VARIANT_MID, "bf16", False, 128, VARIANT_PARITY_M, False),
        ParityCase(n8, "fp16", False, 128, VARIANT_PARITY_M, False),
        ParityCase(TAIL_SHAPE, "bf16", False, 64, VARIANT_PARITY_M, False),
        ParityCase(VARIANT_G32, "bf16", False, 32, VARIANT_PARITY_M, False),
        ParityCase(VARIANT_PROBE, "fp16", False, 128, (1,), True),
    ]


def named_shapes(names: set[str], default_models: tuple[str, ...] = ("llama3.1-8b", "llama3.3-70b"),
                 ) -> list[tuple[str, int, int]]:
    """(model.layer, k, n) of the fixture shapes named, "all" for every one, or with none named
    every shape of default_models; one entry per distinct (k, n), the first name that has it."""
    every = names == {"all"}
    chosen, seen = [], set()
    for s in MODEL_SHAPES:
        name = f"{s.model}.{s.layer}"
        if (every or name in names or not names and s.model in default_models) and (s.k, s.n) not in seen:
            seen.add((s.k, s.n))
            chosen.append((name, s.k, s.n))
    unknown = set() if every else names - {f"{s.model}.{s.layer}" for s in MODEL_SHAPES}
    if unknown:
        raise SystemExit(f"unknown shapes {sorted(unknown)}; expected 'all' or model.layer names of "
                         "oracle.shapes.MODEL_SHAPES")
    return chosen


def variant_timing_cases(names: set[str] | None = None) -> list[TimingCase]:
    """fp16 sym and bf16 asym of VARIANT_SHAPES, or of the fixture shapes named (named_shapes)."""
    shapes = VARIANT_SHAPES if not names else [(k, n) for _, k, n in named_shapes(names)]
    return [TimingCase(k, n, dtype, sym) for k, n in shapes for dtype, sym in (("fp16", True), ("bf16", False))]


def timing_order(kernels: tuple[int, ...], m: int) -> list[tuple[int, str]]:
    """(variant, engine) of each kernel of `kernels` timed at M = m: on the mma engine each that
    runs as itself or as a kernel not in `kernels` (skinny.settled_variant), and at M = 1 each on
    the simt engine too."""
    names = {skinny.VARIANTS[v] for v in kernels}
    order = []
    for v in kernels:
        runs = skinny.settled_variant(skinny.VARIANTS[v], m)
        if runs == skinny.VARIANTS[v] or runs not in names:
            order.append((v, "mma"))
    return order + ([(v, "simt") for v in kernels] if m == 1 else [])


def variant_label(v: int) -> str:
    return "default" if v == skinny.DEFAULT_VARIANT else skinny.VARIANTS[v]


def run_variant_parity(kernel: KernelFn, device: str, cases: list[ParityCase] | None = None) -> list[dict]:
    """Each kernel and the default policy (variant -1) with the mma engine at VARIANT_PARITY_M,
    and with the simt engine at M = 1 (its pipelined instances exist for M = 1 only)."""
    cases = variant_parity_cases() if cases is None else cases
    simt_cases = [dataclasses.replace(c, ms=(1,)) for c in cases]
    rows = []
    for v in [*range(len(skinny.VARIANTS)), skinny.DEFAULT_VARIANT]:
        name = variant_label(v)
        t0 = time.perf_counter()
        fn = functools.partial(kernel, variant=v)
        tag = {"variant": v, "variant_name": name}
        new = run_parity(fn, cases, device, engines=("mma",), tag=tag, quiet=True)
        new += run_parity(fn, simt_cases, device, engines=("simt",), probe_max_m=1, tag=tag, quiet=True)
        fails = sum(not r.get("passed") for r in new)
        log(f"[variant parity] {v} {name}: {len(new) - fails}/{len(new)} passed ({time.perf_counter() - t0:.1f}s)")
        rows += new
    return rows


def failed_variants(parity: list[dict]) -> set[tuple[int, str]]:
    return {(r["variant"], r.get("engine", "mma")) for r in parity if not r.get("passed")}


def run_variant_timing(bandwidth: float, device: str, deadline: float, skip: set[tuple[int, str]],
                       cases: list[TimingCase] | None = None, ms=VARIANT_M,
                       kernels: tuple[int, ...] | None = None) -> list[dict]:
    """Cold-weight graph timing of each kernel of `kernels` (default: all; mma, and simt at M = 1)
    on the same weights and x, kernels interleaved per (case, M), with the first of them timed
    again last as a noise check. A kernel that another one runs at that M (timing_order) is not timed
    again, nor one that failed parity on an engine (an illegal access would poison the context for
    every later cell)."""
    kernels = tuple(range(len(skinny.VARIANTS))) if kernels is None else kernels
    rows = []
    for i, case in enumerate(variant_timing_cases() if cases is None else cases):
        dtype = DTYPES[case.dtype]
        k, n, g = case.k, case.n, 128
        t0 = time.perf_counter()
        if time.perf_counter() > deadline:
            rows.append({"case": case.id, "skipped": "time budget"})
            continue
        try:
            weight_bytes = floor_bytes(0, k, n, g, case.symmetric)
            copies = max(VARIANT_MIN_COPIES, min(MAX_COPIES, math.ceil(VARIANT_COLD_BYTES / weight_bytes)))
            packs = random_packs(k, n, g, case.symmetric, dtype, device, copies)
            torch.cuda.synchronize()  # read-only from here on: the kernels run with overlap "weights"
        except Exception as e:  # noqa: BLE001
            rows.append({"case": case.id, "error": repr(e)})
            log(f"[variant timing {i + 1}] {case.id}: setup error {e!r}")
            continue
        for mi, m in enumerate(ms):
            x = torch.randn(m, k, device=device).to(dtype)
            floor_s = floor_bytes(m, k, n, g, case.symmetric) / bandwidth
            order = timing_order(kernels, m)
            if mi % 2:
                order.reverse()
            order.append((kernels[0], "mma"))  # again: the run-to-run spread
            for j, (v, engine) in enumerate(order):
                row = {"case": case.id, "k": k, "n": n, "dtype": case.dtype, "symmetric": case.symmetric, "m": m,
                       "variant": v, "variant_name": skinny.VARIANTS[v], "engine": engine,
                       "repeat": j == len(order) - 1, "floor_us": floor_s * 1e6, "copies": copies}
                if (v, engine) in skip:
                    row["skipped"] = "failed parity"
                elif time.perf_counter() > deadline:
                    row["skipped"] = "time budget"
                else:
                    try:
                        sec = graph_seconds([lambda p=p, v=v, engine=engine: torch.ops.w4a16.skinny_matmul(
                            x, p[0], p[1], p[2], g, None, engine, v, "weights") for p in packs],
                            replays=VARIANT_REPLAYS)
                        torch.cuda.synchronize()
                        row["us"] = sec * 1e6
                        row["pct_floor"] = 100 * floor_s / sec
                    except Exception as e:  # noqa: BLE001
                        row["error"] = repr(e)
                rows.append(row)
        best = {}
        for r in rows:
            if r.get("case") == case.id and "us" in r and r["engine"] == "mma" and not r["repeat"]:
                if r["m"] not in best or r["us"] < best[r["m"]][0]:
                    best[r["m"]] = (r["us"], r["variant"], r["pct_floor"])
        log(f"[variant timing {i + 1}] {case.id}: {copies} copies, best (variant, % floor) by M: "
            + " ".join(f"M{m}:v{b[1]}/{b[2]:.0f}" for m, b in sorted(best.items()))
            + f" ({time.perf_counter() - t0:.1f}s)")
        del packs
        torch.cuda.empty_cache()
    return rows


def variant_summary(timing: list[dict]) -> dict:
    """Per kernel (mma), and for the default policy (each (case, M) from the kernel
    skinny.default_variant picks): the worst M = 1 % of floor over cases whose floor is >=
    TARGET_MIN_FLOOR_US, and the worst t(M = 16) / t(M = 1) over cases (against TARGET_M1_PCT and
    TARGET_M16_RATIO)."""
    by = {}
    for r in timing:
        if "us" in r and r.get("engine") == "mma" and not r.get("repeat"):
            by.setdefault(r["variant"], {})[(r["case"], r["m"])] = r
            if r["variant"] == skinny.default_variant(r["m"], r["n"], r["k"]):
                by.setdefault(skinny.DEFAULT_VARIANT, {})[(r["case"], r["m"])] = r
    out = {}
    for v, cells in sorted(by.items(), key=lambda item: (item[0] < 0, item[0])):
        m1 = [c["pct_floor"] for (case, m), c in cells.items() if m == 1 and c["floor_us"] >= TARGET_MIN_FLOOR_US]
        ratios = [cells[(case, 16)]["us"] / c["us"] for (case, m), c in cells.items() if m == 1 and (case, 16) in cells]
        pcts = [c["pct_floor"] for c in cells.values()]
        out[variant_label(v)] = {
            "variant": v, "cells": len(cells),
            "min_m1_pct_floor": min(m1) if m1 else None,
            "max_m16_over_m1": max(ratios) if ratios else None,
            "geomean_pct_floor": math.exp(sum(math.log(x) for x in pcts) / len(pcts)) if pcts else None,
        }
    noise = []
    for r in timing:
        if r.get("repeat") and "us" in r:
            first = [o for o in timing if o.get("case") == r["case"] and o.get("m") == r["m"] and "us" in o
                     and o.get("variant") == r["variant"] and o.get("engine") == "mma" and not o.get("repeat")]
            if first:
                noise.append(abs(r["us"] / first[0]["us"] - 1) * 100)
    return {"variants": out, "repeat_spread_pct": {"median": statistics.median(noise) if noise else None,
                                                   "max": max(noise) if noise else None}}


def variant_table(result: dict) -> str:
    """The compact report printed last: per (case, M) each kernel's us/% of floor (mma), the
    fastest and the one the default picks, the simt engine at M = 1, the summary against the
    targets, and parity per kernel and for the default (at the very end, so that a clipped log
    keeps it)."""
    names = skinny.VARIANTS
    lines = ["", "== variants: " + "  ".join(f"v{v}={name}" for v, name in enumerate(names))
             + "; default (dflt): skinny.default_variant"]
    if "bandwidth" in result:
        lines.append(f"copy bandwidth {result['bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s; build "
                     f"{result.get('build_seconds', 0):.0f}s; total {result.get('seconds', 0):.0f}s")
    timing = result.get("timing", [])
    cells = {}
    for r in timing:
        if "variant" in r and not r.get("repeat"):
            cells[(r["case"], r["m"], r["variant"], r["engine"])] = r
    cases = list(dict.fromkeys(r["case"] for r in timing if "m" in r))
    ms = sorted({r["m"] for r in timing if "m" in r})
    shape = {r["case"]: (r["n"], r["k"]) for r in timing if "n" in r}

    def cell(r: dict | None) -> str:
        if r is None:
            return f"{'-':>9}"
        if "us" in r:
            return f"{r['us']:6.1f}/{r['pct_floor']:<2.0f}"[:9].rjust(9)
        return f"{'skip' if 'skipped' in r else 'ERR':>9}"

    lines.append("mma: us/% of floor per variant (best = fastest); case f16s = fp16 sym, b16a = bf16 asym")
    lines.append(f"{'case':<20}{'M':>3}{'floor':>7} " + "".join(f"{'v' + str(v):>9}" for v in range(len(names)))
                 + "  best dflt noise%")
    for case in cases:
        label = case.replace("-fp16-sym", " f16s").replace("-bf16-asym", " b16a").replace("-fp16-asym", " f16a") \
            .replace("-bf16-sym", " b16s")
        for m in ms:
            rs = [cells.get((case, m, v, "mma")) for v in range(len(names))]
            if all(r is None for r in rs):
                continue
            floor = next((r["floor_us"] for r in rs if r is not None and "floor_us" in r), 0.0)
            timed = [(r["us"], v) for v, r in enumerate(rs) if r is not None and "us" in r]
            best = f"v{min(timed)[1]}" if timed else "-"
            rep = [r for r in timing if r.get("case") == case and r.get("m") == m and r.get("repeat") and "us" in r]
            first = cells.get((case, m, rep[0]["variant"], "mma")) if rep else None
            noise = f"{abs(rep[0]['us'] / first['us'] - 1) * 100:.1f}" if rep and first and "us" in first else "-"
            lines.append(f"{label:<20}{m:>3}{floor:7.1f} " + "".join(cell(r) for r in rs)
                         + f"  {best:>4} {'v' + str(skinny.default_variant(m, *shape[case])):>4} {noise:>5}")
    simt = range(len(names))
    lines.append("simt, M = 1: us/% of floor for " + " ".join(f"v{v}" for v in simt))
    for case in cases:
        rs = [cells.get((case, 1, v, "simt")) for v in simt]
        if any(r is not None for r in rs):
            lines.append(f"{case:<28}" + "".join(cell(r) for r in rs))
    summary = result.get("summary", {})
    if summary:
        lines.append("targets: M=1 >= 90% of floor (cases with floor >= 7 us), t(M=16)/t(M=1) <= 1.15")
        for name, sm in summary["variants"].items():
            fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
            tag = "dflt" if sm["variant"] == skinny.DEFAULT_VARIANT else f"v{sm['variant']}"
            lines.append(f"  {tag:<4} {name:<12} min M1 %floor {fmt(sm['min_m1_pct_floor'], '5.1f')}  "
                         f"max t16/t1 {fmt(sm['max_m16_over_m1'], '5.2f')}  geomean %floor "
                         f"{fmt(sm['geomean_pct_floor'], '5.1f')}")
        sp = summary["repeat_spread_pct"]
        if sp["median"] is not None:
            lines.append(f"  one kernel timed twice per (case, M): spread median {sp['median']:.1f}%, "
                         f"max {sp['max']:.1f}%")
    parity = result.get("parity", [])
    for v in [*range(len(names)), skinny.DEFAULT_VARIANT]:
        rows = [r for r in parity if r.get("variant") == v]
        bad = [r for r in rows if not r.get("passed")]
        tag = "dflt" if v == skinny.DEFAULT_VARIANT else f"v{v}"
        line = f"parity {tag} {variant_label(v)}: {len(rows) - len(bad)}/{len(rows)} passed"
        if bad:
            r = bad[0]
            detail = r.get("error") or (r.get("summary") or "").splitlines()[0]
            line += (f"; first failure {r['case']} {r.get('engine', '')} M={r.get('m', '')} {r.get('kind', '')}: "
                     f"{detail[:120]}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def write_variants(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "skinny_variants.json").write_text(json.dumps(result, indent=1, default=str))


def run_variants(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    timing_cases = variant_timing_cases(set(filter(None, args.shapes.split(","))))
    ms = tuple(int(m) for m in args.ms.split(",")) if args.ms else VARIANT_M
    names = args.kernels.split(",") if args.kernels else skinny.VARIANTS
    unknown = set(names) - set(skinny.VARIANTS)
    if unknown:
        raise SystemExit(f"--kernels: unknown {sorted(unknown)}; expected names of {skinny.VARIANTS}")
    kernels = tuple(skinny.VARIANTS.index(k) for k in names)
    if args.dry_run:
        # CPU: the case lists, the parity plumbing per variant (the oracle as a stand-in kernel on
        # small weights), and the report on made-up timings.
        cases = variant_parity_cases()
        log(f"[dry-run] {len(skinny.VARIANTS)} kernels and the default; parity {len(cases)} weights "
            f"({sum(len(c.ms) for c in cases)} mma cells + {len(cases)} simt cells each); timing "
            f"{len(timing_cases)} weights x M {ms} x kernels {[skinny.VARIANTS[v] for v in kernels]}")
        small = [ParityCase(LinearShape("dry", "tiny", 256, 64), "fp16", False, 128, (1, 5), True),
                 ParityCase(LinearShape("dry", "tail", 96, 16), "bf16", True, 32, (1, 16), False)]
        result = {"environment": environment("cpu"), "dry_run": True, "variants": list(skinny.VARIANTS),
                  "bandwidth": {"bytes_per_s": 4.12e12, "seconds": 0.0}}
        result["parity"] = run_variant_parity(reference_stand_in, "cpu", small)
        fake = []
        gen = torch.Generator().manual_seed(0)
        for case in timing_cases:
            for m in ms:
                floor_us = floor_bytes(m, case.k, case.n, 128, case.symmetric) / 4.12e12 * 1e6
                order = timing_order(kernels, m)
                order.append((kernels[0], "mma"))
                for j, (v, engine) in enumerate(order):
                    us = floor_us * (1.1 + float(torch.rand((), generator=gen)))
                    fake.append({"case": case.id, "k": case.k, "n": case.n, "dtype": case.dtype,
                                 "symmetric": case.symmetric, "m": m, "variant": v, "engine": engine,
                                 "variant_name": skinny.VARIANTS[v], "repeat": j == len(order) - 1,
                                 "floor_us": floor_us, "us": us, "pct_floor": 100 * floor_us / us})
        fake[3] = {k: v for k, v in fake[3].items() if k not in ("us", "pct_floor")} | {"error": "dry-run error"}
        result["timing"] = fake
        result["summary"] = variant_summary(fake)
        result["seconds"] = time.perf_counter() - start
        write_variants(result, args.out)
        log(variant_table(result))
        return int(any(not r.get("passed") for r in result["parity"]))

    device = "cuda"
    deadline = start + args.budget_s
    skinny.build(verbose=False)
    result = {"environment": environment(device), "build_seconds": time.perf_counter() - start,
              "variants": list(skinny.VARIANTS)}
    log(f"[build] extension ready in {result['build_seconds']:.1f}s")
    result["bandwidth"] = copy_bandwidth(device)
    log(f"[bandwidth] copy {result['bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s")
    result["parity"] = run_variant_parity(skinny.skinny_matmul, device)
    write_variants(result, args.out)  # keep parity even if timing dies
    skip = failed_variants(result["parity"])
    result["timing"] = run_variant_timing(result["bandwidth"]["bytes_per_s"], device, deadline, skip, timing_cases,
                                          ms, kernels)
    result["summary"] = variant_summary(result["timing"])
    result["seconds"] = time.perf_counter() - start
    write_variants(result, args.out)
    log(f"wrote {args.out / 'skinny_variants.json'}")
    log(variant_table(result))
    return int(bool(skip))


# ---------------------------------------------------------------------------------------------
# Report


def environment(device: str) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "hip": torch.version.hip}
    if device != "cpu":
        env["gpu"] = torch.cuda.get_device_name()
        env["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    return env


def markdown(result: dict) -> str:
    lines = ["# Skinny W4A16 kernel", "", f"Environment: `{json.dumps(result['environment'])}`", "",
             f"Kernel: {result.get('variant', 'default')} (optimized.skinny.VARIANTS; default: the per-M policy)", ""]
    if "bandwidth" in result:
        lines += [f"Copy bandwidth (read + write): {result['bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s", ""]
    for section in ("opcheck", "parity"):
        rows = result.get(section, [])
        failed = [r for r in rows if not r.get("passed")]
        lines += [f"## {section}: {len(rows) - len(failed)} passed, {len(failed)} failed", ""]
        for r in failed[:40]:
            detail = r.get("error") or (r.get("summary") or "").splitlines()[0]
            lines.append(f"- {r['case']} {r.get('engine', '')} M={r.get('m', '')} {r.get('kind', '')}: {detail}")
        lines.append("")
    timing = result.get("timing", [])
    if timing:
        lines += target_lines(target_summary(timing))
        lines += ["## Timing (cold weights, CUDA graph; % of HBM floor, speedup vs dense)", "",
                  "| case | M | floor us | mma us | mma % | simt us | simt % | dense us | mma vs dense |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in timing:
            if "error" in r:
                lines.append(f"| {r['case']} | {r.get('m', '')} | error: {r['error']} |||||||")
                continue
            lines.append(f"| {r['case']} | {r['m']} | {r['floor_us']:.1f} | {r['mma_us']:.1f} | "
                         f"{r['mma_pct_floor']:.0f} | {r['simt_us']:.1f} | {r['simt_pct_floor']:.0f} | "
                         f"{r['dense_us']:.1f} | {r['mma_speedup_vs_dense']:.2f}x |")
    return "\n".join(lines) + "\n"


def target_summary(timing: list[dict], engine: str = "mma") -> dict:
    """Issue 4's targets over a timing table (rows as run_timing writes them): the M = 1 cells with
    a floor >= TARGET_MIN_FLOOR_US and how many reach TARGET_M1_PCT, worst first; each case's
    t(M=16) / t(M=1), worst first. A case missing M = 1 or 16 (or with an error) is left out."""
    by_case: dict[str, dict[int, dict]] = {}
    for r in timing:
        if "error" not in r and f"{engine}_us" in r:
            by_case.setdefault(r["case"], {})[r["m"]] = r
    m1 = sorted(((ms[1][f"{engine}_pct_floor"], case) for case, ms in by_case.items()
                 if 1 in ms and ms[1]["floor_us"] >= TARGET_MIN_FLOOR_US))
    ratios = sorted(((ms[16][f"{engine}_us"] / ms[1][f"{engine}_us"], case) for case, ms in by_case.items()
                     if 1 in ms and 16 in ms), reverse=True)
    return {"engine": engine,
            "m1_cells": [{"case": c, "pct_floor": p} for p, c in m1],
            "m1_met": sum(p >= TARGET_M1_PCT for p, _ in m1),
            "m16_over_m1": [{"case": c, "ratio": r} for r, c in ratios],
            "m16_met": sum(r <= TARGET_M16_RATIO for r, _ in ratios)}


def target_lines(summary: dict) -> list[str]:
    m1, ratios = summary["m1_cells"], summary["m16_over_m1"]
    lines = [f"## Targets ({summary['engine']} engine; issue 4)", "",
             f"- M = 1 at >= {TARGET_M1_PCT:.0f}% of the floor where the floor is >= {TARGET_MIN_FLOOR_US:.0f} us: "
             f"{summary['m1_met']} of {len(m1)} cells"]
    if m1:
        lines.append("  - worst: " + ", ".join(f"{c['case']} {c['pct_floor']:.0f}%" for c in m1[:4]))
    lines.append(f"- t(M = 16) / t(M = 1) <= {TARGET_M16_RATIO}: {summary['m16_met']} of {len(ratios)} cases")
    if ratios:
        lines.append("  - worst: " + ", ".join(f"{c['case']} {c['ratio']:.2f}" for c in ratios[:4]))
    return lines + [""]


def write(result: dict, out: Path) -> None:
    """DIR/skinny_h200.{json,md}, or skinny_h200_<variant>.{json,md} for a forced --variant."""
    out.mkdir(parents=True, exist_ok=True)
    stem = "skinny_h200" if result.get("variant", "default") == "default" else f"skinny_h200_{result['variant']}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    (out / f"{stem}.md").write_text(markdown(result))
    log(f"wrote {out / stem}.json and .md")


def reference_stand_in(x, qweight, scales, zeros, group_size, bias=None, *, engine="auto", variant=-1):
    """For --dry-run: the kernel's interface computed by the oracle on CPU (fp32, rounded once)."""
    from oracle.layouts import KernelWeights

    w = from_kernel_layout(KernelWeights(qweight, scales, zeros, group_size))
    return reference_matmul(x, w, bias, accumulate=torch.float32).y_out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/skinny_h200"))
    parser.add_argument("--sanitize", action="store_true", help="boundary shapes once, for compute-sanitizer")
    parser.add_argument("--dry-run", action="store_true", help="CPU only: case lists, judging and report plumbing")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--variants", action="store_true", help="compare the kernels (parity, timing)")
    parser.add_argument("--budget-s", type=float, default=VARIANT_BUDGET_S,
                        help="--variants: skip timing cells past this many seconds from the start")
    parser.add_argument("--shapes", default="",
                        help="--variants: time these fixture shapes (model.layer names, or 'all') instead of "
                             "VARIANT_SHAPES")
    parser.add_argument("--ms", default="", help="--variants: comma-separated M to time (default VARIANT_M)")
    parser.add_argument("--kernels", default="", help="--variants: comma-separated kernels of optimized.skinny."
                                                      "VARIANTS to time (default: all)")
    parser.add_argument("--variant", choices=("default", *skinny.VARIANTS), default="default",
                        help="parity and timing of one kernel instead of the default policy (results in "
                             "skinny_h200_<variant>.{json,md})")
    args = parser.parse_args()
    variant = skinny.DEFAULT_VARIANT if args.variant == "default" else skinny.VARIANTS.index(args.variant)

    if args.variants:
        return run_variants(args)

    if args.dry_run:
        cases = parity_cases()
        timings = timing_cases()
        log(f"[dry-run] {len(cases)} parity weights, {sum(len(c.ms) for c in cases) * len(ENGINES)} random cells, "
            f"{sum(c.probes for c in cases) * len(ENGINES)} probe runs; {len(timings)} timing cases")
        small = [ParityCase(LinearShape("dry", "tiny", 256, 64, g), d, s, g, (1, 3, 16), True)
                 for g in (32, 128) for d in DTYPES for s in (True, False)]
        result = {"environment": environment("cpu"), "dry_run": True,
                  "parity": run_parity(reference_stand_in, small, "cpu")}
        result["timing"] = [{"case": "dry", "m": 1, "floor_us": floor_bytes(1, 4096, 28672, 128, True) / 4.2e6,
                             "error": "not timed in a dry run"}]
        write(result, args.out)
        return int(any(not r.get("passed") for r in result["parity"]))

    device = "cuda"
    t0 = time.perf_counter()
    skinny.build(verbose=False)
    log(f"[build] extension ready in {time.perf_counter() - t0:.1f}s")
    if args.sanitize:
        return int(run_sanitize(device) > 0)

    result = {"environment": environment(device), "build_seconds": time.perf_counter() - t0, "variant": args.variant}
    result["opcheck"] = run_opcheck(device)
    result["parity"] = run_parity(functools.partial(skinny.skinny_matmul, variant=variant), parity_cases(), device)
    write(result, args.out)  # keep parity even if timing dies
    if not args.skip_timing:
        result["bandwidth"] = copy_bandwidth(device)
        log(f"[bandwidth] copy {result['bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s")
        result["timing"] = run_timing(timing_cases(), result["bandwidth"]["bytes_per_s"], device, variant=variant)
        result["targets"] = target_summary(result["timing"])
        for line in target_lines(result["targets"])[2:]:
            log(f"[targets] {line.strip()}")
    failures = sum(not r.get("passed") for r in result["opcheck"] + result["parity"])
    result["failures"] = failures
    write(result, args.out)
    log(f"[done] {failures} failing parity/opcheck cells in {time.perf_counter() - t0:.0f}s")
    return int(failures > 0)


if __name__ == "__main__":
    sys.exit(main())

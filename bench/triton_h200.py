"""Correctness and speed of the Triton W4A16 kernel on one GPU (written for the H200).

    python bench/triton_h200.py --out DIR             # parity, timing vs peers, tile sweep (< ~8 min)
    compute-sanitizer --tool memcheck python bench/triton_h200.py --sanitize --out DIR
    python bench/triton_h200.py --dry-run --out DIR   # CPU: case lists and floors, no kernel runs
    python bench/triton_h200.py --sections variants --out DIR            # candidate sweep (~4 min)
    python bench/triton_h200.py --sections variants --dry-run --out DIR  # CPU: its plan and protocol

(a) Parity: oracle.shapes.unique_shapes() x DECODE_BATCHES + PREFILL_BATCHES x fp16/bf16 x
    sym/asym at G = 128, judged against the fp64 reference computed on the GPU (error model,
    dequant into the activation dtype with one rounding, plain torch baseline), plus exact probes
    at a subset of M. Verdict failures, probe mismatches and errors are counted per cell.
(b) Timing (DESIGN.md section 5), bf16, asymmetric, G = 128: cold weights (rotating copies
    totalling over 500 MiB), a CUDA graph of R back-to-back calls each on its own copy, per-call
    time = replay / R, median of replays; a single call after an L2 flush as a secondary column.
    Floors: bytes / measured HBM bandwidth and 2MNK / measured dense bf16 rate; each timing is
    reported as % of the larger floor and against dense cuBLAS, torch tinygemm and gemlite (when
    importable) measured in the same run. M in {1, 2, 3, 4, 8, 16} on the Llama shapes, {1, 16}
    on every shape, {1024, 2048, 4096} against dense cuBLAS on the Llama shapes.
(c) Tile sweep at M = 1 and M = 16 on the Llama shapes: a handful of candidate configs per
    shape; prints the best per M bucket (geometric mean of % of floor) for tile_configs.HOPPER.

(d) Variants (only when asked for): every candidate of VARIANT_CANDIDATES (tile shapes, K-tiles
    of several quant groups, multi-row GEMV, swapped tensor-core operands, half dequant) is first
    checked for correctness in a child process (2 small cases judged by the oracle, bit-exact
    repeat), then timed like (b) on four large shapes at M = 1, 4, 16 (decode candidates),
    32..256 (mid) or 4096 (prefill) next to dense cuBLAS and tinygemm; writes
    DIR/triton_variants.json and .md and prints the table and the best candidates per M.

Each section has a share of --budget-s and records the cells it had no time for; every cell
catches its own exception. Writes DIR/triton_h200.json and DIR/triton_h200.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from itertools import product
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cuda_timing import graph_seconds  # noqa: E402
from optimized.tile_configs import HOPPER, TileConfig, check_config, fit_config, select_config  # noqa: E402
from optimized.triton_w4a16 import device_name, w4a16_matmul  # noqa: E402
from oracle import judge, plain_torch_matmul, random_quantized, reference_matmul, run_probes  # noqa: E402
from oracle.canonical import QuantizedWeight  # noqa: E402
from oracle.layouts import KernelWeights, to_kernel_layout, to_tinygemm  # noqa: E402
from oracle.probes import probe_scales  # noqa: E402
from oracle.quantize import quantize_rtn  # noqa: E402
from oracle.shapes import DECODE_BATCHES, PREFILL_BATCHES, LinearShape, unique_shapes  # noqa: E402

DEVICE = "cuda"  # ROCm builds of torch answer to "cuda" too
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GROUP = 128
LLAMA = ("llama3.1-8b", "llama3.3-70b")
PARITY_M = DECODE_BATCHES + PREFILL_BATCHES
# Probe rows per kernel call, and the (dtype, symmetry) combinations each runs on: every combination
# through prefill tiles; one through the 16-row split-K tiles (one call per 16 of the up to K
# probe rows, the costly part); the GEMV (one row per call) only on GEMV_PROBE_SHAPES.
PROBE_PLAN = {4096: None, 16: (("bf16", False),), 1: (("bf16", False),)}
GEMV_PROBE_SHAPES = ("boundary.k_eq_g", "llama3.1-8b.gate_up")
DECODE_M_LLAMA = (1, 2, 3, 4, 8, 16)
DECODE_M_ALL = (1, 16)
PREFILL_M = (1024, 2048, 4096)
COLD_BYTES = 640 << 20     # weight copies rotated per timing graph: over 10x the 60 MB L2
MAX_COPIES = 256
REPLAYS = 7
TARGET_REPLAY_S = 2e-3     # calls per graph: enough for ~2 ms per replay, at least one per copy
FLUSH_BYTES = 256 << 20    # written before each secondary (single-call) timing
# What the dry run assumes; a real run measures both (DESIGN.md section 5).
NOMINAL_BANDWIDTH = 4.25e12
NOMINAL_DENSE_RATE = 680e12
# Default seconds per section; --budget-s rescales them in proportion. variants stays within
# ~240 s on the H200 with start-up and the bandwidth and dense-rate measurements.
SECTION_SECONDS = {"parity": 202.5, "timing": 157.5, "sweep": 90.0, "variants": 200.0}

T = TileConfig
SWEEP_M = (1, 16)
SWEEP_CANDIDATES = {
    1: (T(1, 64, 128, 8, 4, 3), T(1, 128, 128, 1, 4, 3), T(1, 128, 128, 4, 4, 3), T(1, 128, 128, 8, 4, 3),
        T(1, 256, 128, 4, 4, 3), T(1, 256, 128, 8, 8, 3), T(1, 128, 128, 8, 4, 1), T(16, 64, 128, 8, 4, 4)),
    16: (T(16, 32, 128, 8, 4, 4), T(16, 64, 128, 1, 4, 4), T(16, 64, 128, 4, 4, 4), T(16, 64, 128, 8, 4, 4),
         T(16, 128, 128, 4, 4, 3), T(16, 128, 128, 8, 8, 3), T(16, 64, 128, 8, 4, 2), T(16, 64, 64, 8, 4, 4)),
}


def log(msg: str) -> None:
    print(msg, flush=True)


def error_text(e: BaseException) -> str:
    frames = traceback.format_exception(e)
    return f"{type(e).__name__}: {e}".strip()[:600] + " | " + "".join(frames[-3:-1]).replace("\n", " ")[-400:]


class Clock:
    """Cumulative deadlines: a section that finishes early leaves its time to the next."""

    def __init__(self, budget_s: float | None, sections: list[str]):
        self.start = time.perf_counter()
        self.deadline, spent = {}, 0.0
        total = sum(SECTION_SECONDS[s] for s in sections)
        budget_s = total if budget_s is None else budget_s
        for s in sections:
            spent += budget_s * SECTION_SECONDS[s] / total
            self.deadline[s] = self.start + spent

    def expired(self, section: str) -> bool:
        return time.perf_counter() > self.deadline[section]

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


# ---------------------------------------------------------------------------------------------
# Bytes, FLOPs and floors


def w4_bytes(m: int, k: int, n: int, group: int = GROUP, symmetric: bool = False) -> int:
    """Bytes a W4A16 call must move: packed weight, scales, zero points, x and y (16-bit)."""
    groups = k // group
    return k * n // 2 + n * groups * 2 + (0 if symmetric else n * groups // 2) + 2 * m * k + 2 * m * n


def dense_bytes(m: int, k: int, n: int) -> int:
    return 2 * k * n + 2 * m * k + 2 * m * n


def floors_us(m: int, k: int, n: int, bandwidth: float, dense_rate: float) -> dict:
    """Memory floor of the W4 call, compute floor at the dense bf16 rate, and the larger."""
    memory = w4_bytes(m, k, n) / bandwidth * 1e6
    compute = 2 * m * n * k / dense_rate * 1e6
    return {"memory_floor_us": memory, "compute_floor_us": compute, "floor_us": max(memory, compute)}


def timing_cells(shapes: list[LinearShape]) -> list[tuple[str, LinearShape, int]]:
    """(kind, shape, M): Llama decode first (the headline), then M = 1, 16 elsewhere, then prefill."""
    llama = [s for s in shapes if s.model in LLAMA]
    cells = [("decode", s, m) for s in llama for m in DECODE_M_LLAMA]
    cells += [("decode", s, m) for s in shapes if s.model not in LLAMA for m in DECODE_M_ALL]
    cells += [("prefill", s, m) for s in llama for m in PREFILL_M]
    return cells


def probe_batches(shape: LinearShape, dtype: str, symmetric: bool) -> list[int]:
    out = []
    for max_m, combos in PROBE_PLAN.items():
        if max_m == 1 and f"{shape.model}.{shape.layer}" not in GEMV_PROBE_SHAPES:
            continue
        if combos is None or (dtype, symmetric) in combos:
            out.append(max_m)
    return out


# ---------------------------------------------------------------------------------------------
# Weights


def make_weight(shape: LinearShape, symmetric: bool, dtype: torch.dtype, generator: torch.Generator) -> QuantizedWeight:
    """RTN-quantized Gaussian weight drawn on the GPU (the CPU path is slow at 470M values)."""
    w = torch.randn(shape.n, shape.k, device=DEVICE, generator=generator) * 0.02
    return quantize_rtn(w, GROUP, symmetric, dtype)


def probe_twin(w: QuantizedWeight, dtype: torch.dtype, generator: torch.Generator) -> QuantizedWeight:
    """The same q and zero points with probe scales (4 significant bits): exact outputs."""
    scales = probe_scales(w.n, w.num_groups, w.group, dtype, generator).to(w.q.device)
    return QuantizedWeight(w.q, scales, w.zeros, w.group_size)


def kernel_fn(w: QuantizedWeight, dtype: torch.dtype, config: TileConfig | None = None):
    kw = to_kernel_layout(w, dtype)
    return lambda x, bias=None: w4a16_matmul(x, kw.qweight, kw.scales, kw.zeros, kw.group_size, bias, config=config)


# ---------------------------------------------------------------------------------------------
# (a) Parity


def run_parity(shapes: list[LinearShape], clock: Clock, seed: int) -> dict:
    """Two passes over every (shape, dtype, symmetry): decode batches and the probes first, then
    prefill batches (the costly ones), so a run cut short by the budget still covers decode."""
    cells, probes, skipped = [], [], 0
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    name = device_name(torch.device(DEVICE))
    combos = list(product(shapes, DTYPES, (True, False)))
    for batches, with_probes in ((DECODE_BATCHES, True), (PREFILL_BATCHES, False)):
        for shape, dname, symmetric in combos:
            dtype = DTYPES[dname]
            combo = {"shape": shape.id, "k": shape.k, "n": shape.n, "dtype": dname,
                     "symmetric": symmetric, "group": GROUP}
            if clock.expired("parity"):
                skipped += len(batches)
                continue
            t0, first = time.perf_counter(), len(cells)
            try:
                w = make_weight(shape, symmetric, dtype, gen)
                kernel = kernel_fn(w, dtype)
                # Bias with asymmetric weights only: both epilogues covered, half the compilations.
                bias = None if symmetric else (0.5 * torch.randn(shape.n, device=DEVICE, generator=gen)).to(dtype)
            except Exception as e:  # noqa: BLE001 - recorded per cell, the run goes on
                cells.append({**combo, "error": error_text(e)})
                continue
            for m in batches:
                cell = {**combo, "m": m, "bias": bias is not None,
                        "config": select_config(m, shape.n, shape.k, GROUP, name).id}
                try:
                    x = torch.randn(m, shape.k, device=DEVICE, generator=gen).to(dtype)
                    out = kernel(x, bias)
                    ref = reference_matmul(x, w, bias, accumulate=torch.float64)
                    v = judge(out, ref, dequant_dtype=dtype, dequant_roundings=1,
                              baseline=plain_torch_matmul(x, w, bias))
                    cell.update(passed=v.passed, worst_ratio=v.worst_ratio, violations=v.violations,
                                hard_violations=v.hard_violations, max_abs_error=v.max_abs_error,
                                baseline_worst_ratio=v.baseline_worst_ratio,
                                summary=None if v.passed else v.summary())
                except Exception as e:  # noqa: BLE001
                    cell["error"] = error_text(e)
                cells.append(cell)
            for max_m in probe_batches(shape, dname, symmetric) if with_probes else ():
                row = {**combo, "max_m": max_m}
                try:
                    pw = probe_twin(w, dtype, cpu_gen)
                    r = run_probes(kernel_fn(pw, dtype), pw, dtype, bias=bias, max_m=max_m, generator=cpu_gen)
                    row.update(rows=r.rows, mismatches=r.mismatches, summary=None if r.passed else r.summary())
                except Exception as e:  # noqa: BLE001
                    row["error"] = error_text(e)
                probes.append(row)
            del w, kernel
            torch.cuda.empty_cache()
            bad = sum(1 for c in cells[first:] if not c.get("passed"))
            log(f"[{clock.elapsed():6.1f}s] parity {shape.id} {dname} {'sym' if symmetric else 'asym'} "
                f"M={batches[0]}..{batches[-1]}: {bad} failed, {time.perf_counter() - t0:.1f}s")
    return {"cells": cells, "probes": probes, "skipped_cells": skipped,
            "failed_cells": sum(1 for c in cells if not c.get("passed")),
            "probe_mismatches": sum(p.get("mismatches", 0) for p in probes),
            "probe_errors": sum(1 for p in probes if "error" in p)}


# ---------------------------------------------------------------------------------------------
# (b) Timing


def hbm_bandwidth() -> dict:
    """Bytes per second of a 2 GiB device copy (read + write) and of a 2 GiB read-only sum; the
    floors use the larger, the stricter floor."""
    src = torch.empty(1 << 31, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    words = src.view(torch.int32)
    copy_s = event_seconds(lambda: dst.copy_(src), reps=12)
    read_s = event_seconds(lambda: words.sum(), reps=12)
    copy_bw, read_bw = 2 * (1 << 31) / copy_s, (1 << 31) / read_s
    return {"copy_bytes_per_s": copy_bw, "read_bytes_per_s": read_bw, "bytes_per_s": max(copy_bw, read_bw)}


def dense_rate() -> float:
    """bf16 FLOP/s of an 8192^3 cuBLAS matmul on random data."""
    a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    s = event_seconds(lambda: a @ b, reps=10)
    return 2 * 8192**3 / s


def event_seconds(fn: Callable[[], object], reps: int, flush: torch.Tensor | None = None) -> float:
    """Median seconds of single calls between events (after an L2 flush when given)."""
    fn()
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return statistics.median(times)


def copies_for(bytes_per_copy: int) -> int:
    return max(2, min(MAX_COPIES, math.ceil(COLD_BYTES / bytes_per_copy)))


def inner_k_tiles(k: int) -> int:
    """tinygemm's innerKTiles: the largest of 8, 4, 2 its K-tiling accepts."""
    return next((t for t in (8, 4, 2) if k % (t * 32) == 0), 2)


def kernel_copies(w: QuantizedWeight, copies: int) -> list[KernelWeights]:
    kw = to_kernel_layout(w, torch.bfloat16)
    return [KernelWeights(kw.qweight.clone(), kw.scales.clone(), None if kw.zeros is None else kw.zeros.clone(),
                          kw.group_size) for _ in range(copies)]


def triton_calls(kws: list[KernelWeights], config: TileConfig | None = None):
    return [lambda x, kw=kw: w4a16_matmul(x, kw.qweight, kw.scales, kw.zeros, kw.group_size, config=config)
            for kw in kws]


def triton_provider(w: QuantizedWeight, copies: int):
    return triton_calls(kernel_copies(w, copies))


def dense_provider(w: QuantizedWeight, copies: int):
    dense = w.dequantize(torch.float32).to(torch.bfloat16)
    weights = [dense.clone() for _ in range(copies)]
    return [lambda x, d=d: torch.nn.functional.linear(x, d) for d in weights]


def tinygemm_provider(w: QuantizedWeight, copies: int):
    t = to_tinygemm(w)
    packed = torch.ops.aten._convert_weight_to_int4pack(t["weight_uint8"], inner_k_tiles(w.k))
    pairs = [(packed.clone(), t["scales_and_zeros"].clone()) for _ in range(copies)]
    return [lambda x, p=p, sz=sz: torch.ops.aten._weight_int4pack_mm(x, p, GROUP, sz) for p, sz in pairs]


def gemlite_provider(w: QuantizedWeight, copies: int):
    import gemlite  # lazily: it touches the GPU at import

    config = Path(gemlite.__file__).parent / "configs" / "h100.json"
    if config.exists() and hasattr(gemlite, "load_config"):
        gemlite.load_config(str(config))
    base = gemlite.helper.A16W4_HQQ_INT(device=DEVICE, dtype=torch.bfloat16).from_weights(
        w.q, w.scales, w.zeros_or_default().to(torch.bfloat16))
    layers = [base] + [copy.deepcopy(base) for _ in range(copies - 1)]
    return [lambda x, layer=layer: layer(x) for layer in layers]


# name -> (build(w, copies), bytes per copy(k, n), dequant roundings for the judge)
PROVIDERS = {
    "triton": (triton_provider, lambda k, n: w4_bytes(0, k, n), 1),
    "dense": (dense_provider, lambda k, n: 2 * k * n, 1),
    "tinygemm": (tinygemm_provider, lambda k, n: k * n // 2 + 4 * n * (k // GROUP), 2),
    "gemlite": (gemlite_provider, lambda k, n: w4_bytes(0, k, n), 2),
}


def build_providers(w: QuantizedWeight, shape_id: str, gen: torch.Generator,
                    checks: list[dict]) -> dict[str, list[Callable] | str]:
    """Each peer's calls on its cold copies (or the error that stopped it), after judging its
    output once at M = 16 (appended to `checks`)."""
    providers: dict[str, list[Callable] | str] = {}
    x = torch.randn(16, w.k, device=DEVICE, generator=gen).to(torch.bfloat16)
    ref = reference_matmul(x, w, accumulate=torch.float64)
    for name, (build, copy_bytes, roundings) in PROVIDERS.items():
        try:
            fns = build(w, copies_for(copy_bytes(w.k, w.n)))
            v = judge(fns[0](x), ref, dequant_dtype=torch.bfloat16, dequant_roundings=roundings)
            checks.append({"shape": shape_id, "provider": name, "passed": v.passed, "summary": v.summary()})
            providers[name] = fns
        except Exception as e:  # noqa: BLE001
            providers[name] = error_text(e)
    return providers


def time_provider(fns: list[Callable], x: torch.Tensor, flush: torch.Tensor) -> dict:
    single = event_seconds(lambda: fns[0](x), reps=5, flush=flush)
    calls = max(len(fns), min(4 * MAX_COPIES, math.ceil(TARGET_REPLAY_S / single)))
    per_call = graph_seconds([lambda f=f: f(x) for f in fns], calls, REPLAYS)
    return {"graph_us": per_call * 1e6, "event_us": single * 1e6, "calls": calls}


def run_timing(shapes: list[LinearShape], clock: Clock, bandwidth: float, rate: float, seed: int) -> dict:
    rows, skipped, checks = [], 0, []
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=DEVICE)
    cells = timing_cells(shapes)
    by_shape: dict[str, list[tuple[str, LinearShape, int]]] = {}
    for cell in cells:
        by_shape.setdefault(cell[1].id, []).append(cell)
    for shape_id, shape_cells in by_shape.items():
        shape = shape_cells[0][1]
        if clock.expired("timing"):
            skipped += len(shape_cells)
            continue
        t0 = time.perf_counter()
        try:
            providers = build_providers(make_weight(shape, False, torch.bfloat16, gen), shape_id, gen, checks)
        except Exception as e:  # noqa: BLE001
            providers = dict.fromkeys(PROVIDERS, error_text(e))
        for kind, _, m in shape_cells:
            base = {"kind": kind, "shape": shape_id, "k": shape.k, "n": shape.n, "m": m,
                    **floors_us(m, shape.k, shape.n, bandwidth, rate)}
            names = ("triton", "dense") if kind == "prefill" else tuple(PROVIDERS)
            x = torch.randn(m, shape.k, device=DEVICE, generator=gen).to(torch.bfloat16)
            for name in names:
                row = {**base, "provider": name, "copies": 0}
                fns = providers.get(name)
                if isinstance(fns, str):
                    row["error"] = fns
                else:
                    row["copies"] = len(fns)
                    row["cold_bytes"] = len(fns) * PROVIDERS[name][1](shape.k, shape.n)
                    try:
                        row.update(time_provider(fns, x, flush))
                        row["pct_of_floor"] = 100 * row["floor_us"] / row["graph_us"]
                        if name == "dense":
                            row["pct_of_own_floor"] = 100 * dense_bytes(m, shape.k, shape.n) / bandwidth * 1e6 \
                                / row["graph_us"]
                    except Exception as e:  # noqa: BLE001
                        row["error"] = error_text(e)
                rows.append(row)
            mine = next((r for r in rows[-len(names):] if r["provider"] == "triton" and "graph_us" in r), None)
            if mine:
                for r in rows[-len(names):]:
                    if r["provider"] != "triton" and "graph_us" in r:
                        mine[f"speedup_vs_{r['provider']}"] = r["graph_us"] / mine["graph_us"]
        del providers
        torch.cuda.empty_cache()
        log(f"[{clock.elapsed():6.1f}s] timing {shape_id}: {len(shape_cells)} cells, {time.perf_counter() - t0:.1f}s")
    return {"rows": rows, "peer_checks": checks, "skipped_cells": skipped}


# ---------------------------------------------------------------------------------------------
# (c) Tile sweep


def run_sweep(shapes: list[LinearShape], clock: Clock, bandwidth: float, rate: float, seed: int) -> dict:
    rows, skipped = [], 0
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    name = device_name(torch.device(DEVICE))
    for shape in [s for s in shapes if s.model in LLAMA]:
        if clock.expired("sweep"):
            skipped += 1
            continue
        copies = copies_for(w4_bytes(0, shape.k, shape.n))
        try:
            kws = kernel_copies(make_weight(shape, False, torch.bfloat16, gen), copies)
        except Exception as e:  # noqa: BLE001
            rows.append({"shape": shape.id, "error": error_text(e)})
            continue
        for m in SWEEP_M:
            x = torch.randn(m, shape.k, device=DEVICE, generator=gen).to(torch.bfloat16)
            floor = floors_us(m, shape.k, shape.n, bandwidth, rate)["floor_us"]
            table = select_config(m, shape.n, shape.k, GROUP, name)
            for label, cfg in [("table", table)] + [("candidate", c) for c in SWEEP_CANDIDATES[m]]:
                row = {"shape": shape.id, "m": m, "config": cfg.id, "source": label}
                try:
                    fns = triton_calls(kws, cfg)
                    per_call = graph_seconds([lambda f=f: f(x) for f in fns], max(copies, 32), REPLAYS)
                    row.update(graph_us=per_call * 1e6, pct_of_floor=100 * floor / (per_call * 1e6))
                except Exception as e:  # noqa: BLE001
                    row["error"] = error_text(e)
                rows.append(row)
        del kws
        torch.cuda.empty_cache()
        log(f"[{clock.elapsed():6.1f}s] sweep {shape.id}")
    return {"rows": rows, "best": best_per_bucket(rows), "skipped_shapes": skipped}


def best_per_bucket(rows: list[dict]) -> dict:
    """Per M: the candidate with the best geometric mean of % of floor over the shapes it ran on
    (shapes where any candidate failed count against it), and the per-shape winners."""
    out = {}
    for m in SWEEP_M:
        at_m = [r for r in rows if r.get("m") == m and r["source"] == "candidate"]
        shapes = sorted({r["shape"] for r in at_m})
        scores = {}
        for cfg in sorted({r["config"] for r in at_m}):
            pcts = [r.get("pct_of_floor", 0.0) for r in at_m if r["config"] == cfg]
            if len(pcts) == len(shapes) and all(p > 0 for p in pcts):
                scores[cfg] = math.exp(statistics.fmean(math.log(p) for p in pcts))
        per_shape = {}
        for s in shapes:
            ok = [r for r in at_m if r["shape"] == s and "pct_of_floor" in r]
            if ok:
                win = max(ok, key=lambda r: r["pct_of_floor"])
                per_shape[s] = {"config": win["config"], "pct_of_floor": win["pct_of_floor"]}
        table = [r for r in rows if r.get("m") == m and r["source"] == "table" and "pct_of_floor" in r]
        out[str(m)] = {
            "best": max(scores, key=scores.get) if scores else None,
            "geomean_pct": scores,
            "table_geomean_pct": math.exp(statistics.fmean(math.log(r["pct_of_floor"]) for r in table))
            if table else None,
            "per_shape": per_shape,
        }
    return out


# ---------------------------------------------------------------------------------------------
# (d) Variants: candidate tile configs and kernel paths, checked in subprocesses, timed here

V = TileConfig
# Each group of candidates runs at its VARIANT_M. The first of each group is the current
# HOPPER-table config (mid: the first four, one per bucket), the baseline. split_k is an upper
# bound: `fit_config` with HOPPER's target_programs and SPLIT_BELOW picks the split per shape.
VARIANT_CANDIDATES: dict[str, tuple[TileConfig, ...]] = {
    "decode": (
        # GEMV (CUDA cores), one row of x: the table's tile, taller N-tiles of one group (each x
        # value reused over more rows of a thread), more K-splits (more loads in flight).
        V(1, 128, 128, 8, 4, 1),
        V(1, 256, 128, 8, 4, 1),
        V(1, 128, 128, 16, 4, 1),
        V(1, 256, 128, 32, 4, 1),
        V(1, 64, 256, 8, 4, 1),
        # GEMV, several rows of x per program (each dequantized weight reused per row).
        V(2, 128, 128, 16, 4, 1, path="gemv"),
        V(4, 64, 128, 16, 4, 1, path="gemv"),
        # Tensor cores, the weight tile as the A operand (wgmma from registers on Hopper).
        V(16, 128, 128, 8, 4, 4, path="dot_swap", dequant="half"),
        V(16, 64, 128, 32, 4, 4, path="dot_swap", dequant="half"),
        V(16, 128, 128, 32, 4, 4, path="dot_swap", dequant="half"),
        V(16, 64, 256, 16, 4, 4, path="dot_swap", dequant="half"),
    ),
    # M = 17..256, the weakest range on the H200 (8-26% of the floor at M = 128, below gemlite,
    # in the first sweep). The 32 and 64 bucket configs and the 128 and 256 buckets' configs before
    # that sweep first, then more programs per SM (narrower N-tiles, split-K) and deeper K-tiles
    # (the seventh, 128x64x128 split 2, is the table's 65..256 bucket since), all on the swapped
    # half-dequant path, which Triton 3.6 compiles at every group size.
    "mid": (
        V(32, 64, 128, 4, 4, 4, path="dot_swap", dequant="half"),
        V(64, 64, 128, 2, 4, 3, path="dot_swap", dequant="half"),
        V(64, 128, 64, 1, 4, 4, path="dot_swap", dequant="half"),
        V(128, 128, 64, 1, 8, 3, path="dot_swap", dequant="half"),
        V(64, 64, 128, 4, 4, 3, path="dot_swap", dequant="half"),
        V(64, 128, 128, 2, 4, 3, path="dot_swap", dequant="half"),
        V(128, 64, 128, 2, 4, 3, path="dot_swap", dequant="half"),
        V(128, 128, 64, 2, 8, 3, path="dot_swap", dequant="half"),
        V(32, 64, 256, 4, 4, 3, path="dot_swap", dequant="half"),
        V(128, 128, 128, 1, 8, 3, path="dot_swap", dequant="half"),
    ),
    "prefill": (
        V(128, 128, 64, 1, 8, 4),
        V(128, 128, 128, 1, 8, 3, dequant="half"),
        V(128, 256, 64, 1, 8, 3, dequant="half"),
        V(256, 128, 64, 1, 8, 3, dequant="half"),
        V(256, 128, 64, 1, 8, 3, path="dot_swap", dequant="half"),
        V(128, 128, 128, 1, 8, 3, path="dot_swap", dequant="half"),
        V(128, 128, 256, 1, 8, 2, dequant="half"),
    ),
}
VARIANT_SHAPES = ((4096, 28672), (8192, 57344), (28672, 8192), (8192, 10240))  # (K, N)
VARIANT_M = {"decode": (1, 4, 16), "mid": (32, 64, 128, 256), "prefill": (4096,)}
# Peers timed per shape: tinygemm only at decode M (it is a GEMV kernel).
VARIANT_PEERS = {"dense": (1, 4, 16, 32, 64, 128, 256, 4096), "tinygemm": (1, 4, 16), "gemlite": (1, 4, 16)}
SPLIT_BELOW = 2 * 132  # no split-K once the N-tiles are twice the H200's SMs
# Correctness before timing, bf16 asymmetric without bias (the timed specialization, so the check
# compiles what the timing runs): (K, N, M, force no split). N is a multiple of 16 (as every timed
# N, so Triton specializes the same way) but of no tile width.
VARIANT_CHECKS = {"decode": ((2048, 1040, 3, False), (1024, 2064, 16, True)),
                  "mid": ((2048, 1040, 33, False), (1024, 2064, 200, True)),
                  "prefill": ((2048, 1040, 300, False), (1024, 2064, 1000, True))}
# The dry run checks a few candidates through the interpreter on tiny shapes (K = 2 block_k).
DRY_CHECKS = {"decode": ((80, 3, False), (48, 16, True)), "mid": ((80, 20, False), (48, 33, True)), "prefill": ((80, 40, False), (48, 20, True))}
DRY_CANDIDATES = (("decode", 6), ("decode", 9), ("mid", 2), ("prefill", 4))
CHECK_WORKERS = 8
CHECK_TIMEOUT_S = 150.0
VARIANTS_CHECK_SHARE = 0.45  # of the variants budget, at most, for the checks


def variant_list(kinds: tuple[str, ...] = tuple(VARIANT_CANDIDATES)) -> list[tuple[str, int, TileConfig]]:
    return [(kind, i, cfg) for kind, cfgs in VARIANT_CANDIDATES.items() if kind in kinds for i, cfg in enumerate(cfgs)]


def variant_fit(cfg: TileConfig, n: int, k: int) -> TileConfig:
    return fit_config(cfg, n, k, GROUP, HOPPER.target_programs, SPLIT_BELOW)


def variant_plan() -> dict:
    """Every candidate fitted to every timed shape (validity checked), and the cells to time."""
    cells, fitted = [], {}
    for kind, i, cfg in variant_list():
        for k, n in VARIANT_SHAPES:
            f = variant_fit(cfg, n, k)
            check_config(f, k, GROUP)
            fitted[f"{kind}:{i}:K{k}xN{n}"] = f.id
            cells += [{"kind": kind, "index": i, "candidate": cfg.id, "k": k, "n": n, "m": m, "fitted": f.id}
                      for m in VARIANT_M[kind]]
        for k, n, m, no_split in VARIANT_CHECKS[kind]:
            f = variant_fit(cfg, n, k)
            check_config(replace(f, split_k=1) if no_split else f, k, GROUP)
    peers = [{"provider": p, "k": k, "n": n, "m": m} for k, n in VARIANT_SHAPES for p, ms in VARIANT_PEERS.items()
             for m in ms]
    return {"candidates": len(variant_list()), "cells": cells, "peer_cells": peers, "fitted": fitted}


def variant_check(kind: str, index: int, dry: bool) -> dict:
    """One candidate's correctness cases (run in a child process: a faulting kernel cannot take
    the timing process's CUDA context down with it), judged like the parity section."""
    cfg = VARIANT_CANDIDATES[kind][index]
    device = "cpu" if dry else DEVICE
    gen = torch.Generator().manual_seed(index + 101 * len(kind))
    out = {"kind": kind, "index": index, "candidate": cfg.id, "cases": []}
    t0 = time.perf_counter()
    if dry:
        cases = [(2 * max(cfg.block_k, GROUP), n, m, ns) for n, m, ns in DRY_CHECKS[kind]]
    else:
        cases = VARIANT_CHECKS[kind]
    for k, n, m, no_split in cases:
        case = {"k": k, "n": n, "m": m}
        try:
            f = variant_fit(cfg, n, k)
            f = replace(f, split_k=1) if no_split else f
            case["config"] = f.id
            w = random_quantized(n, k, GROUP, False, torch.bfloat16, generator=gen).to(device)
            kw = to_kernel_layout(w, torch.bfloat16)
            x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(device)
            y = w4a16_matmul(x, kw.qweight, kw.scales, kw.zeros, kw.group_size, config=f)
            again = w4a16_matmul(x, kw.qweight, kw.scales, kw.zeros, kw.group_size, config=f)
            v = judge(y, reference_matmul(x, w, None, accumulate=torch.float64), dequant_dtype=torch.bfloat16,
                      dequant_roundings=1, baseline=plain_torch_matmul(x, w, None))
            case.update(passed=bool(v.passed and torch.equal(y, again)), deterministic=bool(torch.equal(y, again)),
                        worst_ratio=v.worst_ratio, hard_violations=v.hard_violations,
                        summary=None if v.passed else v.summary())
        except Exception as e:  # noqa: BLE001 - recorded, the candidate is dropped from timing
            case.update(passed=False, error=error_text(e))
        out["cases"].append(case)
    out["passed"] = all(c.get("passed") for c in out["cases"])
    out["seconds"] = time.perf_counter() - t0
    return out


def check_variants(todo: list[tuple[str, int]], deadline: float, dry: bool) -> dict[tuple[str, int], dict]:
    """Run `variant_check` for each (kind, index) in child processes, CHECK_WORKERS at a time;
    their Triton compilations land in the on-disk cache the timing process then reads."""
    results: dict[tuple[str, int], dict] = {}
    env = dict(os.environ)
    if dry:
        env["TRITON_INTERPRET"] = "1"
    pending, running = list(todo), {}
    while pending or running:
        while pending and len(running) < (1 if dry else CHECK_WORKERS) and time.perf_counter() < deadline:
            kind, index = pending.pop(0)
            cmd = [sys.executable, str(Path(__file__).resolve()), "--variant-check", f"{kind}:{index}", "--out", "."]
            if dry:
                cmd.append("--dry-run")
            # Files, not pipes: a child that writes more than a pipe holds must not block.
            logs = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))
            proc = subprocess.Popen(cmd, stdout=logs[0], stderr=logs[1], text=True, env=env)
            running[(kind, index)] = (proc, time.perf_counter(), logs)
        if not running:
            break
        time.sleep(0.2)
        for key, (proc, started, logs) in list(running.items()):
            late = time.perf_counter() - started > CHECK_TIMEOUT_S or time.perf_counter() > deadline + 30
            if proc.poll() is None and not late:
                continue
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            stdout, stderr = (f.seek(0) or f.read() for f in logs)
            for f in logs:
                f.close()
            line = next((ln for ln in stdout.splitlines() if ln.startswith(CHECK_TAG)), None)
            if line is not None:
                results[key] = json.loads(line[len(CHECK_TAG):])
            else:
                results[key] = {"kind": key[0], "index": key[1], "candidate": VARIANT_CANDIDATES[key[0]][key[1]].id,
                                "passed": False, "error": ("timed out; " if late else "") +
                                f"exit {proc.returncode}: {stderr[-1500:]}"}
            del running[key]
    for key in pending:
        results[key] = {"kind": key[0], "index": key[1], "candidate": VARIANT_CANDIDATES[key[0]][key[1]].id,
                        "passed": False, "error": "not checked (time budget)"}
    return results


CHECK_TAG = "VARIANT_CHECK "


def run_variants(clock: Clock, bandwidth: float, rate: float, seed: int,
                 kinds: tuple[str, ...] = tuple(VARIANT_CANDIDATES)) -> dict:
    plan = variant_plan()
    start = time.perf_counter()
    budget = clock.deadline["variants"] - start
    checks = check_variants([(kind, i) for kind, i, _ in variant_list(kinds)],
                            start + VARIANTS_CHECK_SHARE * budget, dry=False)
    passed = [(kind, i, cfg) for kind, i, cfg in variant_list(kinds) if checks[(kind, i)].get("passed")]
    log(f"[{clock.elapsed():6.1f}s] variants: {len(passed)} of {len(checks)} candidates passed their checks "
        f"({time.perf_counter() - start:.1f}s)")
    for key, c in checks.items():
        if not c.get("passed"):
            why = c.get("error") or next((x.get("error") or x.get("summary") for x in c.get("cases", [])
                                          if not x.get("passed")), "")
            log(f"  check failed {key[0]}:{key[1]} {c['candidate']}: {str(why)[:300]}")
    rows, peers, skipped = [], [], 0
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=DEVICE)
    for k, n in VARIANT_SHAPES:
        shape = LinearShape("variants", "shape", k, n)
        if clock.expired("variants"):
            skipped += 1
            continue
        t0 = time.perf_counter()
        xs = {m: torch.randn(m, k, device=DEVICE, generator=gen).to(torch.bfloat16)
              for m in sorted({m for ms in VARIANT_M.values() for m in ms})}
        try:
            w = make_weight(shape, False, torch.bfloat16, gen)
            kws = kernel_copies(w, copies_for(w4_bytes(0, k, n)))
        except Exception as e:  # noqa: BLE001
            rows.append({"k": k, "n": n, "error": error_text(e)})
            continue
        timed_m = {m for kind in kinds for m in VARIANT_M[kind]}
        for name, all_ms in VARIANT_PEERS.items():
            ms = [m for m in all_ms if m in timed_m]
            if not ms or name not in PROVIDERS:
                continue
            build, copy_bytes, _ = PROVIDERS[name]
            try:
                fns = build(w, copies_for(copy_bytes(k, n)))
            except Exception as e:  # noqa: BLE001
                peers += [{"provider": name, "k": k, "n": n, "m": m, "error": error_text(e)} for m in ms]
                continue
            for m in ms:
                row = {"provider": name, "k": k, "n": n, "m": m, **floors_us(m, k, n, bandwidth, rate)}
                try:
                    row.update(time_provider(fns, xs[m], flush))
                    row["pct_of_floor"] = 100 * row["floor_us"] / row["graph_us"]
                except Exception as e:  # noqa: BLE001
                    row["error"] = error_text(e)
                peers.append(row)
            del fns
        del w
        torch.cuda.empty_cache()
        for kind, i, cfg in passed:
            if clock.expired("variants"):
                skipped += len(VARIANT_M[kind])
                continue
            fitted = variant_fit(cfg, n, k)
            for m in VARIANT_M[kind]:
                row = {"kind": kind, "index": i, "candidate": cfg.id, "config": fitted.id, "k": k, "n": n, "m": m,
                       **floors_us(m, k, n, bandwidth, rate)}
                try:
                    row.update(time_provider(triton_calls(kws, fitted), xs[m], flush))
                    row["pct_of_floor"] = 100 * row["floor_us"] / row["graph_us"]
                    for p in peers:
                        if (p["k"], p["n"], p["m"]) == (k, n, m) and "graph_us" in p:
                            row[f"vs_{p['provider']}"] = p["graph_us"] / row["graph_us"]
                except Exception as e:  # noqa: BLE001
                    row["error"] = error_text(e)
                rows.append(row)
        del kws
        torch.cuda.empty_cache()
        log(f"[{clock.elapsed():6.1f}s] variants K{k}xN{n}: {time.perf_counter() - t0:.1f}s")
    return {"plan_cells": len(plan["cells"]), "split_below": SPLIT_BELOW,
            "target_programs": HOPPER.target_programs, "checks": list(checks.values()), "rows": rows,
            "peers": peers, "skipped_cells": skipped, "best": variant_best(rows)}


def variant_best(rows: list[dict]) -> dict:
    """Per M: candidates ranked by the geometric mean of % of floor over the shapes (only those
    timed on every shape that any candidate was timed on at that M), and the per-shape winner."""
    out = {}
    for m in sorted({r["m"] for r in rows if "m" in r}):
        at_m = [r for r in rows if r.get("m") == m and "pct_of_floor" in r]
        shapes = sorted({(r["k"], r["n"]) for r in at_m})
        scores, counts = {}, {}
        for cand in sorted({r["candidate"] for r in at_m}):
            pcts = [r["pct_of_floor"] for r in at_m if r["candidate"] == cand]
            scores[cand] = math.exp(statistics.fmean(math.log(p) for p in pcts))
            counts[cand] = len(pcts)
        # Candidates timed on every shape first (a run cut short by the budget leaves some out).
        ranked = sorted(scores, key=lambda c: (counts[c], scores[c]), reverse=True)
        per_shape = {}
        for k, n in shapes:
            win = max((r for r in at_m if (r["k"], r["n"]) == (k, n)), key=lambda r: r["pct_of_floor"])
            per_shape[f"K{k}xN{n}"] = {"candidate": win["candidate"], "config": win["config"],
                                       "graph_us": win["graph_us"], "pct_of_floor": win["pct_of_floor"],
                                       **{key: win[key] for key in ("vs_dense", "vs_tinygemm") if key in win}}
        out[str(m)] = {"ranking": [(c, scores[c], counts[c]) for c in ranked], "shapes": len(shapes),
                       "per_shape": per_shape}
    return out


def variants_table(v: dict) -> str:
    """The compact table: candidate x shape x M: us, % of floor, speedup vs dense (and tinygemm)."""
    lines = ["| candidate | shape | M | config | us | % floor | vs dense | vs tinygemm |",
             "|---|---|---|---|---|---|---|---|"]
    for r in v["peers"]:
        lines.append(f"| ({r['provider']}) | K{r['k']}xN{r['n']} | {r['m']} | - | {fmt(r.get('graph_us'))} | "
                     f"{fmt(r.get('pct_of_floor'), '.0f')} | - | - |")
    for r in v["rows"]:
        if "m" not in r:
            lines.append(f"| - | K{r['k']}xN{r['n']} | - | - | {r.get('error', '')[:120]} | | | |")
            continue
        us = fmt(r.get("graph_us")) if "graph_us" in r else "ERR " + r.get("error", "")[:80]
        lines.append(f"| {r['candidate']} | K{r['k']}xN{r['n']} | {r['m']} | {r['config']} | {us} | "
                     f"{fmt(r.get('pct_of_floor'), '.0f')} | {fmt(r.get('vs_dense'), '.2f')} | "
                     f"{fmt(r.get('vs_tinygemm'), '.2f')} |")
    lines += ["", "Best per M (geometric mean of % of floor over the shapes; speedup = peer us / candidate us):"]
    for m, b in v["best"].items():
        top = ", ".join(f"{c} {s:.1f}%" + ("" if n == b["shapes"] else f" ({n} shapes)")
                        for c, s, n in b["ranking"][:6])
        lines.append(f"- M={m}: {top}")
        lines += [f"  - {s}: {w['candidate']} ({w['config']}) {w['graph_us']:.1f} us {w['pct_of_floor']:.0f}% "
                  f"vs dense {fmt(w.get('vs_dense'), '.2f')} vs tinygemm {fmt(w.get('vs_tinygemm'), '.2f')}"
                  for s, w in b["per_shape"].items()]
    failed = [c for c in v["checks"] if not c.get("passed")]
    lines += ["", f"{len(v['checks']) - len(failed)} of {len(v['checks'])} candidates passed their checks; "
              f"{v['skipped_cells']} cells skipped (time budget)"]
    for c in failed:
        why = c.get("error") or next((x.get("error") or x.get("summary") for x in c.get("cases", [])
                                      if not x.get("passed")), "")
        lines.append(f"- {c['kind']}:{c['index']} {c['candidate']}: {str(why)[:300]}")
    return "\n".join(lines) + "\n"


def variants_dry_run(out: Path) -> dict:
    """CPU: the plan (every candidate fitted and valid on every shape), a check of a few
    candidates through the child-process protocol under the interpreter, and the report built
    from made-up timings."""
    plan = variant_plan()
    checks = check_variants([c for c in DRY_CANDIDATES], time.perf_counter() + 600, dry=True)
    fake_rows, fake_peers = [], []
    for j, c in enumerate(plan["cells"]):
        floor = floors_us(c["m"], c["k"], c["n"], NOMINAL_BANDWIDTH, NOMINAL_DENSE_RATE)
        us = floor["floor_us"] * (1.2 + 0.01 * (j % 37))
        fake_rows.append({**c, **floor, "config": c["fitted"], "graph_us": us, "pct_of_floor": 100 * floor["floor_us"] / us,
                          "vs_dense": 1.0})
    for p in plan["peer_cells"]:
        floor = floors_us(p["m"], p["k"], p["n"], NOMINAL_BANDWIDTH, NOMINAL_DENSE_RATE)
        fake_peers.append({**p, **floor, "graph_us": 2 * floor["floor_us"], "pct_of_floor": 50.0})
    fake = {"checks": list(checks.values()), "rows": fake_rows, "peers": fake_peers, "skipped_cells": 0,
            "best": variant_best(fake_rows)}
    report = variants_table(fake)
    out.mkdir(parents=True, exist_ok=True)
    (out / "triton_variants.json").write_text(json.dumps({"dry_run": True, "plan": plan, **fake}, indent=1, default=str))
    (out / "triton_variants.md").write_text("# Triton W4A16 variants (dry run, made-up timings)\n\n" + report)
    log(report[-3000:])
    return {"plan": plan, "checks": list(checks.values())}


def variant_check_main(spec: str, dry: bool) -> int:
    kind, index = spec.split(":")
    result = variant_check(kind, int(index), dry)
    print(CHECK_TAG + json.dumps(result, default=str), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# Sanitize


def run_sanitize(seed: int) -> int:
    """Each path once per dtype and symmetry, for compute-sanitizer: N = 8, K = G, a K with an odd
    number of groups, N not a multiple of any tile, strided x; GEMV, split-K and prefill tiles (M up
    to 257: the Hopper table's 65..256 and > 256 buckets too)."""
    shapes = [(8, 4096, 128), (4096, 128, 128), (200, 320, 64), (1024, 9856, 128), (72, 200, -1)]
    errors = 0
    gen = torch.Generator().manual_seed(seed)
    for (n, k, g), (dname, dtype), symmetric in product(shapes, DTYPES.items(), (True, False)):
        w = random_quantized(n, k, g, symmetric, dtype, generator=gen).to(DEVICE)
        kernel = kernel_fn(w, dtype)
        bias = (0.5 * torch.randn(n, generator=gen)).to(dtype).to(DEVICE)
        for m in (1, 7, 16, 33, 129, 257):  # 129 and 257: one row past a 128- and a 256-row tile
            x = torch.randn(m, k + 64, generator=gen).to(dtype).to(DEVICE)[:, 32:32 + k]
            try:
                v = judge(kernel(x, bias), reference_matmul(x, w, bias), dequant_dtype=dtype)
                torch.cuda.synchronize()
                if not v.passed:
                    raise AssertionError(v.summary())
            except Exception as e:  # noqa: BLE001
                errors += 1
                log(f"[sanitize] N{n} K{k} G{g} {dname} sym={symmetric} M{m}: {error_text(e)}")
    log(f"[sanitize] done, {errors} errors")
    return errors


# ---------------------------------------------------------------------------------------------
# Report


def environment() -> dict:
    import triton

    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "hip": torch.version.hip}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
        try:
            import gemlite

            env["gemlite"] = getattr(gemlite, "__version__", "unknown")
        except Exception as e:  # noqa: BLE001 - a missing peer is a fact to report
            env["gemlite"] = f"unavailable: {type(e).__name__}: {e}"
    return env


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def markdown(result: dict) -> str:
    lines = ["# Triton W4A16 kernel", "", f"Environment: `{json.dumps(result['environment'])}`", ""]
    if "measured" in result:
        me = result["measured"]
        lines += [f"HBM: copy {me['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write), read-only "
                  f"{me['read_bytes_per_s'] / 1e12:.2f} TB/s; floors use {me['bytes_per_s'] / 1e12:.2f} TB/s. "
                  f"Dense bf16: {me['dense_flops'] / 1e12:.0f} TFLOP/s.", ""]
    if "parity" in result:
        p = result["parity"]
        lines += [f"## Parity: {len(p['cells'])} cells, {p['failed_cells']} failed or errored, "
                  f"{p['skipped_cells']} skipped (time budget); probes: {len(p['probes'])} runs, "
                  f"{p['probe_mismatches']} mismatching elements, {p['probe_errors']} errors", ""]
        worst = max((c for c in p["cells"] if "worst_ratio" in c), key=lambda c: c["worst_ratio"], default=None)
        if worst:
            lines += [f"Largest error / tight bound: {worst['worst_ratio']:.3f} ({worst['shape']} M={worst['m']} "
                      f"{worst['dtype']}); plain torch there: {fmt(worst['baseline_worst_ratio'], '.3f')}", ""]
        for c in [c for c in p["cells"] if not c.get("passed")][:40]:
            lines.append(f"- {c['shape']} {c['dtype']} {'sym' if c['symmetric'] else 'asym'} M={c.get('m')}: "
                         f"{c.get('error') or (c.get('summary') or '').splitlines()[0]}")
        for r in [r for r in p["probes"] if r.get("mismatches") or "error" in r][:20]:
            lines.append(f"- probes {r['shape']} {r['dtype']} max_m={r['max_m']}: {r.get('error') or r['summary']}")
        lines.append("")
    if "timing" in result:
        t = result["timing"]
        lines += ["## Timing (bf16, asym, G=128; cold weights, CUDA graph; % of floor; speedup = peer / triton)", "",
                  "| kind | shape | M | floor us | triton us | triton % | dense us | tinygemm us | gemlite us "
                  "| vs dense | vs tinygemm | vs gemlite |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        cells: dict[tuple, dict] = {}
        for r in t["rows"]:
            cells.setdefault((r["kind"], r["shape"], r["m"]), {})[r["provider"]] = r
        for (kind, shape, m), by in cells.items():
            mine = by.get("triton", {})
            us = {name: by.get(name, {}).get("graph_us") for name in PROVIDERS}
            lines.append(f"| {kind} | {shape} | {m} | {fmt(mine.get('floor_us'))} | {fmt(us['triton'])} | "
                         f"{fmt(mine.get('pct_of_floor'), '.0f')} | {fmt(us['dense'])} | {fmt(us['tinygemm'])} | "
                         f"{fmt(us['gemlite'])} | {fmt(mine.get('speedup_vs_dense'), '.2f')} | "
                         f"{fmt(mine.get('speedup_vs_tinygemm'), '.2f')} | "
                         f"{fmt(mine.get('speedup_vs_gemlite'), '.2f')} |")
        errors = [r for r in t["rows"] if "error" in r]
        lines += ["", f"{len(errors)} timing errors, {t['skipped_cells']} cells skipped (time budget)"]
        lines += [f"- {r['shape']} M={r['m']} {r['provider']}: {r['error']}" for r in errors[:20]]
        lines += [f"- peer check {c['shape']} {c['provider']}: {c['summary']}" for c in t["peer_checks"]
                  if not c["passed"]]
        lines.append("")
    if "sweep" in result:
        lines += ["## Tile sweep (best per M bucket, geometric mean of % of floor over the Llama shapes)", ""]
        for m, b in result["sweep"]["best"].items():
            table = [c.id for max_m, c in HOPPER.buckets if max_m is None or int(m) <= max_m][0]
            lines.append(f"- M={m}: best {b['best']} ({fmt(b['geomean_pct'].get(b['best']))}%); HOPPER table "
                         f"{table} ({fmt(b['table_geomean_pct'])}%)")
            lines += [f"  - {s}: {w['config']} {w['pct_of_floor']:.1f}%" for s, w in b["per_shape"].items()]
        lines.append("")
    if "plan" in result:
        pl = result["plan"]
        lines += [f"## Dry run: {pl['parity_cells']} parity cells, {pl['probe_runs']} probe runs, "
                  f"{len(pl['timing'])} timing cells, {pl['sweep_runs']} sweep runs", "",
                  "| kind | shape | M | W4 bytes | floor us (nominal) |", "|---|---|---|---|---|"]
        lines += [f"| {c['kind']} | {c['shape']} | {c['m']} | {c['bytes']} | {c['floor_us']:.2f} |"
                  for c in pl["timing"]]
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "triton_h200.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "triton_h200.md").write_text(markdown(result))
    log(f"wrote {out / 'triton_h200.json'} and {out / 'triton_h200.md'}")


def dry_run(shapes: list[LinearShape]) -> dict:
    timing = [{"kind": kind, "shape": s.id, "m": m, "bytes": w4_bytes(m, s.k, s.n),
               **floors_us(m, s.k, s.n, NOMINAL_BANDWIDTH, NOMINAL_DENSE_RATE)} for kind, s, m in timing_cells(shapes)]
    probe_runs = sum(len(probe_batches(s, d, y)) for s in shapes for d in DTYPES for y in (True, False))
    sweep_runs = sum(len(SWEEP_CANDIDATES[m]) + 1 for s in shapes if s.model in LLAMA for m in SWEEP_M)
    for m in SWEEP_M:  # every candidate must be a valid config on every swept shape
        for s in [s for s in shapes if s.model in LLAMA]:
            for cfg in SWEEP_CANDIDATES[m]:
                check_config(cfg, s.k, GROUP)
    return {"parity_cells": len(shapes) * len(PARITY_M) * 4, "probe_runs": probe_runs, "timing": timing,
            "sweep_runs": sweep_runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for triton_h200.json and .md")
    parser.add_argument("--sections", default="parity,timing,sweep",
                        help=f"comma-separated subset of {list(SECTION_SECONDS)}")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="total seconds for the sections (default: the sum of their defaults, "
                             f"{SECTION_SECONDS})")
    parser.add_argument("--shapes", default="", help="only shapes whose id contains this text")
    parser.add_argument("--kinds", default=",".join(VARIANT_CANDIDATES),
                        help=f"variants: comma-separated candidate groups of {list(VARIANT_CANDIDATES)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="CPU only: case lists and nominal floors")
    parser.add_argument("--sanitize", action="store_true", help="a few small runs of every path, for compute-sanitizer")
    parser.add_argument("--variant-check", default=None, help=argparse.SUPPRESS)  # KIND:INDEX, a child process
    args = parser.parse_args()
    if args.variant_check:
        return variant_check_main(args.variant_check, args.dry_run)
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTION_SECONDS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {list(SECTION_SECONDS)}")
    shapes = [s for s in unique_shapes() if args.shapes in s.id]
    result: dict = {"environment": environment(), "argv": sys.argv[1:]}
    if args.dry_run:
        if sections != ["variants"]:
            result["plan"] = dry_run(shapes)
        if "variants" in sections:
            result["variants_plan"] = variants_dry_run(args.out)
        write(result, args.out)
        return 0
    if not torch.cuda.is_available():
        parser.error("no GPU: use --dry-run")
    if args.sanitize:
        return 1 if run_sanitize(args.seed) else 0
    clock = Clock(args.budget_s, sections)
    try:
        if {"timing", "sweep", "variants"} & set(sections):
            result["measured"] = {**hbm_bandwidth(), "dense_flops": dense_rate()}
            log(f"[{clock.elapsed():6.1f}s] measured {json.dumps(result['measured'])}")
        bandwidth = result.get("measured", {}).get("bytes_per_s", NOMINAL_BANDWIDTH)
        rate = result.get("measured", {}).get("dense_flops", NOMINAL_DENSE_RATE)
        if "parity" in sections:
            result["parity"] = run_parity(shapes, clock, args.seed)
        if "timing" in sections:
            result["timing"] = run_timing(shapes, clock, bandwidth, rate, args.seed)
        if "sweep" in sections:
            result["sweep"] = run_sweep(shapes, clock, bandwidth, rate, args.seed)
            for m, b in result["sweep"]["best"].items():
                log(f"sweep M={m}: best {b['best']} {fmt(b['geomean_pct'].get(b['best']))}% of floor "
                    f"(table {fmt(b['table_geomean_pct'])}%)")
        if "variants" in sections:
            kinds = tuple(k for k in args.kinds.split(",") if k)
            if set(kinds) - set(VARIANT_CANDIDATES):
                parser.error(f"unknown kinds {kinds}; choose from {list(VARIANT_CANDIDATES)}")
            result["variants"] = run_variants(clock, bandwidth, rate, args.seed, kinds)
    finally:
        result["elapsed_s"] = clock.elapsed()
        if "variants" in result:
            v = result["variants"]
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "triton_variants.json").write_text(json.dumps(
                {"environment": result["environment"], "measured": result.get("measured"),
                 "elapsed_s": result["elapsed_s"], **v}, indent=1, default=str))
            table = variants_table(v)
            (args.out / "triton_variants.md").write_text("# Triton W4A16 variants\n\n" + table)
            log("\n" + table)
        write(result, args.out)
    p = result.get("parity", {})
    return 1 if p.get("failed_cells") or p.get("probe_mismatches") or p.get("probe_errors") else 0


if __name__ == "__main__":
    sys.exit(main())

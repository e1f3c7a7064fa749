"""Programmatic dependent launch of the skinny kernel on the H200: what each overlap mode gains, and
that it stays correct.

    python bench/overlap_h200.py --out DIR          # chain check, then timing (< ~5 min with the build)
    python bench/overlap_h200.py --dry-run --out DIR   # CPU: the case lists and the report

The kernel takes `overlap` (optimized.skinny.OVERLAPS): "none" (a plain launch) or "weights" (a
call's blocks may start while the previous kernel drains; they load their first weights, scales and
zero points, then wait for it before reading x or writing y).

Chain check: a CUDA graph of CHAIN_CALLS calls in which each call's x is the previous call's output
(square K = N weights, so the data dependency is real) must give bit-identical results to the
same chain run eagerly with overlap "none": a call that read x before its predecessor had written
it would differ. Every mode, M 1, 4 and 16.

Timing: DESIGN.md section 5 (cold weight copies over 600 MiB, a graph of back-to-back calls, per
call = replay / calls, median of replays), each mode on the Llama 3.1-8B and
3.3-70B shapes, bf16 asym at G = 128, M in TIMING_M, the modes interleaved per cell. Writes
DIR/overlap_h200.json and DIR/overlap_h200.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cuda_timing import graph_seconds  # noqa: E402
from bench.skinny_h200 import copy_bandwidth, environment, floor_bytes, random_packs  # noqa: E402
from optimized import skinny  # noqa: E402
from oracle.shapes import MODEL_SHAPES  # noqa: E402

GROUP = 128
TIMING_M = (1, 2, 4, 8, 16)
CHAIN_M = (1, 4, 16)
CHAIN_CALLS = 24
CHAIN_SHAPE = 4096  # K = N, Llama 3.1-8B's o projection
COLD_BYTES = 600 << 20
MAX_COPIES = 256
REPLAYS = 10
MODELS = ("llama3.1-8b", "llama3.3-70b")


def log(msg: str) -> None:
    print(msg, flush=True)


def kernels() -> dict:
    """name -> fn(x, qweight, scales, zeros, overlap). (The Triton kernel took the same modes through
    `launch_pdl` in commit 63f80c5, whose run bench/results/h200/overlap_h200_63f80c5.md records: no gain on
    average, and register spills in some GEMV tiles, so it was taken out.)"""
    return {"skinny": lambda x, q, s, z, overlap: skinny.skinny_matmul(x, q, s, z, GROUP, overlap=overlap)}


def timing_shapes() -> list[tuple[str, int, int]]:
    return [(s.id, s.k, s.n) for s in MODEL_SHAPES if s.model in MODELS]


def run_chain(device: str) -> list[dict]:
    """Each mode: a graph chain against the eager chain without overlap, bit for bit."""
    rows = []
    gen = torch.Generator(device=device).manual_seed(7)
    k = CHAIN_SHAPE
    # Small scales keep the chain's values in range over CHAIN_CALLS products.
    packs = [(torch.randint(-2**31, 2**31 - 1, (k, k // 8), dtype=torch.int32, device=device, generator=gen),
              (torch.rand(k, k // GROUP, device=device, generator=gen) * 4e-3 + 1e-3).to(torch.bfloat16),
              torch.randint(-2**31, 2**31 - 1, (k // 8, k // GROUP), dtype=torch.int32, device=device, generator=gen))
             for _ in range(CHAIN_CALLS)]
    for name, fn in kernels().items():
        for m in CHAIN_M:
            x0 = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)

            def chain(overlap: str, x0=x0, fn=fn) -> torch.Tensor:
                x = x0
                for q, s, z in packs:
                    x = fn(x, q, s, z, overlap)
                return x

            want = chain("none")
            torch.cuda.synchronize()
            for overlap in skinny.OVERLAPS:
                row = {"kernel": name, "m": m, "overlap": overlap, "calls": CHAIN_CALLS}
                try:
                    chain(overlap)  # compiles and warms up outside the capture
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        got = chain(overlap)
                    ok = True
                    for _ in range(3):
                        graph.replay()
                        torch.cuda.synchronize()
                        ok = ok and torch.equal(got, want)
                    eager = chain(overlap)
                    torch.cuda.synchronize()
                    row.update(passed=ok and torch.equal(eager, want), finite=bool(torch.isfinite(want).all()),
                               max_abs=float(want.float().abs().max()))
                    del graph
                except Exception as e:  # noqa: BLE001
                    row.update(passed=False, error=repr(e))
                log(f"[chain] {name} M={m} {overlap}: {'ok' if row['passed'] else 'FAIL'} {row.get('error', '')}")
                rows.append(row)
    return rows


def run_timing(device: str, bandwidth: float, deadline: float) -> list[dict]:
    rows = []
    fns = kernels()
    for shape_id, k, n in timing_shapes():
        if time.perf_counter() > deadline:
            rows.append({"shape": shape_id, "skipped": "time budget"})
            continue
        t0 = time.perf_counter()
        copies = max(2, min(MAX_COPIES, math.ceil(COLD_BYTES / floor_bytes(0, k, n, GROUP, False))))
        packs = random_packs(k, n, GROUP, False, torch.bfloat16, device, copies)
        for mi, m in enumerate(TIMING_M):
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            floor_s = floor_bytes(m, k, n, GROUP, False) / bandwidth
            order = [(name, o) for name in fns for o in skinny.OVERLAPS]
            if mi % 2:
                order.reverse()
            for name, overlap in order:
                row = {"shape": shape_id, "k": k, "n": n, "m": m, "kernel": name, "overlap": overlap,
                       "floor_us": floor_s * 1e6, "copies": copies}
                try:
                    sec = graph_seconds([lambda p=p, f=fns[name], o=overlap: f(x, *p, o) for p in packs],
                                        replays=REPLAYS)
                    row.update(us=sec * 1e6, pct_floor=100 * floor_s / sec)
                except Exception as e:  # noqa: BLE001
                    row["error"] = repr(e)
                rows.append(row)
        cells = [r for r in rows if r.get("shape") == shape_id and "us" in r]
        log(f"[timing] {shape_id}: " + " ".join(f"{r['kernel'][0]}M{r['m']}{r['overlap'][0]}={r['us']:.1f}"
                                                for r in cells) + f" ({time.perf_counter() - t0:.1f}s)")
        del packs
        torch.cuda.empty_cache()
    return rows


def markdown(result: dict) -> str:
    lines = ["# Programmatic dependent launch: overlap modes", "",
             f"Environment: `{json.dumps(result['environment'])}`", "",
             f"Copy bandwidth (read + write): {result['bandwidth'] / 1e12:.2f} TB/s", ""]
    chain = result.get("chain", [])
    fails = [r for r in chain if not r.get("passed")]
    lines += [f"## Chain check: {len(chain) - len(fails)} of {len(chain)} passed", ""]
    lines += [f"- FAIL {r['kernel']} M={r['m']} {r['overlap']}: {r.get('error', 'output differs')}" for r in fails]
    lines += ["", "## Timing (bf16 asym, G = 128, cold weights, CUDA graph): us per call (% of HBM floor); "
              "speedup = none / mode", ""]
    cells: dict[tuple, dict] = {}
    for r in result.get("timing", []):
        if "us" in r:
            cells.setdefault((r["shape"], r["m"], r["kernel"]), {})[r["overlap"]] = r
    modes = [o for o in skinny.OVERLAPS if o != "none"]
    lines += ["| shape | M | kernel | floor us | " + " | ".join(skinny.OVERLAPS) + " | "
              + " | ".join(f"{o} speedup" for o in modes) + " |",
              "|---" * (4 + len(skinny.OVERLAPS) + len(modes)) + "|"]
    for (shape, m, kernel), by_mode in cells.items():
        def cell(o: str) -> str:
            return f"{by_mode[o]['us']:.2f} ({by_mode[o]['pct_floor']:.0f}%)" if o in by_mode else "-"

        def speedup(o: str) -> str:
            return f"{by_mode['none']['us'] / by_mode[o]['us']:.3f}" if o in by_mode and "none" in by_mode else "-"
        floor = next(iter(by_mode.values()))["floor_us"]
        lines.append(f"| {shape} | {m} | {kernel} | {floor:.2f} | " + " | ".join(map(cell, skinny.OVERLAPS)) + " | "
                     + " | ".join(map(speedup, modes)) + " |")
    for kernel in sorted({k for _, _, k in cells}):
        for o in modes:
            ratios = [by_mode["none"]["us"] / by_mode[o]["us"] for (_, _, k), by_mode in cells.items()
                      if k == kernel and o in by_mode and "none" in by_mode]
            if ratios:
                lines.append(f"\n{kernel} {o}: geometric-mean speedup over none "
                             f"{math.exp(statistics.fmean(map(math.log, ratios))):.3f} "
                             f"(range {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} cells)")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/overlap_h200"))
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop starting timing shapes after this")
    parser.add_argument("--skip-chain", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="CPU only: case lists and the report")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        result = {"environment": {"dry_run": True}, "bandwidth": 4.2e12,
                  "chain": [{"kernel": "skinny", "m": 1, "overlap": o, "passed": True} for o in skinny.OVERLAPS],
                  "timing": [{"shape": s, "k": k, "n": n, "m": m, "kernel": kern, "overlap": o, "floor_us": 1.0,
                              "us": 2.0 - 0.1 * i, "pct_floor": 50.0}
                             for s, k, n in timing_shapes() for m in TIMING_M for kern in kernels()
                             for i, o in enumerate(skinny.OVERLAPS)]}
    else:
        device = "cuda"
        start = time.perf_counter()
        skinny.build()
        log(f"built skinny in {time.perf_counter() - start:.1f}s")
        result = {"environment": environment(device), "bandwidth": copy_bandwidth(device)["bytes_per_s"]}
        if not args.skip_chain:
            result["chain"] = run_chain(device)
        result["timing"] = run_timing(device, result["bandwidth"], start + args.budget_s)
    (args.out / "overlap_h200.json").write_text(json.dumps(result, indent=1))
    (args.out / "overlap_h200.md").write_text(markdown(result))
    log(markdown(result))
    return 0 if all(r.get("passed") for r in result.get("chain", [])) else 1


if __name__ == "__main__":
    sys.exit(main())

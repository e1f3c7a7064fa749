"""Reliability of both kernels on one GPU (issue 8; written for the H200).

    python bench/reliability_h200.py --out DIR                       # fuzz, large, determinism
    python bench/reliability_h200.py --sections large,determinism --out DIR
    compute-sanitizer --tool memcheck python bench/reliability_h200.py --sanitize full
    compute-sanitizer --tool racecheck python bench/reliability_h200.py --sanitize small --kernels skinny
    python bench/reliability_h200.py --dry-run --out DIR              # CPU: every section on tiny shapes

(a) fuzz: tests/test_fuzz.py under pytest with W4A16_FUZZ=long (hundreds of examples per
    property; W4A16_FUZZ_EXAMPLES overrides), the Triton kernel and the skinny kernel (every engine
    and variant) on the device; log, junit XML and a per-test summary. A skipped test fails the
    section on a GPU: there everything must run.
(b) large: shapes whose M*K, N*K or M*N exceed 2^32 elements (so both 2^31, where int32 element
    offsets overflow, and 2^32, where int32 byte offsets of the packed weight overflow, lie
    inside), and N around the skinny kernel's switch from the pipelined to the base kernel
    (N * K/32 = 2^31). Random packed data is made on the device; the kernel's output buffer is
    NaN-poisoned first (a freed buffer of the same size, which the caching allocator hands back:
    recorded as poison_reused), every output element must be finite, and the rows and columns
    where a flat offset crosses 2^31 or 2^32 (plus the first, last and a few random ones) are
    judged by the oracle against the fp64 reference of those rows and columns only.
(c) determinism: repeated calls (on fresh copies of x) are bit-identical; permuting the rows of x
    permutes the output rows bit for bit; and row i keeps its bits for every M of one
    configuration range: the Triton table's M buckets, the skinny kernel's
    optimized.skinny.same_rows_ranges. Across a Triton bucket edge rows may differ within the error bound:
    how many elements do is recorded, not judged.
(d) --sanitize full|small: every kernel over oracle.shapes.BOUNDARY_SHAPES (small: three of them,
    bf16, fewer M, for racecheck) with strided x, both symmetries; for compute-sanitizer, whose log
    is the record. Exit code 1 on any raised error or non-finite output.

--dry-run runs (a)-(d) on CPU with tiny shapes and an index limit of 2^11 instead of 2^31: the
Triton kernel through its interpreter, the skinny kernel replaced by the oracle computing its
interface (bench/skinny_h200.py reference_stand_in). Writes DIR/reliability_h200.json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before optimized.triton_w4a16 is imported

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.skinny_h200 import environment, reference_stand_in  # noqa: E402
from optimized import skinny  # noqa: E402
from optimized.tile_configs import select_config, table_for  # noqa: E402
from optimized.triton_w4a16 import device_name, w4a16_matmul  # noqa: E402
from oracle import QuantizedWeight, judge, reference_matmul  # noqa: E402
from oracle.layouts import nibbles  # noqa: E402
from oracle.shapes import BOUNDARY_SHAPES  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GROUP = 128
SECTIONS = ("fuzz", "large", "determinism")

Kernel = Callable[..., torch.Tensor]  # (x, qweight, scales, zeros, group_size, bias) -> y


def log(msg: str) -> None:
    print(msg, flush=True)


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()[:600] + " | " + " ".join(traceback.format_exception(e)[-3:-1])[-400:]


@dataclass(frozen=True)
class Plan:
    """Sizes for one run. limit: the flat offset the large shapes cross (2^31 on a GPU); big_k: K of
    the large N*K and M*K shapes; fuzz_env/fuzz_args: environment and extra pytest arguments of
    the fuzz run; det_cases: (K, N, dtype, symmetric) for determinism; m_cap: where the open last
    Triton bucket is cut; exact_permutation: whether permuted rows must keep their bits (not under
    Triton's interpreter, whose tl.dot is a numpy matmul: its BLAS sums a row differently by its
    place in the block); sanitize_shapes: (N, K, G) per sanitize size."""

    device: str
    limit: int
    big_k: int
    fuzz_env: dict[str, str]
    fuzz_args: tuple[str, ...]
    det_cases: tuple[tuple[int, int, str, bool], ...]
    m_cap: int
    repeats: int
    exact_permutation: bool
    sanitize_shapes: dict[str, tuple[tuple[int, int, int], ...]]


def boundary_nkg(names: tuple[str, ...] | None = None) -> tuple[tuple[int, int, int], ...]:
    return tuple((s.n, s.k, s.group_size) for s in BOUNDARY_SHAPES if names is None or s.layer in names)


GPU_PLAN = Plan(
    device="cuda", limit=2**31, big_k=65536, fuzz_env={"W4A16_FUZZ": "long"}, fuzz_args=(),
    det_cases=tuple((k, n, d, y) for k, n in [(s.k, s.n) for s in BOUNDARY_SHAPES] + [(4096, 14336)]
                    for d in DTYPES for y in (False, True)),
    m_cap=4096, repeats=5, exact_permutation=True,
    sanitize_shapes={"full": boundary_nkg(), "small": boundary_nkg(("n8", "k_eq_g", "km_9856"))},
)
DRY_PLAN = Plan(
    device="cpu", limit=2**11, big_k=256, fuzz_env={"W4A16_FUZZ_EXAMPLES": "2"},
    fuzz_args=("-k", "triton_matches_oracle"), det_cases=((256, 72, "bf16", False),), m_cap=66, repeats=2,
    exact_permutation=False, sanitize_shapes={"full": ((8, 256, 128),), "small": ((8, 256, 128),)},
)


def kernels(dry: bool) -> dict[str, Kernel]:
    """The kernels under test by name; in a dry run the skinny ones are the oracle's stand-in."""
    skinny_fn = reference_stand_in if dry else skinny.skinny_matmul
    return {"triton": w4a16_matmul, "skinny": partial(skinny_fn, engine="auto"),
            "skinny-simt": partial(skinny_fn, engine="simt")}


def max_m(name: str) -> int | None:
    return skinny.MAX_M if name.startswith("skinny") else None


# ---------------------------------------------------------------------------------------------
# Random packed problems, made on the device (the large ones would take minutes through the CPU)


@dataclass
class Packed:
    qweight: torch.Tensor       # int32 [N, K/8]
    scales: torch.Tensor        # dtype [N, K/G]
    zeros: torch.Tensor | None  # int32 [N/8, K/G]
    bias: torch.Tensor | None
    group_size: int


def random_packed(n: int, k: int, group: int, dtype: torch.dtype, symmetric: bool, bias: bool,
                  device: str) -> Packed:
    """Random nibbles and zero points (random bytes viewed as words); scales in [2^-8, 2^-7) so
    that sums over K = 65536 stay far from fp16 overflow."""
    groups = k // group
    qweight = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device).view(torch.int32)
    scales = ((torch.rand(n, groups, device=device) + 1) * 2**-8).to(dtype)
    zeros = None if symmetric else torch.randint(0, 256, (n // 8, groups * 4), dtype=torch.uint8,
                                                 device=device).view(torch.int32)
    b = (0.1 * torch.randn(n, device=device)).to(dtype) if bias else None
    return Packed(qweight, scales, zeros, b, group)


def columns_weight(p: Packed, cols: torch.Tensor) -> QuantizedWeight:
    """The canonical weight of output columns `cols` only (row n of W is column n of y)."""
    q = nibbles.unpack(p.qweight[cols], 1)
    zeros = None
    if p.zeros is not None:
        # Word n // 8 holds row n at nibble n % 8: unpacking words along dim 0 puts it at 8 i + n % 8.
        zeros = nibbles.unpack(p.zeros[cols // 8], 0)[torch.arange(len(cols), device=cols.device) * 8 + cols % 8]
    return QuantizedWeight(q, p.scales[cols], zeros, p.group_size)


def call(fn: Kernel, x: torch.Tensor, p: Packed) -> torch.Tensor:
    return fn(x, p.qweight, p.scales, p.zeros, p.group_size, p.bias)


# ---------------------------------------------------------------------------------------------
# (a) fuzz


def run_fuzz(plan: Plan, out: Path) -> dict:
    """tests/test_fuzz.py in a child pytest (its own process, so a crash is a result, not the end
    of this script); per-test outcomes from the junit XML."""
    junit, log_path = out / "fuzz_junit.xml", out / "fuzz_log.txt"
    cmd = [sys.executable, "-m", "pytest", "tests/test_fuzz.py", "-q", "-rs", "-p", "no:cacheprovider",
           f"--junitxml={junit}", *plan.fuzz_args]
    env = {**os.environ, **plan.fuzz_env}
    log(f"[fuzz] {' '.join(f'{k}={v}' for k, v in plan.fuzz_env.items())} {' '.join(cmd[1:])}")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log_path.write_text(proc.stdout + proc.stderr)
    result = {"command": cmd[1:], "env": plan.fuzz_env, "returncode": proc.returncode,
              "seconds": time.perf_counter() - start, "log": log_path.name, "tests": []}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
            detail = next((c.get("message", "") for c in case if c.tag in ("failure", "error", "skipped")), "")
            result["tests"].append({"name": case.get("name"), "outcome": outcome, "seconds": float(case.get("time", 0)),
                                    "message": detail[:2000]})
    counts = {o: sum(t["outcome"] == o for t in result["tests"]) for o in ("passed", "failure", "error", "skipped")}
    result["counts"] = counts
    # On a GPU every property must run: a skipped skinny test means the extension did not build.
    result["passed"] = proc.returncode == 0 and bool(result["tests"]) and (
        plan.device == "cpu" or counts["skipped"] == 0)
    log(f"[fuzz] {counts} in {result['seconds']:.0f}s, returncode {proc.returncode}")
    return result


# ---------------------------------------------------------------------------------------------
# (b) large indices


@dataclass(frozen=True)
class LargeShape:
    """One weight and x, and the M each kernel runs on them (rows of x taken from the front)."""

    name: str
    n: int
    k: int
    dtype: str
    ms: dict[str, tuple[int, ...]]
    group_size: int = GROUP
    symmetric: bool = False
    bias: bool = True


def large_shapes(plan: Plan) -> list[LargeShape]:
    two = 2 * plan.limit
    k = plan.big_k
    # The skinny pipelined kernel runs only while N * (K / 32) <= INT32_MAX (csrc/skinny_core.cuh
    # launch_variant); just below, its int offsets are largest; just above, the base kernel takes over.
    pipe_edge = 32 * plan.limit // k
    side = math.isqrt(two) + 8
    return [
        LargeShape("N*K > 2^32", two // k + 8, k, "fp16",
                   {"triton": (1, 16, 300), "skinny": (1, 9, 16), "skinny-simt": (1,)}),
        LargeShape("N*K/32 just below 2^31 (skinny pipelined)", pipe_edge - 8, k, "bf16",
                   {"triton": (1,), "skinny": (1, 8)}, symmetric=True),
        LargeShape("N*K/32 just above 2^31 (skinny base)", pipe_edge + 8, k, "bf16", {"triton": (1,), "skinny": (1, 8)}),
        LargeShape("M*K > 2^32", 64, k, "bf16", {"triton": (two // k + 8,)}),
        LargeShape("M*N > 2^32", side, GROUP, "bf16", {"triton": (side,)}, bias=False),
    ]


def crossings(extent: int, stride: int, limits: tuple[int, ...]) -> set[int]:
    """Indices i < extent whose span [i * stride, (i + 1) * stride) holds one of the limits, and
    one either side: where a flat offset i * stride + j crosses it."""
    return {i + d for t in limits for i in (t // stride,) for d in (-1, 0, 1) if 0 <= i + d < extent}


def sampled_indices(m: int, n: int, k: int, limits: tuple[int, ...], gen: torch.Generator) -> tuple[list[int], list[int]]:
    """Rows: first, last, where x (stride K) or y (stride N) offsets cross a limit, 4 random.
    Columns: first, last, where weight offsets cross (in elements, packed words, skinny's 32-k
    lane chunks), the column where a y offset crosses inside its row, 8 random."""
    rows = {0, m - 1} | crossings(m, k, limits) | crossings(m, n, limits)
    rows |= set(torch.randint(0, m, (4,), generator=gen).tolist())
    cols = {0, n - 1} | crossings(n, k, limits) | crossings(n, k // 8, limits) | crossings(n, k // 32, limits)
    cols |= {t % n + d for t in limits for d in (-1, 0, 1) if 0 <= t % n + d < n}
    cols |= set(torch.randint(0, n, (8,), generator=gen).tolist())
    return sorted(rows), sorted(cols)


def shape_bytes(s: LargeShape, m: int, device: torch.device) -> int:
    """Device bytes of one call at its largest M: weight, scales, zeros, x, y (the poison buffer is
    freed before the call and comes back as y), the non-finite mask of y, and the split-K fp32
    workspace of the Triton config that M gets (a tensor-core M never splits as wide as M = 1)."""
    cfg = select_config(m, s.n, s.k, s.k if s.group_size == -1 else s.group_size, device_name(device))
    workspace = m * s.n * 4 * cfg.split_k if cfg.split_k > 1 else 0
    return s.n * s.k // 2 + s.n * (s.k // s.group_size) * 3 + m * s.k * 2 + m * s.n * (2 + 1) + workspace


def check_large(fn: Kernel, s: LargeShape, m: int, x: torch.Tensor, p: Packed, plan: Plan, gen: torch.Generator) -> dict:
    dtype = DTYPES[s.dtype]
    poison = torch.full((m, s.n), float("nan"), dtype=dtype, device=plan.device)
    address = poison.data_ptr()
    del poison
    start = time.perf_counter()
    y = call(fn, x[:m], p)
    if plan.device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    nonfinite = int((~torch.isfinite(y)).sum())
    rows, cols = sampled_indices(m, s.n, s.k, (plan.limit, 2 * plan.limit), gen)
    rows_t, cols_t = (torch.tensor(v, device=plan.device) for v in (rows, cols))
    ref = reference_matmul(x[rows_t], columns_weight(p, cols_t), None if p.bias is None else p.bias[cols_t])
    v = judge(y[rows_t][:, cols_t], ref, dequant_dtype=dtype)
    return {"passed": v.passed and v.hard_violations == 0 and nonfinite == 0, "verdict": v.summary(),
            "worst_ratio": v.worst_ratio, "nonfinite": nonfinite, "poison_reused": y.data_ptr() == address,
            "sampled_rows": len(rows), "sampled_cols": len(cols), "kernel_seconds": seconds}


def run_large(plan: Plan, fns: dict[str, Kernel]) -> list[dict]:
    results = []
    gen = torch.Generator().manual_seed(0)
    for s in large_shapes(plan):
        top = max(m for ms in s.ms.values() for m in ms)
        row = {"shape": s.name, "n": s.n, "k": s.k, "dtype": s.dtype, "symmetric": s.symmetric}
        if plan.device == "cuda":
            free = torch.cuda.mem_get_info()[0]
            need = shape_bytes(s, top, torch.device(plan.device))
            if need > 0.9 * free:
                results.append({**row, "skipped": f"needs ~{need / 2**30:.1f} GiB, "
                                                  f"{free / 2**30:.1f} GiB free"})
                log(f"[large] {s.name}: skipped, {results[-1]['skipped']}")
                continue
        torch.manual_seed(len(results))
        p = random_packed(s.n, s.k, s.group_size, DTYPES[s.dtype], s.symmetric, s.bias, plan.device)
        x = torch.randn(top, s.k, dtype=DTYPES[s.dtype], device=plan.device)
        for name, ms in s.ms.items():
            for m in ms:
                cell = {**row, "kernel": name, "m": m, "m*k": m * s.k, "n*k": s.n * s.k, "m*n": m * s.n}
                try:
                    cell |= check_large(fns[name], s, m, x, p, plan, gen)
                except Exception as e:  # noqa: BLE001 - a crash is this cell's result
                    cell |= {"passed": False, "error": error_text(e)}
                results.append(cell)
                log(f"[large] {s.name} {name} M{m} N{s.n} K{s.k}: "
                    f"{'PASS' if cell['passed'] else 'FAIL'} {cell.get('verdict', cell.get('error', ''))[:300]}"
                    f" nonfinite={cell.get('nonfinite')} poison_reused={cell.get('poison_reused')}")
        del p, x
        if plan.device == "cuda":
            torch.cuda.empty_cache()
    return results


# ---------------------------------------------------------------------------------------------
# (c) determinism and batch invariance


def m_ranges(name: str, plan: Plan) -> list[tuple[int, int]]:
    """(first M, last M) of each range over which a kernel promises bit-identical rows."""
    if name.startswith("skinny"):
        return skinny.same_rows_ranges("simt" if name == "skinny-simt" else "mma")
    out, lo = [], 1
    for top, _ in table_for(device_name(torch.device(plan.device))).buckets:
        hi = plan.m_cap if top is None else top
        out.append((lo, hi))
        lo = hi + 1
    return out


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    diff = a.view(torch.int16) != b.view(torch.int16)  # bits, so NaN == NaN and -0.0 != 0.0
    return f"{int(diff.sum())} elements differ, first at {diff.nonzero()[:3].tolist()}"


def determinism_checks(fn: Kernel, name: str, x: torch.Tensor, p: Packed, plan: Plan) -> list[dict]:
    checks = []

    def record(check: str, m: int, got: torch.Tensor, want: torch.Tensor, informational: bool = False) -> None:
        same = torch.equal(got.view(torch.int16), want.view(torch.int16))
        checks.append({"check": check, "m": m, "identical": same, "informational": informational,
                       **({} if same else {"detail": first_difference(got, want)})})

    ranges = m_ranges(name, plan)
    for lo, hi in ranges:
        full = call(fn, x[:hi], p)
        for m in sorted({lo, (lo + hi) // 2, hi}):
            y = call(fn, x[:m], p)
            record(f"M {lo}-{hi}: rows of M={m} vs M={hi}", m, y, full[:m])
            for _ in range(plan.repeats - 1):
                record("repeat on a fresh copy of x", m, call(fn, x[:m].clone(), p), y)
            perm = torch.randperm(m, device=x.device)
            record("rows permuted", m, call(fn, x[:m][perm], p), y[perm], not plan.exact_permutation)
    for (_, hi), (nxt, _) in zip(ranges, ranges[1:]):
        # Across an edge the configuration changes: differing bits are allowed (within the error
        # bound, which the fuzz and parity runs judge); recorded to show where they appear.
        a, b = call(fn, x[:hi], p), call(fn, x[:nxt], p)[:hi]
        diff = int((a.view(torch.int16) != b.view(torch.int16)).sum())
        checks.append({"check": f"edge M={hi} -> M={nxt}", "m": nxt, "identical": diff == 0,
                       "informational": True, "differing_elements": diff})
    return checks


def run_determinism(plan: Plan, fns: dict[str, Kernel]) -> list[dict]:
    results = []
    torch.manual_seed(1)
    for k, n, dname, symmetric in plan.det_cases:
        dtype = DTYPES[dname]
        p = random_packed(n, k, GROUP if k % GROUP == 0 else 32, dtype, symmetric, not symmetric, plan.device)
        x = torch.randn(plan.m_cap, k, device=plan.device).to(dtype)
        for name, fn in fns.items():
            row = {"kernel": name, "k": k, "n": n, "dtype": dname, "symmetric": symmetric}
            try:
                checks = determinism_checks(fn, name, x[:max_m(name) or plan.m_cap], p, plan)
                failed = [c for c in checks if not c["identical"] and not c["informational"]]
                row |= {"passed": not failed, "checks": len(checks), "failed": failed,
                        "informational": [c for c in checks if c["informational"] and not c["identical"]]}
            except Exception as e:  # noqa: BLE001
                row |= {"passed": False, "error": error_text(e)}
            results.append(row)
            log(f"[determinism] {name} K{k} N{n} {dname} {'sym' if symmetric else 'asym'}: "
                f"{'PASS' if row['passed'] else 'FAIL'} {row.get('error') or row['failed'][:2]}")
    return results


# ---------------------------------------------------------------------------------------------
# (d) sanitize


SANITIZE_M = {"full": (1, 7, 16, 33), "small": (1, 16, 33)}


def run_sanitize(plan: Plan, size: str, fns: dict[str, Kernel]) -> int:
    """Every kernel once per shape, dtype, symmetry and M, x strided (rows k + 64 apart, starting 64
    bytes in: aligned, not contiguous); small is bf16 only. Errors: raised exceptions and
    non-finite outputs (a wrong but finite value is the parity runs' business)."""
    errors = 0
    dtypes = DTYPES if size == "full" else {"bf16": torch.bfloat16}
    torch.manual_seed(2)
    for (n, k, g), (dname, dtype), symmetric in [(s, d, y) for s in plan.sanitize_shapes[size]
                                                 for d in dtypes.items() for y in (True, False)]:
        p = random_packed(n, k, g, dtype, symmetric, True, plan.device)
        for name, fn in fns.items():
            for m in [m for m in SANITIZE_M[size] if m <= (max_m(name) or m)]:
                x = torch.randn(m, k + 64, device=plan.device).to(dtype)[:, 32:32 + k]
                try:
                    y = call(fn, x, p)
                    if plan.device == "cuda":
                        torch.cuda.synchronize()
                    if not bool(torch.isfinite(y).all()):
                        raise AssertionError("non-finite output")
                except Exception as e:  # noqa: BLE001
                    errors += 1
                    log(f"[sanitize] {name} N{n} K{k} G{g} {dname} sym={symmetric} M{m}: {error_text(e)}")
    log(f"[sanitize] done, {errors} errors")
    return errors


# ---------------------------------------------------------------------------------------------
# Report


def markdown(result: dict) -> str:
    lines = ["# Reliability (issue 8)", "", f"Environment: `{json.dumps(result['environment'])}`",
             f"Dry run: {result['dry_run']}; index limit {result['limit']}", ""]
    if "fuzz" in result:
        f = result["fuzz"]
        lines += ["## (a) Fuzz", "", f"`{' '.join(f['command'])}` with `{f['env']}`: {f['counts']}, "
                  f"{f['seconds']:.0f} s, {'PASS' if f['passed'] else 'FAIL'}", "",
                  "| test | outcome | s |", "|---|---|---|"]
        lines += [f"| {t['name']} | {t['outcome']} | {t['seconds']:.1f} |" for t in f["tests"]] + [""]
    if "large" in result:
        lines += ["## (b) Large indices", "", "| shape | kernel | M | N | K | result | worst error/bound | "
                  "non-finite | poison reused | kernel s |", "|---|---|---|---|---|---|---|---|---|---|"]
        for c in result["large"]:
            if "skipped" in c:
                lines.append(f"| {c['shape']} | | | {c['n']} | {c['k']} | skipped: {c['skipped']} | | | | |")
                continue
            verdict = "PASS" if c["passed"] else f"FAIL {c.get('error', '')[:200]}"
            lines.append(f"| {c['shape']} | {c['kernel']} | {c['m']} | {c['n']} | {c['k']} | {verdict} | "
                         f"{c.get('worst_ratio', float('nan')):.3g} | {c.get('nonfinite', '')} | "
                         f"{c.get('poison_reused', '')} | {c.get('kernel_seconds', float('nan')):.3f} |")
        lines.append("")
    if "determinism" in result:
        lines += ["## (c) Determinism and batch invariance", "",
                  "| kernel | K | N | dtype | sym | result | checks | allowed to differ, and did |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in result["determinism"]:
            verdict = "PASS" if r["passed"] else f"FAIL {r.get('error', '')[:200]} {r.get('failed', [])[:2]}"
            edges = "; ".join(f"{c['check']} at M={c['m']}: {c.get('differing_elements', c.get('detail'))}"
                              for c in r.get("informational", []))
            lines.append(f"| {r['kernel']} | {r['k']} | {r['n']} | {r['dtype']} | {r['symmetric']} | {verdict} | "
                         f"{r.get('checks', '')} | {edges} |")
        lines.append("")
    lines.append(f"Failures: {result['failures']}")
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "reliability_h200.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "reliability_h200.md").write_text(markdown(result))
    log(f"wrote {out / 'reliability_h200.json'} and {out / 'reliability_h200.md'}")


def failures(result: dict) -> int:
    count = int("fuzz" in result and not result["fuzz"]["passed"]) + result.get("sanitize_errors", 0)
    count += sum(not c["passed"] for c in result.get("large", []) if "skipped" not in c)
    return count + sum(not r["passed"] for r in result.get("determinism", []))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/reliability_h200"))
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {list(SECTIONS)}")
    parser.add_argument("--kernels", default="triton,skinny,skinny-simt", help="comma-separated kernels to run")
    parser.add_argument("--sanitize", choices=("full", "small"), default=None,
                        help="only the sanitizer sweep (full: every boundary shape; small: for racecheck)")
    parser.add_argument("--dry-run", action="store_true", help="CPU: every section on tiny shapes")
    args = parser.parse_args()
    sections = [s for s in args.sections.split(",") if s]
    if set(sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(set(sections) - set(SECTIONS))}; choose from {list(SECTIONS)}")
    all_fns = kernels(args.dry_run)
    names = [k for k in args.kernels.split(",") if k]
    if set(names) - set(all_fns):
        parser.error(f"unknown kernels {sorted(set(names) - set(all_fns))}; choose from {list(all_fns)}")
    fns = {k: all_fns[k] for k in names}
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no GPU: use --dry-run")
    plan = DRY_PLAN if args.dry_run else GPU_PLAN
    if not args.dry_run and any(k.startswith("skinny") for k in fns):
        skinny.build()
    if args.sanitize:
        return int(run_sanitize(plan, args.sanitize, fns) > 0)

    result: dict = {"environment": environment(plan.device), "dry_run": args.dry_run, "limit": plan.limit,
                    "argv": sys.argv[1:]}
    if args.dry_run:  # on a GPU the sweep runs under compute-sanitizer (--sanitize); here it joins the dry run
        result["sanitize_errors"] = run_sanitize(plan, "full", fns)
    start = time.perf_counter()
    if "fuzz" in sections:
        args.out.mkdir(parents=True, exist_ok=True)
        result["fuzz"] = run_fuzz(plan, args.out)
        write(result | {"failures": failures(result)}, args.out)  # keep what is done if a later section dies
    if "large" in sections:
        result["large"] = run_large(plan, fns)
        write(result | {"failures": failures(result)}, args.out)
    if "determinism" in sections:
        result["determinism"] = run_determinism(plan, fns)
    result["seconds"] = time.perf_counter() - start
    result["failures"] = failures(result)
    write(result, args.out)
    log(f"[done] {result['failures']} failures in {result['seconds']:.0f}s")
    return int(result["failures"] > 0)


if __name__ == "__main__":
    sys.exit(main())

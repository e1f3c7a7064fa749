"""The hybrid op on the H200: crossover timing that sets its thresholds, parity, opcheck.

    python3 bench/hybrid_h200.py --out DIR [--sections crossover,opcheck,parity] [--budget-s S]
    python3 bench/hybrid_h200.py --dry-run --out DIR      # CPU: the same code on tiny shapes

crossover: per-call time (CUDA graph of back-to-back calls on rotated cold weight copies,
           DESIGN.md section 5) of skinny, Triton and the dense GEMM on the dense cache, over the
           Llama shapes, bf16 asymmetric and fp16 symmetric, decode and prefill M. From the geometric
           mean of time ratios over shapes per M it derives skinny_max_m (skinny faster at every
           M up to it) and dense_min_m (dense faster at every measured M from it on), and writes
           DIR/h200.json: the thresholds file for optimized/thresholds/, with its table and command.
opcheck:   torch.library.opcheck of w4a16::matmul for each implementation, and a fullgraph
           torch.compile of a function calling it.
parity:    the full fixtures matrix (oracle.cases "full" tier) through optimized.specs.hybrid, plus
           the prefill cases through hybrid_dense and the G = 32 / 64 decode cases through
           optimized.specs.triton; each case's chosen implementation recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--dry-run" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from oracle import random_quantized  # noqa: E402
from oracle.cases import Case, parity_cases  # noqa: E402
from oracle.check import check_case, probe_key  # noqa: E402
from oracle.shapes import MODEL_SHAPES, LinearShape  # noqa: E402
from optimized import dispatch, hybrid, skinny, specs  # noqa: E402

LLAMA = ("llama3.1-8b", "llama3.3-70b")
DECODE_M = (1, 2, 4, 8, 12, 16)
PREFILL_M = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
VARIANTS = (("bf16", torch.bfloat16, False), ("fp16", torch.float16, True))
COLD_BYTES = 640 << 20  # rotated weight copies per graph: over 10x the 60 MB L2
TARGET_REPLAY_S = 2e-3
COMMAND = "python3 bench/hybrid_h200.py --out DIR --sections crossover,opcheck --name hybrid_crossover"


def log(msg: str) -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------------
# crossover


def per_call_seconds(fn, copies: list, x: torch.Tensor, first_s: float) -> float:
    if x.device.type == "cpu":
        start = time.perf_counter()
        fn(x, copies[0])
        return time.perf_counter() - start
    from bench.cuda_timing import graph_seconds

    calls = max(len(copies), min(2000, math.ceil(TARGET_REPLAY_S / max(first_s, 1e-6))))
    return graph_seconds([lambda c=c: fn(x, c) for c in copies], calls=calls, replays=7)


def crossover(shapes: list[LinearShape], device: str, decode_m, prefill_m) -> dict:
    rows = []
    for shape in shapes:
        for dname, dtype, symmetric in VARIANTS:
            g = torch.Generator().manual_seed(0)
            w = random_quantized(shape.n, shape.k, shape.group_size, symmetric, dtype, generator=g)
            pw = hybrid.prepare(w, dtype, device, dense_cache=True)
            n_copies = max(2, min(64, math.ceil(COLD_BYTES / pw.nbytes))) if device == "cuda" else 1
            copies = [pw] + [hybrid.prepare(w, dtype, device, dense_cache=True) for _ in range(n_copies - 1)]
            for m in sorted(set(decode_m) | set(prefill_m)):
                x = torch.randn(m, shape.k, generator=g).to(dtype).to(device)
                impls = ["triton"]
                if m in decode_m and m <= skinny.MAX_M and device == "cuda":
                    impls.append("skinny")
                if m in prefill_m:
                    impls.append("dense")
                row = {"shape": shape.id, "dtype": dname, "symmetric": symmetric, "m": m}
                for impl in impls:
                    fn = lambda x_, c, impl=impl: hybrid.matmul(x_, c, impl=impl)  # noqa: E731
                    start = time.perf_counter()
                    fn(x, copies[0])
                    if device == "cuda":
                        torch.cuda.synchronize()
                    row[f"{impl}_us"] = per_call_seconds(fn, copies, x, time.perf_counter() - start) * 1e6
                rows.append(row)
                log(json.dumps(row))
            del copies, pw
            if device == "cuda":
                torch.cuda.empty_cache()
    return {"rows": rows, **derive_thresholds(rows)}


def geo_mean_ratio(rows: list[dict], m: int, a: str, b: str) -> float | None:
    ratios = [r[f"{a}_us"] / r[f"{b}_us"] for r in rows if r["m"] == m and f"{a}_us" in r and f"{b}_us" in r]
    return math.exp(statistics.fmean(math.log(v) for v in ratios)) if ratios else None


def derive_thresholds(rows: list[dict]) -> dict:
    """skinny_max_m: the largest M such that skinny beats Triton (geo-mean over shapes) at every
    measured M up to it (0 if it loses at M = 1). dense_min_m: the smallest measured M from which
    the dense GEMM beats Triton at every larger measured M (above the largest M if never)."""
    ms = sorted({r["m"] for r in rows})
    table = {m: {"skinny/triton": geo_mean_ratio(rows, m, "skinny", "triton"),
                 "dense/triton": geo_mean_ratio(rows, m, "dense", "triton")} for m in ms}
    skinny_max_m = 0
    for m in ms:
        r = table[m]["skinny/triton"]
        if r is None:
            continue
        if r >= 1.0:
            break
        skinny_max_m = m
    dense_ms = [m for m in ms if table[m]["dense/triton"] is not None]
    dense_min_m = (max(dense_ms) * 2) if dense_ms else 1 << 30
    for m in reversed(dense_ms):
        if table[m]["dense/triton"] >= 1.0:
            break
        dense_min_m = m
    return {"table": {str(m): v for m, v in table.items()}, "skinny_max_m": skinny_max_m, "dense_min_m": dense_min_m}


def thresholds_file(result: dict, device_name: str) -> dict:
    return {
        "devices": ["H200"],
        "measured_on": device_name,
        "skinny_max_m": result["skinny_max_m"],
        "dense_min_m": result["dense_min_m"],
        "why": derive_thresholds.__doc__.replace("\n   ", "").strip(),
        "command": COMMAND,
        "measurement": "bench/results/h200/hybrid_crossover.json",
        "geo_mean_time_ratio_by_m": result["table"],
    }


# ----------------------------------------------------------------------------------------------
# opcheck


def opchecks(device: str) -> list[dict]:
    out = []
    g = torch.Generator().manual_seed(1)
    w = random_quantized(64, 256, 64, False, torch.bfloat16, generator=g)
    pw = hybrid.prepare(w, torch.bfloat16, device, dense_cache=True)
    impls = ("triton", "torch", "dense") + (("skinny",) if device == "cuda" else ())
    for impl in impls:
        for m in (1, 5, 33):
            if impl == "skinny" and m > skinny.MAX_M:
                continue
            x = torch.randn(m, 256, generator=g).to(torch.bfloat16).to(device)
            args = (x, pw.qweight, pw.scales, pw.zeros, pw.group_size, pw.n, pw.perm, pw.dense, None, impl)
            try:
                torch.library.opcheck(torch.ops.w4a16.matmul.default, args)
                out.append({"impl": impl, "m": m, "ok": True})
            except Exception as e:  # noqa: BLE001 - recorded as a failure
                out.append({"impl": impl, "m": m, "ok": False, "error": f"{type(e).__name__}: {e}"[:800]})
            log(json.dumps(out[-1]))
    compiled = torch.compile(lambda x: hybrid.matmul(x, pw), fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 256, generator=g).to(torch.bfloat16).to(device)
    ok = torch.equal(compiled(x), hybrid.matmul(x, pw))
    out.append({"impl": "auto", "m": 4, "ok": ok, "what": "torch.compile(fullgraph=True) equals eager"})
    return out


# ----------------------------------------------------------------------------------------------
# parity


def shard_of(cases: list[Case], shards: int) -> dict[tuple, int]:
    """Whole weights to shards (their cases share one quantized weight: the weight's key is
    probe_key), largest first to the least loaded shard; every process computes the same assignment."""
    work = Counter()
    for c in cases:
        work[probe_key(c)] += c.n * c.k
    load = [0] * shards
    owner = {}
    for key, amount in sorted(work.items(), key=lambda kv: (-kv[1], str(kv[0]))):
        owner[key] = load.index(min(load))
        load[owner[key]] += amount
    return owner


def parity(cases: list[Case], device: str, deadline: float, shard: int = 0, shards: int = 1) -> dict:
    """This shard's cases of each spec pass, one row each; cases past the deadline are counted as not
    run, never as passed. Exact probes once per weight configuration and spec."""
    results = {}
    platform = dispatch.detect_platform(torch.device(device))
    dense_min_m = dispatch.thresholds_for(platform.name).dense_min_m
    # The dense path is cuBLAS whatever the shape: a few M at and above its threshold cover it.
    dense_ms = {dense_min_m, dense_min_m + 1, 1024, 4096}
    passes = (
        (specs.hybrid, lambda c: True, lambda c: choice_for(c, False, device)),
        (specs.hybrid_dense, lambda c: c.m in dense_ms, lambda c: choice_for(c, True, device)),
        # Where the hybrid op sends decode at G = 32 / 64 to skinny, Triton's own decode path would
        # otherwise run only on CPU (bench/triton_h200.py's parity is G = 128).
        (specs.triton, lambda c: c.m <= skinny.MAX_M and c.group_size in (32, 64), lambda c: "triton"),
    )
    for spec, keep, impl_of in passes:
        todo = [c for c in cases if keep(c) and spec.supports(c)[0]]
        owner = shard_of(todo, shards)
        todo = [c for c in todo if owner[probe_key(c)] == shard]
        probed: set[tuple] = set()
        rows = []
        for case in todo:
            if time.perf_counter() > deadline:
                break
            if device == "cuda" and rows and probe_key(case) != probe_key(last):
                # The shards share the GPU: give back the last weight's cached blocks.
                torch.cuda.empty_cache()
            last = case
            report = check_case(spec, case, seed=0, device=device, probes=probe_key(case) not in probed)
            probed.add(probe_key(case))
            rows.append({"case": report.case_id, "impl": impl_of(case),
                         "passed": report.passed, "error": report.error, "seconds": round(report.seconds, 4),
                         "worst_ratio": None if report.verdict is None else report.verdict.worst_ratio,
                         "probe_mismatches": None if report.probe is None else report.probe.mismatches,
                         "diagnosis": report.diagnosis})
            if not report.passed:
                log(f"FAIL {spec.name} {report.case_id}: {report.error or report.diagnosis}")
        log(f"{spec.name} shard {shard}/{shards}: {len(rows)}/{len(todo)} cases run")
        results[spec.name] = {"todo": len(todo), "rows": rows}
    return results


def summarize(parts: list[dict]) -> dict:
    """The shards' rows merged per spec, with the counts the report shows."""
    out = {}
    for name in parts[0]:
        rows = [r for p in parts for r in p[name]["rows"]]
        todo = sum(p[name]["todo"] for p in parts)
        failed = sum(not r["passed"] for r in rows)
        worst = max((r["worst_ratio"] or 0.0 for r in rows), default=0.0)
        chosen = dict(Counter(r["impl"] for r in rows))
        log(f"{name}: {len(rows)} cases, {failed} failed, worst ratio {worst:.3f}, chosen {chosen}")
        out[name] = {"cases": len(rows), "not_run": todo - len(rows), "failed": failed, "worst_ratio": worst,
                     "chosen": chosen, "probe_mismatches": sum(r["probe_mismatches"] or 0 for r in rows),
                     "rows": rows}
    return out


def sharded_parity(args: argparse.Namespace) -> list[dict]:
    """The CPU side (quantizing the random weights, the error model) dominates the parity run, so
    N processes share the GPU, each with its own weights and 1/N of the CPU threads."""
    threads = max(1, (os.cpu_count() or 1) // args.shards)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    procs = []
    for i in range(args.shards):
        cmd = [sys.executable, __file__, "--out", str(args.out), "--sections", "parity", "--name", f"{args.name}_shard{i}",
               "--shard", f"{i}/{args.shards}", "--budget-s", str(args.budget_s), "--tier", args.tier]
        procs.append(subprocess.Popen(cmd + (["--dry-run"] if args.dry_run else []), env=env))
    for p in procs:
        p.wait()
    parts = []
    for i in range(args.shards):
        path = args.out / f"{args.name}_shard{i}.json"
        if not path.exists():
            raise RuntimeError(f"parity shard {i} wrote no {path} (exit status {procs[i].returncode})")
        parts.append(json.loads(path.read_text())["parity_shard"])
        path.unlink()
    return parts


def choice_for(case: Case, dense: bool, device: str) -> str:
    call = dispatch.Call(case.m, case.n, case.k, case.group_size, case.dtype, case.symmetric, dense)
    platform = dispatch.detect_platform(torch.device(device))
    return dispatch.choose(call, platform, dispatch.thresholds_for(platform.name)).name


# ----------------------------------------------------------------------------------------------


def markdown(result: dict) -> str:
    lines = [f"# Hybrid op on {result['device']}", "", f"Command: `{' '.join(result['argv'])}`", ""]
    if "crossover" in result:
        c = result["crossover"]
        lines += ["## Crossover (geometric mean of per-call time ratios over shapes)", "",
                  f"skinny_max_m = {c['skinny_max_m']}, dense_min_m = {c['dense_min_m']}", "",
                  "| M | skinny / triton | dense / triton |", "|---:|---:|---:|"]
        for m, r in c["table"].items():
            cells = [f"{r[k]:.2f}" if r[k] is not None else "" for k in ("skinny/triton", "dense/triton")]
            lines.append(f"| {m} | {cells[0]} | {cells[1]} |")
        lines.append("")
    if "opcheck" in result:
        bad = [o for o in result["opcheck"] if not o["ok"]]
        lines += ["## opcheck", "", f"{len(result['opcheck']) - len(bad)}/{len(result['opcheck'])} passed", ""]
        lines += [f"* FAILED {o}" for o in bad]
    if "parity" in result:
        lines += ["## Parity", "", "| spec | cases | not run | failed | probe mismatches | worst err/bound | chosen |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for name, p in result["parity"].items():
            lines.append(f"| {name} | {p['cases']} | {p['not_run']} | {p['failed']} | {p['probe_mismatches']} | "
                         f"{p['worst_ratio']:.3f} | {p['chosen']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", default="crossover,opcheck,parity")
    parser.add_argument("--name", default="hybrid_h200", help="output files NAME.json and NAME.md")
    parser.add_argument("--budget-s", type=float, default=520.0, help="parity stops starting cases after this")
    parser.add_argument("--tier", default="full", help="parity tier (oracle.cases.TIERS)")
    parser.add_argument("--shards", type=int, default=1, help="parity in this many processes sharing the GPU")
    parser.add_argument("--shard", default="", help=argparse.SUPPRESS)  # I/N: one worker of --shards N
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes")
    args = parser.parse_args()
    deadline = time.perf_counter() + args.budget_s
    device = "cpu" if args.dry_run else "cuda"
    sections = args.sections.split(",")
    result = {"device": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(), "argv": sys.argv}
    status = 0
    args.out.mkdir(parents=True, exist_ok=True)
    if "crossover" in sections:
        if args.dry_run:
            shapes = [LinearShape("tiny", "x", 256, 64, 64)]
            result["crossover"] = crossover(shapes, device, (1, 2), (16, 32))
        else:
            shapes = [s for s in MODEL_SHAPES if s.model in LLAMA]
            result["crossover"] = crossover(shapes, device, DECODE_M, PREFILL_M)
        (args.out / "h200.json").write_text(json.dumps(thresholds_file(result["crossover"], result["device"]),
                                                       indent=1) + "\n")
    if "opcheck" in sections:
        result["opcheck"] = opchecks(device)
        status |= not all(o["ok"] for o in result["opcheck"])
    if "parity" in sections:
        cases = parity_cases("cpu", keep=lambda c: c.m <= 33)[:12] if args.dry_run else parity_cases(args.tier)
        if args.shard:
            i, n = map(int, args.shard.split("/"))
            result["parity_shard"] = parity(cases, device, deadline, i, n)
        else:
            parts = sharded_parity(args) if args.shards > 1 else [parity(cases, device, deadline)]
            result["parity"] = summarize(parts)
            status |= any(p["failed"] or p["not_run"] for p in result["parity"].values())
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.shard:
        return status
    (args.out / f"{args.name}.md").write_text(markdown(result))
    log(markdown(result))
    return status


if __name__ == "__main__":
    sys.exit(main())

"""The skinny kernel on a CUDA or ROCm device: what a CPU cannot check.

* opcheck: both ops' schemas, the matmul's fake implementation and their dispatch agree.
* The raw ops' TORCH_CHECK messages on the device (callers that skip the Python wrapper reach
  them), each violation in a child process, so that a crash (a signal, or a sticky device error)
  is recorded against its case and cannot take the run down.
* Programmatic dependent launch (overlap="weights"): a chain of calls captured in a CUDA graph,
  each reading the previous call's output, gives the bits of the same chain run eagerly without
  overlap; a call that read x before its predecessor had written it would differ.
* Every kernel, asked for and by default, on boundary shapes, judged by the oracle. These cells
  carry the `sanitize` marker: small and fast, they are what a compute-sanitizer run selects
  (pytest tests/optimized/test_skinny_gpu.py -m sanitize).

Every cell skips without a device. With one, the extension must build: a build failure fails.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from optimized import skinny

ROOT = Path(__file__).resolve().parents[2]
HAS_DEVICE = torch.cuda.is_available()
HAS_MMA = HAS_DEVICE and torch.version.hip is None and torch.cuda.get_device_capability() >= (8, 0)

pytestmark = pytest.mark.skipif(not HAS_DEVICE, reason="no CUDA or ROCm device: the skinny kernel runs on one only")
needs_mma = pytest.mark.skipif(HAS_DEVICE and not HAS_MMA, reason="the tensor-core kernels need CUDA sm_80+")


@pytest.fixture(scope="module", autouse=True)
def built():
    """The extension, built (or loaded from torch's cache) once; a failure fails every cell."""
    if HAS_DEVICE:
        skinny.build()


def kernel_weights(n: int, k: int, g: int, symmetric: bool, dtype: torch.dtype, seed: int = 0):
    """(canonical weight, kernel-layout weight) on the device: an RTN-quantized Gaussian weight."""
    from oracle import quantize_rtn
    from oracle.layouts import to_kernel_layout

    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = quantize_rtn(torch.randn(n, k, device="cuda", generator=gen) * 0.02, g, symmetric, dtype)
    return w, to_kernel_layout(w, dtype)


# ---------------------------------------------------------------------------------------------
# opcheck

OPCHECK = [  # M, K, N, G, dtype, symmetric, bias, qweight dtype
    (1, 256, 64, 32, torch.float16, False, True, torch.int32),
    (5, 512, 128, 128, torch.bfloat16, True, False, torch.int32),
    (16, 384, 72, 64, torch.float16, True, True, torch.int8),
    (40, 512, 96, 128, torch.bfloat16, False, True, torch.int32),
]


@pytest.mark.parametrize("m,k,n,g,dtype,symmetric,with_bias,weight_dtype", [
    pytest.param(*c, id=f"M{c[0]}-K{c[1]}-N{c[2]}-G{c[3]}-{str(c[4])[6:]}-{'sym' if c[5] else 'asym'}"
                 f"-{'bias' if c[6] else 'nobias'}-{str(c[7])[6:]}") for c in OPCHECK])
def test_opcheck_skinny_matmul(m, k, n, g, dtype, symmetric, with_bias, weight_dtype):
    _, kw = kernel_weights(n, k, g, symmetric, dtype)
    qweight = kw.qweight if weight_dtype == torch.int32 else kw.qweight.view(torch.int8)
    x = torch.randn(m, k, device="cuda").to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype) if with_bias else None
    args = (x, qweight, kw.scales, kw.zeros, g, bias, "auto", skinny.policy_values())
    torch.library.opcheck(torch.ops.w4a16.skinny_matmul.default, args)


@pytest.mark.parametrize("limits", ["current-device", "explicit"])
def test_opcheck_skinny_plan(limits):
    device_limits = [] if limits == "current-device" else [132, 32, 227 * 1024, 228 * 1024, 90]
    args = (16, 4096, 14336, 128, False, "auto", skinny.policy_values(), device_limits, "stream", 0)
    torch.library.opcheck(torch.ops.w4a16.skinny_plan.default, args)
    plan = skinny.SkinnyPlan.from_values(torch.ops.w4a16.skinny_plan(*args))
    cuda_limits = limits == "explicit" and torch.version.hip is None  # the plan of an sm_90 device
    assert plan.kernel == ("stream" if HAS_MMA or cuda_limits else "batch"), plan


def test_plan_names_the_kernel_that_runs():
    """skinny.plan asks the op: the default at M = 1, 9 and 16 on a decode shape is a kernel of
    KERNELS whose grid and workspace are the plan's."""
    for m in (1, 9, 16):
        plan = skinny.plan(m, 4096, 14336, 128, False)
        assert plan.kernel in skinny.KERNELS and plan.blocks > 0, plan
        assert plan.engine == ("mma" if HAS_MMA else "simt"), plan


# ---------------------------------------------------------------------------------------------
# The raw ops' TORCH_CHECKs, a child process a case

DECODE = (14336, 4096)  # K, N: at M = 16 the stream kernel's split 1 does not fit shared memory


def valid(m: int = 2, k: int = 256, n: int = 64, g: int = 128, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Arguments of a valid skinny_matmul call, by schema name; cases replace one."""
    torch.manual_seed(0)
    qweight = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device="cuda")
    zeros = torch.randint(-2**31, 2**31 - 1, (n // 8, k // g), dtype=torch.int32, device="cuda")
    scales = (torch.rand(n, k // g, device="cuda") * 1e-3 + 1e-4).to(dtype)
    return {"x": torch.randn(m, k, device="cuda").to(dtype), "qweight": qweight, "scales": scales, "zeros": zeros,
            "group_size": g, "bias": None, "engine": "auto", "policy": skinny.policy_values(), "kernel": "auto",
            "overlap": "none", "split": 0}


def with_(**changes):
    return lambda: {**valid(), **{key: v() if callable(v) else v for key, v in changes.items()}}


def misaligned_x() -> torch.Tensor:
    return torch.randn(2, 260, device="cuda").to(torch.bfloat16)[:, 4:]  # starts 8 bytes in, rows 520 apart


def plan_call(**changes) -> dict:
    return {"op": "plan", "m": 1, "n": 4096, "k": 4096, "group_size": 128, "symmetric": False, "engine": "auto",
            "policy": skinny.policy_values(), "device_limits": [], "kernel": "auto", "split": 0, **changes}


# (case id, the arguments, a fragment the error message must hold, or None: the call must succeed
# with a finite output). The valid cases first: a valid call as a process's first call must work.
CASES = [
    ("valid-M1-default", lambda: valid(1, *DECODE), None),
    ("valid-M16-default-overlap", lambda: {**valid(16, *DECODE), "overlap": "weights"}, None),
    ("valid-M16-stream", lambda: {**valid(16, *DECODE), "kernel": "stream"}, None),
    ("x-float32", with_(x=lambda: torch.randn(2, 256, device="cuda")), "x must be float16 or bfloat16"),
    ("M17-K-not-tiled", lambda: valid(m=17, k=192, g=64), "M > 16 runs on the tile kernel only"),
    ("group-96", with_(group_size=96), "group_size must be 32, 64 or 128"),
    ("K-not-multiple-of-group", lambda: {**valid(k=192, g=64), "group_size": 128}, "K must be a multiple of group_size"),
    ("x-strided-K", with_(x=lambda: torch.randn(2, 512, device="cuda").to(torch.bfloat16)[:, ::2]),
     "x must be contiguous along K"),
    ("x-rows-misaligned", with_(x=misaligned_x), "x rows must start on 16-byte boundaries"),
    ("qweight-3d", with_(qweight=lambda: torch.zeros(64, 32, 1, dtype=torch.int32, device="cuda")),
     "qweight must be 2-D"),
    ("qweight-too-few-bytes", with_(qweight=lambda: torch.zeros(64, 16, dtype=torch.int32, device="cuda")),
     "bytes but N*K/2"),
    ("qweight-float", with_(qweight=lambda: torch.zeros(64, 32, dtype=torch.float32, device="cuda")),
     "qweight must be int32/uint32"),
    ("qweight-wrong-width", with_(qweight=lambda: torch.zeros(64, 40, dtype=torch.int32, device="cuda")),
     "qweight must be [N, K/8]"),
    ("qweight-transposed", with_(qweight=lambda: torch.zeros(32, 64, dtype=torch.int32, device="cuda").t()),
     "qweight must be contiguous"),
    ("scales-fp16", with_(scales=lambda: torch.ones(64, 2, dtype=torch.float16, device="cuda")), "scales must be"),
    ("scales-wrong-shape", with_(scales=lambda: torch.ones(64, 3, dtype=torch.bfloat16, device="cuda")),
     "scales must be"),
    ("zeros-unpacked", with_(zeros=lambda: torch.full((64, 2), 8.0, dtype=torch.bfloat16, device="cuda")),
     "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0)"),
    ("zeros-wrong-shape", with_(zeros=lambda: torch.zeros(64, 2, dtype=torch.int32, device="cuda")),
     "packed zero points must be [N/8, K/G]"),
    ("bias-wrong-shape", with_(bias=lambda: torch.zeros(63, dtype=torch.bfloat16, device="cuda")), "bias must be"),
    ("scales-on-cpu", with_(scales=lambda: torch.ones(64, 2, dtype=torch.bfloat16)), "all tensors must be on"),
    ("kernel-unknown", with_(kernel="persistent"), "kernel must be 'auto' or one of"),
    ("overlap-bogus", with_(overlap="bogus"), "overlap must be 'none' or 'weights'"),
    ("engine-bogus", with_(engine="bogus"), "engine must be 'auto', 'mma' or 'simt'"),
    ("policy-seven-values", with_(policy=lambda: skinny.policy_values()[:7]), "policy must hold 8 values"),
    ("policy-ring_max_m-20", with_(policy=lambda: [20.0, *skinny.policy_values()[1:]]),
     "policy field ring_max_m must be an integer in [4, 16]"),
    ("split-negative", with_(kernel="stream", split=-1), "split must be 0 (the plan's) or positive"),
    ("split-with-auto", with_(split=2), "unless kernel names one other than segment_persistent"),
    ("split-with-persistent", with_(kernel="segment_persistent", split=1), "unless kernel names one other than"),
    ("split-ring-beyond-warps", with_(kernel="ring", split=16), "must be a power of two up to the"),
    ("split-stream-beyond-pieces", with_(kernel="stream", split=3), "split must be in [1, K/128]"),
    ("split-stream-too-small-for-shared", lambda: {**valid(16, *DECODE), "kernel": "stream", "split": 1},
     "bytes of shared memory a block"),
    ("plan-M0", lambda: plan_call(m=0), "skinny_plan: M must be at least 1, got M=0"),
    ("plan-M17-simt", lambda: plan_call(m=17, engine="simt"), "skinny_plan: M > 16 runs on the tile kernel only"),
    ("plan-device-limits-three", lambda: plan_call(device_limits=[132, 32, 1024]), "device_limits must hold 5 values"),
    ("plan-split-with-auto", lambda: plan_call(split=2), "skinny_plan: split must be 0"),
]


def run_case(name: str) -> dict:
    """One case in this process: {"ok", "error" (its message's first line), "expected"}."""
    _, make, fragment = next(c for c in CASES if c[0] == name)
    skinny.build()
    args = make()
    try:
        if args.pop("op", None) == "plan":
            out = torch.ops.w4a16.skinny_plan(*args.values())
            return {"ok": fragment is None and len(out) == skinny.PLAN_FIELDS, "error": None, "expected": fragment}
        y = torch.ops.w4a16.skinny_matmul(*args.values())
        torch.cuda.synchronize()
    except RuntimeError as e:
        first = str(e).splitlines()[0][:400]
        return {"ok": fragment is not None and fragment in str(e), "error": first, "expected": fragment}
    return {"ok": fragment is None and bool(torch.isfinite(y).all()), "error": None, "expected": fragment}


@pytest.fixture(scope="module")
def device_cases() -> dict[str, dict]:
    """Every case of CASES in a child process of its own (8 at a time): {case: its result, or
    {"ok": False, "crashed": exit status, "tail": its output} where the child died}."""
    def run(case: str) -> tuple[str, dict]:
        proc = subprocess.run([sys.executable, "-X", "faulthandler", __file__, case], cwd=ROOT, capture_output=True,
                              text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if proc.returncode != 0:
            return case, {"ok": False, "crashed": proc.returncode, "tail": (proc.stdout + proc.stderr)[-3000:]}
        return case, json.loads(proc.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(pool.map(run, [c[0] for c in CASES]))


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_raw_op_check_on_the_device(device_cases, case):
    """The op called directly with one violation raises RuntimeError naming what was expected (or,
    for the valid cases, returns a finite output), each case in a child process of its own."""
    result = device_cases[case]
    assert result["ok"], result


# ---------------------------------------------------------------------------------------------
# Programmatic dependent launch: a chain of calls, each on the previous output

CHAIN_CALLS = 24


@dataclasses.dataclass(frozen=True)
class Chain:
    kernel: str
    m: int
    k: int  # K = N, so that each call's output is the next call's x
    split: int = 0


CHAINS = [
    Chain("auto", 1, 4096), Chain("auto", 4, 4096), Chain("auto", 16, 4096),
    Chain("batch", 16, 4096), Chain("ring", 5, 4096), Chain("segment", 1, 4096, 2), Chain("segment_smem", 1, 4096, 1),
    Chain("segment_persistent", 1, 16384), Chain("stream", 9, 8192, 1), Chain("stream", 9, 8192, 4),
]


def chain_id(c: Chain) -> str:
    return f"{c.kernel}-M{c.m}-K{c.k}" + (f"-split{c.split}" if c.split else "")


@pytest.mark.parametrize("chain", [pytest.param(c, id=chain_id(c), marks=needs_mma if c.kernel != "auto" and
                                                c.kernel not in ("batch", "ring") else ()) for c in CHAINS])
def test_overlap_weights_chain_in_a_graph_matches_eager_calls(chain):
    """CHAIN_CALLS calls in a CUDA graph with overlap="weights", each reading the previous call's
    output as x, against the same chain run eagerly with overlap="none": bit-identical (three
    replays, and an eager run with overlap), and finite. Each named kernel must be the one the plan
    runs."""
    k = chain.k
    if chain.kernel != "auto":
        plan = skinny.plan(chain.m, k, k, 128, False, kernel=chain.kernel, split=chain.split)
        assert plan.kernel == chain.kernel, plan
    gen = torch.Generator(device="cuda").manual_seed(7)
    scale = math.sqrt(4096 / k)  # small scales keep the values in range over the chain
    packs = [(torch.randint(-2**31, 2**31 - 1, (k, k // 8), dtype=torch.int32, device="cuda", generator=gen),
              ((torch.rand(k, k // 128, device="cuda", generator=gen) * 4e-3 + 1e-3) * scale).to(torch.bfloat16),
              torch.randint(-2**31, 2**31 - 1, (k // 8, k // 128), dtype=torch.int32, device="cuda", generator=gen))
             for _ in range(CHAIN_CALLS)]
    x0 = torch.randn(chain.m, k, device="cuda", generator=gen).to(torch.bfloat16)

    def run(overlap: str) -> torch.Tensor:
        x = x0
        for q, s, z in packs:
            x = skinny.skinny_matmul(x, q, s, z, 128, kernel=chain.kernel, split=chain.split, overlap=overlap)
        return x

    want = run("none")
    run("weights")  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = run("weights")
    for replay in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want), f"replay {replay} differs from the eager chain without overlap"
    assert torch.equal(run("weights"), want), "the eager chain with overlap differs"
    assert torch.isfinite(want).all()


# ---------------------------------------------------------------------------------------------
# Every kernel on boundary shapes, judged by the oracle (the sanitizer's selection)

@dataclasses.dataclass(frozen=True)
class Boundary:
    n: int
    k: int
    g: int
    ms: tuple[int, ...]
    why: str


BOUNDARIES = [
    Boundary(8, 4096, 128, (1, 3, 7, 16), "N = 8: rows past N in every tile"),
    Boundary(4096, 128, 128, (1, 3, 7, 16), "K = G = one iteration"),
    Boundary(24, 96, 32, (1, 3, 7, 16), "K ending mid-iteration"),
    Boundary(200, 320, 64, (1, 3, 7, 16), "N not a multiple of a tile, a K tail"),
    Boundary(1024, 49152, 128, (1, 7, 16), "a long K the stream kernel splits"),
    Boundary(50696, 256, 128, (1, 3), "persistent row groups of one iteration, the last half past N"),
    Boundary(10248, 4096, 128, (1, 3), "persistent warps cutting row groups, the last half past N at M = 3"),
    Boundary(28680, 4096, 128, (7, 16), "the stream kernel's 2-slot ring, its last block 8 rows into N"),
]
# Where the shape's K is whole 128-k pieces, the tile kernel (the default and when asked for) also
# runs these M: each M tile of 16, 32, 64, 128 partly filled, and two M tiles of 128 at 130.
TILE_MS = (17, 40, 64, 65, 130)
LAYOUTS = {"bf16-asym": (torch.bfloat16, False), "fp16-sym": (torch.float16, True)}
# (kernel, engine): the default on each engine, and every kernel asked for by name.
REQUESTS = [("auto", "auto"), ("auto", "simt"), *((kernel, "auto") for kernel in skinny.KERNELS)]


@functools.lru_cache(maxsize=2)
def boundary_problem(n: int, k: int, g: int, layout: str):
    """(weight, kernel-layout weight, x [max(TILE_MS), K] with rows K + 64 apart, bias, reference of x)."""
    from oracle import reference_matmul

    dtype, symmetric = LAYOUTS[layout]
    w, kw = kernel_weights(n, k, g, symmetric, dtype, seed=n + k)
    gen = torch.Generator(device="cuda").manual_seed(3)
    padded = torch.randn(max(TILE_MS), k + 64, device="cuda", generator=gen).to(dtype)
    x = padded[:, 32:32 + k]  # row stride K + 64, 64 bytes in: aligned but strided
    bias = (torch.randn(n, device="cuda", generator=gen) * 0.1).to(dtype)
    return w, kw, x, bias, reference_matmul(x, w, bias)


def first_rows(ref, m: int):
    """The reference of x[:m]: the first m rows of the reference of x (rows are independent)."""
    return dataclasses.replace(ref, **{f.name: getattr(ref, f.name)[:m] for f in dataclasses.fields(ref)
                                       if isinstance(getattr(ref, f.name), torch.Tensor)
                                       and getattr(ref, f.name).dim() == 2})


def boundary_cells():
    for b in BOUNDARIES:
        for layout in LAYOUTS:
            for kernel, engine in REQUESTS:
                marks = [pytest.mark.sanitize]
                if kernel.startswith(("segment", "stream", "tile", "wgmma")):
                    marks.append(needs_mma)
                yield pytest.param(b, layout, kernel, engine, marks=marks,
                                   id=f"N{b.n}-K{b.k}-G{b.g}-{layout}-{kernel}-{engine}")


@pytest.mark.parametrize("boundary,layout,kernel,engine", list(boundary_cells()))
def test_kernel_on_a_boundary_matches_the_oracle(boundary, layout, kernel, engine):
    """The call at each M of the shape (the segmented kernels at M <= 4, where they run; the tile
    kernel, by default or by name, at TILE_MS too) is within the oracle's error bound; the kernel the
    plan names runs it."""
    from oracle import judge, plain_torch_matmul

    w, kw, x, bias, ref = boundary_problem(boundary.n, boundary.k, boundary.g, layout)
    dtype = LAYOUTS[layout][0]
    ms = [m for m in boundary.ms if m <= 4] if kernel.startswith("segment") else list(boundary.ms)
    if kernel in ("auto", "tile", "wgmma") and engine == "auto" and not skinny.unfit(max(TILE_MS), boundary.k, torch.version.hip is not None):
        ms += TILE_MS
    for m in ms or [1]:
        plan = skinny.plan(m, boundary.n, boundary.k, boundary.g, kw.zeros is None, engine=engine, kernel=kernel)
        y = skinny.skinny_matmul(x[:m], kw.qweight, kw.scales, kw.zeros, boundary.g, bias, engine=engine, kernel=kernel)
        torch.cuda.synchronize()
        verdict = judge(y, first_rows(ref, m), dequant_dtype=dtype, dequant_roundings=1,
                        baseline=plain_torch_matmul(x[:m], w, bias))
        assert verdict.passed, f"M={m} ({boundary.why}), ran {plan}: {verdict.summary()}"


@needs_mma
@pytest.mark.parametrize("split", (1, 2, 3, 4, 6, 8, 12, 16, 24, 32))
def test_forced_stream_split_matches_the_oracle_or_is_refused(split):
    """Every forced split of the stream kernel at M = 16 on K 14336 x N 4096 (bf16, zero points,
    G 128) either runs within the oracle's bound or is refused because its shared memory does not
    fit a block (split 1 there)."""
    from oracle import judge

    k, n = DECODE
    w, kw = kernel_weights(n, k, 128, False, torch.bfloat16, seed=11)
    x = torch.randn(16, k, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5)).to(torch.bfloat16)
    try:
        plan = skinny.plan(16, n, k, 128, False, kernel="stream", split=split)
    except RuntimeError as e:
        assert "bytes of shared memory a block" in str(e), str(e)
        with pytest.raises(RuntimeError, match="bytes of shared memory a block"):
            skinny.skinny_matmul(x, kw.qweight, kw.scales, kw.zeros, 128, kernel="stream", split=split)
        return
    assert (plan.kernel, plan.split) == ("stream", split), plan
    y = skinny.skinny_matmul(x, kw.qweight, kw.scales, kw.zeros, 128, kernel="stream", split=split)
    from oracle import reference_matmul

    verdict = judge(y, reference_matmul(x, w), dequant_dtype=torch.bfloat16, dequant_roundings=1)
    assert verdict.passed, verdict.summary()


if __name__ == "__main__":  # a child of test_raw_op_check_on_the_device: one case, JSON on the last line
    print(json.dumps(run_case(sys.argv[1])))

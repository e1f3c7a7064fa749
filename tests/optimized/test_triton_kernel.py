"""The Triton W4A16 kernel judged by the oracle, on CPU through Triton's interpreter.

Random data is judged against the error model; exact probes catch what hides under rounding;
then determinism, batch invariance within an M bucket, the argument contract, the tile tables'
invariants, and an ahead-of-time compile of every GPU-table config for Hopper and CDNA3 (no
device needed). Shapes stay small (K <= 1024, N <= 256): the interpreter runs each program as
numpy calls.
"""

import json
import os
import random
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from optimized import triton_w4a16
from optimized.contract import ContractError
from optimized.policy import INTERPRETER, policy_for
from optimized.tile_configs import TileConfig, check_config, fit_config, no_straddle, select_config
from optimized.triton_w4a16 import w4a16_matmul
from oracle import judge, plain_torch_matmul, probe_weight, random_quantized, reference_matmul, run_probes
from oracle.layouts import to_kernel_layout
from oracle.shapes import unique_shapes

# The tile tables of a Hopper GPU, of any other GPU (the default file), and of the interpreter.
DEVICES = {"hopper": "NVIDIA H200", "generic": "AMD Instinct MI300X", "interpreter": INTERPRETER}
HOPPER, GENERIC, INTERPRETED = (policy_for(d).triton for d in DEVICES.values())

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GROUPS = (32, 64, 128, -1)
# Both sides of every interpreter-table bucket edge: 1 | 2-16 | 17-64 | 65+.
M_VALUES = (1, 2, 3, 5, 16, 17, 33, 64, 65, 129)
# (K, N): N not a multiple of the 64/128-wide tiles (200, 72, 136) and N below one tile (8).
SHAPES = ((256, 200), (512, 72), (1024, 136), (128, 8))


def resolved(group: int, k: int) -> int:
    return k if group == -1 else group


def make_inputs(k: int, n: int, m: int, group: int, symmetric: bool, dtype: torch.dtype, bias: bool,
                strided: bool, seed: int):
    """Canonical weight, its kernel layout, x [M, K] (rows 24 elements apart when strided) and bias."""
    g = torch.Generator().manual_seed(seed)
    w = random_quantized(n, k, group, symmetric, scale_dtype=dtype, generator=g)
    kw = to_kernel_layout(w, dtype)
    x = torch.randn(m, k + 24 if strided else k, generator=g).to(dtype)[:, :k]
    b = (0.5 * torch.randn(n, generator=g)).to(dtype) if bias else None
    return w, kw, x, b


def run_kernel(kw, x, bias, **kwargs):
    return w4a16_matmul(x, kw.qweight, kw.scales, kw.zeros, kw.group_size, bias, **kwargs)


def parity_cases():
    """Every (M, dtype, symmetry, group); shape, bias and row stride drawn per case (seeded) from
    the combinations that are valid for the group (K a multiple of G)."""
    rng = random.Random(0)
    cases = []
    for m, dname, sym, group in product(M_VALUES, DTYPES, (True, False), GROUPS):
        shapes = [(k, n) for k, n in SHAPES if k % resolved(group, k) == 0]
        k, n = rng.choice(shapes)
        bias, strided = rng.random() < 0.5, rng.random() < 0.3
        case_id = (f"K{k}xN{n}-G{group}-M{m}-{dname}-{'sym' if sym else 'asym'}"
                   f"{'-bias' if bias else ''}{'-strided' if strided else ''}")
        cases.append(pytest.param(k, n, m, group, sym, DTYPES[dname], bias, strided, id=case_id))
    return cases


@pytest.mark.parametrize("k, n, m, group, symmetric, dtype, bias, strided", parity_cases())
def test_matches_reference(k, n, m, group, symmetric, dtype, bias, strided):
    w, kw, x, b = make_inputs(k, n, m, group, symmetric, dtype, bias, strided, seed=k * n + m)
    out = run_kernel(kw, x, b)
    v = judge(out, reference_matmul(x, w, b), dequant_dtype=dtype, dequant_roundings=1,
              baseline=plain_torch_matmul(x, w, b))
    print(select_config(m, n, k, resolved(group, k), INTERPRETED).id, v.summary())
    assert v.passed, v.summary()
    assert v.hard_violations == 0, v.summary()


# Probe rows per kernel call for each path: GEMV with split-K, tensor cores with split-K, prefill.
PROBE_PATHS = {"gemv": 1, "splitk-dot": 16, "prefill": 128}


def probe_cases():
    """Each path x dtype x symmetry, groups rotating; combinations with K % G != 0 dropped."""
    cases = []
    for i, (path, dname, sym) in enumerate(product(PROBE_PATHS, DTYPES, (True, False))):
        group = GROUPS[i % len(GROUPS)]
        # The GEMV path takes one probe row per call: keep its K (the one-hot count) short.
        k, n = (64 if path == "gemv" else 256), 72
        if k % resolved(group, k):
            continue
        bias = i % 3 != 2
        case_id = f"K{k}xN{n}-G{group}-{path}-{dname}-{'sym' if sym else 'asym'}{'-bias' if bias else ''}"
        cases.append(pytest.param(k, n, group, sym, DTYPES[dname], PROBE_PATHS[path], bias, id=case_id))
    return cases


@pytest.mark.parametrize("k, n, group, symmetric, dtype, max_m, bias", probe_cases())
def test_exact_probes(k, n, group, symmetric, dtype, max_m, bias):
    g = torch.Generator().manual_seed(k + n + max_m)
    pw = probe_weight(n, k, group, symmetric, dtype, g)
    kw = to_kernel_layout(pw, dtype)
    b = (0.5 * torch.randn(n, generator=g)).to(dtype) if bias else None
    r = run_probes(lambda x, bb: run_kernel(kw, x, bb), pw, dtype, bias=b, max_m=max_m, generator=g)
    assert r.passed, r.summary()


@pytest.mark.parametrize("m", (1, 16, 129), ids=lambda m: f"M{m}")
def test_deterministic(m):
    _, kw, x, b = make_inputs(256, 200, m, 64, False, torch.bfloat16, True, False, seed=m)
    first = run_kernel(kw, x, b)
    assert torch.equal(first, run_kernel(kw, x, b))


def interpreter_buckets():
    """(smallest M, largest M) of each interpreter-table bucket holding more than one M; the open
    last bucket is cut at 129."""
    out, lo = [], 1
    for max_m, _ in INTERPRETED.buckets:
        hi = 129 if max_m is None else max_m
        if hi > lo:
            out.append(pytest.param(lo, hi, id=f"M{lo}-{hi}"))
        lo = hi + 1
    return out


@pytest.mark.parametrize("lo, hi", interpreter_buckets())
def test_batch_invariant_within_bucket(lo, hi):
    """Row i is bit-identical for every M in one bucket (the documented exception is crossing a
    bucket edge, where the split and summation order change)."""
    _, kw, x, b = make_inputs(256, 200, hi, 64, False, torch.float16, True, False, seed=hi)
    full = run_kernel(kw, x, b)
    for m in sorted({lo, (lo + hi) // 2}):
        assert torch.equal(run_kernel(kw, x[:m], b), full[:m]), f"M={m} differs from the first {m} rows at M={hi}"


@pytest.mark.parametrize("m, dtype", ((2, torch.float16), (17, torch.bfloat16)), ids=("M2-fp16", "M17-bf16"))
def test_channelwise_k_below_dot_minimum(m, dtype):
    """K = 200 channelwise: its largest power-of-two divisor (8) is below tl.dot's minimum K, so
    every M falls back to GEMV tiles."""
    k, n = 200, 40
    assert not select_config(m, n, k, k, INTERPRETED).use_dot
    w, kw, x, b = make_inputs(k, n, m, -1, False, dtype, True, True, seed=m)
    v = judge(run_kernel(kw, x, b), reference_matmul(x, w, b), dequant_dtype=dtype)
    assert v.passed, v.summary()


@triton.jit
def _nibble_probe_kernel(words_ptr, z16_ptr, out_ptr, magic0, BLOCK: tl.constexpr):
    """out[p, i] = _nibble_x16(word i, plane p) - _x16_offset(16 z_i, plane p)."""
    offs = tl.arange(0, BLOCK)
    packed = tl.load(words_ptr + offs)
    high = packed >> 16
    z16 = tl.load(z16_ptr + offs)
    for p in tl.static_range(8):
        value = triton_w4a16._nibble_x16(packed, high, p, magic0) - triton_w4a16._x16_offset(z16, p)
        tl.store(out_ptr + p * BLOCK + offs, value)


def test_nibble_magic_gives_16_times_q_minus_z_exactly():
    """Every nibble position's magic exponent and offset: 16 (q - z) exactly, for every nibble
    value at every position (words with the sign bit set too) and every zero point."""
    nibbles = torch.arange(16, dtype=torch.int64)
    # Word i holds nibble (i + p) % 16 at position p: each position sees every value 0..15.
    q = (nibbles[:, None] + torch.arange(8)[None, :]) % 16  # [16, 8]
    words = (q << (4 * torch.arange(8))[None, :]).sum(dim=1)
    words = words.repeat(16)  # [256]: each word with every zero point
    q = q.repeat(16, 1)
    z = nibbles.repeat_interleave(16)
    out = torch.empty(8, 256, dtype=torch.float32)
    signed = (words - (words >> 31 << 32)).to(torch.int32)  # the same bits as int32
    _nibble_probe_kernel[(1,)](signed, (16 * z).to(torch.float32), out, triton_w4a16.NIBBLE_MAGIC, BLOCK=256)
    assert torch.equal(out, (16 * (q - z[:, None])).T.to(torch.float32))


def test_unsigned_packed_words_match_int32():
    _, kw, x, b = make_inputs(256, 72, 5, 32, False, torch.float16, True, False, seed=1)
    signed = run_kernel(kw, x, b)
    unsigned = w4a16_matmul(x, kw.qweight.view(torch.uint32), kw.scales, kw.zeros.view(torch.uint32), 32, b)
    assert torch.equal(signed, unsigned)


def table_config_cases():
    """The smallest M of every bucket of the GPU tables."""
    cases = []
    for name in ("hopper", "generic"):
        table = policy_for(DEVICES[name]).triton
        firsts = [1] + [max_m + 1 for max_m, _ in table.buckets[:-1]]
        cases += [pytest.param(name, m, id=f"{name}-M{m}") for m in firsts]
    return cases


@pytest.mark.parametrize("name, m", table_config_cases())
def test_gpu_table_configs_compute_correctly(name, m):
    """Each GPU bucket's config, fitted to a small problem and forced on the interpreter."""
    k, n, group = 256, 72, 128
    cfg = select_config(m, n, k, group, policy_for(DEVICES[name]).triton)
    w, kw, x, b = make_inputs(k, n, m, group, False, torch.bfloat16, True, False, seed=m)
    v = judge(run_kernel(kw, x, b, config=cfg), reference_matmul(x, w, b), dequant_dtype=torch.bfloat16)
    assert v.passed, f"{cfg.id}: {v.summary()}"


# Every kernel path and dequant route through config overrides, with K-tiles of several groups
# (K = 512, G = 32 / 64 against block_k 256 / 512) and inside one group (block_k 128 at G = 128).
PATH_CONFIGS = (
    TileConfig(1, 64, 256, split_k=2),
    TileConfig(4, 32, 256, split_k=2, path="gemv"),
    TileConfig(2, 32, 512, path="gemv"),
    TileConfig(16, 64, 256, split_k=2),
    TileConfig(16, 64, 256, split_k=2, dequant="half"),
    TileConfig(16, 64, 512, path="dot_swap"),
    TileConfig(16, 64, 128, split_k=2, path="dot_swap", dequant="half"),
    TileConfig(64, 64, 256, path="dot_swap", dequant="half"),
)
PATH_PROBLEMS = (  # (dtype, group, symmetric, bias, M)
    (torch.bfloat16, 32, False, True, 5),
    (torch.float16, 64, True, False, 18),
    (torch.bfloat16, 128, True, True, 3),
)


@pytest.mark.parametrize("cfg", PATH_CONFIGS, ids=lambda c: c.id)
@pytest.mark.parametrize("dtype, group, symmetric, bias, m", PATH_PROBLEMS,
                         ids=lambda v: str(v).removeprefix("torch."))
def test_paths_match_reference(cfg, dtype, group, symmetric, bias, m):
    k, n = 512, 72
    fitted = fit_config(cfg, n, k, group, target_programs=4)
    assert fitted.kernel_path == cfg.kernel_path and fitted.dequant == cfg.dequant
    w, kw, x, b = make_inputs(k, n, m, group, symmetric, dtype, bias, m == 5, seed=k + m + group)
    out = run_kernel(kw, x, b, config=fitted)
    v = judge(out, reference_matmul(x, w, b), dequant_dtype=dtype, dequant_roundings=1,
              baseline=plain_torch_matmul(x, w, b))
    assert v.passed, f"{fitted.id}: {v.summary()}"
    assert v.hard_violations == 0, v.summary()
    assert torch.equal(out, run_kernel(kw, x, b, config=fitted)), "not deterministic"


@pytest.mark.parametrize("cfg, dtype, group, symmetric", (
    (TileConfig(16, 64, 256, split_k=2, path="dot_swap", dequant="half"), torch.bfloat16, 64, False),
    (TileConfig(16, 64, 256, split_k=2, dequant="half"), torch.float16, 32, False),
    (TileConfig(4, 64, 256, path="gemv"), torch.float16, 128, True),
), ids=("swap-half-bf16", "dot-half-fp16", "gemv4-fp16"))
def test_paths_exact_probes(cfg, dtype, group, symmetric):
    """The exact probes through the new paths: multi-group tiles and the half dequant."""
    k, n = 256, 72
    fitted = fit_config(cfg, n, k, group, target_programs=4)
    g = torch.Generator().manual_seed(7)
    pw = probe_weight(n, k, group, symmetric, dtype, g)
    kw = to_kernel_layout(pw, dtype)
    b = (0.5 * torch.randn(n, generator=g)).to(dtype)
    r = run_probes(lambda x, bb: run_kernel(kw, x, bb, config=fitted), pw, dtype, bias=b,
                   max_m=cfg.block_m if cfg.block_m > 1 else 1, generator=g)
    assert r.passed, r.summary()


class _NoLaunch:
    def __getitem__(self, grid):
        raise AssertionError("a kernel was launched before the arguments were rejected")


def _valid_args():
    """k=256, n=72, G=64, fp16, asymmetric, with bias: (x, qweight, scales, zeros, group_size, bias)."""
    _, kw, x, b = make_inputs(256, 72, 3, 64, False, torch.float16, True, False, seed=0)
    return [x, kw.qweight, kw.scales, kw.zeros, 64, b]


def _unpacked_zeros(a):
    a[3] = torch.full((72, 4), 8.0, dtype=torch.float16)


def _k_not_multiple_of_group(a):
    a[0], a[1], a[4] = a[0][:, :200], torch.zeros(72, 25, dtype=torch.int32), 32


CONTRACT_VIOLATIONS = {
    "unpacked-fp16-zero-points": (_unpacked_zeros,
                                  r"Zero points must be int32 or uint32 \(packed 8x uint4 along dim 0\)"),
    "zero-points-wrong-shape": (lambda a: a.__setitem__(3, a[3][:, :2].contiguous()), "Zero points must be"),
    "scales-fp32": (lambda a: a.__setitem__(2, a[2].float()), "scales must be float16"),
    "scales-transposed": (lambda a: a.__setitem__(2, a[2].t().contiguous()), "scales must be"),
    "K-not-multiple-of-G": (_k_not_multiple_of_group, "K must be a multiple of group_size"),
    "group-size-16": (lambda a: a.__setitem__(4, 16), "group_size must be one of"),
    "x-fp32": (lambda a: a.__setitem__(0, a[0].float()), "x must be float16 or bfloat16"),
    "x-column-major": (lambda a: a.__setitem__(0, a[0].t().contiguous().t()), "contiguous along K"),
    "x-no-rows": (lambda a: a.__setitem__(0, a[0][:0]), "M >= 1"),
    "qweight-unpacked-uint8": (lambda a: a.__setitem__(1, torch.zeros(72, 256, dtype=torch.uint8)),
                               "qweight must be int32"),
    "bias-bf16": (lambda a: a.__setitem__(5, a[5].bfloat16()), "bias must be float16"),
}


@pytest.mark.parametrize("mutate, message", CONTRACT_VIOLATIONS.values(), ids=CONTRACT_VIOLATIONS.keys())
def test_contract_violation_raises_before_launch(monkeypatch, mutate, message):
    monkeypatch.setattr(triton_w4a16, "_w4a16_kernel", _NoLaunch())
    monkeypatch.setattr(triton_w4a16, "_split_k_reduce_kernel", _NoLaunch())
    args = _valid_args()
    mutate(args)
    with pytest.raises(ContractError, match=message):
        w4a16_matmul(*args)


def test_straddling_config_override_rejected_before_launch(monkeypatch):
    """K = 384 with G = 128: 256-wide K-tiles would cover a group and a half."""
    monkeypatch.setattr(triton_w4a16, "_w4a16_kernel", _NoLaunch())
    _, kw, x, b = make_inputs(384, 72, 3, 128, False, torch.float16, True, False, seed=0)
    with pytest.raises(ValueError, match="straddles"):
        w4a16_matmul(x, kw.qweight, kw.scales, kw.zeros, 128, b, config=TileConfig(16, 64, 256))


@pytest.mark.parametrize("block_k, k, group, ok", (
    (64, 512, 128, True), (128, 512, 128, True),     # inside one group
    (256, 512, 128, True), (512, 512, 32, True),     # whole groups
    (256, 384, 128, False),                          # one and a half groups at the end of K
    (1024, 512, 128, False),                         # wider than K
    (96, 384, 96, False),                            # not a power of two
    (8, 200, 200, True), (16, 200, 200, False),      # channelwise K = 200: 16 straddles nothing but leaves 8
    (128, 256, 64, True), (64, 300, 64, False),      # K not a multiple of G
))
def test_no_straddle_rule(block_k, k, group, ok):
    assert no_straddle(block_k, k, group) is ok


@pytest.mark.parametrize("block_k, k, group, fitted", (
    (256, 4096, 128, 256), (512, 9856, 128, 128), (256, 128, 128, 128), (256, 4096, 4096, 256),
    (128, 200, 200, 8), (512, 14336, 14336, 512), (64, 1024, 32, 64),
))
def test_fit_block_k_keeps_the_widest_valid_tile(block_k, k, group, fitted):
    cfg = fit_config(TileConfig(1, 64, block_k, split_k=4), 4096, k, group, target_programs=64)
    assert cfg.block_k == fitted
    check_config(cfg, k, group)


def test_split_below_turns_split_k_off():
    cfg = TileConfig(1, 64, 256, split_k=8)
    assert fit_config(cfg, 64 * 300, 8192, 128, 528, split_below=264).split_k == 1
    assert fit_config(cfg, 64 * 100, 8192, 128, 528, split_below=264).split_k == 6
    assert fit_config(cfg, 64 * 300, 8192, 128, 528).split_k == 2


@pytest.mark.parametrize("name", DEVICES)
def test_tables_never_straddle_a_group(name):
    """Every M in 1..4096 on every real shape and group size: a valid config whose K-tiles stay
    inside one group, identical for every M of a bucket (what batch invariance rests on)."""
    table = policy_for(DEVICES[name]).triton
    assert table.buckets[-1][0] is None
    edges = [max_m for max_m, _ in table.buckets[:-1]]
    assert edges == sorted(set(edges))
    for shape, group in product(unique_shapes(), GROUPS):
        k, n, g = shape.k, shape.n, resolved(group, shape.k)
        if k % g:
            continue
        for m in range(1, 4097):
            cfg = select_config(m, n, k, g, table)
            if m == 1 or m - 1 in edges:
                check_config(cfg, k, g)
                bucket_cfg = cfg
            assert no_straddle(cfg.block_k, k, g), f"{shape.id} G{group} M{m}: {cfg.id}"
            assert cfg == bucket_cfg, f"{shape.id} G{group} M{m}: {cfg.id} differs within its bucket"


# Hopper's shared memory per block (227 KiB).
SM90_SHARED_BYTES = 232448


def aot_compile_tables(target: str, which: str = "tables") -> None:
    """Compile every config of the table for `target` ("cuda:90:32" or "hip:gfx942:64") ahead of
    time, no device needed, and exit non-zero listing the failures. which="candidates": instead the
    tuning sweeps' tile candidates (tests/benchmarks/candidates.py; bf16, G = 128), each also
    failing on register spills or more shared memory than sm_90 has; prints registers per config.
    Runs in a subprocess: the interpreter must be off when the kernels are defined."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tests.support.sass import cubin_resources

    backend, arch, warp = target.split(":")
    gpu = GPUTarget(backend, int(arch) if arch.isdigit() else arch, int(warp))
    if which == "candidates":
        from tests.benchmarks.candidates import candidates

        configs = [(cfg, 128) for cfg in candidates()]
        dtypes, bias = ("bf16",), False
    else:
        # Each bucket as select_config fits it to every group size (K-tile, groups per tile), on a
        # shape big enough to keep its split: the kernels a launch compiles.
        table = HOPPER if backend == "cuda" else GENERIC
        configs = sorted({(fit_config(cfg, 8192, 8192, group, table.target_programs, table.split_below), group)
                          for _, cfg in table.buckets for group in (32, 64, 128, 8192)}, key=str)
        dtypes, bias = ("fp16", "bf16"), True
    failures = []
    for (cfg, group), dtype in product(configs, dtypes):
        for partials in sorted({False, cfg.split_k > 1}):
            kernels = [(triton_w4a16._w4a16_kernel,
                        triton_w4a16.kernel_constexprs(cfg, group, partials, True, bias, False))]
            if partials:
                kernels.append((triton_w4a16._split_k_reduce_kernel,
                                dict(HAS_BIAS=bias, BLOCK=triton_w4a16.REDUCE_BLOCK)))
            for fn, constexprs in kernels:
                sig, aligned = triton_w4a16.compile_signature(fn, constexprs, dtype, partials)
                name = f"{fn.__name__} {cfg.id} G{group} {dtype}{' partials' if partials else ''}"
                try:
                    compiled = triton.compile(ASTSource(fn, sig, constexprs, aligned), target=gpu,
                                              options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
                except Exception as e:  # every failure is reported, not just the first
                    failures.append(f"{name}: {type(e).__name__}: {str(e)[:500]}")
                    continue
                if which == "candidates" and fn is triton_w4a16._w4a16_kernel:
                    res = cubin_resources(compiled.asm["cubin"]) if backend == "cuda" else {}
                    print(f"{name}: {res} shared={compiled.metadata.shared}", flush=True)
                    if res.get("stack") or compiled.metadata.shared > SM90_SHARED_BYTES:
                        failures.append(f"{name}: spills or too much shared memory: {res} "
                                        f"shared={compiled.metadata.shared}")
    if failures:
        sys.exit("\n".join(failures))


ROOT = Path(__file__).resolve().parents[2]
# The H200 image runs Triton 3.6.0 (DESIGN.md), whose compiler rejects tiles this one accepts:
# .ci/run installs it into this folder, apart from the Triton the tests import.
H200_TRITON_ENV = "W4A16_H200_TRITON"
H200_TRITON_VERSION = "3.6.0"


def _require(condition: bool, reason: str) -> None:
    if condition:
        return
    if os.environ.get("W4A16_REQUIRE_COMPILERS") == "1":
        pytest.fail(f"{reason}, and W4A16_REQUIRE_COMPILERS=1 requires it")
    pytest.skip(reason)


def _compile_in_subprocess(target: str, backend: str, which: str, site: str | None = None):
    """site: a folder holding another Triton, put first on the path; its backend is not checked
    here (a missing one fails the compile)."""
    if site is None:
        _require(backend in triton.backends.backends, f"this triton build has no {backend} backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (site, env.get("PYTHONPATH"))))
    run = subprocess.run([sys.executable, "-c", "import triton; print('triton', triton.__version__); "
                          f"from tests.optimized.test_triton_kernel import aot_compile_tables as f; f({target!r}, {which!r})"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return run


@pytest.mark.parametrize("target, backend", (("cuda:90:32", "nvidia"), ("hip:gfx942:64", "amd")),
                         ids=("sm90", "gfx942"))
def test_gpu_tables_compile_for_real_targets(target, backend):
    """The kernels as a GPU compiles them (layouts, tl.dot shapes, register allocation): Hopper
    and CDNA3 code for every table config and group size, built on this CPU-only machine."""
    _compile_in_subprocess(target, backend, "tables")


def test_hopper_table_compiles_with_the_h200_triton():
    """The same for sm_90 with the Triton the H200 runs: its 3.6 compiler failed on plain-path
    tiles (64x64x128 at G = 32) that newer Triton builds, which only the H200 showed."""
    site = os.environ.get(H200_TRITON_ENV)
    _require(bool(site), f"${H200_TRITON_ENV} names no folder holding triton=={H200_TRITON_VERSION}")
    run = _compile_in_subprocess("cuda:90:32", "nvidia", "tables", site)
    assert run.stdout.startswith(f"triton {H200_TRITON_VERSION}\n"), run.stdout[:200]


def test_tile_candidates_compile_for_sm90():
    """Every tile candidate of the tuning sweeps (triton@<tile>) compiles for sm_90 without
    register spills and within Hopper's shared memory (registers are printed)."""
    run = _compile_in_subprocess("cuda:90:32", "nvidia", "candidates")
    print(run.stdout)


def test_gemv_loop_costs_one_lop3_per_weight():
    """The M = 1 GEMV's K loop in sm_90 SASS (tests/support/triton_sass.py): one LOP3, one subtract
    and one FMA per weight, and few other instructions; a mask and magic number both as immediates
    (two LOP3s) or a shift per nibble would show here before any GPU run."""
    _require("nvidia" in triton.backends.backends, "this triton build has no nvidia backend")
    cfg = HOPPER.buckets[0][1]
    assert cfg.kernel_path == "gemv" and cfg.block_m == 1
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", "import json; from optimized.policy import tile_from_id; "
                          "from tests.support.triton_sass import analyse; "
                          f"print(json.dumps(analyse(tile_from_id({cfg.id!r}), 128, 'bf16', False)))"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    r = json.loads(run.stdout.strip().splitlines()[-1])
    ops = r["opcodes_per_weight"]
    assert r["stack"] == 0, r
    assert ops.get("LOP3.LUT", 0) <= 1.1, ops
    assert 0.95 <= ops.get("FFMA", 0) <= 1.1 and ops.get("FADD", 0) <= 1.25, ops
    assert r["per_weight"] <= 5.0, r

"""The hybrid W4A16 op (optimized/hybrid.py) on CPU: routing, forcing, the layout every
implementation receives, the argument contract, numerics against the oracle, its torch.library
registration, and the measured thresholds it routes by.

Routing, forcing and layout tests replace the runners with recording fakes and the platform with a
fixed one, so the GPU routing decisions are checked without a GPU. Numerics run the real CPU paths
("torch", and "dense", which falls back to it on CPU); the Triton path is judged by
tests/test_triton_kernel.py, since under the interpreter it is too slow for this module's budget.
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optimized import dispatch, hybrid, skinny
from optimized.contract import ContractError
from optimized.dispatch import Choice, ImplementationUnavailable, Platform
from optimized.hybrid import PreparedWeight, choose, matmul, prepare, prepare_checkpoint
from oracle import QuantizedWeight, judge, reference_matmul
from oracle.checkpoint import write_checkpoint
from oracle.layouts import KernelWeights, to_awq, to_compressed_tensors, to_gptq, to_kernel_layout

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GROUPS = (32, 64, 128, -1)
# The priority the design fixes (dense > skinny > transient > triton > torch); dispatch.PRIORITY
# must follow it.
PRIORITY = ("dense", "skinny", "transient", "triton", "torch")

PLATFORMS = {
    "h200": Platform("cuda", "NVIDIA H200", (True, ""), (True, "")),
    "cuda-no-compiler": Platform("cuda", "NVIDIA H200", (False, "nvcc not found: the skinny extension cannot be built"),
                                 (True, "")),
    "rocm-mi300x": Platform("rocm", "AMD Instinct MI300X", (True, ""), (True, "")),
    "cpu-interpreter": Platform("cpu", "interpreter", (False, "the skinny kernel needs a CUDA or ROCm device"),
                                (True, "")),
    "cpu": Platform("cpu", "interpreter", (False, "the skinny kernel needs a CUDA or ROCm device"),
                    (False, "Triton runs on CPU only under its interpreter (TRITON_INTERPRET=1)")),
}

# Where the H200's auto routing stops taking the skinny op.
H200_SKINNY_MAX_M = dispatch.thresholds_for(PLATFORMS["h200"].name).skinny_max_m


def resolved(group_size: int, k: int) -> int:
    return k if group_size == -1 else group_size


def make_weight(n: int, k: int, group_size: int, symmetric: bool, act_order: bool = False,
                seed: int = 0) -> QuantizedWeight:
    """Every nibble value in q; zero points 1..15 (GPTQ v1 stores z - 1, so z = 0 has no file
    form); signed fp16 scales, as checkpoints store them; act-order g_idx as GPTQ builds it."""
    gen = torch.Generator().manual_seed(seed)
    group = resolved(group_size, k)
    groups = k // group
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    zeros = None if symmetric else torch.randint(1, 16, (n, groups), generator=gen, dtype=torch.uint8)
    sign = torch.where(torch.rand(n, groups, generator=gen) < 0.5, -1.0, 1.0)
    scales = ((torch.rand(n, groups, generator=gen) * 0.02 + 1e-3) * sign).half()
    g_idx = None
    if act_order:
        visit = torch.randperm(k, generator=gen)
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[visit] = (torch.arange(k) // group).to(torch.int32)
    return QuantizedWeight(q, scales, zeros, group_size, g_idx)


@functools.cache
def prepared(k: int, n: int, group_size: int, dtype: torch.dtype, dense_cache: bool) -> PreparedWeight:
    # Cached across tests: a PreparedWeight is frozen and no test writes into its tensors.
    return prepare(make_weight(n, k, group_size, False, seed=k + n), dtype, dense_cache=dense_cache)


class Ran(NamedTuple):
    name: str
    x: torch.Tensor
    w: PreparedWeight
    bias: torch.Tensor | None


@pytest.fixture
def ran(monkeypatch) -> list[Ran]:
    """Every runner replaced by a fake that records its call and returns zeros [M, N] (the runner
    contract: unpadded N, padding is the runner's business)."""
    record: list[Ran] = []

    def fake(name):
        def run(x, w, bias):
            record.append(Ran(name, x, w, bias))
            return x.new_zeros(x.shape[0], w.n)
        return run

    monkeypatch.setattr(hybrid, "RUNNERS", {name: fake(name) for name in hybrid.RUNNERS})
    return record


def on(monkeypatch, platform: Platform) -> None:
    """Route as if x lived on `platform`: hybrid.choose asks dispatch.detect_platform by attribute."""
    monkeypatch.setattr(dispatch, "detect_platform", lambda device: platform)


# ----------------------------------------------------------------------------------------------
# 1. routing table


def expected_impl(platform: Platform, m: int, k: int, group_size: int, has_dense: bool) -> str:
    """The routing rule restated independently of dispatch: the first of PRIORITY that can run
    the call here and is the fast choice by the measured thresholds."""
    t = dispatch.thresholds_for(platform.name)
    if has_dense and m >= t.dense_min_m:
        return "dense"
    if (platform.kind in ("cuda", "rocm") and platform.skinny[0] and m <= t.skinny_max_m
            and not skinny.unfit(m, k, platform.kind == "rocm") and group_size in skinny.GROUP_SIZES):
        return "skinny"
    if platform.kind in ("cuda", "rocm") and platform.triton[0] and m >= t.transient_min_m:
        return "transient"
    return "triton" if platform.triton[0] else "torch"


def boundary_ms(platform: Platform) -> dict[int, str]:
    """M on both sides of each measured threshold for this platform's device, labelled."""
    t = dispatch.thresholds_for(platform.name)
    ms: dict[int, str] = {}
    for label, m in (("1", 1), ("skinny_max_m", t.skinny_max_m), ("skinny_max_m+1", t.skinny_max_m + 1),
                     ("dense_min_m-1", t.dense_min_m - 1), ("dense_min_m", t.dense_min_m),
                     ("transient_min_m-1", t.transient_min_m - 1), ("transient_min_m", t.transient_min_m),
                     ("4096", 4096)):
        if m >= 1:
            ms.setdefault(m, label)
    return ms


def routing_cases():
    cases = []
    for pname, platform in PLATFORMS.items():
        for m, label in boundary_ms(platform).items():
            for group_size in GROUPS:
                for dense in (False, True):
                    case_id = f"{pname}-M{m}({label})-G{group_size}{'-dense' if dense else ''}"
                    cases.append(pytest.param(pname, m, group_size, dense, id=case_id))
    return cases


# Two K per call: K * M lands on different sides of every M threshold (x 4), so a dispatcher
# keyed by problem size rather than M routes them apart. The activation dtype must not matter.
ROUTING_PROBLEMS = [(k, n, dtype) for k, n in ((128, 20), (512, 256)) for dtype in DTYPES.values()]


@pytest.mark.parametrize("pname, m, group_size, dense_cache", routing_cases())
def test_routes_by_m_platform_and_priority(ran, monkeypatch, pname, m, group_size, dense_cache):
    platform = PLATFORMS[pname]
    on(monkeypatch, platform)
    wants = [expected_impl(platform, m, k, group_size, dense_cache) for k, _, _ in ROUTING_PROBLEMS]
    for (k, n, dtype), want in zip(ROUTING_PROBLEMS, wants):
        pw = prepared(k, n, group_size, dtype, dense_cache)
        y = matmul(torch.zeros(m, k, dtype=dtype), pw)
        assert y.shape == (m, n) and y.dtype == dtype
        choice = choose(m, pw)
        assert (choice.name, choice.forced) == (want, False), f"K={k}, {dtype}"
        # Every implementation ahead of the chosen one was considered and passed over, with a reason.
        assert [name for name, _ in choice.rejected] == list(PRIORITY[:PRIORITY.index(want)])
        assert all(why for _, why in choice.rejected)
    assert [r.name for r in ran] == wants


def test_dispatch_priority_is_the_designed_one():
    assert dispatch.PRIORITY == PRIORITY
    assert set(hybrid.RUNNERS) == set(PRIORITY) == set(dispatch.IMPLEMENTATIONS)


def test_skinny_flag_alone_does_not_route_a_cpu_call_to_skinny(ran, monkeypatch):
    # The skinny gate checks the device kind too: a CPU platform that (wrongly) reports the
    # extension as built must still not launch a CUDA kernel on CPU tensors.
    on(monkeypatch, Platform("cpu", "interpreter", (True, ""), (False, "no interpreter")))
    matmul(torch.zeros(1, 128, dtype=torch.float16), prepared(128, 20, 32, torch.float16, False))
    assert [r.name for r in ran] == ["torch"]


@pytest.mark.parametrize("interpret, triton_ok", ((True, True), (False, False)),
                         ids=("TRITON_INTERPRET=1", "no-interpreter"))
def test_real_cpu_platform_detection(monkeypatch, interpret, triton_ok):
    # __wrapped__: detect_platform is cached per device, and other tests in this process may have
    # filled the cache under the other setting.
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    platform = dispatch.detect_platform.__wrapped__(torch.device("cpu"))
    assert (platform.kind, platform.name) == ("cpu", "interpreter")
    assert platform.skinny[0] is False and "CUDA or ROCm" in platform.skinny[1]
    assert platform.triton[0] is triton_ok
    assert triton_ok or "TRITON_INTERPRET=1" in platform.triton[1]


# ----------------------------------------------------------------------------------------------
# 2. forcing an implementation


def force(monkeypatch, source: str, impl: str) -> str | None:
    """The impl= argument for a call forced through `source` ("arg" or "env")."""
    if source == "env":
        monkeypatch.setenv(dispatch.ENV_VAR, impl)
        return None
    return impl


def unavailable(impl: str, pname: str, m: int, group_size: int, dense_cache: bool, reason: str, id: str,
                k: int = 128):
    return pytest.param(impl, pname, m, k, group_size, dense_cache, reason, id=id)


# Above skinny.MAX_M only the tile kernel runs: CUDA only, K a multiple of skinny.TILE_K (192 is not).
UNAVAILABLE = [
    unavailable("skinny", "cuda-no-compiler", 1, 32, False, PLATFORMS["cuda-no-compiler"].skinny[1],
                id="skinny-not-built"),
    unavailable("skinny", "cpu", 1, 32, False, "the skinny kernel needs a CUDA or ROCm device, the call is on cpu",
                id="skinny-on-cpu"),
    unavailable("skinny", "h200", skinny.MAX_M + 1, 32, False,
                f"M={skinny.MAX_M + 1} above {skinny.MAX_M} runs on the tile kernel, which needs "
                f"K % {skinny.TILE_K} == 0, got K=192", id="skinny-M-over-limit-K-not-tiled", k=192),
    unavailable("skinny", "rocm-mi300x", skinny.MAX_M + 1, 32, False,
                f"M={skinny.MAX_M + 1} above {skinny.MAX_M} runs on the tile kernel, which is CUDA-only",
                id="skinny-M-over-limit-on-rocm"),
    unavailable("skinny", "h200", 1, -1, False, f"group_size=-1 not in the skinny kernel's {skinny.GROUP_SIZES}",
                id="skinny-channelwise"),
    unavailable("dense", "h200", 4096, 32, False, "no dense cache", id="dense-without-cache"),
    unavailable("triton", "cpu", 1, 32, False, PLATFORMS["cpu"].triton[1], id="triton-without-interpreter"),
    unavailable("transient", "cpu-interpreter", 4096, 32, False,
                "the transient path dequantizes with a GPU kernel, the call is on cpu", id="transient-on-cpu"),
]


@pytest.mark.parametrize("source", ("arg", "env"))
@pytest.mark.parametrize("impl, pname, m, k, group_size, dense_cache, reason", UNAVAILABLE)
def test_forced_impl_that_cannot_run_raises_with_the_reason(ran, monkeypatch, source, impl, pname, m, k, group_size,
                                                            dense_cache, reason):
    on(monkeypatch, PLATFORMS[pname])
    pw = prepared(k, 20, group_size, torch.float16, dense_cache)
    arg = force(monkeypatch, source, impl)
    with pytest.raises(ImplementationUnavailable, match=re.escape(f"implementation {impl!r} was forced")) as err:
        matmul(torch.zeros(m, k, dtype=torch.float16), pw, impl=arg)
    assert reason in str(err.value)
    assert ran == []


@pytest.mark.parametrize("source", ("arg", "env"))
@pytest.mark.parametrize("m", (H200_SKINNY_MAX_M + 1, 4096), ids=lambda m: f"M{m}")
def test_forced_skinny_runs_above_its_auto_range_on_cuda(ran, monkeypatch, source, m):
    """Above skinny_max_m auto routing never takes skinny, but on CUDA with K % TILE_K == 0 the tile
    kernel can run any M, so forcing it runs skinny (the M-over-limit rows above are the calls it
    cannot take)."""
    on(monkeypatch, PLATFORMS["h200"])
    pw = prepared(128, 20, 32, torch.float16, False)
    assert choose(m, pw).name != "skinny"
    arg = force(monkeypatch, source, "skinny")
    y = matmul(torch.zeros(m, 128, dtype=torch.float16), pw, impl=arg)
    assert y.shape == (m, 20)
    assert [r.name for r in ran] == ["skinny"]
    assert choose(m, pw, impl="skinny") == Choice("skinny", True, ())


@pytest.mark.parametrize("source", ("arg", "env"))
@pytest.mark.parametrize("impl", PRIORITY)
def test_forced_impl_runs_where_auto_would_not(ran, monkeypatch, source, impl):
    # At M = 1 with a dense cache on the H200, auto takes skinny; forcing skips "prefers" (dense
    # below dense_min_m) but never "can_implement".
    on(monkeypatch, PLATFORMS["h200"])
    pw = prepared(128, 20, 32, torch.bfloat16, True)
    arg = force(monkeypatch, source, impl)
    matmul(torch.zeros(1, 128, dtype=torch.bfloat16), pw, impl=arg)
    assert [r.name for r in ran] == [impl]
    assert choose(1, pw, impl=impl) == Choice(impl, True, ())


@pytest.mark.parametrize("env, arg, want", (
    pytest.param("skinny", "torch", "torch", id="arg-beats-unrunnable-env"),
    pytest.param("torch", "auto", "skinny", id="explicit-auto-beats-env"),
    pytest.param("cublas", "triton", "triton", id="arg-beats-invalid-env"),
))
def test_impl_argument_overrides_environment(ran, monkeypatch, env, arg, want):
    on(monkeypatch, PLATFORMS["h200"])
    monkeypatch.setenv(dispatch.ENV_VAR, env)
    matmul(torch.zeros(1, 128, dtype=torch.float16), prepared(128, 20, 32, torch.float16, False), impl=arg)
    assert [r.name for r in ran] == [want]


@pytest.mark.parametrize("source, name, where", (
    pytest.param("arg", "marlin", "impl", id="arg-unknown"),
    pytest.param("arg", "Torch", "impl", id="arg-wrong-case"),
    pytest.param("env", "cublas", "$W4A16_IMPL", id="env-unknown"),
))
def test_invalid_impl_name_names_the_allowed_ones(ran, monkeypatch, source, name, where):
    on(monkeypatch, PLATFORMS["h200"])
    pw = prepared(128, 20, 32, torch.float16, False)
    arg = force(monkeypatch, source, name)
    expected = re.escape(f"{where} must be 'auto' or one of {list(PRIORITY)}, got {name!r}")
    with pytest.raises(ContractError, match=expected):
        matmul(torch.zeros(1, 128, dtype=torch.float16), pw, impl=arg)
    with pytest.raises(ContractError, match=expected):
        choose(1, pw, impl=arg)
    assert ran == []


def test_unavailable_impl_warns_once_and_falls_back(ran, monkeypatch, caplog):
    on(monkeypatch, PLATFORMS["cuda-no-compiler"])
    dispatch._warn_unavailable.cache_clear()
    caplog.set_level(logging.DEBUG, logger="optimized.hybrid")
    pw = prepared(128, 20, 32, torch.float16, False)
    for _ in range(3):
        matmul(torch.zeros(1, 128, dtype=torch.float16), pw)
    assert [r.name for r in ran] == ["triton"] * 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "optimized.hybrid"]
    # Once per process and reason: a warning per call would flood a decode loop.
    assert len(warnings) == 1
    assert "skinny" in warnings[0].getMessage()
    assert PLATFORMS["cuda-no-compiler"].skinny[1] in warnings[0].getMessage()


def test_routine_routing_is_not_a_warning(ran, monkeypatch, caplog):
    # M above the skinny limit on a machine where everything is built is normal prefill traffic.
    on(monkeypatch, PLATFORMS["h200"])
    dispatch._warn_unavailable.cache_clear()
    caplog.set_level(logging.DEBUG, logger="optimized.hybrid")
    matmul(torch.zeros(H200_SKINNY_MAX_M + 1, 128, dtype=torch.float16), prepared(128, 20, 32, torch.float16, False))
    assert [r.name for r in ran] == ["triton"]
    hybrid_records = [r for r in caplog.records if r.name == "optimized.hybrid"]
    assert not [r for r in hybrid_records if r.levelno >= logging.WARNING]
    assert any(r.levelno == logging.DEBUG and "skinny" in r.getMessage() for r in hybrid_records)


# ----------------------------------------------------------------------------------------------
# 3. every input layout converges on one kernel layout


def unpack_along_k(words: torch.Tensor) -> torch.Tensor:
    """int32 [R, C/8] -> int64 [R, C]; nibble p of word j is column 8j + p (natural order)."""
    shifts = 4 * torch.arange(8)
    return ((words.long().unsqueeze(-1) >> shifts) & 0xF).flatten(-2)


def unpack_along_n(words: torch.Tensor) -> torch.Tensor:
    """int32 [R/8, C] -> int64 [R, C]; row r at bits 4 * (r % 8) of word r // 8."""
    shifts = (4 * torch.arange(8)).view(1, 8, 1)
    return ((words.long().unsqueeze(1) >> shifts) & 0xF).flatten(0, 1)


# name: (weight -> what prepare takes, prepare keywords, act-order possible, any N when symmetric,
# any N when asymmetric). AWQ and GPTQ pack along N, and packed zero points need N % 8 == 0.
SOURCES = {
    "quantized": (lambda w, dtype: w, {}, True, True, True),
    "kernel": (lambda w, dtype: to_kernel_layout(w, dtype), {}, False, True, False),
    "awq": (lambda w, dtype: to_awq(w), {"fmt": "awq"}, False, False, False),
    "gptq": (lambda w, dtype: to_gptq(w, 1), {"fmt": "gptq"}, True, False, False),
    "gptq_v2": (lambda w, dtype: to_gptq(w, 2), {"fmt": "gptq_v2"}, True, False, False),
    "compressed-tensors": (lambda w, dtype: to_compressed_tensors(w), {"fmt": "compressed-tensors"}, True, True, False),
}


def layout_cases():
    cases = []
    for source, (_, _, act_order_ok, any_n_sym, any_n_asym) in SOURCES.items():
        for symmetric in (True, False):
            n = 20 if (any_n_sym if symmetric else any_n_asym) else 24
            for act_order in (False, True):
                for group_size in (32, -1):
                    if act_order and (not act_order_ok or group_size == -1):
                        continue  # the layout has no g_idx, or one group has nothing to reorder
                    for dname, dtype in DTYPES.items():
                        case_id = (f"{source}-{'sym' if symmetric else 'asym'}-N{n}-G{group_size}-{dname}"
                                   + ("-actorder" if act_order else ""))
                        cases.append(pytest.param(source, symmetric, n, act_order, group_size, dtype, id=case_id))
    return cases


def assert_kernel_layout(got: PreparedWeight, w: QuantizedWeight, dtype: torch.dtype) -> None:
    """`got` holds `w` (scales already in dtype) in the kernel layout, bit for bit, padding zeroed."""
    n, k, group = w.n, w.k, w.group
    n_pad, groups = -(-n // 8) * 8, k // group
    assert got.n == n and got.group_size == w.group_size
    assert got.qweight.dtype == torch.int32 and got.qweight.shape == (n_pad, k // 8) and got.qweight.is_contiguous()
    assert got.scales.dtype == dtype and got.scales.shape == (n_pad, groups) and got.scales.is_contiguous()
    perm = torch.arange(k) if got.perm is None else got.perm
    assert (got.perm is not None) == w.has_act_order
    assert torch.equal(perm.sort().values, torch.arange(k)), "perm is not a permutation of K"
    # After the gather every group is G consecutive channels, the layout a kernel indexes by k // G.
    assert torch.equal(w.group_index()[perm], torch.arange(k) // group)
    q = unpack_along_k(got.qweight)
    assert torch.equal(q[:n], w.q[:, perm].long()) and not q[n:].any()
    assert torch.equal(got.scales[:n], w.scales) and not got.scales[n:].any()
    if w.symmetric:
        assert got.zeros is None
    else:
        assert got.zeros.dtype == torch.int32 and got.zeros.shape == (n_pad // 8, groups)
        assert got.zeros.is_contiguous()
        z = unpack_along_n(got.zeros)
        assert torch.equal(z[:n], w.zeros.long()) and not z[n:].any()
    assert got.dense.dtype == dtype and got.dense.shape == (n, k) and got.dense.is_contiguous()
    assert torch.equal(got.dense, w.dequantize(torch.float32).to(dtype))


@pytest.mark.parametrize("source, symmetric, n, act_order, group_size, dtype", layout_cases())
def test_every_layout_reaches_every_runner_in_the_kernel_layout(ran, monkeypatch, source, symmetric, n, act_order,
                                                                 group_size, dtype):
    on(monkeypatch, PLATFORMS["h200"])
    w = make_weight(n, 128, group_size, symmetric, act_order, seed=n + group_size)
    convert, options, *_ = SOURCES[source]
    if options:
        options = {**options, "group_size": group_size, "symmetric": symmetric}
    pw = prepare(convert(w, dtype), dtype, dense_cache=True, **options)
    x = torch.randn(2, 128).to(dtype)
    impls = [i for i in PRIORITY if i != "skinny" or group_size in skinny.GROUP_SIZES]
    for impl in impls:
        matmul(x, pw, impl=impl)
    assert [r.name for r in ran] == impls
    for r in ran:
        # Runners gather x by perm themselves, so they get x as the caller gave it.
        assert torch.equal(r.x, x) and r.bias is None
        assert_kernel_layout(r.w, w.with_scales(w.scales.to(dtype)), dtype)


def checkpoint_cases():
    for fmt, version in (("awq", None), ("gptq", 1), ("gptq", 2), ("compressed-tensors", None)):
        for symmetric, act_order in ((True, False), (False, False), (False, True)):
            if act_order and fmt == "awq":
                continue  # AWQ has no g_idx
            name = fmt + (f"-v{version}" if version else "")
            yield pytest.param(fmt, version, symmetric, act_order,
                               id=f"{name}-{'sym' if symmetric else 'asym'}{'-actorder' if act_order else ''}")


@pytest.mark.parametrize("fmt, version, symmetric, act_order", list(checkpoint_cases()))
def test_prepare_checkpoint_gives_each_layer_in_the_kernel_layout(tmp_path, fmt, version, symmetric, act_order):
    layers = {"model.layers.0.self_attn.q_proj": make_weight(24, 128, 32, symmetric, act_order, seed=1),
              "model.layers.0.mlp.down_proj": make_weight(16, 256, 32, symmetric, act_order, seed=2)}
    config = write_checkpoint(tmp_path / "model.safetensors", layers, fmt, **({"version": version} if version else {}))
    got = prepare_checkpoint(tmp_path / "model.safetensors", torch.bfloat16, dense_cache=True, config=config)
    assert sorted(got) == sorted(layers)
    for name, w in layers.items():
        assert_kernel_layout(got[name], w.with_scales(w.scales.to(torch.bfloat16)), torch.bfloat16)


# ----------------------------------------------------------------------------------------------
# 4. the argument contract, checked before any runner


W20 = make_weight(20, 128, 32, False)
PW20 = prepare(W20, torch.float16)  # N_pad = 24, 4 groups
X = torch.randn(3, 128).half()
# The canonical zero points padded to N_pad: the unpacked [N, groups] form a caller may hand over
# in place of the packed int32 [N/8, groups] one.
UNPACKED_ZEROS = torch.nn.functional.pad(W20.zeros, (0, 0, 0, 4))
ZERO_POINT_ERROR = "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0) [N/8, groups] = [3, 4]"


def call_op(**changes):
    """torch.ops.w4a16.matmul with PW20's tensors, some replaced."""
    args = {"x": X, "qweight": PW20.qweight, "scales": PW20.scales, "zeros": PW20.zeros, "group_size": 32,
            "n": 20, "perm": None, "dense": None, "bias": None, "impl": "auto", **changes}
    return torch.ops.w4a16.matmul(*args.values())


CONTRACT_CASES = [
    pytest.param(lambda: call_op(zeros=UNPACKED_ZEROS.half()), ZERO_POINT_ERROR, "got float16 [24, 4]",
                 id="op-zeros-unpacked-float"),
    pytest.param(lambda: call_op(zeros=UNPACKED_ZEROS), ZERO_POINT_ERROR, "got uint8 [24, 4]",
                 id="op-zeros-unpacked-uint8"),
    pytest.param(lambda: call_op(zeros=PW20.zeros.t().contiguous()), ZERO_POINT_ERROR, "got int32 [4, 3]",
                 id="op-zeros-packed-transposed"),
    # Right shape, wrong dtype: only the dtype tells float zero points from packed words here.
    pytest.param(lambda: call_op(zeros=torch.full((3, 4), 8.0, dtype=torch.float16)), ZERO_POINT_ERROR,
                 "got float16 [3, 4]", id="op-zeros-float-in-packed-shape"),
    pytest.param(lambda: PreparedWeight(PW20.qweight, PW20.scales, UNPACKED_ZEROS.half(), 32, 20), ZERO_POINT_ERROR,
                 "got float16 [24, 4]", id="PreparedWeight-zeros-unpacked-float"),
    pytest.param(lambda: call_op(scales=PW20.scales.float()), "prepared scales must be contiguous float16 or "
                 "bfloat16 [N_pad, K/G] = [24, 4]", "got float32 [24, 4]", id="op-scales-fp32"),
    pytest.param(lambda: call_op(group_size=64), "[N_pad, K/G] = [24, 2]", "got float16 [24, 4]",
                 id="op-group-size-disagrees-with-scales"),
    pytest.param(lambda: call_op(n=30), "n must be the weight's N, with N_pad = 24", "got n=30", id="op-n-above-N_pad"),
    pytest.param(lambda: call_op(perm=torch.arange(128, dtype=torch.int32)), "perm must be int64 [K] = [128]",
                 "got int32 [128]", id="op-perm-int32"),
    pytest.param(lambda: call_op(dense=torch.zeros(24, 128, dtype=torch.float16)),
                 "dense must be contiguous float16 [N, K] = [20, 128]", "got float16 [24, 128]", id="op-dense-padded"),
    pytest.param(lambda: call_op(x=X.bfloat16()), "x must be float16 (the dtype the weight was prepared for)",
                 "got bfloat16 [3, 128]", id="op-x-bf16-for-fp16-weight"),
    pytest.param(lambda: matmul(X.float(), PW20), "x must be float16 (the dtype the weight was prepared for)",
                 "got float32 [3, 128]", id="x-fp32"),
    pytest.param(lambda: matmul(torch.randn(3, 256).half()[:, ::2], PW20),
                 "x must be contiguous along K (stride(1) == 1)", "got strides [256, 2]", id="x-strided-along-K"),
    pytest.param(lambda: matmul(X, PW20, torch.zeros(24, dtype=torch.float16)), "bias must be float16 [N] = [20]",
                 "got float16 [24]", id="bias-padded-to-N_pad"),
    pytest.param(lambda: matmul(X, PW20, torch.zeros(20)), "bias must be float16 [N] = [20]", "got float32 [20]",
                 id="bias-fp32"),
    pytest.param(lambda: matmul(X, PW20, torch.zeros(1, 20, dtype=torch.float16)), "bias must be float16 [N] = [20]",
                 "got float16 [1, 20]", id="bias-2d"),
    pytest.param(lambda: matmul(torch.zeros(3, 136, dtype=torch.float16), PW20),
                 "x must be a tensor [..., K] with K=128", "got float16 [3, 136]", id="x-K-mismatch"),
    pytest.param(lambda: matmul(torch.tensor(1.0, dtype=torch.float16), PW20),
                 "x must be a tensor [..., K] with K=128", "got float16 []", id="x-0d"),
    pytest.param(lambda: matmul(X.tolist(), PW20), "x must be a tensor [..., K] with K=128", "got list",
                 id="x-list"),
    pytest.param(lambda: matmul(X.numpy(), PW20), "x must be a tensor [..., K] with K=128", "got ndarray",
                 id="x-numpy"),
    pytest.param(lambda: matmul(X, KernelWeights(PW20.qweight, PW20.scales, PW20.zeros, 32)),
                 "w must be a PreparedWeight", "got KernelWeights", id="w-KernelWeights"),
    pytest.param(lambda: matmul(X, W20), "w must be a PreparedWeight", "got QuantizedWeight", id="w-QuantizedWeight"),
    pytest.param(lambda: matmul(X.to("meta"), PW20), "must be on one device", "got ['cpu', 'meta']", id="x-on-meta"),
]


@pytest.mark.parametrize("call, expected, given", CONTRACT_CASES)
def test_contract_errors_name_expected_and_given(ran, monkeypatch, call, expected, given):
    on(monkeypatch, PLATFORMS["h200"])
    with pytest.raises(ContractError) as err:
        call()
    assert expected in str(err.value) and given in str(err.value), str(err.value)
    assert ran == []


# ----------------------------------------------------------------------------------------------
# 5. numerics on CPU, real runners


def real_cpu_platform(monkeypatch) -> None:
    """The platform detection of a CPU machine without Triton's interpreter: auto must pick the
    torch or dense path here (the interpreter is too slow for this module)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(dispatch, "detect_platform", dispatch.detect_platform.__wrapped__)


def judge_against_oracle(y: torch.Tensor, x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None) -> None:
    """Every implementation rounds W once into x.dtype ((q - z) * s) and accumulates in fp32."""
    k, n = w.k, w.n
    v = judge(y.reshape(-1, n), reference_matmul(x.reshape(-1, k), w, bias), dequant_dtype=x.dtype)
    assert v.passed and v.hard_violations == 0, v.summary()


# (lead dims of x, N, K, G, symmetric, act-order, dtype, bias)
NUMERIC_CASES = {
    "M5-N20-G32-asym-fp16-bias": ((5,), 20, 128, 32, False, False, torch.float16, True),
    "M5-N20-Gm1-sym-bf16": ((5,), 20, 136, -1, True, False, torch.bfloat16, False),
    "M4-N24-G64-asym-bf16-actorder-bias": ((4,), 24, 256, 64, False, True, torch.bfloat16, True),
    "M7-N20-G32-sym-fp16-actorder": ((7,), 20, 128, 32, True, True, torch.float16, False),
    "x2x3-N20-G128-asym-bf16-bias": ((2, 3), 20, 256, 128, False, False, torch.bfloat16, True),
    "x1d-N20-G32-asym-fp16-bias": ((), 20, 128, 32, False, False, torch.float16, True),
    "M40-N20-G64-asym-fp16-bias": ((40,), 20, 128, 64, False, False, torch.float16, True),
    "M0-N20": ((0,), 20, 128, 32, False, False, torch.float16, True),
    "x2x0-N20": ((2, 0), 20, 128, 32, True, False, torch.bfloat16, False),
}


def numeric_cases():
    for case_id, case in NUMERIC_CASES.items():
        for impl in ("torch", "dense", "auto"):
            for dense_cache in (False, True):
                if impl == "dense" and not dense_cache:
                    continue  # forcing dense without the cache raises (tested above)
                yield pytest.param(case, impl, dense_cache, id=f"{case_id}-{impl}{'-cache' if dense_cache else ''}")


@pytest.mark.parametrize("case, impl, dense_cache", list(numeric_cases()))
def test_matches_oracle_reference(monkeypatch, case, impl, dense_cache):
    lead, n, k, group_size, symmetric, act_order, dtype, has_bias = case
    real_cpu_platform(monkeypatch)
    w = make_weight(n, k, group_size, symmetric, act_order, seed=n * k)
    w = w.with_scales(w.scales.to(dtype))
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(*lead, k, generator=gen).to(dtype)
    bias = (0.5 * torch.randn(n, generator=gen)).to(dtype) if has_bias else None
    pw = prepare(w, dtype, dense_cache=dense_cache)
    m = x.numel() // k
    if impl == "auto" and m:
        want = "dense" if dense_cache and m >= dispatch.thresholds_for("interpreter").dense_min_m else "torch"
        assert choose(m, pw).name == want
    y = matmul(x, pw, bias, impl=impl)
    assert y.shape == (*lead, n) and y.dtype == dtype and y.is_contiguous()
    judge_against_oracle(y, x, w, bias)
    # The dense cache holds exactly what the torch path dequantizes on the fly: same bits out.
    assert torch.equal(y, matmul(x, prepare(w, dtype), bias, impl="torch"))


@pytest.mark.parametrize("impl", ("auto", "skinny"))
def test_op_with_no_rows_returns_an_unpadded_empty_result(ran, monkeypatch, impl):
    # matmul reshapes to [..., N], which hides a padded [0, N_pad]: call the op itself. No rows
    # means nothing to compute, so not even a forced implementation that cannot run is consulted.
    on(monkeypatch, PLATFORMS["cpu"])
    y = call_op(x=X[:0], impl=impl)
    assert y.shape == (0, 20) and y.dtype == torch.float16
    assert ran == []


# ----------------------------------------------------------------------------------------------
# 6. property: the torch implementation equals the oracle on any small problem


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 64), n=st.integers(1, 64), groups=st.integers(1, 4), group_size=st.sampled_from(GROUPS),
       dtype=st.sampled_from(tuple(DTYPES.values())), symmetric=st.booleans(), act_order=st.booleans(),
       has_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_torch_impl_matches_oracle_property(m, n, groups, group_size, dtype, symmetric, act_order, has_bias, seed):
    # Channelwise (G = -1) takes K = 40 per "group": K need only be a multiple of 8 there.
    k = groups * (40 if group_size == -1 else group_size)
    w = make_weight(n, k, group_size, symmetric, act_order and group_size != -1 and groups > 1, seed)
    w = w.with_scales(w.scales.to(dtype))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype) if has_bias else None
    y = matmul(x, prepare(w, dtype), bias, impl="torch")
    assert y.shape == (m, n) and y.dtype == dtype
    judge_against_oracle(y, x, w, bias)


# ----------------------------------------------------------------------------------------------
# 7. torch.library registration


@pytest.mark.parametrize("symmetric, act_order, has_bias, impl", (
    pytest.param(True, False, False, "torch", id="sym-torch"),
    pytest.param(False, True, True, "torch", id="asym-actorder-bias-torch"),
    pytest.param(False, False, True, "dense", id="asym-bias-dense"),
))
def test_opcheck(symmetric, act_order, has_bias, impl):
    w = make_weight(20, 128, 32, symmetric, act_order, seed=3)
    pw = prepare(w, torch.bfloat16, dense_cache=impl == "dense")
    x = torch.randn(3, 128).bfloat16()
    bias = torch.randn(20).bfloat16() if has_bias else None
    assert (pw.zeros is None) == symmetric and (pw.perm is not None) == act_order
    torch.library.opcheck(torch.ops.w4a16.matmul.default,
                          (x, pw.qweight, pw.scales, pw.zeros, pw.group_size, pw.n, pw.perm, pw.dense, bias, impl))


@pytest.mark.parametrize("lead, impl", (
    pytest.param(((3,), (5,)), "torch", id="2d-x-torch"),
    pytest.param(((2, 3), (1, 4)), None, id="3d-x-auto"),
))
def test_compiled_matmul_equals_eager(monkeypatch, lead, impl):
    real_cpu_platform(monkeypatch)
    pw = prepare(make_weight(20, 128, 64, False, seed=4), torch.float16)
    bias = torch.randn(20).half()

    def f(x):
        return matmul(x, pw, bias, impl=impl)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    # Two M per case: the second call goes through the fake implementation with a new shape.
    for shape in lead:
        x = torch.randn(*shape, 128).half()
        assert torch.equal(compiled(x), f(x))


@pytest.mark.parametrize("case_id", ("M5-N20-G32-asym-fp16-bias", "M4-N24-G64-asym-bf16-actorder-bias",
                                     "M5-N20-Gm1-sym-bf16"))
def test_transient_runner_matches_the_oracle(case_id):
    """The transient path's runner on CPU tensors (its dequantization kernel under Triton's
    interpreter, padded rows and act-order included): the same GEMM on the same bits as the dense
    cache, so the same output, and within the oracle's bound."""
    lead, n, k, group_size, symmetric, act_order, dtype, has_bias = NUMERIC_CASES[case_id]
    w = make_weight(n, k, group_size, symmetric, act_order, seed=n * k)
    w = w.with_scales(w.scales.to(dtype))
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(*lead, k, generator=gen).to(dtype)
    bias = (0.5 * torch.randn(n, generator=gen)).to(dtype) if has_bias else None
    y = hybrid.RUNNERS["transient"](x.reshape(-1, k), prepare(w, dtype), bias)
    assert y.shape == (x.numel() // k, n) and y.dtype == dtype
    dense = prepare(w, dtype, dense_cache=True).dense
    assert torch.equal(y, torch.nn.functional.linear(x.reshape(-1, k), dense, bias))
    judge_against_oracle(y, x, w, bias)

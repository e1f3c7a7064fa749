"""W4A16Linear (optimized/linear.py): numerics against the oracle, the nn.Linear surface, the repr's
dispatch summary, state_dict round trips and refusals, device and dtype moves, torch.compile, and
(on a GPU) a captured CUDA graph.

CPU cells run the hybrid op's "torch" implementation (forced per module), except where a test
says otherwise: the Triton interpreter is judged by tests/optimized/test_triton_kernel.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from optimized import W4A16Linear, dispatch, prepare, skinny
from optimized.contract import ContractError
from optimized.dispatch import Platform
from optimized.linear import LAYOUT_VERSION
from oracle import QuantizedWeight, judge, quantize_rtn, reference_matmul
from tests.support.weights import make_weight

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
HAS_GPU = torch.cuda.is_available()
NEEDS_GPU = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA or ROCm device")
H200 = Platform("cuda", "NVIDIA H200", (True, ""), (True, ""))
H100 = Platform("cuda", "NVIDIA H100", (True, ""), (True, ""))
CPU = Platform("cpu", "interpreter", (False, "the skinny kernel needs a CUDA or ROCm device"),
               (False, "Triton runs on CPU only under its interpreter (TRITON_INTERPRET=1)"))

pytestmark = pytest.mark.usefixtures("one_thread")


def dense_linear(n: int, k: int, dtype: torch.dtype, bias: bool, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        if bias:
            linear.bias.normal_(0, 0.5)
    return linear.to(dtype)


def assert_matches_oracle(y: torch.Tensor, x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None) -> None:
    """Every implementation rounds W once into x.dtype ((q - z) * s) and accumulates in fp32."""
    w = w.with_scales(w.scales.to(x.dtype))
    ref = reference_matmul(x.reshape(-1, w.k), w, None if bias is None else bias.detach())
    v = judge(y.reshape(-1, w.n), ref, dequant_dtype=x.dtype)
    assert v.passed and v.hard_violations == 0, v.summary()


# ----------------------------------------------------------------------------------------------
# 1. numerics and the nn.Linear surface

# (N, K, group_size, symmetric, dtype, bias, leading dims of x)
FROM_LINEAR_CASES = {
    "N60-K128-G32-asym-bf16-bias-3d": (60, 128, 32, False, "bf16", True, (2, 3)),
    "N64-K256-G64-sym-fp16-2d": (64, 256, 64, True, "fp16", False, (5,)),
    "N24-K128-G128-asym-fp16-bias-1d": (24, 128, 128, False, "fp16", True, ()),
    "N40-K96-Gm1-sym-bf16-bias-M0": (40, 96, -1, True, "bf16", True, (0,)),
}


@pytest.mark.parametrize("case", FROM_LINEAR_CASES.values(), ids=FROM_LINEAR_CASES.keys())
def test_from_linear_computes_the_rtn_weight(case):
    n, k, group_size, symmetric, dtype, has_bias, lead = case
    dtype = DTYPES[dtype]
    linear = dense_linear(n, k, dtype, has_bias, seed=n + k)
    layer = W4A16Linear.from_linear(linear, group_size, symmetric, impl="torch")
    # The module holds exactly what the oracle's quantizer makes of the dense weight.
    want = quantize_rtn(linear.weight.detach(), group_size, symmetric, scale_dtype=dtype)
    assert layer.canonical().equal(want)
    assert (layer.in_features, layer.out_features, layer.group_size) == (k, n, group_size)
    assert layer.dtype == dtype and layer.symmetric == symmetric and not layer.act_order
    if has_bias:
        assert isinstance(layer.bias, nn.Parameter) and not layer.bias.requires_grad
        assert torch.equal(layer.bias, linear.bias.detach())
    else:
        assert layer.bias is None
    x = torch.randn(*lead, k, generator=torch.Generator().manual_seed(k)).to(dtype)
    y = layer(x)
    assert y.shape == (*lead, n) and y.dtype == dtype
    if x.numel():
        assert_matches_oracle(y, x, want, linear.bias)


@pytest.mark.parametrize("symmetric", (False, True), ids=("asym", "sym"))
def test_from_weight_act_order_and_strided_input(symmetric):
    w = make_weight(24, 256, 64, symmetric, act_order=True, seed=3)
    bias = torch.randn(24, generator=torch.Generator().manual_seed(4))  # float32: stored in the layer's dtype
    layer = W4A16Linear.from_weight(w, torch.bfloat16, bias, impl="torch")
    assert layer.act_order and layer.bias.dtype == torch.bfloat16
    assert layer.canonical().equal(w.with_scales(w.scales.to(torch.bfloat16)))
    # A transposed (non-contiguous) x is taken like nn.Linear takes it.
    x = torch.randn(256, 6, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).t()
    assert not x.is_contiguous()
    assert_matches_oracle(layer(x), x.contiguous(), w, layer.bias)


def test_module_matches_the_op_on_its_prepared_weight():
    """The forward is the hybrid op on the buffers: same bits as optimized.matmul."""
    from optimized import matmul

    w = make_weight(20, 128, 32, False, seed=6)
    layer = W4A16Linear.from_weight(w, torch.float16, torch.randn(20).half(), impl="torch")
    x = torch.randn(3, 128).half()
    assert torch.equal(layer(x), matmul(x, layer.prepared, layer.bias, impl="torch"))


# ----------------------------------------------------------------------------------------------
# 2. repr: layout, group size, symmetry, and the implementation per M range


def on(monkeypatch, platform: Platform) -> None:
    monkeypatch.setattr(dispatch, "detect_platform", lambda device: platform)


def expected_ranges(platform: Platform, dense: bool, k: int) -> list[tuple[int, int | None, str]]:
    """The dispatcher's rule restated from the policy thresholds, for weights of K columns
    (tests/optimized/test_hybrid.py checks the rule itself): skinny up to skinny_max_m where it
    takes that M (above MAX_M only its tile kernel runs, on CUDA with K % 128 == 0), else up to
    MAX_M at most."""
    t = dispatch.thresholds_for(platform.name)
    out, lo = [], 1
    takes_all = not skinny.unfit(t.skinny_max_m, k, platform.kind == "rocm")
    skinny_hi = t.skinny_max_m if takes_all else min(t.skinny_max_m, skinny.MAX_M)
    if platform.skinny[0]:
        # A dense cache outranks skinny; skinny outranks the transient path.
        hi = min(skinny_hi, t.dense_min_m - 1) if dense else skinny_hi
        out.append((1, hi, "skinny"))
        lo = hi + 1
    rest = "triton" if platform.triton[0] else "torch"
    if dense or (platform.kind == "cuda" and platform.triton[0]):
        start = t.dense_min_m if dense else max(lo, t.transient_min_m)
        if lo < start:
            out.append((lo, start - 1, rest))
        out.append((start, None, "dense" if dense else "transient"))
    else:
        out.append((lo, None, rest))
    return out


@pytest.mark.parametrize("platform, dense, k", (
    pytest.param(H200, False, 128, id="h200"),
    pytest.param(H200, True, 128, id="h200-dense-cache"),
    pytest.param(CPU, True, 128, id="cpu-dense-cache"),
    pytest.param(H100, False, 128, id="h100-skinny-past-16"),
    pytest.param(H100, False, 192, id="h100-K-not-tiled-skinny-to-16"),
))
def test_repr_names_layout_and_implementation_per_m_range(monkeypatch, platform, dense, k):
    on(monkeypatch, platform)
    w = make_weight(20, k, 64, False, act_order=True, seed=7)
    layer = W4A16Linear.from_weight(w, torch.bfloat16, torch.zeros(20), dense_cache=dense)
    ranges = layer.implementation_ranges()
    assert ranges == expected_ranges(platform, dense, k)
    if platform is H100:
        skinny_max_m = dispatch.thresholds_for(H100.name).skinny_max_m
        assert ranges[0] == (1, skinny_max_m if k % 128 == 0 else 16, "skinny"), ranges
    # Each range agrees with choose() inside it and at its edges.
    from optimized import choose
    for lo, hi, name in ranges:
        for m in {lo, (lo + hi) // 2 if hi else lo * 3, hi or 4096}:
            assert choose(m, layer.prepared).name == name, (m, ranges)
    text = repr(layer)
    for part in (f"in_features={k}", "out_features=20", "bias=True", "dtype=bfloat16", "group_size=64",
                 "asymmetric", "act-order", "kernel layout"):
        assert part in text, text
    assert ("dense cache" in text) == dense
    if platform is H200:
        assert ranges[0][2] == "skinny" and f"M=1-{ranges[0][1]}: skinny" in text, text


def test_repr_of_a_forced_implementation_and_a_symmetric_channelwise_layer(monkeypatch):
    on(monkeypatch, H200)
    layer = W4A16Linear.from_weight(make_weight(16, 64, -1, True, seed=8), torch.float16, impl="skinny")
    text = repr(layer)
    assert "per-channel (G=K)" in text and "symmetric (z=8)" in text and "bias=False" in text
    # skinny takes G = -1 nowhere: every M says so instead of the repr raising.
    assert re.search(r"impl \(forced\): all M: nothing \(skinny is forced and cannot run\)", text), text


# ----------------------------------------------------------------------------------------------
# 3. state_dict round trips and refusals


def module_pair(symmetric: bool, act_order: bool, bias: bool, dense: bool, n: int = 60, group_size: int = 32):
    w = make_weight(n, 128, group_size, symmetric, act_order=act_order, seed=9)
    b = torch.randn(n) if bias else None
    src = W4A16Linear.from_weight(w, torch.bfloat16, b, dense_cache=dense, impl="torch")
    return src, w


LAYOUTS = [pytest.param(s, a, b, d, id=f"{'sym' if s else 'asym'}{'-actorder' if a else ''}{'-bias' if b else ''}"
                                        f"{'-dense' if d else ''}")
           for s, a, b, d in ((False, False, True, False), (True, True, False, True), (False, True, True, True))]


@pytest.mark.parametrize("symmetric, act_order, bias, dense", LAYOUTS)
def test_state_dict_round_trip_is_bit_identical(symmetric, act_order, bias, dense):
    src, w = module_pair(symmetric, act_order, bias, dense)
    state = src.state_dict()
    want_keys = {"qweight", "scales", "layout"} | ({"zeros"} if not symmetric else set()) \
        | ({"perm"} if act_order else set()) | ({"bias"} if bias else set())
    assert set(state) == want_keys  # the dense cache is rebuilt, not saved
    assert state["layout"].tolist() == [LAYOUT_VERSION, 60, 128, 32]
    x = torch.randn(7, 128).bfloat16()
    # Into a fresh module of the same layout (zeros), and into one holding another weight.
    fresh = W4A16Linear.empty(128, 60, group_size=32, symmetric=symmetric, act_order=act_order, bias=bias,
                              dense_cache=dense, impl="torch")
    other = W4A16Linear.from_weight(make_weight(60, 128, 32, symmetric, act_order=act_order, seed=10),
                                    torch.bfloat16, torch.zeros(60) if bias else None, dense_cache=dense, impl="torch")
    for target in (fresh, other):
        assert not torch.equal(target(x), src(x))
        target.load_state_dict(state)
        assert torch.equal(target(x), src(x))
        assert target.canonical().equal(w.with_scales(w.scales.to(torch.bfloat16)))
        if dense:  # rebuilt from the loaded buffers, bit for bit
            assert torch.equal(target.dense, src.dense)


def test_state_dict_loads_inside_a_model_and_across_dense_cache_choices():
    src, _ = module_pair(False, False, True, dense=False)
    model = nn.Sequential(nn.LayerNorm(128), src).bfloat16()
    target = nn.Sequential(nn.LayerNorm(128), W4A16Linear.empty(128, 60, group_size=32, bias=True,
                                                                 dense_cache=True, impl="torch")).bfloat16()
    target.load_state_dict(model.state_dict())
    x = torch.randn(4, 128).bfloat16()
    assert torch.equal(target(x), model(x))


REFUSALS = {
    # name: (what the target is, the state_dict's source, a phrase the error must hold)
    "other-N-same-padded-shapes": (dict(out=64), dict(), "expected a state_dict of W4A16Linear(N=64, K=128, "
                                                         "group_size=32), got one of N=60"),
    "other-group-size": (dict(group_size=64), dict(), "group_size=64), got one of N=60, K=128, group_size=32"),
    "asym-into-sym": (dict(symmetric=True), dict(), "holds 'zeros' but this module is not asymmetric"),
    "sym-into-asym": (dict(), dict(symmetric=True), "lacks 'zeros' but this module is asymmetric"),
    "act-order-into-plain": (dict(), dict(act_order=True), "holds 'perm' but this module is not act-order"),
    "no-bias-into-bias": (dict(bias=True), dict(bias=False), "lacks 'bias' but this module is with a bias"),
    "fp16-into-bf16": (dict(), dict(dtype=torch.float16), "expected 'scales' bfloat16 [64, 4] (loading never converts"),
    "dense-linear-state": (dict(), dict(dense_linear=True), "holds a dense 'weight' float32 [60, 128] (an nn.Linear's)"),
    "other-layout-version": (dict(), dict(version=2), "expected layout version 1, got 2"),
}


@pytest.mark.parametrize("target, source, phrase", REFUSALS.values(), ids=REFUSALS.keys())
def test_state_dict_of_another_layout_is_refused_by_name(target, source, phrase):
    tgt = W4A16Linear.empty(128, target.get("out", 60), group_size=target.get("group_size", 32),
                            symmetric=target.get("symmetric", False), bias=target.get("bias", True), impl="torch")
    before = {k: v.clone() for k, v in tgt.state_dict().items()}
    if source.get("dense_linear"):
        state = nn.Linear(128, 60).state_dict()
    else:
        w = make_weight(60, 128, 32, source.get("symmetric", False), act_order=source.get("act_order", False), seed=11)
        src = W4A16Linear.from_weight(w, source.get("dtype", torch.bfloat16),
                                      torch.zeros(60) if source.get("bias", True) else None)
        state = src.state_dict()
        if "version" in source:
            state["layout"][0] = source["version"]
    model = nn.Sequential(tgt)
    with pytest.raises(RuntimeError, match=re.escape(phrase)) as info:
        model.load_state_dict({f"0.{k}": v for k, v in state.items()})
    assert "0: " in str(info.value)  # names the module at fault
    assert all(torch.equal(before[k], v) for k, v in tgt.state_dict().items())  # nothing half-loaded


# ----------------------------------------------------------------------------------------------
# 4. dtype and device moves, bad input


def test_half_of_a_bf16_layer_rebuilds_its_dense_cache():
    w = make_weight(20, 128, 32, False, seed=12)
    layer = W4A16Linear.from_weight(w, torch.bfloat16, dense_cache=True, impl="torch").half()
    want = W4A16Linear.from_weight(w.with_scales(w.scales.to(torch.bfloat16)), torch.float16, dense_cache=True)
    assert layer.dtype == torch.float16 and torch.equal(layer.dense, want.dense)
    x = torch.randn(3, 128).half()
    assert torch.equal(layer(x), want(x))


def test_float_cast_fails_at_the_call_naming_the_dtype():
    layer = W4A16Linear.from_weight(make_weight(16, 64, 32, False, seed=13), torch.float16, impl="torch").float()
    with pytest.raises(ContractError, match=r"scales must be contiguous float16 or bfloat16 .* got float32"):
        layer(torch.randn(2, 64).half())
    assert "impl: none (prepared scales must be" in repr(layer)


BAD_INPUTS = {
    "prepared-not-a-PreparedWeight": (lambda: W4A16Linear(make_weight(16, 64, 32, False)),
                                      "prepared must be a PreparedWeight from optimized.prepare(...), got QuantizedWeight"),
    "bias-wrong-length": (lambda: W4A16Linear(prepare(make_weight(16, 64, 32, False), torch.float16), torch.zeros(15)),
                          "bias must be a floating-point tensor [N] = [16] or None, got float32 [15]"),
    "impl-unknown": (lambda: W4A16Linear(prepare(make_weight(16, 64, 32, False), torch.float16), impl="fast"),
                     "impl must be 'auto' or one of"),
    "from-linear-float32": (lambda: W4A16Linear.from_linear(nn.Linear(64, 16)),
                            "linear.weight is float32, so pass dtype="),
    "from-linear-not-linear": (lambda: W4A16Linear.from_linear(nn.Conv1d(4, 4, 1)), "got Conv1d"),
    "from-linear-group-not-dividing-K": (lambda: W4A16Linear.from_linear(nn.Linear(96, 16).half(), 64),
                                         "in_features (K) must be a multiple of group_size, got K=96, group_size=64"),
    "from-linear-unsupported-group": (lambda: W4A16Linear.from_linear(nn.Linear(512, 16).half(), 256),
                                      "group_size must be one of (32, 64, 128, -1)"),
    "x-wrong-K": (lambda: W4A16Linear(prepare(make_weight(16, 64, 32, False), torch.float16))(torch.zeros(2, 32).half()),
                  "x must be a tensor [..., K] with K=64, got float16 [2, 32]"),
    "x-wrong-dtype": (lambda: W4A16Linear(prepare(make_weight(16, 64, 32, False), torch.float16))(torch.zeros(2, 64)),
                      "x must be float16 (the dtype the weight was prepared for)"),
    "x-on-meta": (lambda: W4A16Linear(prepare(make_weight(16, 64, 32, False), torch.float16))(
        torch.zeros(2, 64, dtype=torch.float16, device="meta")), "x must be on the module's device cpu, got meta"),
}


@pytest.mark.parametrize("call, message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_names_expected_and_given(call, message):
    with pytest.raises(ContractError, match=re.escape(message)):
        call()


# ----------------------------------------------------------------------------------------------
# 5. torch.compile


def test_compiled_module_equals_eager(monkeypatch):
    """fullgraph: no graph break anywhere in the module, $W4A16_IMPL read included (at trace time)."""
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    torch._dynamo.reset()
    linear = dense_linear(20, 128, torch.float16, bias=True, seed=14)
    layer = W4A16Linear.from_linear(linear, 64)
    model = nn.Sequential(nn.LayerNorm(128).half(), layer)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    # Two M: the second goes through the op's fake implementation with a new shape. No grad: the
    # op has no backward (inference only), and the LayerNorm's parameters would ask for one.
    with torch.no_grad():
        for shape in ((3, 128), (2, 5, 128)):
            x = torch.randn(*shape).half()
            assert torch.equal(compiled(x), model(x))


# ----------------------------------------------------------------------------------------------
# 6. the device: moves, and a captured CUDA graph


@NEEDS_GPU
@pytest.mark.gpu
def test_to_cuda_moves_every_buffer_and_state_dict_crosses_devices():
    src, w = module_pair(False, True, True, dense=True)
    layer = src.to("cuda")
    assert all(t.device.type == "cuda" for t in (*layer.buffers(), layer.bias))
    x = torch.randn(5, 128, device="cuda").bfloat16()
    assert_matches_oracle(layer(x).cpu(), x.cpu(), w, layer.bias.cpu())
    back = W4A16Linear.empty(128, 60, group_size=32, act_order=True, bias=True)
    back.load_state_dict(layer.state_dict())
    assert back.canonical().equal(w.with_scales(w.scales.to(torch.bfloat16)))


GRAPH_CASES = [pytest.param(m, dense, id=f"M{m}{'-dense' if dense else ''}", marks=[NEEDS_GPU, pytest.mark.gpu])
               for m, dense in ((1, False), (16, False), (33, False), (64, True))]


@pytest.mark.parametrize("m, dense", GRAPH_CASES)
def test_cuda_graph_replay_equals_eager_and_the_oracle(m, dense):
    """One layer captured in a CUDA graph (whichever implementation the dispatcher picks at this M:
    skinny, Triton or the dense cache), replayed on new inputs copied into the captured buffer."""
    w = quantize_rtn(torch.randn(96, 512, device="cuda") * 0.02, 128, False, torch.bfloat16)
    layer = W4A16Linear.from_weight(w, torch.bfloat16, torch.randn(96, device="cuda"), dense_cache=dense)
    static_x = torch.randn(m, 512, device="cuda").bfloat16()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile / load outside the capture
            layer(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    for seed in range(3):
        x = torch.randn(m, 512, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).bfloat16()
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        # skinny and Triton are deterministic: the replay gives eager's bits (cuBLAS, behind the
        # dense cache, promises that only for one stream, and the capture runs on its own).
        if not dense:
            assert torch.equal(static_y, layer(x)), f"seed {seed}"
        assert_matches_oracle(static_y.cpu(), x.cpu(), w.to("cpu"), layer.bias.cpu())

"""Models with W4A16Linear layers (optimized/model.py): a tiny Llama (transformers, random weights,
no download) quantized in place and judged against its dense twins with the oracle's error model;
checkpoints written by the oracle's converters in every format loaded bit-exactly; every way a
checkpoint and a model can fail to match, each named; the swap on a plain nn.Module.

The judging (per layer with oracle.judge, and at the logits against the dense twins) and its
derivation are in tests/support/model_check.py.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from optimized import ModelLoadError, W4A16Linear, dispatch, load_quantized, quantize_model
from optimized.contract import ContractError
from oracle import quantize_rtn, write_checkpoint
from oracle.layouts import nibbles
from oracle.quantize import act_order_g_idx
from tests.support.model_check import dense_twin, judge_layers, judge_logits, record_io

HAS_GPU = torch.cuda.is_available()
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Weights at about 1/sqrt(hidden): activations stay O(1) and attention is not uniform, so a wrong
# weight shows at the logits (at transformers' default 0.02 a 64-wide model barely attends).
INIT = 0.125
LAYERS = [f"model.layers.{i}.{part}" for i in range(2) for part in
          ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llama():
    """(LlamaConfig, LlamaForCausalLM, LlamaModel), or the test skips when transformers is absent."""
    transformers = pytest.importorskip("transformers", reason="transformers is an optional dependency "
                                                              "(pip install 'w4a16-oracle[model]')")
    return transformers.LlamaConfig, transformers.LlamaForCausalLM, transformers.LlamaModel


def tiny_config(llama):
    """Llama architecture, hidden 64, 2 layers, 4 heads (2 kv heads), intermediate 128, vocab 128,
    with q/k/v/o and MLP biases (as Qwen-style models have) so that bias handling is exercised."""
    return llama[0](hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=128, vocab_size=128, max_position_embeddings=256, attention_bias=True,
                    mlp_bias=True, initializer_range=INIT)


def source_model(llama, dtype: torch.dtype, seed: int = 0, device: str = "cpu") -> nn.Module:
    """Random weights; biases drawn at the weights' scale (transformers initializes them to zero)."""
    torch.manual_seed(seed)
    model = llama[1](tiny_config(llama)).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.normal_(0, INIT)
    return model.to(device, dtype)


def prompt(device: str = "cpu") -> torch.Tensor:
    """16 tokens: M = 16 rows, which on a GPU the skinny kernel takes."""
    return torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(1)).to(device)


def rtn_weights(model: nn.Module, group_size: int, symmetric: bool, scale_dtype: torch.dtype,
                act_order: bool = False) -> dict:
    """What the quantizer must make of each layer, computed here independently of the swap."""
    gen = torch.Generator().manual_seed(2)
    out = {}
    for name in LAYERS:
        w = model.get_submodule(name).weight.detach()
        g_idx = act_order_g_idx(w.shape[1], group_size, gen).to(w.device) if act_order else None
        out[name] = quantize_rtn(w, group_size, symmetric, scale_dtype, g_idx)
    return out


def layer_biases(model: nn.Module) -> dict:
    return {name: model.get_submodule(name).bias.detach() for name in LAYERS}


def check(model: nn.Module, weights: dict, biases: dict, l_dense: torch.Tensor, l_exact: torch.Tensor):
    """The per-layer verdicts and the logits verdict of one forward of the prompt."""
    ids = prompt(l_exact.device.type)
    with torch.no_grad(), record_io(model, LAYERS) as records:
        logits = model(ids).logits
    return judge_layers(records, weights, biases), judge_logits(logits, l_dense, l_exact)


def twins_logits(model: nn.Module, weights: dict, biases: dict, dtype: torch.dtype):
    """(Ld, L*): the dense twin's logits in `dtype` and the float64 twin's (model_check.py)."""
    ids = prompt(next(model.parameters()).device.type)
    with torch.no_grad():
        l_dense = dense_twin(model, weights, biases, dtype)(ids).logits
        l_exact = dense_twin(model, weights, biases, torch.float64, share=False)(ids).logits
    return l_dense, l_exact


# ----------------------------------------------------------------------------------------------
# 1. a quantized tiny Llama against its dense twins


def e2e_cells():
    # (dtype, group_size, symmetric, impl, device)
    cells = {
        "bf16-asym-G32-torch-cpu": ("bf16", 32, False, "torch", "cpu"),
        "fp16-sym-G64-torch-cpu": ("fp16", 64, True, "torch", "cpu"),
        "bf16-asym-Gm1-torch-cpu": ("bf16", -1, False, "torch", "cpu"),
        # The Triton kernel itself in the model, under its CPU interpreter (about 4 s a forward).
        "bf16-asym-G32-triton-cpu": ("bf16", 32, False, "triton", "cpu"),
        "bf16-asym-G32-auto-cuda": ("bf16", 32, False, None, "cuda"),
        "fp16-sym-G64-auto-cuda": ("fp16", 64, True, None, "cuda"),
    }
    for name, cell in cells.items():
        marks = []
        if cell[4] == "cuda":
            marks += [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA or ROCm device")]
        if cell[3] == "triton":
            ok, why = dispatch.detect_platform(torch.device("cpu")).triton
            marks.append(pytest.mark.skipif(not ok, reason=why))
        yield pytest.param(*cell, id=name, marks=marks)


@pytest.mark.parametrize("dtype, group_size, symmetric, impl, device", e2e_cells())
def test_quantized_llama_matches_its_dense_twin(llama, monkeypatch, dtype, group_size, symmetric, impl, device):
    """The W4 model differs from the exact network only by rounding, and each rounding is bounded.

    Bit-exact first: every module holds exactly what oracle.quantize_rtn makes of the dense layer
    (computed here, independently of the swap). Per layer: hooks record each quantized layer's
    input and output in the real forward, and oracle.judge holds the output to the tight bound
    around the exact (float64) product of that input with that weight plus the original bias. The
    input is the W4 model's own, not the dense twin's: the bound is about the product of whatever
    the layer was given, so any input is as good, and this one is what the model really computes.
    At the logits: L* is the twin holding the dequantized weights exactly, in float64 (the exact
    function of the quantized network), Ld the same twin in the activation dtype with each weight
    rounded once (what a plain layer computes, and what the kernels dequantize into), Lq the W4
    model. Both Lq and Ld deviate from L* by rounding alone; the tight bound is TIGHT_SIGMAS = 6
    standard deviations of a plain layer's rounding, and to first order the logits' deviation is a
    linear function of the layers', so ||Lq - L*|| <= 6 ||Ld - L*|| (Frobenius over all logits).
    tests/support/model_check.py gives the details; test_a_planted_bug_fails_the_check shows that a
    wrong zero point, a missing bias and a transposed weight fail it.
    """
    if impl:
        monkeypatch.setenv(dispatch.ENV_VAR, impl)
    dtype = DTYPES[dtype]
    source = source_model(llama, dtype, device=device)
    weights, biases = rtn_weights(source, group_size, symmetric, dtype), layer_biases(source)
    model = copy.deepcopy(source)
    report = quantize_model(model, group_size, symmetric)
    assert report.replaced == LAYERS and report.unmatched == []
    assert report.skipped == [("lm_head", "named by skip pattern 'lm_head'")]
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, W4A16Linear)
    for name in LAYERS:  # bit-exact: the module holds what the quantizer makes
        assert model.get_submodule(name).canonical().equal(weights[name]), name
    l_dense, l_exact = twins_logits(model, weights, biases, dtype)
    layers, logits = check(model, weights, biases, l_dense, l_exact)
    print("\n".join(f"{name}: {v.summary()}" for name, v in layers.items()) + "\nlogits: " + logits.summary())
    assert all(v.passed for v in layers.values()), [name for name, v in layers.items() if not v.passed]
    assert logits.passed, logits.summary()


def wrong_zero_point(model: nn.Module) -> str:
    layer = "model.layers.1.mlp.down_proj"
    module = model.get_submodule(layer)
    z = nibbles.unpack(module.zeros, 0)
    z[3, 1] = (z[3, 1] + 1) % 16  # one zero point of one row and group, off by one
    module.zeros.copy_(nibbles.pack(z, 0))
    return layer


def missing_bias(model: nn.Module) -> str:
    layer = "model.layers.0.self_attn.o_proj"
    model.get_submodule(layer).bias = None
    return layer


def transposed_weight(model: nn.Module) -> str:
    layer = "model.layers.0.self_attn.q_proj"  # square, so W^T fits
    module = model.get_submodule(layer)
    w = module.canonical()
    wt = quantize_rtn(w.dequantize(torch.float32).t().contiguous(), 32, False, w.scales.dtype)
    parent, _, child = layer.rpartition(".")
    setattr(model.get_submodule(parent), child, W4A16Linear.from_weight(wt, w.scales.dtype, module.bias))
    return layer


@pytest.fixture(scope="module")
def judged_llama(llama):
    """A bf16, asymmetric G=32 quantized tiny Llama, its weights, biases and twin logits."""
    source = source_model(llama, torch.bfloat16)
    weights, biases = rtn_weights(source, 32, False, torch.bfloat16), layer_biases(source)
    model = copy.deepcopy(source)
    quantize_model(model, 32, False)
    for module in model.modules():
        if isinstance(module, W4A16Linear):
            module.impl = "torch"
    return model, weights, biases, *twins_logits(model, weights, biases, torch.bfloat16)


@pytest.mark.parametrize("plant, visible_at_logits", (
    pytest.param(wrong_zero_point, False, id="one-wrong-zero-point"),
    pytest.param(missing_bias, True, id="missing-bias"),
    pytest.param(transposed_weight, True, id="transposed-weight"),
))
def test_a_planted_bug_fails_the_check(judged_llama, plant, visible_at_logits):
    """The per-layer check names the one layer at fault for every bug; the gross ones also fail the
    logits bound. One wrong zero point moves one element of one layer's output: at the logits it
    hides within the bf16 noise, which is why the per-layer check exists."""
    model, weights, biases, l_dense, l_exact = judged_llama
    _, clean = check(model, weights, biases, l_dense, l_exact)
    assert clean.passed, clean.summary()
    broken = copy.deepcopy(model)
    with torch.no_grad():
        layer = plant(broken)
    layers, logits = check(broken, weights, biases, l_dense, l_exact)
    assert [name for name, v in layers.items() if not v.passed] == [layer], {n: v.summary() for n, v in layers.items()}
    if visible_at_logits:
        assert not logits.passed and logits.ratio > 10, logits.summary()


# ----------------------------------------------------------------------------------------------
# 2. checkpoints in every format, loaded bit-exactly


def write_model_checkpoint(folder: Path, source: nn.Module, weights: dict, fmt: str, *, options: dict | None = None,
                           drop_rest: tuple[str, ...] = (), extra_rest: dict | None = None,
                           config_extra: dict | None = None) -> Path:
    """A checkpoint folder as a quantizer leaves one: the quantized layers written by the oracle's
    converters (model.safetensors), every other tensor of `source` (biases of quantized layers,
    embeddings, norms, lm_head) in rest.safetensors, and config.json with the quantization config."""
    folder.mkdir(parents=True, exist_ok=True)
    qc = write_checkpoint(folder / "model.safetensors", weights, fmt, **(options or {}))
    qc.update(config_extra or {})
    rest = {key: t.detach().cpu().contiguous() for key, t in source.state_dict().items()
            if not (key.endswith(".weight") and key.rpartition(".")[0] in weights) and key not in drop_rest}
    rest.update(extra_rest or {})
    save_file(rest, str(folder / "rest.safetensors"))
    (folder / "config.json").write_text(json.dumps({**source.config.to_dict(), "quantization_config": qc}, default=str))
    return folder


CHECKPOINTS = {
    # id: (fmt, options, group_size, symmetric, act_order, model dtype); act-order at G=32, where every
    # layer (K = 64 or 128) has at least two groups to permute.
    "awq-asym-G32": ("awq", {}, 32, False, False, "fp16"),
    "awq-sym-G64": ("awq", {}, 64, True, False, "fp16"),
    "gptq-v1-asym-G32": ("gptq", {"version": 1}, 32, False, False, "fp16"),
    "gptq-v1-sym-G32-actorder": ("gptq", {"version": 1}, 32, True, True, "fp16"),
    "gptq-v2-asym-G32-actorder": ("gptq", {"version": 2}, 32, False, True, "fp16"),
    "gptq-v2-sym-channel": ("gptq", {"version": 2}, -1, True, False, "fp16"),
    "ct-asym-G32": ("compressed-tensors", {}, 32, False, False, "fp16"),
    "ct-sym-G32-actorder": ("compressed-tensors", {}, 32, True, True, "fp16"),
    "ct-asym-channel": ("compressed-tensors", {}, -1, False, False, "fp16"),
    # fp16 scales in the file, a bf16 model: each scale is rounded once into bf16.
    "gptq-v2-asym-G32-into-bf16": ("gptq", {"version": 2}, 32, False, False, "bf16"),
}


@pytest.mark.parametrize("fmt, options, group_size, symmetric, act_order, dtype", CHECKPOINTS.values(),
                         ids=CHECKPOINTS.keys())
def test_checkpoint_loads_bit_exactly(llama, tmp_path, monkeypatch, fmt, options, group_size, symmetric, act_order,
                                      dtype):
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    dtype = DTYPES[dtype]
    source = source_model(llama, torch.float16)
    weights = rtn_weights(source, group_size, symmetric, torch.float16, act_order)
    path = write_model_checkpoint(tmp_path / "ckpt", source, weights, fmt, options=options)
    model = source_model(llama, dtype, seed=1)  # other random weights: everything must come from the file
    report = load_quantized(model, path)
    assert report.replaced == LAYERS and report.biases == LAYERS and report.unmatched == []
    assert report.skipped == [("lm_head", "named by skip pattern 'lm_head'")]
    other = [key for key in source.state_dict() if key.rpartition(".")[0] not in weights]
    assert sorted(report.loaded) == sorted(other)
    for name in LAYERS:
        module, want = model.get_submodule(name), weights[name]
        assert module.canonical().equal(want.with_scales(want.scales.to(dtype))), name
        assert module.act_order == act_order and module.symmetric == symmetric
        assert torch.equal(module.bias, source.get_submodule(name).bias.detach().to(dtype)), name
    state = model.state_dict()
    for key in other:
        assert torch.equal(state[key], source.state_dict()[key].to(dtype)), key
    # End to end: the same logits as the source model with each layer built from the written weight.
    want = copy.deepcopy(source).to(dtype)
    for name in LAYERS:
        parent, _, child = name.rpartition(".")
        setattr(want.get_submodule(parent), child,
                W4A16Linear.from_weight(weights[name], dtype, source.get_submodule(name).bias))
    with torch.no_grad():
        assert torch.equal(model(prompt()).logits, want(prompt()).logits)


# ----------------------------------------------------------------------------------------------
# 3. what does not match is named, and nothing changes unless allowed


@pytest.fixture(scope="module")
def gptq_parts(llama):
    source = source_model(llama, torch.float16)
    return source, rtn_weights(source, 32, False, torch.float16)


def fresh(llama) -> nn.Module:
    return source_model(llama, torch.float16, seed=1)


def assert_unchanged(model: nn.Module, reference: nn.Module) -> None:
    assert not any(isinstance(m, W4A16Linear) for m in model.modules())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))


MISSING = "model.layers.1.mlp.down_proj"


def test_missing_layer_raises_naming_it_and_leaves_the_model(llama, tmp_path, gptq_parts):
    source, weights = gptq_parts
    partial = {k: v for k, v in weights.items() if k != MISSING}
    path = write_model_checkpoint(tmp_path / "ckpt", source, partial, "gptq", drop_rest=(f"{MISSING}.weight",))
    model = fresh(llama)
    before = copy.deepcopy(model)
    with pytest.raises(ModelLoadError) as info:
        load_quantized(model, path)
    text = str(info.value)
    assert f"  {MISSING}: nn.Linear expected to be quantized" in text and "1 unmatched" in text, text
    assert "the model was left unchanged" in text
    assert [name for name, _ in info.value.report.unmatched] == [MISSING]
    assert_unchanged(model, before)


@pytest.mark.parametrize("how", ("allow_unmatched", "strict=False"))
def test_allowed_unmatched_layer_is_listed_and_left_dense(llama, tmp_path, gptq_parts, how):
    source, weights = gptq_parts
    partial = {k: v for k, v in weights.items() if k != MISSING}
    path = write_model_checkpoint(tmp_path / "ckpt", source, partial, "gptq", drop_rest=(f"{MISSING}.weight",))
    model = fresh(llama)
    kwargs = {"allow_unmatched": ["model.layers.*.mlp.down_proj"]} if how == "allow_unmatched" else {"strict": False}
    report = load_quantized(model, path, **kwargs)
    assert [name for name, _ in report.unmatched] == [MISSING] and report.allowed == [MISSING]
    assert report.replaced == [name for name in LAYERS if name != MISSING]
    assert type(model.get_submodule(MISSING)) is nn.Linear
    assert f"unmatched {MISSING}: nn.Linear expected to be quantized" in report.summary()


def test_layer_held_dense_by_the_checkpoint_is_loaded_dense(llama, tmp_path, gptq_parts):
    source, weights = gptq_parts
    partial = {k: v for k, v in weights.items() if k != MISSING}
    path = write_model_checkpoint(tmp_path / "ckpt", source, partial, "gptq")
    model = fresh(llama)
    report = load_quantized(model, path)
    assert (MISSING, "held unquantized by the checkpoint: its dense weight is loaded") in report.skipped
    assert report.unmatched == [] and f"{MISSING}.weight" in report.loaded
    assert torch.equal(model.get_submodule(MISSING).weight, source.get_submodule(MISSING).weight)


def bad_layer(weights: dict, prefix: str, n: int, k: int) -> dict:
    return {**weights, prefix: quantize_rtn(torch.randn(n, k) * 0.1, 32, False, torch.float16)}


UNMATCHED = {
    # id: (change to the written layers, to the rest, the entry the error must name)
    "layer-with-no-module": (lambda w: bad_layer(w, "model.layers.5.mlp.down_proj", 64, 128), {},
                             "model.layers.5.mlp.down_proj: checkpoint layer with no module of that name in the model"),
    "layer-on-a-norm": (lambda w: bad_layer(w, "model.layers.0.input_layernorm", 64, 64), {},
                        "the model's model.layers.0.input_layernorm is a LlamaRMSNorm, not an nn.Linear"),
    "missing-bias": (lambda w: w, {"drop_rest": ("model.layers.0.self_attn.q_proj.bias",)},
                     "model.layers.0.self_attn.q_proj.bias: the model's layer has a bias; the checkpoint has none"),
    "missing-norm": (lambda w: w, {"drop_rest": ("model.norm.weight",)},
                     "model.norm.weight: model tensor the checkpoint does not hold"),
    "tensor-naming-nothing": (lambda w: w, {"extra_rest": {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}},
                              "model.layers.0.self_attn.rotary_emb.inv_freq: checkpoint tensor with no parameter"),
}


@pytest.mark.parametrize("layers, rest, entry", UNMATCHED.values(), ids=UNMATCHED.keys())
def test_every_kind_of_mismatch_is_named(llama, tmp_path, gptq_parts, layers, rest, entry):
    source, weights = gptq_parts
    path = write_model_checkpoint(tmp_path / "ckpt", source, layers(weights), "gptq", **rest)
    model = fresh(llama)
    before = copy.deepcopy(model)
    with pytest.raises(ModelLoadError, match=re.escape(entry)):
        load_quantized(model, path)
    assert_unchanged(model, before)
    # strict=False loads the rest and lists the entry.
    report = load_quantized(model, path, strict=False)
    assert any(entry in f"{name}: {why}" for name, why in report.unmatched), report.summary()


def test_shape_conflict_raises_even_when_not_strict(llama, tmp_path, gptq_parts):
    source, weights = gptq_parts
    path = write_model_checkpoint(tmp_path / "ckpt", source, bad_layer(weights, "model.layers.0.self_attn.q_proj",
                                                                         32, 64), "gptq")
    model = fresh(llama)
    with pytest.raises(ModelLoadError, match=re.escape(
            "model.layers.0.self_attn.q_proj: the checkpoint's weight is [N, K] = [32, 64], the model's layer is "
            "[out_features, in_features] = [64, 64]")):
        load_quantized(model, path, strict=False)
    assert not any(isinstance(m, W4A16Linear) for m in model.modules())


def test_quantized_lm_head_is_loaded_and_config_exclusions_are_skipped(llama, tmp_path, gptq_parts):
    source, weights = gptq_parts
    with_head = {**weights, "lm_head": quantize_rtn(source.lm_head.weight.detach(), 32, False, torch.float16)}
    path = write_model_checkpoint(tmp_path / "head", source, with_head, "gptq")
    model = fresh(llama)
    report = load_quantized(model, path)
    assert report.replaced == LAYERS + ["lm_head"] and report.skipped == []
    assert model.lm_head.canonical().equal(with_head["lm_head"])
    # compressed-tensors' "ignore": the Linears it names are left dense by the config's word.
    path = write_model_checkpoint(tmp_path / "ignore", source, weights, "compressed-tensors",
                                  config_extra={"ignore": ["lm_head"]})
    report = load_quantized(fresh(llama), path, skip=())
    assert report.skipped == [("lm_head", "left out by the checkpoint's quantization config ('lm_head')")]


def test_base_model_loads_a_causal_lm_checkpoint(llama, tmp_path, gptq_parts):
    """Checkpoint names carry "model."; the base model's do not: base_model_prefix bridges them."""
    source, weights = gptq_parts
    path = write_model_checkpoint(tmp_path / "ckpt", source, weights, "gptq")
    torch.manual_seed(1)
    base = llama[2](tiny_config(llama)).half()
    report = load_quantized(base, path, allow_unmatched=["lm_head.weight"])
    assert report.replaced == [name.removeprefix("model.") for name in LAYERS]
    assert report.unmatched == [("lm_head.weight", "checkpoint tensor with no parameter or buffer of that name "
                                                   "in the model")]
    assert base.layers[1].mlp.down_proj.canonical().equal(weights[MISSING])


def test_load_other_false_reads_only_the_quantized_layers(llama, tmp_path, gptq_parts):
    source, weights = gptq_parts
    path = write_model_checkpoint(tmp_path / "ckpt", source, weights, "gptq")
    model = fresh(llama)
    embed = model.model.embed_tokens.weight.clone()
    report = load_quantized(model, path, load_other=False)
    assert report.replaced == LAYERS and report.loaded == [] and report.unmatched == []
    assert torch.equal(model.model.embed_tokens.weight, embed)


# ----------------------------------------------------------------------------------------------
# 4. any nn.Module, and quantize_model's refusals


def test_swap_works_on_a_plain_module(tmp_path):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32, bias=False)).half()
    weights = {"0": quantize_rtn(model[0].weight.detach(), 32, False, torch.float16),
               "2": quantize_rtn(model[2].weight.detach(), 64, False, torch.float16)}
    qc = write_checkpoint(tmp_path / "w.safetensors", {"0": weights["0"]}, "gptq", version=2)
    save_file({"0.bias": model[0].bias.detach().contiguous()}, str(tmp_path / "b.safetensors"))
    target = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32, bias=False)).half()
    # load_other=False: this checkpoint holds the quantized layer and its bias, not the whole model.
    report = load_quantized(target, tmp_path, qc, skip=("2",), load_other=False)
    assert report.replaced == ["0"] and report.biases == ["0"] and report.skipped == [("2", "named by skip pattern '2'")]
    assert target[0].canonical().equal(weights["0"]) and torch.equal(target[0].bias, model[0].bias.detach())
    report = quantize_model(model, 64, skip=("0",))
    assert report.replaced == ["2"] and model[2].canonical().equal(weights["2"])


def test_quantize_model_names_every_layer_it_cannot_quantize():
    model = nn.Sequential(nn.Linear(60, 64), nn.Linear(64, 16)).bfloat16()
    with pytest.raises(ModelLoadError, match=re.escape(
            "0: cannot be quantized: in_features (K) must be a positive multiple of 8")) as info:
        quantize_model(model, 32)
    assert "quantize_model: the model was left unchanged" in str(info.value)
    assert not any(isinstance(m, W4A16Linear) for m in model.modules())
    report = quantize_model(model, 32, strict=False)
    assert report.replaced == ["1"] and [name for name, _ in report.unmatched] == ["0"] and report.allowed == ["0"]
    assert type(model[0]) is nn.Linear


BAD_CALLS = {
    "float32-model": (lambda: quantize_model(nn.Sequential(nn.Linear(64, 16)), 32),
                      "it is float32; W4A16Linear computes in float16 or bfloat16: convert the model first"),
    "unsupported-group": (lambda: quantize_model(nn.Sequential(nn.Linear(512, 16)).half(), 256),
                          "group_size must be one of (32, 64, 128, -1) for the kernels, got 256"),
    "skip-as-a-string": (lambda: quantize_model(nn.Sequential(nn.Linear(64, 16)).half(), 32, skip="lm_head"),
                         "skip must be a sequence of name patterns"),
    "not-a-module": (lambda: quantize_model({"0": nn.Linear(64, 16)}), "model must be a torch.nn.Module, got dict"),
}


@pytest.mark.parametrize("call, message", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_calls_name_expected_and_given(call, message):
    with pytest.raises((ContractError, ModelLoadError), match=re.escape(message)):
        call()

"""Reading real checkpoint formats: small safetensors files written here, read back bit-exact."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from oracle.canonical import QuantizedWeight
from oracle.checkpoint import read_checkpoint, write_checkpoint
from oracle.errors import CheckpointError
from oracle.layouts import to_awq, to_compressed_tensors, to_gptq
from tests.support.weights import make_weight

LAYERS = ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj")
# Tensors of no quantized layer: a reader must leave them alone.
PLAIN = {
    "model.embed_tokens.weight": torch.randn(32, 16).half(),
    "model.layers.0.input_layernorm.weight": torch.ones(16).half(),
    "model.layers.0.self_attn.q_proj.bias": torch.zeros(24).half(),
    "lm_head.weight": torch.randn(32, 16).half(),
}


def make_layers(symmetric: bool, group_size: int = 32, act_order: bool = False, min_zero: int = 0,
                scale_dtype=torch.float16) -> dict[str, QuantizedWeight]:
    shapes = [(24, 128), (16, 64), (8, 256)]
    return {name: make_weight(n, k, group_size, symmetric, act_order=act_order, min_zero=min_zero, seed=i,
                              scale_dtype=scale_dtype)
            for i, (name, (n, k)) in enumerate(zip(LAYERS, shapes))}


def assert_same_layers(got: dict[str, QuantizedWeight], want: dict[str, QuantizedWeight]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].equal(want[name]), name


def save_raw(path, layers: dict[str, dict[str, torch.Tensor]], plain: bool = True) -> None:
    """A checkpoint built by hand: {prefix: {tensor name: tensor}} plus the unquantized tensors."""
    tensors = {f"{prefix}.{name}": t.contiguous() for prefix, parts in layers.items() for name, t in parts.items()}
    if plain:
        tensors.update(PLAIN)
    save_file(tensors, str(path))


# ----------------------------------------------------------------------------------------------
# write_checkpoint -> read_checkpoint


def written_cases():
    for fmt, version in (("awq", None), ("gptq", 1), ("gptq", 2), ("compressed-tensors", None)):
        for symmetric in (True, False):
            for act_order in (False, True):
                if act_order and fmt == "awq":
                    continue  # AWQ has no g_idx
                for group_size in (32, -1):
                    if act_order and group_size == -1:
                        continue  # one group: nothing to reorder
                    name = fmt + (f"-v{version}" if version else "")
                    case_id = (f"{name}-{'sym' if symmetric else 'asym'}-G{group_size}"
                               + ("-actorder" if act_order else ""))
                    yield pytest.param(fmt, version, symmetric, act_order, group_size, id=case_id)


@pytest.mark.parametrize("fmt, version, symmetric, act_order, group_size", list(written_cases()))
def test_write_then_read(tmp_path, fmt, version, symmetric, act_order, group_size):
    layers = make_layers(symmetric, group_size, act_order, min_zero=1 if version == 1 else 0)
    options = {} if version is None else {"version": version}
    config = write_checkpoint(tmp_path / "model.safetensors", layers, fmt, **options)
    assert config["quant_method"] == fmt
    assert_same_layers(read_checkpoint(tmp_path / "model.safetensors", config), layers)


@pytest.mark.parametrize("how", ["quantization-config", "whole-hf-config", "config-json-next-to-file",
                                 "directory"])
def test_config_sources(tmp_path, how):
    layers = make_layers(False)
    qc = write_checkpoint(tmp_path / "model.safetensors", layers, "gptq", version=2)
    hf_config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "quantization_config": qc}
    if how == "quantization-config":
        got = read_checkpoint(tmp_path / "model.safetensors", qc)
    elif how == "whole-hf-config":
        got = read_checkpoint(tmp_path / "model.safetensors", hf_config)
    else:
        (tmp_path / "config.json").write_text(json.dumps(hf_config))
        got = read_checkpoint(tmp_path if how == "directory" else tmp_path / "model.safetensors")
    assert_same_layers(got, layers)


def test_sharded_directory(tmp_path):
    layers = make_layers(False)
    names = list(layers)
    qc = write_checkpoint(tmp_path / "model-00001-of-00002.safetensors", {n: layers[n] for n in names[:2]}, "awq")
    write_checkpoint(tmp_path / "model-00002-of-00002.safetensors", {names[2]: layers[names[2]]}, "awq")
    save_file(PLAIN, str(tmp_path / "unquantized.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    assert_same_layers(read_checkpoint(tmp_path), layers)


def test_writer_rejects_mixed_schemes_and_unstorable_layers(tmp_path):
    mixed = {"a": make_weight(8, 64, 32, True), "b": make_weight(8, 64, 32, False)}
    with pytest.raises(CheckpointError, match=r"expected one symmetric for all layers"):
        write_checkpoint(tmp_path / "m.safetensors", mixed, "awq")
    z0 = {"model.layers.3.mlp.up_proj": QuantizedWeight(torch.zeros(8, 8, dtype=torch.uint8),
                                                       torch.ones(8, 1, dtype=torch.float16),
                                                       torch.zeros(8, 1, dtype=torch.uint8), -1)}
    with pytest.raises(CheckpointError, match=r"layer 'model.layers.3.mlp.up_proj': GPTQ v1: .*z = 0"):
        write_checkpoint(tmp_path / "m.safetensors", z0, "gptq", version=1)
    with pytest.raises(CheckpointError, match=r"expected fmt awq / gptq / compressed-tensors, got 'marlin'"):
        write_checkpoint(tmp_path / "m.safetensors", z0, "marlin")


# ----------------------------------------------------------------------------------------------
# hand-built checkpoints, with configs as the real tools write them


def test_autoawq_gemm(tmp_path):
    layers = make_layers(False, 32)
    save_raw(tmp_path / "model.safetensors", {n: to_awq(w) for n, w in layers.items()})
    config = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                                      "version": "gemm", "modules_to_not_convert": None}}
    assert_same_layers(read_checkpoint(tmp_path / "model.safetensors", config), layers)


def test_autoawq_quant_config_json(tmp_path):
    """AutoAWQ's own quant_config.json: w_bit / q_group_size keys, no quant_method."""
    layers = make_layers(True, 32)
    save_raw(tmp_path / "model.safetensors", {n: to_awq(w) for n, w in layers.items()})
    (tmp_path / "quant_config.json").write_text(
        json.dumps({"zero_point": False, "q_group_size": 32, "w_bit": 4, "version": "GEMM"}))
    assert_same_layers(read_checkpoint(tmp_path), layers)


def test_gptq_v1_quantize_config_json(tmp_path):
    """AutoGPTQ's quantize_config.json (no quant_method, no checkpoint_format: v1)."""
    layers = make_layers(False, 64, min_zero=1)
    save_raw(tmp_path / "model.safetensors", {n: to_gptq(w, 1) for n, w in layers.items()})
    (tmp_path / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 64, "damp_percent": 0.01, "desc_act": False, "static_groups": False,
         "sym": False, "true_sequential": True}))
    assert_same_layers(read_checkpoint(tmp_path / "model.safetensors"), layers)


def test_gptq_v2_act_order(tmp_path):
    layers = make_layers(False, 32, act_order=True)
    assert all(w.has_act_order for w in layers.values())
    save_raw(tmp_path / "model.safetensors", {n: to_gptq(w, 2) for n, w in layers.items()})
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False,
          "checkpoint_format": "gptq_v2"}
    assert_same_layers(read_checkpoint(tmp_path / "model.safetensors", qc), layers)
    # The same bytes declared v1: z = 15 is stored as nibble 0xF, which v1 cannot hold.
    with pytest.raises(CheckpointError, match=r"GPTQ v1: zero-point nibble 0xF"):
        read_checkpoint(tmp_path / "model.safetensors", {**qc, "checkpoint_format": "gptq"})


def ct_config(symmetric: bool, strategy: str = "group", group_size: int | None = 32, actorder=None) -> dict:
    weights = {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": strategy,
               "group_size": group_size, "actorder": actorder, "dynamic": False, "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None}},
            "ignore": ["lm_head"]}


@pytest.mark.parametrize("symmetric, strategy, act_order", [
    pytest.param(True, "group", False, id="sym-group"),
    pytest.param(False, "group", False, id="asym-group"),
    pytest.param(True, "channel", False, id="sym-channel"),
    pytest.param(False, "channel", False, id="asym-channel"),
    pytest.param(False, "group", True, id="asym-group-actorder"),
])
def test_compressed_tensors(tmp_path, symmetric, strategy, act_order):
    group_size = 32 if strategy == "group" else -1
    layers = make_layers(symmetric, group_size, act_order, scale_dtype=torch.bfloat16)
    parts = {n: to_compressed_tensors(w) for n, w in layers.items()}
    assert all(("weight_zero_point" in p) != symmetric for p in parts.values())
    save_raw(tmp_path / "model.safetensors", parts)
    config = ct_config(symmetric, strategy, group_size if strategy == "group" else None,
                       "group" if act_order else None)
    assert_same_layers(read_checkpoint(tmp_path / "model.safetensors", {"quantization_config": config}), layers)


def test_compressed_tensors_symmetric_with_stored_zero_point(tmp_path):
    """Symmetric layers may carry a zero point that encodes 0 (packed nibble 8); any other is an error."""
    layers = make_layers(True, 32)
    parts = {n: {**to_compressed_tensors(w), "weight_zero_point": torch.full(
        (w.n // 8, w.num_groups), 0x88888888 - 2**32, dtype=torch.int32)} for n, w in layers.items()}
    save_raw(tmp_path / "model.safetensors", parts)
    assert_same_layers(read_checkpoint(tmp_path / "model.safetensors", ct_config(True)), layers)
    parts[LAYERS[1]]["weight_zero_point"][0, 0] = 0x77777777
    save_raw(tmp_path / "model.safetensors", parts)
    with pytest.raises(CheckpointError, match=rf"layer '{LAYERS[1]}': compressed-tensors: declared symmetric"):
        read_checkpoint(tmp_path / "model.safetensors", ct_config(True))


def test_compressed_tensors_config_groups_by_target(tmp_path):
    """Two config groups: regex targets pick the scheme per layer."""
    attn = make_weight(8, 64, 32, True, seed=1)
    mlp = make_weight(16, 128, 64, False, seed=2)
    save_raw(tmp_path / "model.safetensors", {LAYERS[0]: to_compressed_tensors(attn),
                                              LAYERS[1]: to_compressed_tensors(mlp)})
    config = ct_config(True)
    config["config_groups"]["group_0"]["targets"] = ["re:.*self_attn.*"]
    config["config_groups"]["group_1"] = {
        "targets": ["re:.*mlp.*"],
        "weights": ct_config(False, group_size=64)["config_groups"]["group_0"]["weights"]}
    got = read_checkpoint(tmp_path / "model.safetensors", config)
    assert_same_layers(got, {LAYERS[0]: attn, LAYERS[1]: mlp})


# ----------------------------------------------------------------------------------------------
# what must be reported


def test_gptq_v1_zero_point_0_names_the_layer(tmp_path):
    layers = make_layers(False, 32, min_zero=1)
    parts = {n: to_gptq(w, 1) for n, w in layers.items()}
    qzeros = parts[LAYERS[2]]["qzeros"]
    qzeros[1, 0] = qzeros[1, 0] | 0xF << 8  # group 1, column n = 2: nibble 0xF, i.e. z = 0
    save_raw(tmp_path / "model.safetensors", parts)
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": False}
    with pytest.raises(CheckpointError, match=rf"layer '{LAYERS[2]}': GPTQ v1: zero-point nibble 0xF .*"
                                              r"at \[group, n\] = \[1, 2\]"):
        read_checkpoint(tmp_path / "model.safetensors", qc)


def _write(tmp_path, file: str, drop: str | None = None, **replace) -> None:
    """An AWQ or compressed-tensors file whose layer LAYERS[1] loses or replaces a tensor."""
    convert = {"awq": to_awq, "ct": to_compressed_tensors}[file]
    parts = {n: convert(w) for n, w in make_layers(False, 32).items()}
    if drop:
        del parts[LAYERS[1]][drop]
    parts[LAYERS[1]].update(replace)
    save_raw(tmp_path / "model.safetensors", parts)


AWQ_QC = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
GPTQ_QC = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": False}

REPORTED = [
    ("unknown-quant-method", {}, {"quant_method": "bitsandbytes", "load_in_4bit": True},
     r"expected quant_method awq / gptq / compressed-tensors, found 'bitsandbytes'"),
    ("no-quant-method", {}, {"bits": 4, "group_size": 32},
     r"expected quant_method .*found keys \['bits', 'group_size'\]"),
    ("awq-8-bit", {}, {**AWQ_QC, "bits": 8}, r"expected bits 4, found 8"),
    ("gptq-8-bit", {}, {**GPTQ_QC, "bits": 8}, r"expected bits 4, found 8"),
    ("ct-8-bit", {"file": "ct"}, {**ct_config(False), "config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}, "format": "pack-quantized"}}},
     r"expected num_bits 4, type 'int', found num_bits 8"),
    ("ct-float-quantized", {"file": "ct"}, {**ct_config(False), "format": "float-quantized"},
     r"expected format 'pack-quantized', found 'float-quantized'"),
    ("ct-tensor-strategy", {"file": "ct"}, ct_config(True, strategy="tensor", group_size=None),
     r"expected strategy 'group' or 'channel', found 'tensor'"),
    ("awq-gemv", {}, {**AWQ_QC, "version": "gemv"}, r"expected version 'gemm', found 'gemv'"),
    ("gptq-marlin", {}, {**GPTQ_QC, "checkpoint_format": "marlin"}, r"expected checkpoint_format .*found 'marlin'"),
    ("no-group-size", {}, {k: v for k, v in AWQ_QC.items() if k != "group_size"},
     r"expected group_size -1 or a positive int, found None"),
    ("ct-config-on-awq-tensors", {}, ct_config(False),
     r"expected tensors '<layer>.weight_packed', found '<layer>.qweight'"),
    ("missing-scales", {"drop": "scales"}, AWQ_QC,
     rf"layer '{LAYERS[1]}': AutoAWQ: expected tensors {LAYERS[1]}.qweight, {LAYERS[1]}.qzeros, "
     rf"{LAYERS[1]}.scales; missing scales \(found qweight, qzeros\)"),
    ("missing-qzeros", {"drop": "qzeros"}, AWQ_QC, rf"layer '{LAYERS[1]}': .*missing qzeros"),
    ("orphan-qzeros", {"drop": "qweight"}, AWQ_QC,
     rf"layer '{LAYERS[1]}': expected tensor {LAYERS[1]}.qweight, found only qzeros, scales"),
    ("scales-wrong-shape", {"scales": torch.ones(2, 32, dtype=torch.float16)}, AWQ_QC,
     rf"layer '{LAYERS[1]}': AutoAWQ GEMM scales: expected shape \[\*, 16\].*got float16 \[2, 32\]"),
    ("scales-wrong-group-count", {"scales": torch.ones(3, 16, dtype=torch.float16)}, AWQ_QC,
     rf"layer '{LAYERS[1]}': AutoAWQ scales: expected 2 groups \(K = 64, group_size = 32; qzeros holds 2\), found 3"),
    ("scales-row-dropped", {"scales": torch.ones(1, 16, dtype=torch.float16)}, AWQ_QC,
     rf"layer '{LAYERS[1]}': AutoAWQ scales: expected 2 groups \(K = 64, group_size = 32; qzeros holds 2\), found 1 "
     r"in its shape \[1, 16\]"),
    ("config-group-size-wrong", {}, {**AWQ_QC, "group_size": 64},
     r"AutoAWQ: config group_size=64 gives ceil\(K/G\) = 1 group\(s\) for K = 64, but scales \[2, 16\], qzeros "
     r"\[2, 2\] hold 2: expected group_size to match the file, which K / 2 = 32 would give"),
    ("group-size-not-dividing-k", {}, {**AWQ_QC, "group_size": 48},
     r"group_size: expected a divisor of K=64 \(or -1\), got 48"),
    ("asym-declared-symmetric", {}, {**AWQ_QC, "zero_point": False},
     r"declared symmetric, so every zero point must be 8"),
]


@pytest.mark.parametrize("file_kwargs, qc, message", [pytest.param(f, q, m, id=i) for i, f, q, m in REPORTED])
def test_reported(tmp_path, file_kwargs, qc, message):
    _write(tmp_path, **{"file": "awq", **file_kwargs})
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(tmp_path / "model.safetensors", qc)


def test_gptq_act_order_g_idx_without_desc_act_is_reported(tmp_path):
    layers = make_layers(False, 32, act_order=True)
    save_raw(tmp_path / "model.safetensors", {n: to_gptq(w, 2) for n, w in layers.items()})
    qc = {**GPTQ_QC, "checkpoint_format": "gptq_v2"}
    with pytest.raises(CheckpointError, match=r"desc_act is false, so g_idx must be k // G"):
        read_checkpoint(tmp_path / "model.safetensors", qc)


def test_gptq_desc_act_without_g_idx_is_reported(tmp_path):
    layers = make_layers(False, 32)
    parts = {n: {k: v for k, v in to_gptq(w, 2).items() if k != "g_idx"} for n, w in layers.items()}
    save_raw(tmp_path / "model.safetensors", parts)
    qc = {**GPTQ_QC, "desc_act": True, "checkpoint_format": "gptq_v2"}
    with pytest.raises(CheckpointError, match=r"missing g_idx"):
        read_checkpoint(tmp_path / "model.safetensors", qc)


def test_no_config_and_no_layers_are_reported(tmp_path):
    save_file(PLAIN, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"expected a quantization config .*found none"):
        read_checkpoint(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"expected awq layers .*found none among 4 tensor"):
        read_checkpoint(tmp_path / "model.safetensors", AWQ_QC)
    with pytest.raises(CheckpointError, match=r"expected a .safetensors file or a directory"):
        read_checkpoint(tmp_path / "missing.safetensors", AWQ_QC)


def test_skipped_tensors_are_listed_on_request(tmp_path):
    """Everything not read into a quantized weight is named with the reason, a quantized layer's
    own bias included."""
    layers = make_layers(False)
    path = tmp_path / "model.safetensors"
    qc = write_checkpoint(path, layers, "awq")
    save_file(dict(load_file(str(path))) | PLAIN, str(path))
    skipped: list[tuple[str, str]] = []
    assert_same_layers(read_checkpoint(path, qc, skipped=skipped), layers)
    assert f"{LAYERS[0]}.bias" in PLAIN
    assert dict(skipped) == {name: "the quantized layer's bias" if name == f"{LAYERS[0]}.bias"
                             else "not part of a quantized layer" for name in PLAIN}
    assert read_checkpoint(path, qc).keys() == layers.keys()

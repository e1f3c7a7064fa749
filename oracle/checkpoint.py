"""Reading and writing W4A16 safetensors checkpoints as canonical weights.

Three formats, each detected from the quantization config (and checked against the tensor names):

* AutoAWQ GEMM: quant_method "awq", version "gemm"; `prefix.{qweight, qzeros, scales}`, layouts in
  `oracle/layouts/awq.py`. zero_point false means symmetric (qzeros then must hold 8).
* GPTQ: quant_method "gptq"; `prefix.{qweight, qzeros, scales, g_idx}`, layouts in
  `oracle/layouts/gptq.py`. checkpoint_format "gptq" (v1, qzeros store z - 1; the default) or
  "gptq_v2" (store z); sym true means symmetric; desc_act true means g_idx is act-order.
* compressed-tensors: quant_method "compressed-tensors", format "pack-quantized", 4-bit int weights
  with strategy "group" or "channel"; `prefix.{weight_packed, weight_scale, weight_zero_point
  (asymmetric only), weight_shape, weight_g_idx (act-order only)}`, layouts in
  `oracle/layouts/compressed_tensors.py`.

Layers are keyed by their prefix ("model.layers.0.self_attn.q_proj"). Tensors of no quantized layer
(embeddings, norms, biases, unquantized heads) are ignored. Anything else that does not fit raises
CheckpointError naming the layer, what was expected and what was found.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .canonical import QuantizedWeight
from .errors import CheckpointError, LayoutError
from .layouts import from_awq, from_compressed_tensors, from_gptq, to_awq, to_compressed_tensors, to_gptq

AWQ, GPTQ, CT = "awq", "gptq", "compressed-tensors"
FORMATS = (AWQ, GPTQ, CT)
# The tensor whose presence makes a prefix a quantized layer, and the full set each format reads.
MAIN_TENSOR = {AWQ: "qweight", GPTQ: "qweight", CT: "weight_packed"}
TENSORS = {
    AWQ: ("qweight", "qzeros", "scales"),
    GPTQ: ("qweight", "qzeros", "scales", "g_idx"),
    CT: ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx"),
}
# Config files that may sit next to the weights: (file name, key holding the config, implied quant_method).
CONFIG_FILES = (
    ("config.json", "quantization_config", None),
    ("quantize_config.json", None, GPTQ),   # AutoGPTQ / GPTQModel
    ("quant_config.json", None, AWQ),       # AutoAWQ
)
GPTQ_VERSIONS = {"gptq": 1, "gptq_v2": 2}


# ----------------------------------------------------------------------------------------------
# reading


def read_checkpoint(path: str | Path, config: Mapping | None = None, *,
                    skipped: list[tuple[str, str]] | None = None) -> dict[str, QuantizedWeight]:
    """Every quantized layer of a checkpoint, as canonical weights keyed by layer prefix.

    path:    a .safetensors file, or a directory whose *.safetensors files (all shards) are read.
    config:  the HF config.json dict holding "quantization_config", or that quantization config
             itself, or None to read config.json / quantize_config.json / quant_config.json from the
             directory (of the file).
    skipped: a list to receive (tensor name, why) for every tensor not read as part of a quantized
             weight: embeddings, norms, unquantized layers, and a quantized layer's own bias.
    """
    path = Path(path)
    tensors = load_tensors(path)
    qc = quantization_config(path, config)
    fmt = detect_format(qc, tensors)
    layers = group_by_layer(tensors, fmt)
    if not layers:
        raise CheckpointError(f"{path}: expected {fmt} layers (tensors named '<layer>.{MAIN_TENSOR[fmt]}'), "
                              f"found none among {len(tensors)} tensor(s), e.g. {sorted(tensors)[:5]}")
    read_layer = {AWQ: _awq_reader, GPTQ: _gptq_reader, CT: _ct_reader}[fmt](qc)
    out = {}
    for prefix, parts in sorted(layers.items()):
        try:
            out[prefix] = read_layer(prefix, parts)
        except (LayoutError, CheckpointError) as err:
            raise CheckpointError(f"layer {prefix!r}: {err}") from err
    if skipped is not None:
        used = {_join(prefix, suffix) for prefix, parts in layers.items() for suffix in parts}
        for name in sorted(set(tensors) - used):
            prefix, _, suffix = name.rpartition(".")
            if prefix in layers:
                why = "the quantized layer's bias" if suffix == "bias" else f"a tensor of quantized layer {prefix!r} " \
                    f"that {fmt} does not define"
            else:
                why = "not part of a quantized layer"
            skipped.append((name, why))
    return out


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{path}: expected *.safetensors files in this directory, found none")
    elif path.is_file():
        files = [path]
    else:
        raise CheckpointError(f"{path}: expected a .safetensors file or a directory, found nothing there")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            shard = load_file(file)
        except SafetensorError as err:  # its message names neither the file nor the format
            raise CheckpointError(f"{file}: expected a safetensors file, could not read it ({err})") from err
        clash = tensors.keys() & shard.keys()
        if clash:
            raise CheckpointError(f"{file}: expected each tensor in one shard, found {sorted(clash)[:3]} twice")
        tensors.update(shard)
    return tensors


def quantization_config(path: Path, config: Mapping | None) -> dict:
    """The quantization config, from the argument or from the files next to the checkpoint."""
    if config is not None:
        if not isinstance(config, Mapping):
            raise CheckpointError(f"config: expected a dict, got {type(config).__name__}")
        qc = config.get("quantization_config", config)
        if not isinstance(qc, Mapping):
            raise CheckpointError(f"config: expected quantization_config to be a dict, got {type(qc).__name__}")
        return dict(qc)
    folder = path if path.is_dir() else path.parent
    for name, key, implied in CONFIG_FILES:
        file = folder / name
        if not file.is_file():
            continue
        data = json.loads(file.read_text())
        if key is not None:
            if key not in data:
                continue  # a plain (unquantized) model config: look further
            data = data[key]
        qc = dict(data)
        if implied is not None:
            qc.setdefault("quant_method", implied)
        return qc
    names = ", ".join(name for name, _, _ in CONFIG_FILES)
    raise CheckpointError(f"{folder}: expected a quantization config (pass config=, or one of {names} "
                          "with a quantization config), found none")


def detect_format(qc: Mapping, tensors: Mapping[str, torch.Tensor]) -> str:
    """The format named by quant_method, checked against the tensor names."""
    seen = {fmt for fmt in FORMATS if any(_suffix(name) == MAIN_TENSOR[fmt] for name in tensors)}
    method = qc.get("quant_method")
    if method is None:
        raise CheckpointError(f"quantization config: expected quant_method ({', '.join(FORMATS)}), found keys "
                              f"{sorted(qc)}")
    method = str(method).lower()
    if method not in FORMATS:
        raise CheckpointError(f"quantization config: expected quant_method {' / '.join(FORMATS)}, "
                              f"found {qc['quant_method']!r}")
    if seen and MAIN_TENSOR[method] not in {MAIN_TENSOR[f] for f in seen}:
        raise CheckpointError(f"quant_method {method!r}: expected tensors '<layer>.{MAIN_TENSOR[method]}', "
                              f"found '<layer>.{MAIN_TENSOR[seen.pop()]}' instead")
    return method


def group_by_layer(tensors: Mapping[str, torch.Tensor], fmt: str) -> dict[str, dict[str, torch.Tensor]]:
    """{prefix: {suffix: tensor}} for every prefix holding the format's main tensor; an orphan
    qzeros (AWQ/GPTQ) without its qweight is reported as a missing tensor."""
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        prefix, _, suffix = name.rpartition(".")
        if suffix in TENSORS[fmt]:
            layers.setdefault(prefix, {})[suffix] = t
    main = MAIN_TENSOR[fmt]
    for prefix, parts in layers.items():
        if main not in parts and "qzeros" in parts:
            raise CheckpointError(f"layer {prefix!r}: expected tensor {_join(prefix, main)}, "
                                  f"found only {', '.join(sorted(parts))}")
    return {prefix: parts for prefix, parts in layers.items() if main in parts}


def _awq_reader(qc: Mapping):
    _bits(qc, "bits", "w_bit")
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise CheckpointError(f"AutoAWQ: expected version 'gemm', found {qc.get('version')!r} (packed differently)")
    group_size = _group_size(qc, "group_size", "q_group_size")
    symmetric = not qc.get("zero_point", True)

    field = "group_size" if "group_size" in qc else "q_group_size"

    def read(prefix: str, parts: dict[str, torch.Tensor]) -> QuantizedWeight:
        _require(prefix, parts, ("qweight", "scales") if symmetric else ("qweight", "qzeros", "scales"), "AutoAWQ")
        k = parts["qweight"].shape[0]
        _check_groups("AutoAWQ", field, group_size, k, {name: (parts[name].shape[0], list(parts[name].shape))
                                                        for name in ("scales", "qzeros") if name in parts})
        return from_awq(parts, group_size, symmetric=symmetric)

    return read


def _gptq_reader(qc: Mapping):
    _bits(qc, "bits")
    group_size = _group_size(qc, "group_size")
    symmetric = bool(qc.get("sym", True))
    desc_act = bool(qc.get("desc_act", False))
    fmt = qc.get("checkpoint_format", qc.get("format", "gptq"))
    if qc.get("is_marlin_format") or fmt not in GPTQ_VERSIONS:
        found = "is_marlin_format true" if qc.get("is_marlin_format") else repr(fmt)
        raise CheckpointError(f"GPTQ: expected checkpoint_format 'gptq' (v1) or 'gptq_v2', found {found}")
    version = GPTQ_VERSIONS[fmt]

    def read(prefix: str, parts: dict[str, torch.Tensor]) -> QuantizedWeight:
        _require(prefix, parts, ("qweight", "qzeros", "scales") + (("g_idx",) if desc_act else ()),
                 f"GPTQ v{version}")
        k = parts["qweight"].shape[0] * 8
        _check_groups(f"GPTQ v{version}", "group_size", group_size, k,
                      {name: (parts[name].shape[0], list(parts[name].shape)) for name in ("scales", "qzeros")})
        w = from_gptq(parts, group_size, version=version, symmetric=symmetric)
        if w.has_act_order and not desc_act:
            raise CheckpointError("GPTQ: desc_act is false, so g_idx must be k // G; found an act-order g_idx "
                                  "(kernels that trust desc_act would read this layer wrongly)")
        return w

    return read


def _ct_reader(qc: Mapping):
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise CheckpointError(f"compressed-tensors: expected config_groups, found {groups!r}")
    schemes = []
    for name, group in groups.items():
        fmt = group.get("format") or qc.get("format")
        if fmt != "pack-quantized":
            raise CheckpointError(f"compressed-tensors group {name!r}: expected format 'pack-quantized', found {fmt!r}")
        schemes.append((name, group.get("targets") or [], _ct_weight_scheme(name, group.get("weights"))))

    def read(prefix: str, parts: dict[str, torch.Tensor]) -> QuantizedWeight:
        group_size, symmetric = _ct_scheme_for(prefix, schemes)
        need = ("weight_packed", "weight_scale") + (() if symmetric else ("weight_zero_point",))
        _require(prefix, parts, need, "compressed-tensors pack-quantized")
        if symmetric and "weight_zero_point" in parts:
            _check_ct_symmetric_zero_point(parts.pop("weight_zero_point"))
        k = parts["weight_packed"].shape[1] * 8
        _check_groups("compressed-tensors", "weights.group_size", group_size, k,
                      {name: (parts[name].shape[1], list(parts[name].shape)) for name in ("weight_scale", "weight_zero_point")
                       if name in parts and parts[name].dim() == 2})
        return from_compressed_tensors(parts, group_size)

    return read


def _ct_weight_scheme(name: str, weights: Mapping | None) -> tuple[int, bool]:
    """(group_size, symmetric) of one config group's weight arguments."""
    if not isinstance(weights, Mapping):
        raise CheckpointError(f"compressed-tensors group {name!r}: expected quantized weights, found {weights!r}")
    what = f"compressed-tensors group {name!r} weights"
    if weights.get("num_bits") != 4 or weights.get("type", "int") != "int":
        raise CheckpointError(f"{what}: expected num_bits 4, type 'int', found num_bits "
                              f"{weights.get('num_bits')!r}, type {weights.get('type')!r}")
    strategy = weights.get("strategy")
    if strategy == "group":
        group_size = weights.get("group_size")
        if not isinstance(group_size, int) or group_size <= 0:
            raise CheckpointError(f"{what}: expected a positive group_size for strategy 'group', found {group_size!r}")
    elif strategy == "channel":
        group_size = -1
    else:
        raise CheckpointError(f"{what}: expected strategy 'group' or 'channel', found {strategy!r}")
    return group_size, bool(weights.get("symmetric", True))


def _ct_scheme_for(prefix: str, schemes: list) -> tuple[int, bool]:
    """The scheme of the one config group whose targets name this layer; a class-name target
    ("Linear") matches any layer, so it decides only when no name or regex target does."""
    if len({scheme for _, _, scheme in schemes}) == 1:
        return schemes[0][2]

    def names_layer(target: str) -> bool:
        if target.startswith("re:"):
            return re.match(target[3:], prefix) is not None
        return target == prefix or prefix.endswith("." + target)

    by_name = [s for s in schemes if any(names_layer(t) for t in s[1])]
    found = by_name or [s for s in schemes if any(t[:1].isupper() for t in s[1])]  # class names
    if len({scheme for _, _, scheme in found}) != 1:
        raise CheckpointError(f"compressed-tensors: expected one config group targeting this layer, found "
                              f"{[name for name, _, _ in found] or 'none'}")
    return found[0][2]


def _check_ct_symmetric_zero_point(zp: torch.Tensor) -> None:
    """Some writers store a zero point for symmetric layers too; accept it only when it is zero
    (packed int32 nibbles 8, or an unpacked signed 0)."""
    if zp.dtype == torch.int32:
        ok = bool((zp == 0x88888888 - 2**32).all())
    else:
        ok = not zp.is_floating_point() and bool((zp == 0).all())
    if not ok:
        raise CheckpointError("compressed-tensors: declared symmetric, so weight_zero_point must encode 0 "
                              f"(packed 0x88888888 or unpacked 0), found other values in {zp.dtype} "
                              f"{list(zp.shape)}")


def _check_groups(fmt: str, field: str, group_size: int, k: int, found: Mapping[str, tuple[int, list[int]]]) -> None:
    """found: tensor name -> (its group count, its shape as the file has it). Every tensor's group
    count must be ceil(K / G) for the config's group size; the error names the tensor at fault, or
    the config field when the tensors agree with each other but not with it."""
    g = k if group_size == -1 else group_size
    want = -(-k // g)
    wrong = {name: v for name, v in found.items() if v[0] != want}
    if not wrong:
        return
    counts = {v[0] for v in found.values()}
    if len(counts) == 1 and len(found) > 1 or len(found) == 1:
        have = counts.pop()
        implied = f", which K / {have} = {k // have} would give" if have and k % have == 0 else ""
        shapes = ", ".join(f"{name} {shape}" for name, (_, shape) in found.items())
        raise CheckpointError(f"{fmt}: config {field}={group_size} gives ceil(K/G) = {want} group(s) for K = {k}, but "
                              f"{shapes} hold {have}: expected {field} to match the file{implied}")
    right = [name for name in found if name not in wrong]
    for name, (have, shape) in wrong.items():
        raise CheckpointError(f"{fmt} {name}: expected {want} groups (K = {k}, {field} = {group_size}; {', '.join(right)} "
                              f"hold{'s' if len(right) == 1 else ''} {want}), found {have} in its shape {shape}")


def _require(prefix: str, parts: Mapping[str, torch.Tensor], names: tuple[str, ...], fmt: str) -> None:
    missing = [n for n in names if n not in parts]
    if missing:
        raise CheckpointError(f"{fmt}: expected tensors {', '.join(_join(prefix, n) for n in names)}; missing "
                              f"{', '.join(missing)} (found {', '.join(sorted(parts))})")


def _bits(qc: Mapping, *keys: str) -> None:
    bits = next((qc[k] for k in keys if k in qc), None)
    if bits != 4:
        raise CheckpointError(f"quantization config: expected {keys[0]} 4, found {bits!r}")


def _group_size(qc: Mapping, *keys: str) -> int:
    g = next((qc[k] for k in keys if k in qc), None)
    if not isinstance(g, int) or isinstance(g, bool) or not (g == -1 or g > 0):
        raise CheckpointError(f"quantization config: expected {keys[0]} -1 or a positive int, found {g!r}")
    return g


def _suffix(name: str) -> str:
    return name.rpartition(".")[2]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# ----------------------------------------------------------------------------------------------
# writing


def write_checkpoint(path: str | Path, layers: Mapping[str, QuantizedWeight], fmt: str, **options) -> dict:
    """Write `layers` ({prefix: weight}) to one .safetensors file in `fmt` and return the matching
    quantization config (what HF keeps under config.json's "quantization_config").

    fmt: "awq", "gptq" (option version=1 or 2; default 1) or "compressed-tensors".
    All layers must share one group_size and be all symmetric or all asymmetric: a checkpoint's
    config holds one of each. Act-order g_idx is written for GPTQ and compressed-tensors.
    """
    if fmt not in FORMATS:
        raise CheckpointError(f"write_checkpoint: expected fmt {' / '.join(FORMATS)}, got {fmt!r}")
    allowed = {"version"} if fmt == GPTQ else set()
    if set(options) - allowed:
        raise TypeError(f"write_checkpoint({fmt!r}): unexpected option(s) {sorted(set(options) - allowed)}")
    if not layers:
        raise CheckpointError("write_checkpoint: expected at least one layer, got none")
    group_size = _one_value(layers, "group_size", lambda w: w.group_size)
    symmetric = _one_value(layers, "symmetric", lambda w: w.symmetric)
    act_order = any(w.has_act_order for w in layers.values())
    version = options.get("version", 1)

    convert = {
        AWQ: to_awq,
        GPTQ: lambda w: to_gptq(w, version),
        CT: to_compressed_tensors,
    }[fmt]
    tensors = {}
    for prefix, w in layers.items():
        try:
            parts = convert(w)
        except (LayoutError, CheckpointError) as err:
            raise CheckpointError(f"layer {prefix!r}: {err}") from err
        tensors.update({_join(prefix, name): t.detach().cpu().contiguous() for name, t in parts.items()})
    save_file(tensors, str(path), metadata={"format": "pt"})

    if fmt == AWQ:
        return {"quant_method": AWQ, "bits": 4, "group_size": group_size, "zero_point": not symmetric,
                "version": "gemm"}
    if fmt == GPTQ:
        return {"quant_method": GPTQ, "bits": 4, "group_size": group_size, "sym": symmetric,
                "desc_act": act_order, "checkpoint_format": "gptq" if version == 1 else "gptq_v2"}
    weights = {"num_bits": 4, "type": "int", "symmetric": symmetric,
               "strategy": "channel" if group_size == -1 else "group",
               "group_size": None if group_size == -1 else group_size,
               "actorder": "group" if act_order else None, "dynamic": False}
    return {"quant_method": CT, "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": None, "output_activations": None}},
            "ignore": []}


def _one_value(layers: Mapping[str, QuantizedWeight], what: str, get):
    values = {prefix: get(w) for prefix, w in layers.items()}
    if len(set(values.values())) > 1:
        raise CheckpointError(f"write_checkpoint: expected one {what} for all layers (a config holds one), "
                              f"got {values}")
    return next(iter(values.values()))

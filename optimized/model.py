"""Swap a model's `nn.Linear` layers for `W4A16Linear`: from a checkpoint, or quantized in place.

    report = load_quantized(model, "path/to/checkpoint")   # AutoAWQ, GPTQ or compressed-tensors
    report = quantize_model(model, group_size=128)         # no checkpoint: the oracle's RTN quantizer
    print(report.summary())

Any `torch.nn.Module` works: layers are matched by their qualified names (`named_modules()`), which
for a Hugging Face model are the checkpoint's tensor prefixes ("model.layers.0.self_attn.q_proj").
transformers is never imported here.

Which Linears are expected to be quantized: every `nn.Linear` of the model except those that
`skip` names (default: lm_head), those the checkpoint's quantization config leaves out
(compressed-tensors "ignore", AutoAWQ/HF "modules_to_not_convert") and those the checkpoint holds
unquantized (a dense `<layer>.weight`). A skipped Linear that the checkpoint does quantize is
loaded all the same.

Nothing falls back silently. Everything is matched before the model is touched: a checkpoint
layer with no Linear of its name, an expected Linear with no checkpoint layer, a Linear bias the
checkpoint lacks, a model tensor the checkpoint does not supply and a checkpoint tensor that names
nothing in the model are each an unmatched entry. With strict=True (the default) any unmatched
entry that `allow_unmatched` does not name raises ModelLoadError listing all of them, and the
model is left as it was; with strict=False the report lists them. Conflicts that make loading
meaningless (shapes that differ, a dtype the kernels do not take) always raise.

Patterns (skip, allow_unmatched): a qualified name or its last components ("lm_head" names
"lm_head" and "model.lm_head"), a glob ("model.layers.*.mlp.down_proj") or "re:<regex>" matched at
the start of the name, as compressed-tensors writes them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from oracle.canonical import QuantizedWeight
from oracle.checkpoint import quantization_config, read_checkpoint
from oracle.errors import CheckpointError, LayoutError

from .contract import ACTIVATION_DTYPES, GROUP_SIZES, ContractError
from .linear import W4A16Linear, check_quantizable

BIAS_WHY = "the quantized layer's bias"  # oracle.read_checkpoint's reason for a quantized layer's bias
OTHER_WHY = "not part of a quantized layer"


class ModelLoadError(ValueError):
    """Layers or tensors could not be matched (or conflict); `report` holds everything found."""

    def __init__(self, message: str, report: "ModelReport") -> None:
        super().__init__(message)
        self.report = report


@dataclass
class ModelReport:
    """What one `load_quantized` or `quantize_model` call did.

    replaced:  qualified names of the Linears now W4A16Linear, in model order.
    biases:    the replaced layers whose bias came from the checkpoint.
    skipped:   (name, why) of the Linears left as they were on purpose.
    unmatched: (name, why) of everything that did not match (see the module docstring).
    allowed:   the unmatched names that `allow_unmatched` (or strict=False) let through.
    loaded:    the checkpoint's other tensors copied into the model (embeddings, norms, dense layers).
    """

    replaced: list[str] = field(default_factory=list)
    biases: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    unmatched: list[tuple[str, str]] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"{len(self.replaced)} Linear layer(s) now W4A16Linear ({len(self.biases)} with a checkpoint bias), "
                 f"{len(self.loaded)} other tensor(s) loaded, {len(self.skipped)} skipped, "
                 f"{len(self.unmatched)} unmatched"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped]
        lines += [f"  unmatched {name}: {why}{' (allowed)' if name in self.allowed else ''}"
                  for name, why in self.unmatched]
        return "\n".join(lines)


def matches(name: str, pattern: str) -> bool:
    """Whether `pattern` (see the module docstring) names the qualified `name`."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern or name.endswith("." + pattern)


def _first_match(name: str, patterns: Iterable[str]) -> str | None:
    return next((p for p in patterns if matches(name, p)), None)


def _check_patterns(what: str, patterns: object) -> tuple[str, ...]:
    if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
        raise ContractError(f"{what} must be a sequence of name patterns (e.g. ('lm_head',)), got {patterns!r}")
    return tuple(patterns)


def _check_model(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise ContractError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def _layer_problem(module: nn.Module) -> str | None:
    """Why a Linear (or W4A16Linear) cannot become a W4A16Linear where it is, or None."""
    weight = module.qweight if isinstance(module, W4A16Linear) else module.weight
    dtype = module.dtype if isinstance(module, W4A16Linear) else weight.dtype
    if weight.device.type == "meta":
        return "its weight is on the meta device: build the model on a real device first"
    if dtype not in ACTIVATION_DTYPES:
        return (f"it is {str(dtype).removeprefix('torch.')}; W4A16Linear computes in float16 or bfloat16: "
                "convert the model first (model.to(torch.bfloat16))")
    return None


def _layer_dtype(module: nn.Module) -> torch.dtype:
    return module.dtype if isinstance(module, W4A16Linear) else module.weight.dtype


def _layer_device(module: nn.Module) -> torch.device:
    return module.device if isinstance(module, W4A16Linear) else module.weight.device


def _swap(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def _finish(report: ModelReport, conflicts: list[str], strict: bool, allow: tuple[str, ...], what: str) -> None:
    """Raise ModelLoadError for conflicts, and for unmatched entries not allowed under strict."""
    report.allowed = [name for name, _ in report.unmatched if not strict or _first_match(name, allow)]
    refused = [(name, why) for name, why in report.unmatched if name not in report.allowed]
    if not conflicts and not refused:
        return
    lines = [f"{what}: the model was left unchanged."]
    if conflicts:
        lines.append(f"{len(conflicts)} conflict(s), which no option lets through:")
        lines += [f"  {c}" for c in conflicts]
    if refused:
        lines.append(f"{len(refused)} unmatched (pass allow_unmatched=[names or patterns] or strict=False to "
                     "load without them; the report then lists them):")
        lines += [f"  {name}: {why}" for name, why in refused]
    raise ModelLoadError("\n".join(lines), report)


# ----------------------------------------------------------------------------------------------
# quantizing in place


def quantize_model(model: nn.Module, group_size: int = 128, symmetric: bool = False, skip: Iterable[str] = ("lm_head",),
                   *, dense_cache: bool = False, strict: bool = True) -> ModelReport:
    """Replace every nn.Linear of `model` not named by `skip` with a W4A16Linear holding its weight
    quantized by `oracle.quantize_rtn` (scales in the layer's dtype, which must be float16 or
    bfloat16), on the layer's device, bias kept.

    A Linear that cannot be quantized (K not a multiple of 8 or of group_size, a float32 layer)
    is unmatched: strict=True raises ModelLoadError listing every one before anything changes;
    strict=False leaves them dense and lists them.
    """
    _check_model(model)
    skip = _check_patterns("skip", skip)
    if group_size not in GROUP_SIZES or isinstance(group_size, bool):
        raise ContractError(f"group_size must be one of {GROUP_SIZES} for the kernels, got {group_size!r}")
    report = ModelReport()
    todo = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        pattern = _first_match(name, skip)
        if pattern is not None:
            report.skipped.append((name, f"named by skip pattern {pattern!r}"))
            continue
        problem = _layer_problem(module)
        if problem is None:
            try:
                check_quantizable(module.in_features, group_size)
            except ContractError as e:
                problem = str(e)
        if problem:
            report.unmatched.append((name, f"cannot be quantized: {problem}"))
        else:
            todo.append((name, module))
    _finish(report, [], strict, (), "quantize_model")
    built = [(name, W4A16Linear.from_linear(module, group_size, symmetric, dense_cache=dense_cache))
             for name, module in todo]
    for name, new in built:
        _swap(model, name, new)
        report.replaced.append(name)
    return report


# ----------------------------------------------------------------------------------------------
# loading a checkpoint


def load_quantized(model: nn.Module, checkpoint_path: str | Path, config: Mapping | None = None, strict: bool = True,
                   *, skip: Iterable[str] = ("lm_head",), allow_unmatched: Iterable[str] = (),
                   dense_cache: bool = False, load_other: bool = True) -> ModelReport:
    """Load an AutoAWQ, GPTQ (v1/v2, act-order) or compressed-tensors checkpoint into `model`.

    checkpoint_path: a .safetensors file or a directory of shards, with its quantization config
             beside it (config.json, quantize_config.json, quant_config.json) or given as `config`
             (oracle.read_checkpoint reads both).
    Each quantized layer replaces the nn.Linear of the same name with a W4A16Linear in that
    Linear's dtype (float16 or bfloat16) and on its device, with the checkpoint's bias for that
    layer. load_other: also copy the checkpoint's other tensors (embeddings, norms, unquantized
    layers) into the model's parameters and buffers of the same names, cast to their dtypes; the
    model's tensors the checkpoint lacks are then unmatched (weights tied to a loaded one are not).
    skip, allow_unmatched, strict: see the module docstring.
    dense_cache: as `optimized.prepare` (every layer keeps a dequantized copy for prefill).
    Raises ModelLoadError (with `.report`) before changing the model, or oracle.CheckpointError for
    a file that cannot be read.
    """
    _check_model(model)
    skip = _check_patterns("skip", skip)
    allow = _check_patterns("allow_unmatched", allow_unmatched)
    path = Path(checkpoint_path)
    qc = quantization_config(path, config)
    ckpt_skipped: list[tuple[str, str]] = []
    layers = read_checkpoint(path, config, skipped=ckpt_skipped)
    not_converted = _config_exclusions(qc)

    report = ModelReport()
    conflicts: list[str] = []
    modules = dict(model.named_modules())
    state = model.state_dict(keep_vars=True)
    base = getattr(model, "base_model_prefix", "") or ""

    def resolve(name: str, table: Mapping) -> str | None:
        """The model's name for a checkpoint name: itself, or with the base model prefix added or removed."""
        if name in table:
            return name
        if base:
            for alt in (f"{base}.{name}", name.removeprefix(base + ".")):
                if alt != name and alt in table:
                    return alt
        return None

    # quantized layers
    plan: dict[str, tuple[QuantizedWeight, str]] = {}  # model name -> (weight, checkpoint prefix)
    for prefix, w in layers.items():
        name = resolve(prefix, modules)
        module = modules.get(name) if name is not None else None
        if module is None:
            report.unmatched.append((prefix, "checkpoint layer with no module of that name in the model"))
        elif not isinstance(module, (nn.Linear, W4A16Linear)):
            report.unmatched.append((prefix, f"checkpoint layer: the model's {name} is a {type(module).__name__}, "
                                             "not an nn.Linear"))
        elif (w.n, w.k) != (module.out_features, module.in_features):
            conflicts.append(f"{name}: the checkpoint's weight is [N, K] = [{w.n}, {w.k}], the model's layer is "
                             f"[out_features, in_features] = [{module.out_features}, {module.in_features}]")
        else:
            problem = _layer_problem(module)
            if problem:
                conflicts.append(f"{name}: {problem}")
            plan[name] = (w, prefix)
    order = {name: i for i, name in enumerate(modules)}
    plan = dict(sorted(plan.items(), key=lambda item: order[item[0]]))  # model order, for the report
    by_prefix = {prefix: name for name, (_, prefix) in plan.items()}

    # the checkpoint's other tensors: biases of quantized layers, and everything else
    bias_names: dict[str, str] = {}      # model layer name -> checkpoint tensor name
    other: dict[str, str] = {}           # model state key -> checkpoint tensor name
    shapes = _tensor_shapes(path, [name for name, _ in ckpt_skipped])
    for tensor, why in ckpt_skipped:
        prefix, _, suffix = tensor.rpartition(".")
        if why == BIAS_WHY:
            if prefix in by_prefix:
                layer = by_prefix[prefix]
                if shapes[tensor] != [modules[layer].out_features]:
                    conflicts.append(f"{tensor}: the checkpoint's bias is {shapes[tensor]}, the layer has "
                                     f"N = {modules[layer].out_features}")
                bias_names[layer] = tensor
            continue  # the bias of an unmatched layer goes with it
        if why != OTHER_WHY:
            report.unmatched.append((tensor, f"checkpoint tensor ignored: {why}"))
            continue
        if not load_other:
            continue
        key = resolve(tensor, state)
        if key is None:
            report.unmatched.append((tensor, "checkpoint tensor with no parameter or buffer of that name in the model"))
        elif key.rpartition(".")[0] in plan:
            report.unmatched.append((tensor, "dense tensor of a layer the checkpoint also quantizes"))
        elif list(state[key].shape) != shapes[tensor]:
            conflicts.append(f"{key}: the checkpoint's tensor is {shapes[tensor]}, the model's is "
                             f"{list(state[key].shape)}")
        elif state[key].device.type == "meta":
            conflicts.append(f"{key}: the model's tensor is on the meta device: build the model on a real device")
        else:
            other[key] = tensor

    # biases the model has and the checkpoint lacks
    for name in plan:
        module = modules[name]
        if name not in bias_names and module.bias is not None:
            report.unmatched.append((f"{name}.bias", "the model's layer has a bias; the checkpoint has none for "
                                                     "this quantized layer"))

    # Linears expected to be quantized
    absent: set[str] = set()  # those without a checkpoint layer: their tensors are not listed again
    for name, module in modules.items():
        if name in plan or not isinstance(module, (nn.Linear, W4A16Linear)):
            continue
        pattern = _first_match(name, skip)
        excluded = _first_match(name, not_converted)
        if isinstance(module, W4A16Linear):
            report.skipped.append((name, "already a W4A16Linear, not in the checkpoint"))
        elif pattern is not None:
            report.skipped.append((name, f"named by skip pattern {pattern!r}"))
        elif excluded is not None:
            report.skipped.append((name, f"left out by the checkpoint's quantization config ({excluded!r})"))
        elif f"{name}.weight" in other:
            report.skipped.append((name, "held unquantized by the checkpoint: its dense weight is loaded"))
        else:
            report.unmatched.append((name, f"nn.Linear expected to be quantized (not named by skip={list(skip)} "
                                           "or the checkpoint's exclusions), no layer of that name in the checkpoint"))
            absent.add(name)

    # the model's tensors the checkpoint does not supply
    if load_other:
        supplied = {_storage(state[key]) for key in other}
        for key, t in state.items():
            owner = key.rpartition(".")[0]
            if key in other or owner in plan or owner in absent or _storage(t) in supplied:
                continue
            report.unmatched.append((key, "model tensor the checkpoint does not hold: it would keep its current value"))

    _finish(report, conflicts, strict, allow, f"load_quantized({str(path)!r})")

    # Everything matched (or allowed): build every module first, so a failure changes nothing.
    tensors = _read_tensors(path, [*bias_names.values(), *other.values()])
    built = []
    for name, (w, prefix) in plan.items():
        module = modules[name]
        bias = tensors[bias_names[name]] if name in bias_names else None
        try:
            built.append((name, W4A16Linear.from_weight(w, _layer_dtype(module), bias, device=_layer_device(module),
                                                        dense_cache=dense_cache)))
        except (ContractError, LayoutError) as e:
            raise ModelLoadError(f"load_quantized: layer {name!r} (checkpoint {prefix!r}) does not fit the kernels: "
                                 f"{e}; the model was left unchanged", report) from e
    for name, new in built:
        _swap(model, name, new)
        report.replaced.append(name)
    report.biases = [name for name in report.replaced if name in bias_names]
    with torch.no_grad():
        for key, tensor in other.items():
            state[key].copy_(tensors[tensor])
            report.loaded.append(key)
    return report


def _config_exclusions(qc: Mapping) -> tuple[str, ...]:
    """Patterns for the layers a quantization config leaves unquantized: compressed-tensors
    "ignore" (names or re: patterns), and "modules_to_not_convert" (AutoAWQ and transformers
    match it as a substring of the name)."""
    out = [str(p) for p in qc.get("ignore") or ()]
    out += [f"*{p}*" for p in qc.get("modules_to_not_convert") or ()]
    return tuple(out)


def _storage(t: torch.Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr()) if t.device.type != "meta" else (t.device, id(t))


def _files(path: Path) -> list[Path]:
    """The safetensors files `oracle.read_checkpoint` reads for `path` (it has checked they exist)."""
    return sorted(path.glob("*.safetensors")) if path.is_dir() else [path]


def _tensor_shapes(path: Path, names: list[str]) -> dict[str, list[int]]:
    from safetensors import safe_open

    wanted, out = set(names), {}
    for file in _files(path):
        with safe_open(str(file), framework="pt") as f:
            for key in wanted & set(f.keys()):
                out[key] = list(f.get_slice(key).get_shape())
    return out


def _read_tensors(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    wanted, out = set(names), {}
    for file in _files(path):
        with safe_open(str(file), framework="pt") as f:
            for key in wanted & set(f.keys()):
                out[key] = f.get_tensor(key)
    missing = wanted - out.keys()
    if missing:
        raise CheckpointError(f"{path}: expected tensors {sorted(missing)[:5]} (listed by the reader), found none")
    return out

"""Judging a model whose Linears are W4 layers, with the oracle's error model, layer by layer and
at the logits. Used by tests/optimized/test_model.py (CPU) and tests/benchmarks/model_e2e.py (GPU).

The two checks, and why they are sound:

* Per layer (exact): forward hooks record what every quantized layer was given and returned in
  the real forward. Each output is judged by `oracle.judge` against `oracle.reference_matmul` of
  the recorded input with the weight the layer must hold (the quantizer's or the checkpoint's,
  never the module's own tensors) and the bias it must add. A wrong zero point, nibble, scale,
  permutation, bias or transposition in any layer fails here, on inputs the model really produces.

* At the logits (statistical): three forwards of one prompt.
    L* = the exact function: a twin whose Linears hold the dequantized weights exactly, every other
         tensor the same values, all in float64 (RMSNorm and rotary compute in float32 inside
         transformers, 2^-24 relative: far below the bfloat16/float16 noise judged here);
    Ld = the plain same-precision computation: the same twin in the activation dtype, each weight
         rounded once into it (the dequant rounding u_w every W4 kernel here makes), cuBLAS/CPU GEMMs;
    Lq = the W4 model.
  Lq and Ld differ from L* only by rounding: in their linear layers (the W4 layer's is bounded per
  element by the oracle's tight bound, which is TIGHT_SIGMAS standard deviations of the same
  random-sign rounding model that describes a plain layer's error) and in the shared non-linear
  ops. To first order the logits error is a sum of per-layer errors times fixed Jacobians, so its
  RMS grows linearly with the per-layer error scale: a model whose every layer stays within
  TIGHT_SIGMAS sigma of plain rounding has ||Lq - L*|| <= TIGHT_SIGMAS ||Ld - L*|| (Frobenius norm
  over every logit), and that is the verdict, printed with both norms. A bug is not rounding: the
  mutations in test_model.py (one wrong zero point, a dropped bias, a transposed weight) move the
  ratio far above the factor.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from oracle import judge, reference_matmul
from oracle.canonical import QuantizedWeight
from oracle.error_model import TIGHT_SIGMAS, Verdict


@contextmanager
def record_io(model: nn.Module, names: list[str]) -> Iterator[dict[str, list[tuple[torch.Tensor, torch.Tensor]]]]:
    """{name: [(input, output), ...]} of the named modules for every forward inside the block."""
    records: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {name: [] for name in names}
    handles = []
    for name in names:
        def hook(module, args, output, name=name):
            records[name].append((args[0].detach(), output.detach()))
        handles.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


def judge_layers(records: Mapping[str, list[tuple[torch.Tensor, torch.Tensor]]], weights: Mapping[str, QuantizedWeight],
                 biases: Mapping[str, torch.Tensor | None], *, roundings: int = 1) -> dict[str, Verdict]:
    """The oracle's verdict on every recorded call of every layer (the worst call per layer).

    weights: {name: the weight the layer must compute with}; its scales are rounded into the
    activation dtype first, as every W4 layer here does. biases: {name: activation dtype [N] or None}.
    roundings: the layers' dequant chain (1 for W4A16Linear, 2 for tinygemm's float zero).
    """
    out = {}
    for name, calls in records.items():
        if not calls:
            raise AssertionError(f"{name}: the forward never called this layer")
        worst = None
        w = weights[name]  # once per layer: a lazy mapping may unpack it from the model
        for x, y in calls:
            x2 = x.reshape(-1, x.shape[-1])
            w = w.to(x2.device).with_scales(w.scales.to(x2.device, x2.dtype))
            bias = biases.get(name)
            ref = reference_matmul(x2, w, None if bias is None else bias.detach().to(x2.device, x2.dtype))
            v = judge(y.reshape(-1, w.n), ref, dequant_dtype=x2.dtype, dequant_roundings=roundings)
            if worst is None or (not v.passed, v.worst_ratio) > (not worst.passed, worst.worst_ratio):
                worst = v
        out[name] = worst
    return out


def dense_twin(model: nn.Module, weights: Mapping[str, QuantizedWeight], biases: Mapping[str, torch.Tensor | None],
               dtype: torch.dtype, *, share: bool = True) -> nn.Module:
    """A copy of `model` in which each layer of `weights` is an nn.Linear holding that weight
    dequantized exactly (float64), then rounded once into `dtype`, with biases[name]; every other
    floating tensor is converted to `dtype`. share: reuse the tensors already in `dtype` instead
    of copying them (the twin then aliases `model`'s embeddings and norms; on a GPU that saves
    their memory)."""
    memo: dict[int, object] = {}
    modules = dict(model.named_modules())
    for name, w in weights.items():
        old = modules[name]
        device = next(old.buffers(), None)
        device = device.device if device is not None else next(old.parameters()).device
        bias = biases.get(name)
        new = nn.Linear(w.k, w.n, bias=bias is not None, device="meta")
        new.weight = nn.Parameter(_dequantized(w, dtype, device), requires_grad=False)
        if bias is not None:
            new.bias = nn.Parameter(bias.detach().to(device, dtype).clone(), requires_grad=False)
        memo[id(old)] = new
    replaced = {id(t) for name in weights for t in (*modules[name].parameters(), *modules[name].buffers())}
    for t in (*model.parameters(), *model.buffers()):
        if id(t) in replaced or id(t) in memo:
            continue
        if not t.is_floating_point() or (share and t.dtype == dtype):
            memo[id(t)] = t
        elif isinstance(t, nn.Parameter):
            memo[id(t)] = nn.Parameter(t.detach().to(dtype), requires_grad=False)
        else:
            memo[id(t)] = t.to(dtype)
    return copy.deepcopy(model, memo)


def _dequantized(w: QuantizedWeight, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """W [N, K] exactly (float64, row chunks on `device`), rounded once into `dtype`."""
    w = w.to(device)
    out = torch.empty(w.n, w.k, dtype=dtype, device=device)
    step = max(1, (1 << 24) // w.k)
    for start in range(0, w.n, step):
        stop = min(w.n, start + step)
        out[start:stop] = w.dequantize_rows(start, stop, torch.float64).to(dtype)
    return out


@dataclass(frozen=True)
class LogitsVerdict:
    passed: bool
    err_q: float    # ||Lq - L*||, Frobenius over every logit
    err_d: float    # ||Ld - L*||
    bound: float    # TIGHT_SIGMAS * err_d + floor
    max_q: float    # max |Lq - L*|
    max_d: float    # max |Ld - L*|

    @property
    def ratio(self) -> float:
        return self.err_q / self.err_d if self.err_d else math.inf

    def summary(self) -> str:
        return (f"{'PASS' if self.passed else 'FAIL'}: ||Lq - L*|| = {self.err_q:.4g} against the bound "
                f"{TIGHT_SIGMAS:g} ||Ld - L*|| = {self.bound:.4g} (ratio {self.ratio:.3g}); max |Lq - L*| "
                f"{self.max_q:.4g}, max |Ld - L*| {self.max_d:.4g}")


def judge_logits(l_q: torch.Tensor, l_d: torch.Tensor, l_exact: torch.Tensor) -> LogitsVerdict:
    """l_q, l_d: the W4 model's and the plain dense twin's logits (any float dtype), l_exact the
    float64 twin's; all [..., V] of one prompt. See the module docstring for the bound."""
    exact = l_exact.double()
    dq, dd = l_q.double().to(exact.device) - exact, l_d.double().to(exact.device) - exact
    err_q, err_d = float(torch.linalg.vector_norm(dq)), float(torch.linalg.vector_norm(dd))
    # A floor for a twin that happens to be exact: one float32 ulp of every logit.
    floor = float(torch.linalg.vector_norm(exact)) * 2.0**-23
    bound = TIGHT_SIGMAS * err_d + floor
    return LogitsVerdict(bool(err_q <= bound) and bool(torch.isfinite(l_q).all()), err_q, err_d, bound,
                         float(dq.abs().max()), float(dd.abs().max()))

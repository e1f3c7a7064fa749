"""The W4A16 op users call: `prepare` a weight once, then `matmul` picks the kernel per call.

    pw = prepare(weight, torch.bfloat16, "cuda")      # any layout the oracle reads
    y = matmul(x, pw, bias)                            # x [..., K] -> y [..., N]

`matmul` runs the torch.library op `w4a16::matmul` (fake implementation registered, so
torch.compile traces it). The op rebuilds a `PreparedWeight` from its tensors, whose constructor
accepts only the kernel layout, and `optimized.dispatch` chooses the implementation: the dense
prefill cache for large M when `prepare(..., dense_cache=True)` built one, the skinny kernel for
decode and small batches (up to the policy's skinny_max_m) where it is built, Triton otherwise,
and plain torch where nothing else runs. Force one with `impl=` or $W4A16_IMPL; a forced one that
cannot run raises.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import dispatch, skinny
from .contract import ACTIVATION_DTYPES, ContractError, _desc
from .dispatch import Call, Choice, ImplementationUnavailable
from .prepared import PreparedWeight, dequantize_dense, prepare, prepare_checkpoint

__all__ = ["Choice", "ImplementationUnavailable", "PreparedWeight", "choose", "matmul", "prepare",
           "prepare_checkpoint"]

OP = "w4a16::matmul"


def matmul(x: torch.Tensor, w: PreparedWeight, bias: torch.Tensor | None = None, *,
           impl: str | None = None) -> torch.Tensor:
    """y = x @ W^T + bias.

    x:    w.dtype [..., K]; the last dimension contiguous. Any number of leading dimensions,
          including none with M = 0 rows (returns an empty result).
    w:    a PreparedWeight from `prepare`.
    bias: w.dtype [N] or None.
    impl: "auto" (default), or "dense", "skinny", "transient", "triton", "torch" to force one; None reads
          $W4A16_IMPL (under torch.compile, once, when the call is traced: set it before).
    Returns w.dtype [..., N], contiguous; fp32 accumulation in every implementation.
    """
    if not isinstance(w, PreparedWeight):
        raise ContractError(f"w must be a PreparedWeight from optimized.prepare(...), got {type(w).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != w.k:
        raise ContractError(f"x must be a tensor [..., K] with K={w.k}, got {_desc(x)}")
    # Checked here as well as in the op: a call with one meta tensor dispatches to the fake
    # implementation, which would return an empty meta result instead of failing.
    check_same_device(x, w, bias if isinstance(bias, torch.Tensor) else None)
    lead = x.shape[:-1]
    y = torch.ops.w4a16.matmul(x.reshape(-1, w.k), w.qweight, w.scales, w.zeros, w.group_size, w.n, w.perm,
                               w.dense, bias, dispatch.requested(impl))
    return y.reshape(*lead, w.n)


def choose(m: int, w: PreparedWeight, *, device: torch.device | str | None = None, impl: str | None = None) -> Choice:
    """The implementation `matmul` runs for an [m, K] x against `w` on `device` (default: w's)."""
    device = torch.device(device) if device is not None else w.device
    platform = dispatch.detect_platform(device)
    return dispatch.choose(call_of(m, w), platform, dispatch.thresholds_for(platform.name), impl)


def call_of(m: int, w: PreparedWeight) -> Call:
    return Call(m, w.n, w.k, w.group_size, w.dtype, w.symmetric, w.dense is not None)


@torch.library.custom_op(OP, mutates_args=())
def _matmul_op(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
               group_size: int, n: int, perm: torch.Tensor | None, dense: torch.Tensor | None,
               bias: torch.Tensor | None, impl: str) -> torch.Tensor:
    # Direct callers of the op get the same layout checks as `prepare`'s output.
    w = PreparedWeight(qweight, scales, zeros, group_size, n, perm, dense)
    check_call(x, w, bias)
    if x.shape[0] == 0:
        return x.new_empty(0, n)
    choice = choose(x.shape[0], w, device=x.device, impl=impl)
    return RUNNERS[choice.name](x, w, bias)


@_matmul_op.register_fake
def _matmul_fake(x, qweight, scales, zeros, group_size, n, perm, dense, bias, impl):
    torch._check(x.dim() == 2, lambda: f"x must be [M, K], got {x.dim()}-D")
    torch._check(x.shape[1] == qweight.shape[1] * 8, lambda: "x must be [M, K] with K = 8 * qweight.shape[1]")
    return x.new_empty(x.shape[0], n)


def check_call(x: torch.Tensor, w: PreparedWeight, bias: torch.Tensor | None) -> None:
    if x.dtype not in ACTIVATION_DTYPES or x.dtype != w.dtype:
        raise ContractError(f"x must be {str(w.dtype).removeprefix('torch.')} (the dtype the weight was "
                            f"prepared for) [M, K], got {_desc(x)}")
    if x.stride(1) != 1 and x.shape[0] > 0:
        raise ContractError(f"x must be contiguous along K (stride(1) == 1), got strides {list(x.stride())}")
    if bias is not None and (bias.dtype != x.dtype or tuple(bias.shape) != (w.n,)):
        raise ContractError(f"bias must be {str(x.dtype).removeprefix('torch.')} [N] = [{w.n}], got {_desc(bias)}")
    check_same_device(x, w, bias)


def check_same_device(x: torch.Tensor, w: PreparedWeight, bias: torch.Tensor | None) -> None:
    devices = {str(t.device) for t in (x, w.qweight, bias) if t is not None}
    if len(devices) > 1:
        raise ContractError(f"x, the prepared weight and bias must be on one device, got {sorted(devices)}")


# --------------------------------------------------------------------------------------------
# The implementations. Each takes x [M, K] (M >= 1), the PreparedWeight, bias [N] or None, and
# returns [M, N] contiguous.


def _kernel_inputs(x: torch.Tensor, w: PreparedWeight, bias: torch.Tensor | None):
    """x gathered into the prepared channel order, bias padded to N_pad."""
    if w.perm is not None:
        x = x.index_select(1, w.perm)
    if bias is not None and w.n_padded != w.n:
        bias = torch.nn.functional.pad(bias, (0, w.n_padded - w.n))
    return x, bias


def _unpadded(y: torch.Tensor, w: PreparedWeight) -> torch.Tensor:
    return y if w.n_padded == w.n else y[:, :w.n].contiguous()


def _run_triton(x: torch.Tensor, w: PreparedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    from .triton_w4a16 import w4a16_matmul  # imports triton, which may be absent

    x, bias = _kernel_inputs(x, w, bias)
    return _unpadded(w4a16_matmul(x, w.qweight, w.scales, w.zeros, w.group_size, bias), w)


def _run_skinny(x: torch.Tensor, w: PreparedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    x, bias = _kernel_inputs(x, w, bias)
    # A PreparedWeight is read-only, and `prepare` waited for the kernels that wrote it.
    return _unpadded(skinny.skinny_matmul(x, w.qweight, w.scales, w.zeros, w.group_size, bias, overlap="weights"),
                     w)


def _run_transient(x: torch.Tensor, w: PreparedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    from .dequant import transient_dense  # imports triton, which may be absent

    if w.perm is not None:
        x = x.index_select(1, w.perm)
    # The workspace holds N_pad rows in the prepared channel order; its first n rows are W's.
    dense = transient_dense(w.qweight, w.scales, w.zeros, w.group_size)[: w.n]
    return torch.nn.functional.linear(x, dense, bias)


def _run_dense(x: torch.Tensor, w: PreparedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    if x.device.type == "cpu":
        return _run_torch(x, w, bias)  # CPU half-precision GEMMs are slow and need not accumulate in fp32
    return torch.nn.functional.linear(x, w.dense, bias)


def _run_torch(x: torch.Tensor, w: PreparedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    weight = w.dense if w.dense is not None else _dequantized(w)
    y = torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype)


def _dequantized(w: PreparedWeight) -> torch.Tensor:
    """W [n, K] rounded once into w.dtype, original channel order (as the dense cache holds it)."""
    return dequantize_dense(w.canonical(), w.dtype)


RUNNERS: dict[str, Callable[[torch.Tensor, PreparedWeight, torch.Tensor | None], torch.Tensor]] = {
    "dense": _run_dense,
    "skinny": _run_skinny,
    "transient": _run_transient,
    "triton": _run_triton,
    "torch": _run_torch,
}

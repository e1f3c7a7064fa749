"""Our kernels described to the oracle (`w4a16-oracle check optimized.specs:triton optimized.specs:hybrid`)."""

from __future__ import annotations

import torch

from oracle.canonical import QuantizedWeight
from oracle.cases import Case
from oracle.kernel_spec import KernelSpec

from . import hybrid as hybrid_op
from . import skinny as skinny_op
from .triton_w4a16 import w4a16_matmul


def _triton(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
            group_size: int, bias: torch.Tensor | None) -> torch.Tensor:
    return w4a16_matmul(x, weight, scales, zeros, group_size, bias)


# The M = 1 path scales after an exact dot (no weight rounding), the tensor-core path rounds
# (q - z) * s once into x.dtype: the latter is the looser bound, so it is declared for all M.
triton = KernelSpec(name="triton", fn=_triton, weight_layout="kernel", zero_layout="packed", dequant_roundings=1)


def _skinny(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
            group_size: int, bias: torch.Tensor | None) -> torch.Tensor:
    return skinny_op.skinny_matmul(x, weight, scales, zeros, group_size, bias)


def _skinny_can_implement(case: Case) -> tuple[bool, str]:
    ok, why = skinny_op.is_available()
    if ok:
        why = skinny_op.unfit(case.m, case.k, torch.version.hip is not None)
        ok = not why
    return ok, why


# Dequantizes (q - z) * s into x.dtype once, like the Triton tensor-core path.
skinny = KernelSpec(name="skinny", fn=_skinny, group_sizes=skinny_op.GROUP_SIZES, can_implement=_skinny_can_implement)


def _hybrid_fn(**prepare_options):
    def run(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int,
            bias: torch.Tensor | None, impl: str | None = None) -> torch.Tensor:
        w = hybrid_op.prepare(QuantizedWeight(q, scales, zeros, group_size), x.dtype, **prepare_options)
        return hybrid_op.matmul(x, w, bias, impl=impl)
    return run


# The hybrid op from the canonical weight, so `prepare` is judged too. Every implementation
# behind it rounds (q - z) * s once into x.dtype (or keeps W exact), so one bound covers them.
hybrid = KernelSpec(name="hybrid", fn=_hybrid_fn(), weight_layout="canonical", zero_layout="canonical")
# With the dense prefill cache: calls at M >= the thresholds' dense_min_m run the dense GEMM.
hybrid_dense = KernelSpec(name="hybrid_dense", fn=_hybrid_fn(dense_cache=True), weight_layout="canonical",
                          zero_layout="canonical")

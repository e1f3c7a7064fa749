"""Kernels that ship with the oracle, so it can be exercised (and compared) with no kernel of
your own: a plain dequantize-then-matmul in the activation dtype."""

from __future__ import annotations

import torch

from .canonical import QuantizedWeight
from .kernel_spec import KernelSpec
from .layouts import nibbles
from .reference import plain_torch_matmul


def _torch_dequant(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                   group_size: int, bias: torch.Tensor | None) -> torch.Tensor:
    w = QuantizedWeight(nibbles.unpack(weight, 1), scales, None if zeros is None else nibbles.unpack(zeros, 0),
                        group_size)
    return plain_torch_matmul(x, w, bias)


torch_dequant = KernelSpec(name="torch-dequant", fn=_torch_dequant)

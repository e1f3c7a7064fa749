"""Exact converters between the canonical weight and every real layout (DESIGN.md section 2)."""

from .awq import from_awq, to_awq
from .compressed_tensors import from_compressed_tensors, to_compressed_tensors
from .exllama import pack_exllama, unpack_exllama
from .gptq import from_gptq, to_gptq
from .kernel import (
    KernelWeights,
    check_packed_zero_points,
    from_kernel_layout,
    pack_zero_points,
    to_kernel_layout,
    unpack_zero_points,
    zero_points_from_float,
    zero_points_to_float,
)
from .tinygemm import from_tinygemm, to_tinygemm

__all__ = [
    "KernelWeights", "check_packed_zero_points", "from_awq", "from_compressed_tensors", "from_gptq",
    "from_kernel_layout", "from_tinygemm", "pack_exllama", "pack_zero_points", "to_awq",
    "to_compressed_tensors", "to_gptq", "to_kernel_layout", "to_tinygemm", "unpack_exllama",
    "unpack_zero_points", "zero_points_from_float", "zero_points_to_float",
]

"""w4a16 oracle: the exact reference, layouts, error model and probes for W4A16 matmul kernels.

Pure PyTorch; runs on CPU or GPU and never imports `optimized`. What a kernel author needs is
exported here:

    from oracle import KernelSpec, check_kernel, parity_cases
    reports = check_kernel(KernelSpec("mine", my_kernel), parity_cases("cpu"))

The names load on first use: pytest loads this package's plugin (oracle.pytest_plugin) in every
run of any environment it is installed in, and that must not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the submodule that defines it
_EXPORTS = {
    "QuantizedWeight": "canonical",
    "TIERS": "tiers", "Case": "cases", "CaseInputs": "cases", "case": "cases", "make_inputs": "cases",
    "parity_cases": "cases",
    "CaseReport": "check", "check_case": "check", "check_kernel": "check",
    "read_checkpoint": "checkpoint", "write_checkpoint": "checkpoint",
    "diagnose": "diagnose",
    "Verdict": "error_model", "error_bounds": "error_model", "judge": "error_model",
    "CheckpointError": "errors", "LayoutError": "errors",
    "KernelSpec": "kernel_spec",
    "KernelWeights": "layouts", "from_kernel_layout": "layouts", "to_kernel_layout": "layouts",
    "ProbeResult": "probes", "probe_weight": "probes", "run_probes": "probes",
    "quantize_rtn": "quantize", "random_quantized": "quantize", "random_weight": "quantize",
    "Reference": "reference", "plain_torch_matmul": "reference", "reference_matmul": "reference",
    "LinearShape": "shapes",
}
__all__ = ["Case", "CaseInputs", "CaseReport", "CheckpointError", "KernelSpec", "KernelWeights",
    "LayoutError", "LinearShape", "ProbeResult", "QuantizedWeight", "Reference", "TIERS", "Verdict",
    "case", "check_case", "check_kernel", "diagnose", "error_bounds", "from_kernel_layout", "judge", "make_inputs",
    "parity_cases", "plain_torch_matmul", "probe_weight", "quantize_rtn", "random_quantized",
    "random_weight", "read_checkpoint", "reference_matmul", "run_probes", "to_kernel_layout",
    "write_checkpoint"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'oracle' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from .canonical import QuantizedWeight
    from .cases import Case, CaseInputs, case, make_inputs, parity_cases
    from .check import CaseReport, check_case, check_kernel
    from .checkpoint import read_checkpoint, write_checkpoint
    from .diagnose import diagnose
    from .error_model import Verdict, error_bounds, judge
    from .errors import CheckpointError, LayoutError
    from .kernel_spec import KernelSpec
    from .layouts import KernelWeights, from_kernel_layout, to_kernel_layout
    from .probes import ProbeResult, probe_weight, run_probes
    from .quantize import quantize_rtn, random_quantized, random_weight
    from .reference import Reference, plain_torch_matmul, reference_matmul
    from .shapes import LinearShape
    from .tiers import TIERS

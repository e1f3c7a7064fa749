"""w4a16 oracle: the exact reference, layouts, error model and probes for W4A16 matmul kernels.

Pure PyTorch; runs on CPU or GPU and never imports `optimized`.
"""

from .canonical import QuantizedWeight
from .error_model import Verdict, error_bounds, judge
from .errors import CheckpointError, LayoutError
from .probes import ProbeResult, probe_weight, run_probes
from .quantize import quantize_rtn, random_quantized, random_weight
from .reference import Reference, plain_torch_matmul, reference_matmul

__all__ = [
    "CheckpointError", "LayoutError", "ProbeResult", "QuantizedWeight", "Reference", "Verdict", "error_bounds",
    "judge", "plain_torch_matmul", "probe_weight", "quantize_rtn", "random_quantized", "random_weight",
    "reference_matmul", "run_probes",
]

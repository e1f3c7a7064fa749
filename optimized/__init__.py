"""Our W4A16 kernels behind one op: `prepare` a weight once, then `matmul` picks the kernel per call.

    import optimized
    pw = optimized.prepare(weight, torch.bfloat16, "cuda")   # any layout the oracle reads
    y = optimized.matmul(x, pw, bias)                        # x [..., K] -> y [..., N]
    optimized.choose(m, pw)                                  # which implementation an [m, K] call takes

    layer = optimized.W4A16Linear.from_linear(linear)        # an nn.Linear replacement (optimized/linear.py)
    report = optimized.load_quantized(model, path)           # a checkpoint into a model (optimized/model.py)
    report = optimized.quantize_model(model)                 # or RTN-quantize its Linears in place

Importing this package registers the torch.library op `w4a16::matmul` (with its fake
implementation, so torch.compile traces it). Nothing is compiled at import.
"""

from .contract import ContractError
from .dispatch import Choice, ImplementationUnavailable
from .hybrid import choose, matmul
from .linear import W4A16Linear
from .model import ModelLoadError, ModelReport, load_quantized, quantize_model
from .prepared import PreparedWeight, prepare, prepare_checkpoint

__all__ = ["Choice", "ContractError", "ImplementationUnavailable", "ModelLoadError", "ModelReport", "PreparedWeight",
           "W4A16Linear", "choose", "load_quantized", "matmul", "prepare", "prepare_checkpoint", "quantize_model"]

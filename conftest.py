"""Root conftest: where no GPU exists, Triton kernels run under its CPU interpreter.

TRITON_INTERPRET must be set before any @triton.jit function is defined, so it is set here,
before test modules import `optimized`.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

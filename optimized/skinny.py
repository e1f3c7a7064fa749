"""The skinny W4A16 kernel (decode, and small batches through its tile kernel): one C++ source for
CUDA and ROCm, built on first use.

Two ops are defined here (schema, and the matmul's fake implementation); the extension
(csrc/skinny_binding.cpp) registers their implementations when it is built:

* `w4a16::skinny_matmul`: y = x @ W^T + bias: every kernel up to MAX_M rows of x, the tile and
  wgmma kernels (CUDA tensor cores, K % TILE_K == 0) at any M;
* `w4a16::skinny_plan`: what such a call runs (csrc/skinny_plan.h plan_call, the one place that
  decides it), for reports and for grouping the M whose output rows are bit-identical.

The plan reads the device's measured thresholds from its policy file (optimized/policies/, the
"skinny" section). Importing this module compiles nothing, so it works on a machine without a GPU
or compiler.

Tensor arguments (optimized/contract.py holds the shared contract):

* x:       float16 or bfloat16 [M, K], M >= 1 (see unfit()), unit stride along K; rows 16-byte aligned
           (the wrapper copies a misaligned x).
* qweight: int32 or uint32 [N, K/8], the 4-bit values q packed along K, nibble p of word j of row n
           holding q[n, 8 j + p]; contiguous, 16-byte aligned (the same bytes as int8/uint8
           [N, K/2] are accepted too).
* scales:  x.dtype [N, K/G], contiguous: W[n, k] = (q[n, k] - z[n, k // G]) * scales[n, k // G].
* zeros:   int32 or uint32 [N/8, K/G], zero points packed along N (row n at bits 4 (n % 8) of row
           n // 8), contiguous; or None for symmetric weights (z = 8).
* bias:    x.dtype [N], contiguous, or None.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from .contract import ContractError, check_args

MAX_M = 16                   # the most rows of x every kernel takes (csrc/skinny_plan.h kMaxM)
TILE_K = 128                 # above MAX_M only the tile and wgmma kernels run: CUDA, K a multiple of this
GROUP_SIZES = (32, 64, 128)  # the group sizes G it takes: each lane's 32-k chunk lies in one group
ENGINES = ("auto", "mma", "simt")  # mma: CUDA tensor cores (sm_80+); simt: CUDA cores, the one HIP path
# The kernels, in the order of csrc/skinny_plan.h Kernel, for the `kernel` argument and every report:
# "batch" issues a batch of loads per warp, waits, computes; "ring" keeps a register ring of loads in
# flight; "segment", "segment_smem" and "segment_persistent" read long contiguous K segments of a
# few rows (M <= 4, tensor cores) with x from global memory, x staged in shared memory, and x staged
# on a persistent grid; "stream" streams weights through a shared-memory ring and may split K over
# blocks (tensor cores, K % 128 == 0); "tile" streams weights and x through shared-memory stages, a
# block an output tile of N x M (tensor cores, K % 128 == 0, any M), and splits K like "stream";
# "wgmma" is "tile" on Hopper's warpgroup MMA, the weights dequantized into its register operand (compute
# capability 9.0, M above 16).
KERNELS = ("batch", "ring", "segment", "segment_smem", "segment_persistent", "stream", "tile", "wgmma")
# How a call overlaps the kernel before it on the stream (csrc/skinny_plan.h Overlap, same order):
# "none" (a plain launch); "weights" (programmatic dependent launch, CUDA sm_90+, a plain launch
# elsewhere: the kernel's blocks may start while the previous kernel drains, load their first
# weights, scales and zero points, and wait for it before reading x or writing y).
OVERLAPS = ("none", "weights")
ROW_ALIGN_BYTES = 16         # x rows and qweight are read with 16-byte loads


@dataclass(frozen=True)
class SkinnyPlan:
    """What one call runs (csrc/skinny_plan.h SkinnyPlan).

    kernel:           the name in KERNELS of the kernel that runs (the default, or the one asked
                      for where it can run the call).
    engine:           "mma" or "simt".
    split:            the register kernels: warps of a block sharing each row; "stream", "tile", "wgmma":
                      blocks sharing each row (K split over blocks, their fp32 sums added by a second
                      kernel).
    blocks:           the kernel's grid.
    stages:           the stream kernel's shared-memory ring slots per warp, the tile and wgmma
                      kernels' shared-memory stages (0 for the others).
    shared_bytes:     the kernel's dynamic shared memory.
    workspace_floats: fp32 partial sums the stream, tile or wgmma kernel allocates when it splits K.
    summation:        equal for two plans of one weight shape exactly when they add every output's
                      terms in the same order: the M whose plans share it give bit-identical rows.
    """

    kernel: str
    engine: str
    split: int
    blocks: int
    stages: int
    shared_bytes: int
    workspace_floats: int
    summation: tuple[int, ...]

    @classmethod
    def from_values(cls, values) -> SkinnyPlan:
        """The plan of the ints the plan op returns (csrc/skinny_plan.h plan_values, same order)."""
        v = [int(x) for x in values]
        if len(v) != PLAN_FIELDS:
            raise ValueError(f"a skinny plan is {PLAN_FIELDS} integers, got {len(v)}: {v}")
        return cls(KERNELS[v[0]], ENGINES[v[1]], v[2], v[3], v[4], v[5], v[6], tuple(v[7:]))


PLAN_FIELDS = 12  # integers of a plan (csrc/skinny_plan.h kPlanFields)

OP = "w4a16::skinny_matmul"  # the matmul op's name
PLAN_OP = "w4a16::skinny_plan"  # the plan op's name
EXTENSION_NAME = "w4a16_skinny"  # the name torch.utils.cpp_extension builds and caches the extension under
CSRC = Path(__file__).resolve().parent / "csrc"  # the C++ sources

torch.library.define(
    OP,
    "(Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, int group_size, Tensor? bias, str engine, "
    "float[] policy, str kernel='auto', str overlap='none', int split=0) -> Tensor",
)
torch.library.define(
    PLAN_OP,
    "(int m, int n, int k, int group_size, bool symmetric, str engine, float[] policy, int[] device_limits, "
    "str kernel='auto', int split=0) -> int[]",
)


@torch.library.register_fake(OP)
def _skinny_matmul_fake(x, qweight, scales, zeros, group_size, bias, engine, policy, kernel="auto", overlap="none",
                        split=0):
    torch._check(x.dim() == 2, lambda: f"x must be [M, K], got {x.dim()}-D")
    m, k = x.shape
    torch._check(1 <= m, lambda: "x must have at least one row")
    torch._check(qweight.dim() == 2, lambda: "qweight must be 2-D")
    per_word = 8 if qweight.element_size() == 4 else 2
    torch._check(qweight.shape[1] * per_word == k, lambda: f"qweight must be [N, K/{per_word}] for K={k}")
    n = qweight.shape[0]
    torch._check(scales.shape[0] == n and scales.shape[1] * group_size == k, lambda: "scales must be [N, K/G]")
    if zeros is not None:
        torch._check(zeros.shape[0] * 8 == n, lambda: "packed zero points must be [N/8, K/G]")
    if bias is not None:
        torch._check(bias.shape[0] == n, lambda: "bias must be [N]")
    return x.new_empty((m, n))


def unfit(m: int, k: int, rocm: bool) -> str:
    """Why the op cannot take x [m, k] on a CUDA (rocm False) or ROCm device, or "": above MAX_M
    only the tile kernel runs, a tensor-core kernel of whole TILE_K pieces."""
    if m <= MAX_M:
        return ""
    if rocm:
        return f"M={m} above {MAX_M} runs on the tile kernel, which is CUDA-only (tensor-core mma.sync)"
    if k % TILE_K:
        return f"M={m} above {MAX_M} runs on the tile kernel, which needs K % {TILE_K} == 0, got K={k}"
    return ""


class SkinnyUnavailable(RuntimeError):
    """The extension cannot run here (no device, no compiler, or the build failed); says why."""


_lock = threading.Lock()
_build_error: str | None = None
_built = False
_policies: dict[int, list[float]] = {}


def _device_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA or ROCm device (torch.cuda.is_available() is False)"
    if torch.version.cuda is None and torch.version.hip is None:
        return "this PyTorch build has neither CUDA nor ROCm"
    return None


def _cuda_flags() -> list[str]:
    if torch.version.hip is not None:
        return ["-O3"]  # PYTORCH_ROCM_ARCH (or the visible GPUs) picks the targets
    # sm_90a machine code for the H100 and H200 (wgmma is sm_90a only), and compute_90 PTX that newer
    # GPUs JIT-compile (without the wgmma kernel, which the plan runs on compute capability 9.0 only).
    return ["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90,code=compute_90"]


# The kernel families' translation units, built side by side.
FAMILY_UNITS = ("skinny_batch.cu", "skinny_ring.cu", "skinny_segment.cu", "skinny_stream.cu", "skinny_tile.cu",
                "skinny_wgmma.cu")


def _sources() -> list[Path]:
    """The binding (host compiler), the launch and one translation unit per kernel family (nvcc;
    built in parallel by ninja)."""
    return [CSRC / "skinny_binding.cpp", CSRC / "skinny_launch.cu"] + [CSRC / unit for unit in FAMILY_UNITS]


def build(verbose: bool = False) -> None:
    """Compile and load the extension once per process; raises SkinnyUnavailable with the reason."""
    global _build_error, _built
    if _built:
        return
    with _lock:
        if _built:
            return
        if _build_error is None:
            _build_error = _device_reason()
        if _build_error is None:
            try:
                from torch.utils.cpp_extension import load

                # extra_include_paths also tells ROCm's hipify where the included headers are.
                load(name=EXTENSION_NAME, sources=[str(f) for f in _sources()], extra_cuda_cflags=_cuda_flags(),
                     extra_include_paths=[str(CSRC)], is_python_module=False, verbose=verbose)
                _built = True
                return
            except Exception as e:  # compiler missing, toolkit mismatch, compile error: all mean "unavailable"
                lines = str(e).strip().splitlines()
                _build_error = f"building {EXTENSION_NAME} failed: {type(e).__name__}: " + "\n".join(lines[-20:])
        raise SkinnyUnavailable(_build_error)


def is_available() -> tuple[bool, str]:
    """(True, "") once the extension is loaded, else (False, why). Never raises; on a machine with
    a device it builds the extension (cached), elsewhere it compiles nothing."""
    try:
        build()
    except SkinnyUnavailable as e:
        return False, str(e)
    return True, ""


def _device_index(device: torch.device | str | int | None) -> int:
    if isinstance(device, int):
        return device
    index = None if device is None else torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def policy_values(device: torch.device | str | int | None = None) -> list[float]:
    """The skinny thresholds of a CUDA device's policy file (default: the current device's), as the
    ops' `policy` argument takes them (optimized/policy.py SkinnyPolicy.values())."""
    from .policy import policy_for

    index = _device_index(device)
    if index not in _policies:
        _policies[index] = policy_for(torch.cuda.get_device_name(index)).skinny.values()
    return _policies[index]


def plan(m: int, n: int, k: int, group_size: int, symmetric: bool, *, device: torch.device | str | int | None = None,
         engine: str = "auto", kernel: str = "auto", split: int = 0) -> SkinnyPlan:
    """What skinny_matmul runs for x [m, k] and weights [n, k] of group size G (zero points unless
    `symmetric`) on a CUDA device (default: the current one), with the same engine, kernel and split
    arguments. Asks the extension's plan op, so it needs a device (SkinnyUnavailable otherwise);
    raises RuntimeError, naming what is wrong, for a request skinny_matmul would refuse."""
    build()
    index = _device_index(device)
    with torch.cuda.device(index):
        values = torch.ops.w4a16.skinny_plan(m, n, k, group_size, symmetric, engine, policy_values(index), [],
                                             kernel, split)
    return SkinnyPlan.from_values(values)


def skinny_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                  group_size: int, bias: torch.Tensor | None = None, *, engine: str = "auto", kernel: str = "auto",
                  overlap: str = "none", split: int = 0) -> torch.Tensor:
    """y = x @ W^T + bias for decode batches; tensors as in the module docstring.

    group_size: one of GROUP_SIZES, dividing K.
    engine: one of ENGINES: "auto" (tensor cores where the device has them), "mma" or "simt".
    kernel: "auto" (the plan's choice, see plan()) or a name in KERNELS, for benchmarking; a kernel
    that cannot run the call is replaced by one that can, as plan() reports.
    overlap: one of OVERLAPS. "weights" reads qweight, scales and zeros before the previous kernel
    on the stream has finished: pass it only when no kernel just before this call writes them
    (weights prepared once; a host synchronize after writing them is enough).
    split: 0 (the plan's), or for benchmarking a named kernel other than "segment_persistent": the
    register kernels' warps of a block sharing each row (a power of two up to the warps of a block),
    or the stream and tile kernels' blocks along K (1 to K/128, within the device's shared memory).
    Returns x.dtype [M, N]; fp32 accumulation, deterministic (no atomics). Row i is bit-identical
    for every M whose plan has the same `summation`; across those the summation order changes, and
    a row can differ in its last bits, within the error bound.
    Raises ContractError before any build or launch, SkinnyUnavailable when it cannot run here, and
    RuntimeError (from the op) for a kernel or split request the plan refuses.
    """
    if isinstance(qweight, torch.Tensor) and qweight.dtype in (torch.int8, torch.uint8) and qweight.dim() == 2 \
            and qweight.shape[1] % 4 == 0 and qweight.is_contiguous():
        qweight = qweight.view(torch.int32)
    problem = check_args(x, qweight, scales, zeros, group_size, bias, group_sizes=GROUP_SIZES)
    why = unfit(problem.m, problem.k, torch.version.hip is not None)
    if why:
        raise ContractError(f"skinny_matmul cannot take this call: {why}")
    if engine not in ENGINES:
        raise ContractError(f"engine must be one of {ENGINES}, got {engine!r}")
    if kernel != "auto" and kernel not in KERNELS:
        raise ContractError(f"kernel must be 'auto' or one of {KERNELS}, got {kernel!r}")
    if overlap not in OVERLAPS:
        raise ContractError(f"overlap must be one of {OVERLAPS}, got {overlap!r}")
    if not isinstance(split, int) or isinstance(split, bool) or split < 0:
        raise ContractError(f"split must be an int >= 0 (0: the plan's), got {split!r}")
    if x.device.type != "cuda":
        raise SkinnyUnavailable(f"skinny_matmul runs on CUDA/ROCm devices, got x on {x.device}")
    if x.data_ptr() % ROW_ALIGN_BYTES or (problem.m > 1 and x.stride(0) * x.element_size() % ROW_ALIGN_BYTES):
        x = x.clone(memory_format=torch.contiguous_format)  # a fresh allocation is aligned
    build()
    return torch.ops.w4a16.skinny_matmul(x, qweight, scales, zeros, group_size, bias, engine,
                                         policy_values(x.device), kernel, overlap, split)

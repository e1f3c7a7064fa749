"""The skinny (decode) W4A16 kernel: one C++ source for CUDA and ROCm, built on first use.

The op `w4a16::skinny_matmul` is defined here (schema + fake implementation); its CUDA/ROCm
implementation is registered by the extension (csrc/skinny_binding.cpp) when it is built.
Importing this module compiles nothing, so it works on a machine without a GPU or compiler.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from .contract import ContractError, check_args

MAX_M = 16                   # rows of x per call (csrc/skinny_core.cuh kMaxM)
GROUP_SIZES = (32, 64, 128)  # each lane's 32-k chunk must lie in one group
ENGINES = ("auto", "mma", "simt")  # mma: CUDA tensor cores (sm_80+); simt: CUDA cores, the one HIP path
ROW_ALIGN_BYTES = 16         # x rows and qweight are read with 16-byte loads
# The kernels (csrc/skinny_core.cuh Variant, same order), for the op's `variant` argument:
# "base": each warp loads kUnroll iterations, waits, computes; "regs_s4": a register ring keeps
# 3 iterations' loads in flight per lane while the warp computes one (it needs K % 128 == 0 and
# N >= 8, else the base kernel runs; its simt engine exists for M = 1 only, other M run base);
# "seg_r4": a register ring too, with each warp's quads on consecutive K segments of 4 rows per
# lane, so a load reads up to 512 contiguous bytes of a row (mma engine at M <= SEG_MAX_M; other
# calls run regs_s4); "seg_xs": at split 1, seg_r4 reading x from a permuted copy in shared
# memory, where the padded rows of x fit in SEG_XS_MAX_BYTES (seg_r4 otherwise); "stream": weights
# stream through a shared-memory ring per warp by asynchronous copies, x, scales and zero points
# are staged in shared memory once a block, and blocks split K (a second kernel adds their fp32
# partial sums in a fixed order) where that fills the GPU better (mma engine at K % 128 == 0,
# every M; other calls run regs_s4 up to REGS_MAX_M, base above); "seg_p": seg_xs's kernel on a
# persistent grid (2 blocks an SM), each block's row groups split evenly over its warps' iterations,
# which run back to back with the loads running on from one row group into the next; a row group
# that warp boundaries cut is added from its warps' partial sums at the end of the block (mma
# engine at M <= SEG_MAX_M, where x fits in SEG_XS_MAX_BYTES and seg_xs would run more than one
# wave of blocks or load the SMs unevenly, with 4 or more iterations a warp; seg_xs runs elsewhere,
# seg_r4 where x does not fit, regs_s4 on other calls).
VARIANTS = ("base", "regs_s4", "seg_r4", "seg_xs", "stream", "seg_p")
# variant=-1 (the default) picks per call in the kernel's host dispatch: seg_p up to SEG_MAX_M
# (which runs seg_xs where its plan has no grid), above it stream from K = STREAM_MIN_K or from
# STREAM_MIN_BYTES_MID (M <= REGS_MAX_M) or STREAM_MIN_BYTES_HIGH bytes of weights, regs_s4 or base
# on other shapes
# (csrc/skinny_host.h default_variant and seg_persist_blocks, from the comparisons in
# bench/results/h200/ and h100/).
# default_variant(m, n, k) mirrors it for reports.
DEFAULT_VARIANT = -1
# The "stream" variant's M buckets (csrc/skinny_core.cuh stream_bucket_m): every M of a bucket runs
# the same block tiles and K split, so row i of its output is bit-identical across them.
STREAM_BUCKETS = ((1, 2), (3, 4), (5, 8), (9, 16))
REGS_MAX_M = 8
# Where the default runs stream rather than regs_s4 at M = 5..REGS_MAX_M and rather than base above:
# from K = STREAM_MIN_K, or from these weight bytes (N K / 2) (csrc/skinny_host.h kStreamMinK,
# kStreamMinBytesMid, kStreamMinBytesHigh).
STREAM_MIN_K = 6144
STREAM_MIN_BYTES_MID = 28 << 20
STREAM_MIN_BYTES_HIGH = 20 << 20
# The forced splits the register-ring kernels (base, regs_s4, seg_r4, seg_xs) take: warps of a
# block sharing each row (csrc/skinny_binding.cpp).
REGISTER_SPLITS = (1, 2, 4, 8)
SEG_MAX_M = 4
SEG_XS_MAX_BYTES = 96 * 1024
# How a call overlaps the kernel before it on the stream (csrc/skinny_core.cuh Overlap, same order):
# "none" (the default: a plain launch); "weights" (programmatic dependent launch, CUDA sm_90+, a
# plain launch elsewhere: the kernel's blocks may start while the previous kernel drains, load
# their first weights, scales and zero points, and wait for it before reading x or writing y; only
# for weights, scales and zero points that the previous kernel on the stream does not write).
OVERLAPS = ("none", "weights")


def default_variant(m: int, n: int, k: int) -> int:
    """The index into VARIANTS that variant=-1 asks for at M = m on weights [n, k]. On the mma
    engine seg_p runs where its plan has a grid (seg_xs elsewhere), seg_xs where x fits in
    SEG_XS_MAX_BYTES at split 1 (seg_r4 elsewhere), and stream where K % 128 == 0; elsewhere
    regs_s4 runs where this names seg_p or seg_xs, regs_s4 or base where it names stream."""
    if m <= SEG_MAX_M:
        return VARIANTS.index("seg_p")
    threshold = STREAM_MIN_BYTES_MID if m <= REGS_MAX_M else STREAM_MIN_BYTES_HIGH
    if k >= STREAM_MIN_K or n * k // 2 >= threshold:
        return VARIANTS.index("stream")
    return VARIANTS.index("regs_s4") if m <= REGS_MAX_M else VARIANTS.index("base")


def settled_variant(name: str, m: int, engine: str = "mma") -> str:
    """The kernel that runs for variant `name` at M = m on `engine` where K % 128 == 0 and x fits
    in shared memory (csrc/skinny_host.h settle_variant): the segmented kernels exist for the mma
    engine up to SEG_MAX_M and the streaming kernel for the mma engine; regs_s4 runs in their place,
    base instead of stream above REGS_MAX_M."""
    if name.startswith("seg") and (engine != "mma" or m > SEG_MAX_M):
        return "regs_s4"
    if name == "stream" and engine != "mma":
        return "regs_s4" if m <= REGS_MAX_M else "base"
    return name


def same_rows_ranges(engine: str = "mma") -> list[tuple[int, int]]:
    """(first M, last M) of each range of M over which the default policy keeps row i of the
    output bit-identical: the M that run one kernel with one split and one mma tile. The segmented
    kernel's tile, K segments and split follow M rounded up to 1, 2 or 4, so on the mma engine
    M = 1, 2 and 3..4 are ranges of their own (the H200 reliability run measured rows of M = 1 and
    M = 4 differing from M = 8 before these ranges were split). Above SEG_MAX_M the kernel depends
    on the shape only, and every choice keeps rows across 5..REGS_MAX_M and above: regs_s4 and base
    run one mma tile and an M-free split for each, the streaming kernel plans its tile and split
    for the whole bucket (STREAM_BUCKETS)."""
    def config(m: int) -> tuple[int, bool]:
        seg = engine == "mma" and m <= SEG_MAX_M
        return (1 if m <= 1 else 2 if m <= 2 else 4) if seg else 0, m <= REGS_MAX_M
    ranges: list[tuple[int, int]] = []
    for m in range(1, MAX_M + 1):
        if ranges and config(m) == config(ranges[-1][0]):
            ranges[-1] = (ranges[-1][0], m)
        else:
            ranges.append((m, m))
    return ranges


OP = "w4a16::skinny_matmul"
EXTENSION_NAME = "w4a16_skinny"
CSRC = Path(__file__).resolve().parent / "csrc"

torch.library.define(
    OP,
    "(Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, int group_size, Tensor? bias=None, "
    "str engine='auto', int variant=-1, str overlap='none', int split=0) -> Tensor",
)


@torch.library.register_fake(OP)
def _skinny_matmul_fake(x, qweight, scales, zeros, group_size, bias=None, engine="auto", variant=-1,
                        overlap="none", split=0):
    torch._check(x.dim() == 2, lambda: f"x must be [M, K], got {x.dim()}-D")
    m, k = x.shape
    torch._check(1 <= m, lambda: "x must have at least one row")
    torch._check(m <= MAX_M, lambda: f"M must be at most {MAX_M}, got {m}")
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


class SkinnyUnavailable(RuntimeError):
    """The extension cannot run here (no device, no compiler, or the build failed); says why."""


_lock = threading.Lock()
_build_error: str | None = None
_built = False


def _device_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA or ROCm device (torch.cuda.is_available() is False)"
    if torch.version.cuda is None and torch.version.hip is None:
        return "this PyTorch build has neither CUDA nor ROCm"
    return None


def _cuda_flags() -> list[str]:
    if torch.version.hip is not None:
        return ["-O3"]  # PYTORCH_ROCM_ARCH (or the visible GPUs) picks the targets
    # sm_90 machine code for the H200, and compute_90 PTX that newer GPUs JIT-compile.
    return ["-O3", "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"]


def _sources() -> list[Path]:
    """The binding (host compiler), the dispatch and one translation unit per variant (nvcc; built
    in parallel by ninja)."""
    return [CSRC / "skinny_binding.cpp", CSRC / "skinny_launch.cu"] + \
        [CSRC / f"skinny_inst_v{v}.cu" for v in range(len(VARIANTS))]


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


def skinny_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                  group_size: int, bias: torch.Tensor | None = None, *, engine: str = "auto",
                  variant: int = -1, overlap: str = "none", split: int = 0) -> torch.Tensor:
    """y = x @ W^T + bias for decode batches (M <= MAX_M), W[n, k] = (q - z) * s per group.

    Arguments follow optimized/contract.py (dtypes, shapes, packing), with these limits:
    M <= MAX_M; group_size in GROUP_SIZES, so K is a multiple of 32; x rows 16-byte aligned (a
    misaligned x is copied first). qweight may also be the same bytes as int8/uint8 [N, K/2].
    engine: "auto" (tensor cores where the device has them), "mma" or "simt" (the HIP path).
    variant: an index into VARIANTS, for benchmarking; -1 (the default) picks by M
    (default_variant).
    overlap: one of OVERLAPS. "weights" reads qweight, scales and zeros before the previous
    kernel on the stream has finished: pass it only when no kernel just before this call writes
    them (weights prepared once; a host synchronize after writing them is enough). In a CUDA
    graph of back-to-back calls on the H200 it took 0.74-1.00x the time of "none"
    (bench/results/h200/overlap_h200.md).
    split: for benchmarking a forced variant: the stream variant's blocks along K (1 to K/128,
    within the device's shared memory), or the warps of a block sharing each row for base,
    regs_s4, seg_r4 and seg_xs (REGISTER_SPLITS; 8 only where warps are 32 lanes); it steers that
    kernel only, and where another one runs (settle_variant) that one takes its plan's split.
    0 (the default) takes the kernel's plan; seg_p and the default policy take 0 only.
    Returns x.dtype [M, N]; fp32 accumulation, deterministic (no atomics). Row i is bit-identical
    for every M that runs the same kernel configuration (under the default, same_rows_ranges: M 1,
    2, 3..4, 5..8 and 9..16 on the tensor cores, 1..8 and 9..16 on the simt engine);
    across those ranges the summation order changes, and a row can differ in its last bits,
    within the error bound.
    Raises ContractError before any build or launch, SkinnyUnavailable when it cannot run here.
    """
    if isinstance(qweight, torch.Tensor) and qweight.dtype in (torch.int8, torch.uint8) and qweight.dim() == 2 \
            and qweight.shape[1] % 4 == 0 and qweight.is_contiguous():
        qweight = qweight.view(torch.int32)
    problem = check_args(x, qweight, scales, zeros, group_size, bias, group_sizes=GROUP_SIZES)
    if problem.m > MAX_M:
        raise ContractError(f"skinny_matmul handles M <= {MAX_M}, got M={problem.m} (use a prefill kernel)")
    if engine not in ENGINES:
        raise ContractError(f"engine must be one of {ENGINES}, got {engine!r}")
    if not isinstance(variant, int) or not -1 <= variant < len(VARIANTS):
        raise ContractError(f"variant must be -1 (the default) or in [0, {len(VARIANTS)}), got {variant!r}")
    if overlap not in OVERLAPS:
        raise ContractError(f"overlap must be one of {OVERLAPS}, got {overlap!r}")
    stream = VARIANTS.index("stream")
    if not isinstance(split, int) or split < 0 or (split > 0 and variant in (-1, VARIANTS.index("seg_p"))):
        raise ContractError(f"split must be 0 (the plan's), or at least 1 with a variant other than -1 and "
                            f"{VARIANTS.index('seg_p')} (seg_p), got split={split!r} with variant={variant!r}")
    if split > 0 and variant != stream and split not in REGISTER_SPLITS:
        raise ContractError(f"a forced split of variant {variant} ({VARIANTS[variant]}) must be one of "
                            f"{REGISTER_SPLITS}, got {split}")
    if x.device.type != "cuda":
        raise SkinnyUnavailable(f"skinny_matmul runs on CUDA/ROCm devices, got x on {x.device}")
    if x.data_ptr() % ROW_ALIGN_BYTES or (problem.m > 1 and x.stride(0) * x.element_size() % ROW_ALIGN_BYTES):
        x = x.clone(memory_format=torch.contiguous_format)  # a fresh allocation is aligned
    build()
    return torch.ops.w4a16.skinny_matmul(x, qweight, scales, zeros, group_size, bias, engine, variant, overlap,
                                         split)

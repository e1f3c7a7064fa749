"""The argument contract every optimized W4A16 kernel shares, checked before any launch.

x:         float16 or bfloat16 [M, K], M >= 1; rows may be strided (x.stride(1) == 1).
qweight:   int32 [N, K/8], packed along K, natural nibble order: nibble p of word j in row n
           holds q[n, 8j + p] (the compressed-tensors `weight_packed` bytes).
scales:    x.dtype [N, K/G], contiguous.
zeros:     int32 (or uint32) [N/8, K/G], packed along N: row n at bits 4*(n % 8) of word n // 8;
           None for symmetric weights (z = 8). The unpacked activation-dtype [N, K/G] form is
           rejected by name: both forms are 2-D with compatible extents, so accepting it silently
           would compute with the wrong zero points.
group_size: 32, 64, 128, or -1 (one group spanning K).
bias:      x.dtype [N] or None.
Output:    x.dtype [M, N], contiguous; accumulation in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)
PACKED_DTYPES = (torch.int32, torch.uint32)
GROUP_SIZES = (32, 64, 128, -1)


class ContractError(ValueError):
    """An argument does not match the kernel contract; raised before launch."""


def _desc(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
    return type(t).__name__


@dataclass(frozen=True)
class Problem:
    """The sizes of one validated call."""

    m: int
    n: int
    k: int
    group: int  # resolved: K when group_size == -1
    dtype: torch.dtype
    symmetric: bool
    has_bias: bool


def check_args(x: object, qweight: object, scales: object, zeros: object, group_size: object,
               bias: object = None, group_sizes: tuple[int, ...] = GROUP_SIZES) -> Problem:
    if not isinstance(x, torch.Tensor) or x.dtype not in ACTIVATION_DTYPES or x.dim() != 2:
        raise ContractError(f"x must be float16 or bfloat16 [M, K], got {_desc(x)}")
    m, k = x.shape
    if m < 1:
        raise ContractError(f"x must have M >= 1 rows, got {_desc(x)}")
    if x.stride(1) != 1:
        raise ContractError(f"x must be contiguous along K (stride(1) == 1), got strides {list(x.stride())}")
    if k % 8:
        raise ContractError(f"K must be a multiple of 8 (packed int32 words along K), got K={k}")
    if not isinstance(qweight, torch.Tensor) or qweight.dtype not in PACKED_DTYPES or qweight.dim() != 2 \
            or qweight.shape[1] * 8 != k:
        raise ContractError(f"qweight must be int32 [N, K/8] = [N, {k // 8}] (packed along K), got {_desc(qweight)}")
    if not qweight.is_contiguous():
        raise ContractError(f"qweight must be contiguous, got strides {list(qweight.stride())}")
    n = qweight.shape[0]
    # 32.0, a numpy integer or a 0-d tensor compare equal to 32 but would reach the kernel as a
    # non-constexpr block size: only a Python int is accepted.
    if type(group_size) is not int or group_size not in group_sizes:
        raise ContractError(f"group_size must be one of {group_sizes}, got {group_size!r} "
                            f"({type(group_size).__name__})")
    group = k if group_size == -1 else group_size
    if k % group:
        raise ContractError(f"K must be a multiple of group_size, got K={k}, group_size={group_size}")
    groups = k // group
    if not isinstance(scales, torch.Tensor) or scales.dtype != x.dtype or tuple(scales.shape) != (n, groups):
        raise ContractError(f"scales must be {str(x.dtype).removeprefix('torch.')} [N, K/G] = [{n}, {groups}], "
                            f"got {_desc(scales)}")
    if not scales.is_contiguous():
        raise ContractError(f"scales must be contiguous, got strides {list(scales.stride())}")
    if zeros is not None:
        if not isinstance(zeros, torch.Tensor) or zeros.dtype not in PACKED_DTYPES or zeros.dim() != 2 \
                or zeros.shape[0] * 8 != n or zeros.shape[1] != groups:
            raise ContractError(f"Zero points must be int32 or uint32 (packed 8x uint4 along dim 0) "
                                f"[N/8, groups] = [{n / 8:g}, {groups}], got {_desc(zeros)}")
        if not zeros.is_contiguous():
            raise ContractError(f"zero points must be contiguous, got strides {list(zeros.stride())}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dtype != x.dtype or tuple(bias.shape) != (n,):
            raise ContractError(f"bias must be {str(x.dtype).removeprefix('torch.')} [N] = [{n}], got {_desc(bias)}")
        if not bias.is_contiguous():
            raise ContractError(f"bias must be contiguous, got strides {list(bias.stride())}")
    devices = {t.device for t in (x, qweight, scales, zeros, bias) if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ContractError(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}")
    return Problem(m, n, k, group, x.dtype, zeros is None, bias is not None)

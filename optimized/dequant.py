"""Transient dequantization for large M: W rounded once into the activation dtype in a workspace
reused across calls, then one dense GEMM.

At large M a call is compute-bound, and writing W out (2 bytes a weight) costs less than the
GEMM's time saved over a fused W4 kernel; the weight itself stays 4-bit (no persistent dense
copy). The dequantization is a streaming kernel whose speed is bounded by HBM bandwidth: it reads
the packed words and writes each tile of W once.

    W[n, k] = (q[n, k] - z[n, k // G]) * s[n, k // G], computed in fp32 (exact) and rounded once,
    the same bits as optimized.prepared.dequantize_dense.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import ContractError
from .triton_w4a16 import _to_output

# Tile of W one program writes: BLOCK_N rows x BLOCK_K columns (BLOCK_K / 8 packed words a row).
# Long rows keep each program's loads and stores in whole 512-byte and 2 KiB runs: on an H100 this
# tile writes W at 0.85-0.99 of the copy bandwidth, where 32 x 256 reached 0.53-0.78.
BLOCK_N = 8
BLOCK_K = 1024


@triton.jit
def _dequant_kernel(
    # qweight: int32 [N, K/8] (natural nibble order); scales: [N, K/G]; zeros: int32 [N/8, K/G]
    # packed along N, or unused; out: [N, K] in the scales' dtype, contiguous.
    qweight_ptr, scales_ptr, zeros_ptr, out_ptr,
    N, K, G, stride_gn,
    HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    words = pid_k * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    row_ok = rows < N
    word_ok = words < K // 8
    mask = row_ok[:, None] & word_ok[None, :]
    packed = tl.load(qweight_ptr + rows.to(tl.int64)[:, None] * (K // 8) + words[None, :], mask=mask, other=0)
    group = (words * 8) // G  # a word's 8 channels lie in one group: G is a multiple of 8
    s = tl.load(scales_ptr + rows[:, None] * stride_gn + group[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_ZEROS:
        zw = tl.load(zeros_ptr + (rows // 8)[:, None] * stride_gn + group[None, :], mask=mask, other=0)
        z = ((zw >> ((rows % 8) * 4)[:, None]) & 0xF).to(tl.float32)
    else:
        z = tl.full([BLOCK_N, BLOCK_K // 8], 8.0, tl.float32)
    out_t = out_ptr.dtype.element_ty
    # Plane p holds channel 8j + p of word j; interleaving the planes puts them in K order.
    w = tl.interleave(
        tl.interleave(tl.interleave(_plane(packed, 0, z, s, out_t), _plane(packed, 4, z, s, out_t)),
                      tl.interleave(_plane(packed, 2, z, s, out_t), _plane(packed, 6, z, s, out_t))),
        tl.interleave(tl.interleave(_plane(packed, 1, z, s, out_t), _plane(packed, 5, z, s, out_t)),
                      tl.interleave(_plane(packed, 3, z, s, out_t), _plane(packed, 7, z, s, out_t))))
    w = tl.reshape(w, [BLOCK_N, BLOCK_K])
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], w,
             mask=row_ok[:, None] & (cols < K)[None, :])


@triton.jit
def _plane(packed, P: tl.constexpr, z, s, OUT: tl.constexpr):
    """Nibble P of every word as (q - z) * s: exact in fp32, rounded once to OUT (by hand for bf16,
    which Triton's interpreter would truncate)."""
    q = ((packed >> (4 * P)) & 0xF).to(tl.float32)
    return _to_output((q - z) * s, OUT)


# One workspace per (device, stream, dtype), grown to the largest weight seen and reused by every
# call there: work queued on one stream runs in order, so a GEMM reads its W before the next call
# overwrites it.
_workspaces: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}


def workspace(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A flat `dtype` buffer of at least `numel` elements on `device`, shared by the calls on the
    current stream there."""
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0
    key = (str(device), stream, dtype)
    buf = _workspaces.get(key)
    if buf is None or buf.numel() < numel:
        _workspaces.pop(key, None)
        buf = torch.empty(numel, dtype=dtype, device=device)
        _workspaces[key] = buf
    return buf


def dequantize_into(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int,
                    out: torch.Tensor) -> torch.Tensor:
    """W into `out`, scales.dtype [N, K] contiguous, from the kernel layout:

    qweight: int32 [N, K/8], packed along K, natural nibble order.
    scales:  float16/bfloat16 [N, K/G], contiguous.
    zeros:   int32 [N/8, K/G] packed along N, or None (z = 8).
    """
    n, k = qweight.shape[0], qweight.shape[1] * 8
    group = k if group_size == -1 else group_size
    if out.dtype != scales.dtype or tuple(out.shape) != (n, k) or not out.is_contiguous():
        raise ContractError(f"out must be contiguous {str(scales.dtype).removeprefix('torch.')} [N, K] = [{n}, {k}], "
                            f"got {str(out.dtype).removeprefix('torch.')} {list(out.shape)}")
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(k, BLOCK_K))
    _dequant_kernel[grid](qweight.view(torch.int32), scales, scales if zeros is None else zeros.view(torch.int32),
                          out, n, k, group, scales.stride(0), HAS_ZEROS=zeros is not None, BLOCK_N=BLOCK_N,
                          BLOCK_K=BLOCK_K)
    return out


def transient_dense(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                    group_size: int) -> torch.Tensor:
    """W as scales.dtype [N, K] in the shared workspace: valid until the next call on this device,
    stream and dtype."""
    n, k = qweight.shape[0], qweight.shape[1] * 8
    out = workspace(n * k, scales.dtype, qweight.device)[: n * k].view(n, k)
    return dequantize_into(qweight, scales, zeros, group_size, out)

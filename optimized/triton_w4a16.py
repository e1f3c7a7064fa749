"""Triton W4A16 matmul: y = x @ W^T + bias, W[n, k] = (q[n, k] - z[n, k // G]) * s[n, k // G].

Arguments follow `optimized.contract` (`w4a16_matmul` restates every tensor's dtype, shape and
layout). One kernel serves every M; the tile config (`optimized.tile_configs`) picks its path
(`TileConfig.path`, compile-time constants, never a branch in the wrapper):

* GEMV tiles (path "gemv", block_m = 1..8 rows of x per program, the decode buckets): rows of x
  against a [block_n, block_k] weight tile on the CUDA cores. Each product x[k] * (q - z) is exact
  in fp32 and the weight is never rounded. A weight costs one LOP3 (its nibble into a float
  mantissa, `_nibble_x16`), one subtract and one FMA. With one row, each word's eight products are
  summed and scaled by s[n, g] once, and the sums over words wait until after the K loop, which
  also keeps the next K-tile's loads in flight; with several rows, each plane's q - z is computed
  once and used for every row, and each group's sum within the K-tile is scaled once.
* Tensor-core tiles (path "dot", block_m >= 16): the weight tile is dequantized in registers into
  x.dtype, (q - z) * s rounded once, and fed to tl.dot with an fp32 accumulator. Path "dot_swap"
  makes the weight tile the A operand and x^T the B operand (acc is [block_n, block_m]): on
  Hopper that is a wgmma with the dequantized weights straight from registers, and 16 rows of x
  fill its N dimension. TileConfig.dequant "half" computes (q - z) * s in x.dtype arithmetic
  (exact q - z from a magic-number nibble, one rounding in the multiply: the same values as the
  fp32 route, in packed half2 instructions).

Small-M buckets also split K (split_k > 1) so that few output columns still spread over every
SM: each split writes fp32 partials to a workspace [splits, M, N] and a second kernel adds them
in split order, adds the bias and rounds once. No atomics anywhere, so repeated calls are
bit-identical.

No K-tile straddles a quant group (`tile_configs.no_straddle`): a K-tile lies inside one group
(block_k divides G) or covers GROUPS_PER_TILE whole groups (block_k a multiple of G dividing K).
Tiles are handled as [block_n, groups per tile, words per group] so each group's scale and zero
point broadcast over its own words, and K needs no masking.

Batch invariance: row i of the output depends only on x[i], the weight and the tile config, and
the config depends on M only through its M bucket. So within one bucket (e.g. M = 2..16 on the
H200 table) row i is bit-identical whatever M is. The exception is crossing a bucket boundary:
the K-split, the tile shape and CUDA-core versus tensor-core summation change, and a row can
differ in its last bits (always within the error bound). Making every M bit-identical would mean
one config for all M: either no split-K at decode (on shapes with few N-tiles, e.g. N = 1024,
most SMs idle and decode loses several times its bandwidth) or decode-sized split-K tiles for
prefill (tensor-core efficiency and an extra fp32 round trip through memory for every output).

Under Triton's CPU interpreter (TRITON_INTERPRET=1, CPU tensors) the same kernel runs with
workarounds for three interpreter bugs (triton 3.9): it computes tl.dot on bf16 operands from their
raw uint16 bits, it truncates fp32 -> bf16, and its bf16 arithmetic is wrong. bf16 results are
therefore rounded by hand (`_round_to_bf16`, also used on GPUs, where it costs a few integer ops
per output element), and bf16 dot operands are widened to fp32 after that rounding
(`DOT_IN_FP32`, which also routes the half dequant through fp32 for bf16), which gives the exact
products and fp32 sums the tensor cores compute.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from .contract import check_args
from .policy import INTERPRETER, policy_for
from .tile_configs import TileConfig, check_config, k_splits, select_config

# Programs are ordered in bands of this many M-tiles, M fastest, so that programs running at the
# same time read the same weight tiles (from L2 after the first); matters when M spans tiles.
GROUP_M = 8
# Elements per program of the split-K reduction.
REDUCE_BLOCK = 1024


@triton.jit
def _round_to_bf16(v):
    """fp32 -> bf16, round to nearest even, by integer arithmetic on the bit pattern: adding
    0x7FFF plus the lowest kept bit carries exactly when the dropped half is above (or at, with an
    odd kept bit) the midpoint. Overflow rounds to inf; NaN stays a (quiet) NaN."""
    bits = v.to(tl.int32, bitcast=True)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    rounded = tl.where(v != v, bits | 0x400000, rounded)
    return (rounded >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _to_output(v, OUT_DTYPE: tl.constexpr):
    """fp32 -> the output dtype, one round-to-nearest-even."""
    if OUT_DTYPE == tl.bfloat16:
        return _round_to_bf16(v)
    else:
        return v.to(OUT_DTYPE)


# Float bits of 2^27, the magic number of nibble class 0 (see `_nibble_x16`). The kernel takes it as
# a run-time argument so that it lives in a register: a LOP3 takes one immediate, and with the mask
# and the magic both immediates the mask-and-OR costs two instructions instead of one.
NIBBLE_MAGIC = 0x4D000000


@triton.jit
def _nibble_x16(packed, high, P: tl.constexpr, magic0):
    """Nibble P of every packed word as the fp32 2^e + 16 q, exactly, in one LOP3 (mask and OR).
    The nibble stays where it is and is ORed into the mantissa of a power of two 2^e chosen so
    that the mantissa's unit at the nibble's position is 16: e = 27 - 4c for a nibble at bits
    4c..4c+3 (c = 0..4, magic0 - c * 2^25 is 2^e's bit pattern). Subtracting 2^e + 16 z
    (`_x16_offset`) then leaves 16 (q - z) exactly, with no int -> float conversion (a
    quarter-rate instruction) and no shift. Nibbles 5..7 straddle the exponent there, so they come
    from `high` = packed >> 16 (one shift per word, shared by three nibbles; an arithmetic shift
    smears the sign bit into bits the masks drop)."""
    C: tl.constexpr = P if P < 5 else P - 4
    if P < 5:
        src = packed
    else:
        src = high
    return ((src & (0xF << (4 * C))) | (magic0 - C * 0x2000000)).to(tl.float32, bitcast=True)


@triton.jit
def _x16_offset(z16, P: tl.constexpr):
    """2^e + 16 z for nibble P's class (`_nibble_x16`); z16 = 16 z as fp32 (exact sums: both terms
    are multiples of 16 below 2^28)."""
    C: tl.constexpr = P if P < 5 else P - 4
    if C == 0:
        return z16 + 134217728.0
    elif C == 1:
        return z16 + 8388608.0
    elif C == 2:
        return z16 + 524288.0
    elif C == 3:
        return z16 + 32768.0
    else:
        return z16 + 2048.0


@triton.jit
def _nibble_half(packed, P: tl.constexpr, XT: tl.constexpr):
    """Nibble P of every packed word as the x.dtype value MAGIC + q, exactly: the nibble is ORed
    into the mantissa of MAGIC (fp16 1024, bf16 128), whose unit there is 1. MAGIC + q - (MAGIC + z)
    is then q - z exactly in x.dtype, and one multiply by s rounds (q - z) * s once, the same value
    the fp32 route produces."""
    if P == 0:
        v = packed & 0xF
    else:
        v = (packed >> (4 * P)) & 0xF
    if XT == tl.bfloat16:
        v = v | 0x4300
    else:
        v = v | 0x6400
    return v.to(tl.int16).to(XT, bitcast=True)


@triton.jit
def _dequant_plane(packed, high, P: tl.constexpr, off, sc, magic0, XT: tl.constexpr, HALF: tl.constexpr,
                   DOT_IN_FP32: tl.constexpr):
    """Nibble plane P of a [BLOCK_N, GT, WPS] word tile as tl.dot operand values: (q - z) * s
    rounded once to x.dtype (widened back to fp32 under DOT_IN_FP32). `off` and `sc` broadcast
    over the words of each group; their form depends on the route (see the kernel): on the fp32
    route `off` is 16 z, which `_x16_offset` turns into plane P's offset."""
    if HALF:
        if DOT_IN_FP32:
            # The interpreter's bf16 arithmetic is wrong (triton 3.9): same values through fp32.
            return _round_to_bf16((_nibble_half(packed, P, XT).to(tl.float32) - off) * sc).to(tl.float32)
        else:
            return (_nibble_half(packed, P, XT) - off) * sc
    else:
        w = (_nibble_x16(packed, high, P, magic0) - _x16_offset(off, P)) * sc
        if DOT_IN_FP32:
            return _round_to_bf16(w).to(tl.float32)
        else:
            return w.to(XT)


# M and the K-tile counts vary from call to call: specializing on them would only multiply
# compilations. The strides stay specialized (divisibility by 16 proves wide loads aligned).
@triton.jit(do_not_specialize=["M", "TILES_PER_GROUP", "TILES_PER_SPLIT"])
def _w4a16_kernel(
    # Pointers: see `w4a16_matmul` for dtypes and layouts. out_ptr is the output [M, N], or with
    # WRITE_PARTIALS the fp32 workspace [splits, M, N], split s at offset s * M * N.
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, bias_ptr, out_ptr,
    # Dimensions and strides (in elements): x rows, qweight rows (K / 8), scale/zero-point rows (K / G).
    M, N, K,
    stride_xm, stride_qn, stride_gn,
    TILES_PER_GROUP,  # G // BLOCK_K when a K-tile lies inside one group, else 1
    TILES_PER_SPLIT,  # K-tiles each split sums
    magic0,  # NIBBLE_MAGIC
    # Meta-parameters. PATH: 0 GEMV (CUDA cores, BLOCK_M rows of x per program, 1..8), 1 tensor
    # cores with x as the A operand, 2 tensor cores with the weight tile as the A operand (acc is
    # [BLOCK_N, BLOCK_M]). GROUPS_PER_TILE: quant groups per K-tile (BLOCK_K // G when BLOCK_K > G,
    # else 1). DQ: tensor-core dequant (tile_configs.DEQUANTS: 0 fp32, 1 x.dtype arithmetic).
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS_PER_TILE: tl.constexpr,
    PATH: tl.constexpr, DQ: tl.constexpr, WRITE_PARTIALS: tl.constexpr,
    HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_IN_FP32: tl.constexpr, GROUP_M: tl.constexpr,
):
    XT: tl.constexpr = x_ptr.dtype.element_ty
    GT: tl.constexpr = GROUPS_PER_TILE
    # Words of one group inside a K-tile (all the tile's words when the tile is inside one group).
    WPS: tl.constexpr = BLOCK_K // 8 // GROUPS_PER_TILE
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    band = GROUP_M * tiles_n
    first_m = (pid // band) * GROUP_M
    band_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % band) % band_rows
    pid_n = (pid % band) // band_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows past M or N read row M-1 / N-1 instead of masking every load; they are never stored.
    rows_m = tl.minimum(offs_m, M - 1).to(tl.int64)
    rows_n = tl.minimum(offs_n, N - 1)
    offs_g = tl.arange(0, GT)
    # Word j of group segment i of a K-tile: word i * WPS + j of the tile. Tiles are handled as
    # [BLOCK_N, GT, WPS] so that each group's scale and zero point broadcast over its own words.
    words = offs_g[:, None] * WPS + tl.arange(0, WPS)[None, :]

    w_ptrs = qweight_ptr + rows_n.to(tl.int64)[:, None, None] * stride_qn + words[None, :, :]
    if PATH == 0 and BLOCK_M > 1:
        # Multi-row GEMV: the weight tile as [1, BLOCK_N, GT, WPS], loaded in the 4-D layout the
        # products use (a 3-D load expanded afterwards costs a layout conversion per plane).
        w_ptrs = w_ptrs[None, :, :, :]
    s_ptrs = scales_ptr + rows_n[:, None] * stride_gn + offs_g[None, :]
    if HAS_ZEROS:
        z_ptrs = zeros_ptr + (rows_n // 8)[:, None] * stride_gn + offs_g[None, :]
        z_shift = ((rows_n % 8) * 4)[:, None]
    if PATH == 0:
        # x[m, 8j + P] for word j: the GEMV multiplies nibble plane P by this strided slice.
        if BLOCK_M == 1:
            x_ptrs = x_ptr + pid_m.to(tl.int64) * stride_xm + words * 8
        else:
            x_ptrs = x_ptr + rows_m[:, None, None] * stride_xm + (words * 8)[None, :, :]
    else:
        x_ptrs = x_ptr + rows_m[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]

    if PATH == 0 and BLOCK_M == 1:
        acc_words = tl.zeros([BLOCK_N, GT, WPS], dtype=tl.float32)
    if PATH == 2:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_tiles = K // BLOCK_K
    first_tile = pid_k * TILES_PER_SPLIT
    last_tile = tl.minimum(first_tile + TILES_PER_SPLIT, k_tiles)
    if PATH == 0:
        # The GEMV keeps the next tile's words, scales and zero points in flight while it works on
        # this one (Triton's pipelining would stage them through shared memory, which it does not
        # need).
        next_packed = tl.load(w_ptrs + first_tile * (BLOCK_K // 8))
        next_s = tl.load(s_ptrs + (first_tile // TILES_PER_GROUP) * GT)
        if HAS_ZEROS:
            next_z = tl.load(z_ptrs + (first_tile // TILES_PER_GROUP) * GT)
    for t in range(first_tile, last_tile):
        g = (t // TILES_PER_GROUP) * GT  # the tile's first group
        if PATH == 0:
            following = tl.minimum(t + 1, last_tile - 1)
            packed = next_packed  # [BLOCK_N, GT, WPS]
            s = next_s  # [BLOCK_N, GT]
            next_packed = tl.load(w_ptrs + following * (BLOCK_K // 8))
            next_s = tl.load(s_ptrs + (following // TILES_PER_GROUP) * GT)
            if HAS_ZEROS:
                z = (next_z >> z_shift) & 0xF
                next_z = tl.load(z_ptrs + (following // TILES_PER_GROUP) * GT)
        else:
            packed = tl.load(w_ptrs + t * (BLOCK_K // 8))  # [BLOCK_N, GT, WPS]
            s = tl.load(s_ptrs + g)  # [BLOCK_N, GT]
            if HAS_ZEROS:
                z = (tl.load(z_ptrs + g) >> z_shift) & 0xF
        high = packed >> 16
        if PATH == 0 or DQ == 0:
            # The fp32 route (`_nibble_x16`): 16 z per word group, and s / 16 (exact), which removes
            # the nibbles' factor 16.
            if HAS_ZEROS:
                z16 = (z * 16).to(tl.float32)[:, :, None]
            else:
                z16 = tl.full([BLOCK_N, GT, 1], 128.0, tl.float32)  # symmetric: z = 8
            sc = s.to(tl.float32) * 0.0625
        if PATH == 0:
            x_tile = x_ptrs + t * BLOCK_K
            if BLOCK_M == 1:
                # One FMA per weight across the eight planes, a word's eight exact products summed in
                # fp32 and scaled once; the sums over words wait until after the loop.
                part = (_nibble_x16(packed, high, 0, magic0) - _x16_offset(z16, 0)) * \
                    tl.load(x_tile).to(tl.float32)[None, :, :]
                for p in tl.static_range(1, 8):
                    part += (_nibble_x16(packed, high, p, magic0) - _x16_offset(z16, p)) * \
                        tl.load(x_tile + p).to(tl.float32)[None, :, :]
                acc_words += part * sc[:, :, None]
            else:
                # Each plane's (q - z) is computed once and multiplies every row of x.
                z16 = z16[None, :, :, :]
                part = (_nibble_x16(packed, high, 0, magic0) - _x16_offset(z16, 0)) * \
                    tl.load(x_tile).to(tl.float32)[:, None, :, :]
                for p in tl.static_range(1, 8):
                    part += (_nibble_x16(packed, high, p, magic0) - _x16_offset(z16, p)) * \
                        tl.load(x_tile + p).to(tl.float32)[:, None, :, :]
                acc += tl.sum(tl.sum(part, axis=3) * sc[None, :, :], axis=2)
        else:
            if DQ == 1:
                if XT == tl.bfloat16:
                    magic = 128.0
                else:
                    magic = 1024.0
                if HAS_ZEROS:
                    off = z.to(tl.float32) + magic
                else:
                    off = tl.full([BLOCK_N, GT], 8.0 + magic, tl.float32)
                if DOT_IN_FP32:
                    off = off[:, :, None]
                    sc = s.to(tl.float32)[:, :, None]
                else:
                    off = off.to(XT)[:, :, None]
                    sc = s[:, :, None]
            else:
                off = z16
                sc = sc[:, :, None]
            # Interleaving the planes this way puts nibble P of word j at column 8j + P.
            HALF: tl.constexpr = DQ == 1
            w = tl.interleave(
                tl.interleave(
                    tl.interleave(_dequant_plane(packed, high, 0, off, sc, magic0, XT, HALF, DOT_IN_FP32),
                                  _dequant_plane(packed, high, 4, off, sc, magic0, XT, HALF, DOT_IN_FP32)),
                    tl.interleave(_dequant_plane(packed, high, 2, off, sc, magic0, XT, HALF, DOT_IN_FP32),
                                  _dequant_plane(packed, high, 6, off, sc, magic0, XT, HALF, DOT_IN_FP32))),
                tl.interleave(
                    tl.interleave(_dequant_plane(packed, high, 1, off, sc, magic0, XT, HALF, DOT_IN_FP32),
                                  _dequant_plane(packed, high, 5, off, sc, magic0, XT, HALF, DOT_IN_FP32)),
                    tl.interleave(_dequant_plane(packed, high, 3, off, sc, magic0, XT, HALF, DOT_IN_FP32),
                                  _dequant_plane(packed, high, 7, off, sc, magic0, XT, HALF, DOT_IN_FP32))))
            w = tl.reshape(w, [BLOCK_N, BLOCK_K])
            x = tl.load(x_ptrs + t * BLOCK_K)
            if DOT_IN_FP32:
                x = x.to(tl.float32)
            if PATH == 2:
                acc = tl.dot(w, tl.trans(x), acc)
            else:
                acc = tl.dot(x, tl.trans(w), acc)
    if PATH == 2:
        acc = tl.trans(acc)
    if PATH == 0 and BLOCK_M == 1:
        acc += tl.sum(tl.sum(acc_words, axis=2), axis=1)[None, :]

    out_rows = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    out_mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if WRITE_PARTIALS:
        tl.store(out_ptr + pid_k.to(tl.int64) * M * N + out_rows, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rows_n).to(tl.float32)[None, :]
        tl.store(out_ptr + out_rows, _to_output(acc, out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["M", "splits"])
def _split_k_reduce_kernel(
    # workspace: fp32 [splits, M, N]; bias: [N] or unused; out: [M, N] contiguous.
    workspace_ptr, bias_ptr, out_ptr,
    M, N, splits,
    HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    numel = M.to(tl.int64) * N
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    ptrs = workspace_ptr + offs
    acc = tl.load(ptrs, mask=mask, other=0.0)
    # Partials are added in split order: the sum, and so the output, is the same on every run.
    for _ in range(1, splits):
        ptrs += numel
        acc += tl.load(ptrs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, _to_output(acc, out_ptr.dtype.element_ty), mask=mask)


# Whether @triton.jit built interpreter functions (TRITON_INTERPRET=1 when this module was imported).
UNDER_INTERPRETER = isinstance(_w4a16_kernel, InterpretedFunction)


def kernel_constexprs(config: TileConfig, group: int, partials: bool, has_zeros: bool, has_bias: bool,
                      dot_in_fp32: bool) -> dict:
    """The meta-parameters `_w4a16_kernel` is compiled for: everything a TileConfig decides, as
    data (also what the ahead-of-time compile tests and the SASS tools pass)."""
    return dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                GROUPS_PER_TILE=max(1, config.block_k // group), PATH=config.path_code,
                DQ=config.dequant_code if config.use_dot else 0, WRITE_PARTIALS=partials,
                HAS_ZEROS=has_zeros, HAS_BIAS=has_bias,
                DOT_IN_FP32=dot_in_fp32, GROUP_M=GROUP_M)


# The kernels' integer arguments (the rest are pointers or constexprs), and those a launch on real
# shapes sees divisible by 16 (Triton specializes on it).
INT_ARGS = ("M", "N", "K", "stride_xm", "stride_qn", "stride_gn", "TILES_PER_GROUP", "TILES_PER_SPLIT", "magic0",
            "splits")
ALIGNED_INT_ARGS = ("N", "K", "stride_xm", "stride_qn", "stride_gn")


def compile_signature(fn, constexprs: dict, dtype: str, partials: bool) -> tuple[dict, dict]:
    """(signature, attrs) for triton.compile(ASTSource(fn, signature, constexprs, attrs)) with no
    device: `fn` is `_w4a16_kernel` or `_split_k_reduce_kernel`, dtype "fp16" or "bf16" (x, scales,
    bias and output), partials: `_w4a16_kernel` writes the fp32 workspace. attrs: what a launch on
    real shapes specializes, pointers 16-byte aligned and N, K and strides divisible by 16."""
    pointers = {"qweight_ptr": "*i32", "zeros_ptr": "*i32", "workspace_ptr": "*fp32",
                "out_ptr": "*fp32" if partials and fn is _w4a16_kernel else f"*{dtype}"}
    sig = {a: "constexpr" if a in constexprs else "i32" if a in INT_ARGS else pointers.get(a, f"*{dtype}")
           for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if sig[a].startswith("*") or a in ALIGNED_INT_ARGS}
    return sig, attrs


def device_name(device: torch.device) -> str:
    """The name the device's policy file is chosen by (optimized/policy.py)."""
    return INTERPRETER if device.type == "cpu" else torch.cuda.get_device_name(device)


def w4a16_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                 group_size: int, bias: torch.Tensor | None = None, *,
                 config: TileConfig | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) -> x.dtype [M, N], contiguous.

    x:          float16/bfloat16 [M, K], x.stride(1) == 1 (rows may be strided).
    qweight:    int32/uint32 [N, K/8], packed along K, natural nibble order.
    scales:     x.dtype [N, K/G].
    zeros:      int32/uint32 [N/8, K/G], packed along N (row n at bits 4*(n % 8)), or None (z = 8).
    group_size: 32, 64, 128, or -1 (G = K).
    bias:       x.dtype [N] or None.
    config:     a tile config to use instead of `select_config`'s (for tuning); must satisfy
                `tile_configs.check_config` for this K and G.
    Raises ContractError (before any launch) when an argument breaks the contract.
    """
    p = check_args(x, qweight, scales, zeros, group_size, bias)
    if x.device.type not in ("cpu", "cuda"):  # ROCm devices are "cuda" too
        raise RuntimeError(f"w4a16_matmul runs on CUDA/ROCm devices, or on CPU under Triton's interpreter; "
                           f"got tensors on {x.device}")
    if x.device.type == "cpu" and not UNDER_INTERPRETER:
        raise RuntimeError("CPU tensors run only under Triton's interpreter: set TRITON_INTERPRET=1 "
                           "before importing optimized.triton_w4a16")
    if config is None:
        config = select_config(p.m, p.n, p.k, p.group, policy_for(device_name(x.device)).triton)
    else:
        check_config(config, p.k, p.group)
    out = torch.empty(p.m, p.n, dtype=x.dtype, device=x.device)
    tiles_per_split, split = k_splits(p.k // config.block_k, config.split_k)
    target = out if split == 1 else torch.empty(split, p.m, p.n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(p.m, config.block_m) * triton.cdiv(p.n, config.block_n), split)
    # Unsigned packed words are reinterpreted, not converted: the kernel masks nibbles itself.
    _w4a16_kernel[grid](
        x, qweight.view(torch.int32), scales, scales if zeros is None else zeros.view(torch.int32),
        out if bias is None else bias, target,
        p.m, p.n, p.k, x.stride(0), p.k // 8, p.k // p.group, max(1, p.group // config.block_k), tiles_per_split,
        NIBBLE_MAGIC,
        **kernel_constexprs(config, p.group, split > 1, zeros is not None, bias is not None,
                            UNDER_INTERPRETER and x.dtype == torch.bfloat16),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if split > 1:
        _split_k_reduce_kernel[(triton.cdiv(p.m * p.n, REDUCE_BLOCK),)](
            target, out if bias is None else bias, out, p.m, p.n, split,
            HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK,
        )
    return out

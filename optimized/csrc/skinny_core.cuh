// Skinny (decode) W4A16 matmul, torch-free: y = x @ W^T + bias with
// W[n, k] = (q[n, k] - z[n, k / G]) * s[n, k / G], for M <= kMaxM rows of x.
//
// Work split. A block of kBlockThreads threads owns a tile of output rows (n) for all M. Within
// a warp, lane = 4 * quad + t: the lane owns rows (quad, quad + W/4) of the warp's rows and, in
// every iteration, one 16-byte chunk (32 consecutive k) of each: chunk t of the iteration's
// 128 k. A block's warps are split `split` ways along K (interleaved iterations) and
// warps / split ways along N; the `split` partial sums of each output meet in shared memory and
// are added in a fixed order, so results are deterministic (no atomics).
//
// Engines, chosen by the host:
//  * kMma (CUDA, sm_80+): each 16 rows x 128 k of a warp's iteration are 8 tensor-core
//    m16n8k16 steps with the weight as the 16-row A operand and up to 8 (or 16) rows of x as B.
//    A lane's A values for one step are 4 nibbles of one of its words, so one step's 16 logical
//    k are 4 nibbles from each of the quad's 4 chunks; x is permuted to the same order. Weights
//    are dequantized to T as (q - z) * s (one rounding), products and sums are fp32. At G = 128
//    the quad's 4 chunks are one group, so the pipelined and segmented kernels feed the exact
//    q - z instead and scale each group's fp32 sums once (the base kernel still rounds).
//  * kSimt (everywhere, the only engine on HIP): each lane forms fp32 dot products over its
//    chunk, (q - z) * s exact in fp32, then the quad adds its 4 partial sums with shuffles.
//
// Kernels (Variant; the host picks one per call with default_variant, and the op's `variant`
// argument can force one for benchmarking):
//  * kVariantBase, "base" (skinny_kernel): each warp issues the loads of kUnroll iterations,
//    waits, computes, then issues the next ones.
//  * kVariantRegs, "regs_s4" (skinny_pipe_kernel): a register ring of kPipeStages iterations per
//    lane: the loads of iteration e + kPipeStages - 1 are issued before iteration e is computed,
//    so kPipeStages - 1 iterations stay in flight while the warp computes.
//  * kVariantSeg, "seg_r4" (skinny_seg_kernel; mma engine, M <= 4): a register ring too, with
//    the 8 quads of a warp on 8 / M_PAD consecutive k segments of the same rows, so that one load
//    instruction reads up to 512 contiguous bytes of a row, and 4 rows per lane. Other calls run
//    regs_s4.
//  * kVariantSegXs, "seg_xs" (the same kernel): at split 1, seg_r4 with x staged in shared memory,
//    permuted so that the warp's x loads are as contiguous as its weight loads (where M_PAD x K x 2
//    bytes fit in kSegXsMaxBytes); seg_r4 otherwise.
//  * kVariantSegPersist, "seg_p" (the segmented kernel, persistent): seg_xs's warps on a grid of
//    at most kMinBlocks blocks an SM, each warp running its share of whole row groups back to back
//    through one ring, so that no block ramps up or drains mid-call and no partial wave is left;
//    where x does not fit in shared memory, seg_r4 runs.
//  * kVariantStream, "stream" (skinny_stream_kernel; mma engine, K % 128 == 0, every M <= 16):
//    weights stream through a ring of shared-memory slots per warp by asynchronous copies
//    (cp.async), so the bytes in flight are not bounded by registers; x, scales and zero points
//    of the block's K range are staged in shared memory once; blocks of 32..256 rows (more at
//    larger M, so each x byte serves more weights) split K across blocks when that fills the GPU
//    better, their fp32 partial sums added in a fixed order by a second kernel. Other calls run
//    regs_s4.
#pragma once

#include <cmath>
#include <type_traits>

#include "compat.h"
#include "skinny_host.h"

namespace w4 {

namespace detail {

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Weights are read exactly once: keep them out of L1 so that x stays there. PREFETCH adds an L2
// prefetch of 256 bytes, which the pipelined kernels' 64-byte pieces of a row gain from; the
// segmented kernel's loads are whole 128-byte lines or more, which the H200 streams fastest without
// it (bench/results/h200/skinny_load_probe.md).
template <bool PREFETCH = true>
__device__ __forceinline__ uint4 load_weights(const uint4* p) {
#if W4_HIP || W4_EMU
  return *p;
#else
  uint4 v;
  if constexpr (PREFETCH) {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  } else {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  }
  return v;
#endif
}

// 16 bytes of x, by a coherent load: x may be the previous kernel's output, and a read-only (.nc)
// load is one ptxas may hoist above the pdl_wait that makes that output visible (it did, in the
// pipelined kernel). Volatile keeps it after the wait's asm in the compiler too.
__device__ __forceinline__ uint4 load_x(const uint4* p) {
#if W4_HIP || W4_EMU
  return *p;
#else
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
#endif
}

// One bias value as its raw 16-bit pattern, by a coherent load for the same reason as load_x.
__device__ __forceinline__ uint32_t load_bias(const unsigned short* p) {
#if W4_HIP || W4_EMU
  return *p;
#else
  unsigned short v;
  asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
#endif
}

// 8 consecutive activations as raw 16-bit patterns; zeros where `ok` is false.
template <typename T>
__device__ __forceinline__ uint4 load_x8(const T* row, int k, bool ok) {
  return ok ? load_x(reinterpret_cast<const uint4*>(row + k)) : make_uint4(0u, 0u, 0u, 0u);
}

template <typename T, int M_TILE, Engine E>
struct Accumulator;  // the engines below; kMma exists on CUDA only

// ---------------------------------------------------------------------------------------------
template <typename T, int M_TILE>
struct Accumulator<T, M_TILE, Engine::kSimt> {
  static constexpr int R = kLaneRows;
  static constexpr int kQuads = W4_WARP_SIZE / 4;
  // Iterations whose loads are issued together in the base kernel; fewer at large M, where
  // acc[2][M_TILE] would otherwise push the loaded words into local memory.
  static constexpr int kUnroll = M_TILE <= 4 ? 4 : 2;
  float acc[R][M_TILE];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int a = 0; a < R; ++a)
#pragma unroll
      for (int m = 0; m < M_TILE; ++m) acc[a][m] = 0.f;
  }

  // One chunk: rows a < R (words wq[a], scale bits s[a], zero point z[a]) times x[:, k0:k0+32];
  // `valid` is false for a chunk past k.
  __device__ __forceinline__ void chunk(const uint4 (&wq)[R], const uint32_t (&s)[R], const uint32_t (&z)[R],
                                        const T* x, int64_t stride_xm, int m_rows, int /*quad*/, int k0, bool valid) {
    float scale[R], zero_magic[R];
#pragma unroll
    for (int a = 0; a < R; ++a) {
      scale[a] = bits_to_float<T>(s[a]);
      zero_magic[a] = 8388608.f + static_cast<float>(z[a]);  // 2^23 + z, exact
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float w[R][8];
#pragma unroll
      for (int a = 0; a < R; ++a) {
        const uint32_t bits = word(wq[a], j);
#pragma unroll
        for (int p = 0; p < 8; ++p) {
          // 2^23 + q as a float, minus 2^23 + z: q - z exactly, without an int-to-float convert.
          const float q_minus_z = __uint_as_float(0x4B000000u | ((bits >> (4 * p)) & 0xFu)) - zero_magic[a];
          w[a][p] = q_minus_z * scale[a];  // exact in fp32: 5 bits times 11
        }
      }
#pragma unroll
      for (int m = 0; m < M_TILE; ++m) {
        const uint4 xv = load_x8(x + m * stride_xm, k0 + 8 * j, valid && m < m_rows);
        float xf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t pair = word(xv, i);
          xf[2 * i] = bits_to_float<T>(pair & 0xFFFFu);
          xf[2 * i + 1] = bits_to_float<T>(pair >> 16);
        }
#pragma unroll
        for (int a = 0; a < R; ++a)
#pragma unroll
          for (int p = 0; p < 8; ++p) acc[a][m] = fmaf(w[a][p], xf[p], acc[a][m]);
      }
    }
  }

  // Adds the quad's 4 partial sums (same order on every lane), then lane t writes m = t mod 4.
  // red_rows: this warp's rows of the block's [rows][M_TILE] partial-sum slice.
  __device__ __forceinline__ void deposit(float* red_rows, int quad, int t) {
#pragma unroll
    for (int a = 0; a < R; ++a)
#pragma unroll
      for (int m = 0; m < M_TILE; ++m) {
        acc[a][m] += shfl_xor(acc[a][m], 1);
        acc[a][m] += shfl_xor(acc[a][m], 2);
        if (m % 4 == t) red_rows[(quad + kQuads * a) * M_TILE + m] = acc[a][m];
      }
  }
};

#if !W4_HIP
// ---------------------------------------------------------------------------------------------
// Packed pairs of T, each op one fma with a single rounding (sm_80+ has fma for both types).
template <typename T>
__device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c);

template <>
__device__ __forceinline__ uint32_t fma2<half_t>(uint32_t a, uint32_t b, uint32_t c) {
#if W4_EMU
  return ::w4emu::fma_f16x2(a, b, c);
#else
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#endif
}

template <>
__device__ __forceinline__ uint32_t fma2<bf16_t>(uint32_t a, uint32_t b, uint32_t c) {
#if W4_EMU
  return ::w4emu::fma_bf16x2(a, b, c);
#else
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#endif
}

__device__ __forceinline__ uint32_t splat(uint32_t bits16) { return bits16 | (bits16 << 16); }

// One word (nibble p = k offset p) -> pairs ((q_i - z) * s, (q_{i+4} - z) * s) for i = 0..3.
// A nibble OR-ed into the mantissa of a power of two ("magic number") is that power plus q;
// subtracting power + z is exact, and the multiply by s is the one rounding.
template <typename T>
__device__ __forceinline__ void dequant_pairs(uint32_t w, uint32_t z, uint32_t s2, uint32_t (&out)[4]);

template <>
__device__ __forceinline__ void dequant_pairs<half_t>(uint32_t w, uint32_t z, uint32_t s2, uint32_t (&out)[4]) {
  constexpr uint32_t kMagic = 0x64006400u;      // 1024: spacing 1, so bits 0..9 add q or 16 q
  constexpr uint32_t kOne = 0x3C003C00u;
  constexpr uint32_t kSixteenth = 0x2C002C00u;  // 1/16
  constexpr uint32_t kNegZero = 0x80008000u;
  const uint32_t neg_1024_z = splat(0xE400u | z);       // -(1024 + z)
  const uint32_t neg_64_z = splat(0xD400u | (z << 4));  // -(64 + z): spacing 1/16 at 64
  const uint32_t w8 = w >> 8;
  const uint32_t lo = (w & 0x000F000Fu) | kMagic;     // 1024 + (q0, q4)
  const uint32_t hi = (w & 0x00F000F0u) | kMagic;     // 1024 + 16 (q1, q5)
  const uint32_t lo8 = (w8 & 0x000F000Fu) | kMagic;   // 1024 + (q2, q6)
  const uint32_t hi8 = (w8 & 0x00F000F0u) | kMagic;   // 1024 + 16 (q3, q7)
  out[0] = fma2<half_t>(fma2<half_t>(lo, kOne, neg_1024_z), s2, kNegZero);
  out[1] = fma2<half_t>(fma2<half_t>(hi, kSixteenth, neg_64_z), s2, kNegZero);
  out[2] = fma2<half_t>(fma2<half_t>(lo8, kOne, neg_1024_z), s2, kNegZero);
  out[3] = fma2<half_t>(fma2<half_t>(hi8, kSixteenth, neg_64_z), s2, kNegZero);
}

template <>
__device__ __forceinline__ void dequant_pairs<bf16_t>(uint32_t w, uint32_t z, uint32_t s2, uint32_t (&out)[4]) {
  constexpr uint32_t kMagic = 0x43004300u;  // 128: only 7 mantissa bits, so each nibble is shifted down
  constexpr uint32_t kOne = 0x3F803F80u;
  constexpr uint32_t kNegZero = 0x80008000u;
  const uint32_t neg_128_z = splat(0xC300u | z);  // -(128 + z)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t v = ((w >> (4 * i)) & 0x000F000Fu) | kMagic;  // 128 + (q_i, q_{i+4})
    out[i] = fma2<bf16_t>(fma2<bf16_t>(v, kOne, neg_128_z), s2, kNegZero);
  }
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma16816<half_t>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if W4_EMU
  ::w4emu::mma16816(c, a, b0, b1, /*bf16=*/false);
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <>
__device__ __forceinline__ void mma16816<bf16_t>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if W4_EMU
  ::w4emu::mma16816(c, a, b0, b1, /*bf16=*/true);
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Fragment map (m16n8k16, lane = 4 quad + t): A holds rows quad and quad + 8 at logical k
// {2t, 2t+1, 2t+8, 2t+9}; B holds x row m = quad at the same k; C holds rows quad, quad + 8 at
// m = 2t, 2t+1. Logical k (2t, 2t+1, 2t+8, 2t+9) of step 2j is nibbles (0, 4, 1, 5) of word j
// of lane t's chunk, and of step 2j+1 nibbles (2, 6, 3, 7); x is permuted to match.

// The B fragments of steps 2j (b[0], b[1]) and 2j + 1 (b[2], b[3]) from x[k0 + 8j .. + 7] of
// one row: the pairs (0, 4), (1, 5), (2, 6), (3, 7), the order of the nibble pairs above.
__device__ __forceinline__ void x_fragments(const uint4& xv, uint32_t (&b)[4]) {
  b[0] = __byte_perm(xv.x, xv.z, 0x5410);
  b[1] = __byte_perm(xv.x, xv.z, 0x7632);
  b[2] = __byte_perm(xv.y, xv.w, 0x5410);
  b[3] = __byte_perm(xv.y, xv.w, 0x7632);
}
template <typename T, int M_TILE>
struct Accumulator<T, M_TILE, Engine::kMma> {
  static_assert(W4_WARP_SIZE == 32 && M_TILE % 8 == 0, "mma tiles are 16 rows x 8 m on 32 lanes");
  static constexpr int kTiles = M_TILE / 8;
  static constexpr int kUnroll = 4;  // iterations whose loads are issued together
  float acc[kTiles][4];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < kTiles; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = 0.f;
  }

  __device__ __forceinline__ void chunk(const uint4 (&wq)[2], const uint32_t (&s)[2], const uint32_t (&z)[2],
                                        const T* x, int64_t stride_xm, int m_rows, int quad, int k0, bool valid) {
    const uint32_t s2[2] = {splat(s[0]), splat(s[1])};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t d0[4], d1[4];  // rows quad, quad + 8
      dequant_pairs<T>(word(wq[0], j), z[0], s2[0], d0);
      dequant_pairs<T>(word(wq[1], j), z[1], s2[1], d1);
      const uint32_t a_even[4] = {d0[0], d1[0], d0[1], d1[1]};
      const uint32_t a_odd[4] = {d0[2], d1[2], d0[3], d1[3]};
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        const int m = 8 * i + quad;
        uint32_t b[4];
        x_fragments(load_x8(x + m * stride_xm, k0 + 8 * j, valid && m < m_rows), b);
        mma16816<T>(acc[i], a_even, b[0], b[1]);
        mma16816<T>(acc[i], a_odd, b[2], b[3]);
      }
    }
  }

  __device__ __forceinline__ void deposit(float* red_rows, int quad, int t) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        red_rows[(quad + 8 * (c / 2)) * M_TILE + 8 * i + 2 * t + c % 2] = acc[i][c];
  }
};

// ---------------------------------------------------------------------------------------------
// The pipelined kernel's mma engine: the fragment map above with fewer instructions per weight:
// one lop3 per nibble pair, x addressed from per-lane row pointers, scales arriving as splat
// pairs.


// (a & mask) | magic in one instruction (the compiler splits it when both are immediates).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t mask, uint32_t magic) {
#if W4_EMU
  return (a & mask) | magic;
#else
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(magic));
  return d;
#endif
}

// Pairs (q_i - z, q_{i+4} - z) of one word, exact in T (as in dequant_pairs).
template <typename T>
__device__ __forceinline__ void nibble_pairs(uint32_t w, uint32_t z, uint32_t (&out)[4]);

template <>
__device__ __forceinline__ void nibble_pairs<half_t>(uint32_t w, uint32_t z, uint32_t (&out)[4]) {
  constexpr uint32_t kMagic = 0x64006400u;
  constexpr uint32_t kOne = 0x3C003C00u;
  constexpr uint32_t kSixteenth = 0x2C002C00u;
  const uint32_t neg_1024_z = splat(0xE400u | z);
  const uint32_t neg_64_z = splat(0xD400u | (z << 4));
  const uint32_t w8 = w >> 8;
  out[0] = fma2<half_t>(and_or(w, 0x000F000Fu, kMagic), kOne, neg_1024_z);
  out[1] = fma2<half_t>(and_or(w, 0x00F000F0u, kMagic), kSixteenth, neg_64_z);
  out[2] = fma2<half_t>(and_or(w8, 0x000F000Fu, kMagic), kOne, neg_1024_z);
  out[3] = fma2<half_t>(and_or(w8, 0x00F000F0u, kMagic), kSixteenth, neg_64_z);
}

template <>
__device__ __forceinline__ void nibble_pairs<bf16_t>(uint32_t w, uint32_t z, uint32_t (&out)[4]) {
  constexpr uint32_t kMagic = 0x43004300u;
  constexpr uint32_t kOne = 0x3F803F80u;
  const uint32_t neg_128_z = splat(0xC300u | z);
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = fma2<bf16_t>(and_or(w >> (4 * i), 0x000F000Fu, kMagic), kOne, neg_128_z);
}

// (q - z) * s pairs of one word in T, one rounding each (nibble_pairs is exact), for the
// pipelined kernels' mma engines.
template <typename T>
__device__ __forceinline__ void scaled_pairs(uint32_t w, uint32_t z, uint32_t s2, uint32_t (&out)[4]) {
  constexpr uint32_t kNegZero = 0x80008000u;
  nibble_pairs<T>(w, z, out);
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = fma2<T>(out[i], s2, kNegZero);
}

// An mma step's 16 k of a row are 4 nibbles from each of the quad's 4 chunks: kIterK k. Where
// that is one group, the weights go into the mma as exact q - z and each step group's fp32 sums
// are scaled once: one multiply per 16 weights instead of one per 2.
__host__ __device__ constexpr bool scale_after_mma(int group_size) { return group_size == kIterK; }

// A operand pairs of one word: exact q - z when the sums are scaled after the mma, else
// (q - z) * s rounded to T.
template <typename T, bool SCALE_AFTER>
__device__ __forceinline__ void a_pairs(uint32_t w, uint32_t z, uint32_t s2, uint32_t (&out)[4]) {
  if constexpr (SCALE_AFTER) {
    nibble_pairs<T>(w, z, out);
  } else {
    scaled_pairs<T>(w, z, s2, out);
  }
}

template <typename T, int M_TILE, int G>
struct MmaPipeAccumulator {
  static_assert(W4_WARP_SIZE == 32 && M_TILE % 8 == 0, "mma tiles are 16 rows x 8 m on 32 lanes");
  static_assert(kLaneRows == 2, "a lane's rows quad and quad + 8 form one 16-row A tile");
  static constexpr int kTiles = M_TILE / 8;
  static constexpr bool kScaleAfter = scale_after_mma(G);  // a chunk call is one step group
  float acc[kTiles][4];
  // This lane's x rows quad + 8 i in 16-byte units. A row past m reads row 0 instead: it only
  // feeds output columns that are never stored (each column of C is its own dot product).
  const uint4* xrow[kTiles];

  __device__ __forceinline__ void init(const void* x, int64_t stride_xm, int m_rows, int quad) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const int m = 8 * i + quad;
      xrow[i] = reinterpret_cast<const uint4*>(static_cast<const T*>(x) + (m < m_rows ? m : 0) * stride_xm);
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = 0.f;
    }
  }

  // The 8 mma steps of chunk `chunk` (k = 32 chunk .. 32 chunk + 31); s2: each row's scale pair.
  __device__ __forceinline__ void chunk(const uint4 (&wq)[2], const uint32_t (&s2)[2], const uint32_t (&z)[2],
                                        int chunk) {
    const uint4* xp[kTiles];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) xp[i] = xrow[i] + 4 * chunk;
    float part[kTiles][4];
#pragma unroll
    for (int i = 0; i < kTiles; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) part[i][c] = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t d0[4], d1[4];  // rows quad, quad + 8
      a_pairs<T, kScaleAfter>(word(wq[0], j), z[0], s2[0], d0);
      a_pairs<T, kScaleAfter>(word(wq[1], j), z[1], s2[1], d1);
      const uint32_t a_even[4] = {d0[0], d1[0], d0[1], d1[1]};
      const uint32_t a_odd[4] = {d0[2], d1[2], d0[3], d1[3]};
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        uint32_t b[4];
        x_fragments(load_x(xp[i] + j), b);
        float(&c)[4] = kScaleAfter ? part[i] : acc[i];
        mma16816<T>(c, a_even, b[0], b[1]);
        mma16816<T>(c, a_odd, b[2], b[3]);
      }
    }
    if constexpr (kScaleAfter) {  // C entries 0, 1 are row quad, 2, 3 row quad + 8
#pragma unroll
      for (int i = 0; i < kTiles; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][c] += bits_to_float<T>(s2[c / 2]) * part[i][c];
    }
  }

  __device__ __forceinline__ void deposit(float* red_rows, int quad, int t) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        red_rows[(quad + 8 * (c / 2)) * M_TILE + 8 * i + 2 * t + c % 2] = acc[i][c];
  }
};
#endif  // !W4_HIP


// Rows [row0, row0 + rows) of the output: each is the sum of its splits * PARTS partials in K
// order, plus bias, rounded once. red: [splits][rows][ROW] with output m of a row at entries
// PARTS m .. PARTS m + PARTS - 1 (the pipelined and base kernels: ROW = M_TILE, PARTS = 1). Called
// after a barrier by every thread of a group of THREADS: the block (its tile, split p.split), or
// under seg_p one warp (its row group, split 1).
template <typename T, int ROW, int PARTS = 1, int THREADS = kBlockThreads>
__device__ __forceinline__ void store_outputs(const SkinnyParams& p, const float* red, int row0, int rows, int splits) {
  T* __restrict__ y = static_cast<T*>(p.y);
  const unsigned short* __restrict__ bias = static_cast<const unsigned short*>(p.bias);
  for (int idx = threadIdx.x % THREADS; idx < rows * p.m; idx += THREADS) {
    const int m = idx / rows, r = idx % rows;
    const int n = row0 + r;
    if (n >= p.n) continue;
    float v = 0.f;
    for (int s = 0; s < splits; ++s)
#pragma unroll
      for (int part = 0; part < PARTS; ++part) v += red[(s * rows + r) * ROW + PARTS * m + part];
    if (bias != nullptr) v += bits_to_float<T>(load_bias(bias + n));
    y[static_cast<int64_t>(m) * p.n + n] = from_float<T>(v);
  }
}

// seg_p's units that warp boundaries cut in a block whose I = iters iterations (of units
// [unit0, ...), per_unit each) its WARPS warps split as [w I / WARPS, (w + 1) I / WARPS): each
// row's sum of the partial slices of the warps that ran part of its unit, in warp order (slot 0 of
// a warp for its first unit, 1 for its last; slot [ROWS][8], entry SEG m + s for x row m and
// segment s), plus bias, rounded once. Called by the whole block after a barrier. A unit is
// handled for the first boundary inside it.
template <typename T, int SEG, int ROWS, int WARPS>
__device__ __forceinline__ void store_cut_units(const SkinnyParams& p, const float* red, int unit0, int iters,
                                                int per_unit) {
  T* __restrict__ y = static_cast<T*>(p.y);
  const unsigned short* __restrict__ bias = static_cast<const unsigned short*>(p.bias);
  for (int idx = threadIdx.x; idx < (WARPS - 1) * ROWS * p.m; idx += kBlockThreads) {
    const int w = 1 + idx / (ROWS * p.m), m = idx / ROWS % p.m, r = idx % ROWS;
    const int cut = w * iters / WARPS, u = cut / per_unit;
    if (cut % per_unit == 0 || (w - 1) * iters / WARPS > u * per_unit) continue;
    const int n = (unit0 + u) * ROWS + r;
    if (n >= p.n) continue;
    float v = 0.f;
    for (int w2 = 0; w2 < WARPS; ++w2) {
      const int lo = w2 * iters / WARPS, hi = (w2 + 1) * iters / WARPS;
      if (lo == hi || hi <= u * per_unit || lo >= (u + 1) * per_unit) continue;
      const float* slot = red + (2 * w2 + (lo / per_unit == u ? 0 : 1)) * ROWS * 8 + r * 8 + SEG * m;
#pragma unroll
      for (int s = 0; s < SEG; ++s) v += slot[s];
    }
    if (bias != nullptr) v += bits_to_float<T>(load_bias(bias + n));
    y[static_cast<int64_t>(m) * p.n + n] = from_float<T>(v);
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// The base kernel (kVariantBase).
template <typename T, int M_TILE, int G, bool SYM, Engine E>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, kMinBlocks) skinny_kernel(const SkinnyParams p) {
  constexpr int kWarp = W4_WARP_SIZE;
  constexpr int kQuads = kWarp / 4;
  constexpr int kWarpRows = kLaneRows * kQuads;
  static_assert(G % kLaneK == 0, "a lane's 32-k chunk lies in one group");
  // Partial sums of every (K-slice, row) pair of the block: [split][rows][M_TILE].
  __shared__ float red[kTileRows * M_TILE];

  const T* __restrict__ x = static_cast<const T*>(p.x);
  const unsigned short* __restrict__ scales = static_cast<const unsigned short*>(p.scales);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int quad = lane / 4, t = lane % 4;
  const int w_k = warp % p.split, w_n = warp / p.split;
  const int block_rows = kTileRows / p.split;
  const int warp_row0 = blockIdx.x * block_rows + w_n * kWarpRows;
  const int groups = p.k / G;
  const int iters = (p.k + kIterK - 1) / kIterK;
  pdl_trigger();

  // Rows past n read row n - 1 (valid memory) and are never stored.
  int row[2];
  const uint4* qrow[2];
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    row[a] = min(warp_row0 + quad + kQuads * a, p.n - 1);
    qrow[a] = reinterpret_cast<const uint4*>(p.qweight) + static_cast<int64_t>(row[a]) * (p.k / kLaneK);
  }

  using Accum = detail::Accumulator<T, M_TILE, E>;
  constexpr int kUnroll = Accum::kUnroll;
  Accum accum;
  accum.init();
  for (int first = w_k; first < iters; first += kUnroll * p.split) {
    // All loads of kUnroll iterations first, scales and zero points included: those come from
    // HBM too, and waiting for them one iteration at a time would serialize the latency.
    uint4 wq[kUnroll][2];
    uint32_t s[kUnroll][2], zw[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k0 = (first + u * p.split) * kIterK + t * kLaneK;
      const bool valid = k0 < p.k;
      const int group = k0 / G;
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        // A chunk past k gets scale 0 (and x 0 in `chunk`), so it adds exactly 0.
        wq[u][a] = valid ? detail::load_weights(qrow[a] + k0 / kLaneK) : make_uint4(0u, 0u, 0u, 0u);
        s[u][a] = valid ? W4_LDG(scales + static_cast<int64_t>(row[a]) * groups + group) : 0u;
        zw[u][a] = !SYM && valid ? W4_LDG(p.zeros + static_cast<int64_t>(row[a] >> 3) * groups + group) : 0u;
      }
    }
    if (first == w_k) pdl_wait();  // the first batch of weights is in flight; x only after it
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int it = first + u * p.split;
      if (it >= iters) break;  // the same for the whole warp, as the mma engine needs
      const int k0 = it * kIterK + t * kLaneK;
      uint32_t z[2];
#pragma unroll
      for (int a = 0; a < 2; ++a) z[a] = SYM ? 8u : (zw[u][a] >> (4 * (row[a] & 7))) & 0xFu;
      accum.chunk(wq[u], s[u], z, x, p.stride_xm, p.m, quad, k0, k0 < p.k);
    }
  }

  pdl_wait();  // for a warp without iterations, before the block writes y; at once for the others
  accum.deposit(red + (w_k * block_rows + w_n * kWarpRows) * M_TILE, quad, t);
  __syncthreads();
  detail::store_outputs<T, M_TILE>(p, red, blockIdx.x * block_rows, block_rows, p.split);
}

// ---------------------------------------------------------------------------------------------
// The pipelined kernel (kVariantRegs). A lane's work: the iterations it = w_k + e * split,
// e < count, of its rows row0 + kQuads * a (a row past n reads a row below n instead and is
// never stored). Ring entry e % S (in registers) holds iteration e's loads: the loads of
// e + S - 1 go into the entry that iteration e - 1 has just freed, then the warp computes e.
// It needs k % 128 == 0 and n >= 8 (launch_variant runs the base kernel otherwise), so no chunk
// lies past k.

namespace detail {

// The simt engine behind the pipelined kernel's interface (x and M kept at init).
template <typename T, int M_TILE>
struct SimtPipeAccumulator {
  Accumulator<T, M_TILE, Engine::kSimt> inner;
  const T* x;
  int64_t stride_xm;
  int m_rows;

  __device__ __forceinline__ void init(const void* x_, int64_t stride, int m, int /*quad*/) {
    x = static_cast<const T*>(x_);
    stride_xm = stride;
    m_rows = m;
    inner.init();
  }
  // s2: scale pairs; the simt engine reads the low half.
  __device__ __forceinline__ void chunk(const uint4 (&wq)[kLaneRows], const uint32_t (&s2)[kLaneRows],
                                        const uint32_t (&z)[kLaneRows], int chunk) {
    inner.chunk(wq, s2, z, x, stride_xm, m_rows, 0, chunk * kLaneK, true);
  }
  __device__ __forceinline__ void deposit(float* red_rows, int quad, int t) { inner.deposit(red_rows, quad, t); }
};

template <typename T, int M_TILE, int G, Engine E>
struct PipeEngine {
  using type = SimtPipeAccumulator<T, M_TILE>;
};
#if !W4_HIP
template <typename T, int M_TILE, int G>
struct PipeEngine<T, M_TILE, G, Engine::kMma> {
  using type = MmaPipeAccumulator<T, M_TILE, G>;
};
#endif

}  // namespace detail

template <typename T, int M_TILE, int G, bool SYM, Engine E>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, kMinBlocks) skinny_pipe_kernel(const SkinnyParams p) {
  constexpr int R = kLaneRows, S = kPipeStages;
  constexpr int kWarp = W4_WARP_SIZE;
  constexpr int kQuads = kWarp / 4;
  constexpr int kWarpRows = R * kQuads;
  constexpr int kChunksPerIter = kIterK / kLaneK;
  constexpr int kChunksPerGroup = G / kLaneK;
  constexpr int kGroupsPerIter = kChunksPerIter / kChunksPerGroup;
  static_assert(G % kLaneK == 0 && kChunksPerIter % kChunksPerGroup == 0, "groups tile the iterations");
  static_assert(S >= 2, "a ring needs at least two entries");
  // Partial sums of every (K-slice, row) pair of the block: [split][rows][M_TILE].
  __shared__ float red[kTileRows * M_TILE];

  const uint4* __restrict__ qw = reinterpret_cast<const uint4*>(p.qweight);
  const unsigned short* __restrict__ scales = static_cast<const unsigned short*>(p.scales);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int quad = lane / 4, t = lane % 4;
  const int w_k = warp % p.split, w_n = warp / p.split;
  const int block_rows = kTileRows / p.split;
  const int warp_row0 = blockIdx.x * block_rows + w_n * kWarpRows;
  const int kc = p.k / kLaneK;  // 16-byte chunks per row
  const int groups = p.k / G;
  const int iters = p.k / kIterK;  // k % 128 == 0 here (launch_variant checks)
  const int count = w_k < iters ? (iters - 1 - w_k) / p.split + 1 : 0;  // the same for the whole warp

  // The lane's rows row0 + kQuads * a. A row r past n reads row r - 8 c instead, the largest
  // below n that is congruent to r mod 8 (n >= 8 here): valid memory, and its sums are never
  // stored. So every row of the lane has the same r mod 8, the zero point's nibble. Element
  // offsets fit in an int (the host checks n * k / 32).
  const int row0 = warp_row0 + quad;
  const int tg = t / kChunksPerGroup;
  int rows[R];
#pragma unroll
  for (int a = 0; a < R; ++a) {
    const int r = row0 + kQuads * a;
    rows[a] = r < p.n ? r : r - 8 * ((r - p.n) / 8 + 1);
  }
  const int zshift = 4 * (row0 & 7);

  uint4 wr[S][R];
  uint32_t sr[S][R], zr[SYM ? 1 : S][R];

  // Issues the loads of iteration w_k + f * split (nothing past count) into ring entry `slot`.
  auto issue = [&](int f, int slot) {
    if (f >= count) return;
    const int it = w_k + f * p.split;
    const int chunk = it * kChunksPerIter + t, group = it * kGroupsPerIter + tg;
#pragma unroll
    for (int a = 0; a < R; ++a) {
      const int qi = rows[a] * kc + chunk, si = rows[a] * groups + group, zi = (rows[a] >> 3) * groups + group;
      wr[slot][a] = detail::load_weights(qw + qi);
      sr[slot][a] = W4_LDG(scales + si);
      if constexpr (!SYM) zr[SYM ? 0 : slot][a] = W4_LDG(p.zeros + zi);
    }
  };

  using Accum = typename detail::PipeEngine<T, M_TILE, G, E>::type;
  Accum accum;
  accum.init(p.x, p.stride_xm, p.m, quad);

  pdl_trigger();
#pragma unroll
  for (int f = 0; f < S - 1; ++f) issue(f, f);
  pdl_wait();  // x and y only after it
  for (int e0 = 0; e0 < count; e0 += S) {
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int e = e0 + u;  // in ring entry u, as e0 % S == 0
      if (e >= count) break;  // the same for the whole warp, as the mma engine needs
      issue(e + S - 1, (u + S - 1) % S);  // into the entry iteration e - 1 used
      const int it = w_k + e * p.split;
      uint32_t s2[R], z[R];
#pragma unroll
      for (int a = 0; a < R; ++a) {
        s2[a] = sr[u][a] * 0x10001u;
        z[a] = SYM ? 8u : (zr[SYM ? 0 : u][a] >> zshift) & 0xFu;
      }
      accum.chunk(wr[u], s2, z, it * kChunksPerIter + t);
    }
  }

  accum.deposit(red + (w_k * block_rows + w_n * kWarpRows) * M_TILE, quad, t);
  __syncthreads();
  detail::store_outputs<T, M_TILE>(p, red, blockIdx.x * block_rows, block_rows, p.split);
}

#if !W4_HIP
// ---------------------------------------------------------------------------------------------
// The segmented kernel (seg_r4; mma engine, M <= kSegMaxM). The mma's 16 A rows need not
// be 16 weight rows. With M_PAD columns of x in use (M rounded up to 1, 2 or 4) and
// SEG = 8 / M_PAD, quad q of a warp holds weight row q / SEG of each row set at k segment
// s = q % SEG (4 chunks, 128 k) of the iteration's SEG segments, and B column q holds x row
// q / SEG at the lane's own k. C entry (row q, column j) is then the dot product over segment s
// of that weight row with x row j / SEG: a partial sum wanted when j % SEG == s, discarded
// otherwise. So a load instruction covers M_PAD rows x SEG * 64 contiguous bytes (at M = 1, 512
// bytes of one row), with the same mma count per weight as the pipelined kernel.
// Lane 4 q + t, row set a < R = kSegRowSets (sets 2 i and 2 i + 1 are rows q and q + 8 of A tile i):
//   row   = warp_row0 + M_PAD a + q / SEG (a row past n reads row n - 1 and is never stored);
//   chunk = 4 (SEG it + s) + t in iteration it = w_k + e * split (e < count); a chunk past k
//           reads zeros (weights, scale and x), so it adds exactly 0 and any k % 32 == 0 works.
// The ring holds 3 entries of R chunks per lane (2 iterations, 128 bytes a lane, in flight: more
// than regs_s4's 96, in 128 registers). A warp's rows start at a multiple of kWarpRows, so its
// sets share ZW zero-point words: set a's row is in 8-row block (M_PAD a) / 8 of the warp's.
//
// XS (seg_xs): a lane's x for word j of its chunk is 16 bytes at 64-byte stride from its
// neighbours', so a warp's global load of them touches 16 cache lines for 512 bytes, four times
// the lines of its weight loads. XS first copies x[:M_PAD] to shared memory (dynamic,
// seg_x_shared_bytes), piece j of chunk c of row r at xs[(4 r + j) kc + c]: the lanes' loads of
// one j are then consecutive 16-byte pieces, 4 wavefronts per 512 bytes, no bank conflicts.
//
// PERSIST (seg_p; split 1, XS): the grid is seg_persist_blocks' B blocks. Block b owns row groups
// (units, kWarpRows rows and all of K each) [b U / B, (b + 1) U / B) of all U, and its warps split
// the I iterations of those units evenly: warp w runs [w I / W, (w + 1) I / W) in unit order, so
// no warp has more than one iteration above the block's mean (whole units a warp left up to one
// unit's iterations of imbalance, which on mid-size shapes was a partial wave's worth). The
// iterations run through one ring, so the loads of the next unit's first iterations are in flight
// while the warp finishes a unit. A unit the warp runs whole is stored as seg_xs stores it at
// split 1 (the C entries through the warp's slice of `red`, store_outputs over the warp, no block
// barrier): its rows' bits equal seg_xs's. A unit that warp boundaries cut (at most W - 1 a block)
// leaves each of its warps a partial slice (slot 0 of the warp's two for its first unit, 1 for its
// last); after a block barrier the block adds them in warp order and stores the unit.
template <typename T, int M_PAD, int G, bool SYM, bool XS, bool PERSIST>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, kMinBlocks) skinny_seg_kernel(const SkinnyParams p) {
  constexpr int R = kSegRowSets, SEG = 8 / M_PAD, S = 3;
  constexpr int kIterChunks = 4 * SEG;
  constexpr int kWarps = kBlockThreads / 32;
  constexpr int kWarpRows = R * M_PAD;
  constexpr int ZW = kWarpRows < 8 ? 1 : kWarpRows / 8;
  static_assert(W4_WARP_SIZE == 32 && R % 2 == 0 && 4 % M_PAD == 0, "16-row A tiles of two row sets on 32 lanes");
  static_assert(G % kLaneK == 0, "a lane's 32-k chunk lies in one group");
  constexpr bool kScaleAfter = detail::scale_after_mma(G);  // an iteration is one step group
  // Partial sums [split][block rows][8]: entry j = SEG m + s of a row is x row m at segment s.
  // PERSIST: two slots of [kWarpRows][8] a warp.
  __shared__ float red[kWarps * kWarpRows * 8 * (PERSIST ? 2 : 1)];
  W4_DYNAMIC_SHARED(uint4, xs);

  const uint4* __restrict__ qw = reinterpret_cast<const uint4*>(p.qweight);
  const unsigned short* __restrict__ scales = static_cast<const unsigned short*>(p.scales);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int quad = lane / 4, t = lane % 4;
  const int seg = quad % SEG, pr = quad / SEG;
  const int split = PERSIST ? 1 : p.split;
  const int w_k = warp % split, w_n = warp / split;
  const int block_rows = kWarps / split * kWarpRows;
  const int kc = p.k / kLaneK;  // 16-byte chunks per row
  const int groups = p.k / G;
  const int iters = (kc + kIterChunks - 1) / kIterChunks;
  const int per_unit = w_k < iters ? (iters - 1 - w_k) / split + 1 : 0;  // the same for the whole warp
  // The warp's row group (unit of kWarpRows rows), all its iterations; under PERSIST (split 1,
  // per_unit = iters) `count` iterations from iteration ie0 of unit unit0 on, unit by unit: the
  // warp's share [warp I / W, (warp + 1) I / W) of its block's I iterations, which are those of
  // units [block_unit0, block_unit1).
  // The block's (block_unit0, I) are kept in shared memory for the end, rather than in registers
  // through the main loop.
  static_assert(!PERSIST || XS, "seg_p stages x");
  __shared__ int block_plan[2];
  int unit0 = blockIdx.x * (kWarps / split) + w_n, ie0 = 0, count = per_unit;
  if constexpr (PERSIST) {
    const int64_t all_units = (p.n + kWarpRows - 1) / kWarpRows;
    const int block_unit0 = static_cast<int>(blockIdx.x * all_units / gridDim.x);
    const int block_iters = (static_cast<int>((blockIdx.x + 1) * all_units / gridDim.x) - block_unit0) * per_unit;
    if (threadIdx.x == 0) {
      block_plan[0] = block_unit0;
      block_plan[1] = block_iters;
    }
    const int first = warp * block_iters / kWarps;
    unit0 = block_unit0 + first / per_unit;
    ie0 = first % per_unit;
    count = (warp + 1) * block_iters / kWarps - first;
  }

  // Element offsets fit in an int (the host checks n * k / 32). A zero-point word's block is that
  // of its first set's row; a row past n in it is never stored, so its nibble does not matter.
  // The lane's chunk in iteration e of a unit is chunk0 + e * step, its group group0 +
  // e * step / (G / 32) (step is a multiple of G / 32). The offsets of iteration 0 are kept
  // unsigned, so that each iteration's address is one add and one wide multiply-add; a row's scale
  // offset is its chunk offset / (G / 32), as a row holds kc = groups * G / 32 chunks.
  constexpr int kGroupShift = G == 128 ? 2 : G == 64 ? 1 : 0;
  static_assert(G >> kGroupShift == kLaneK, "G / 32 is a power of two");
  const int chunk0 = 4 * (w_k * SEG + seg) + t;
  const int step = split * kIterChunks;
  const int group0 = chunk0 >> kGroupShift;
  // Set a's offsets (weights, zero-point word) in unit `unit`; a row past n reads row n - 1.
  auto unit_offsets = [&](int unit, unsigned (&woff)[R], unsigned (&zoff)[ZW]) {
#pragma unroll
    for (int a = 0; a < R; ++a) {
      const int row = min(unit * kWarpRows + M_PAD * a + pr, p.n - 1);
      woff[a] = row * kc + chunk0;
      if (M_PAD * a % 8 == 0) zoff[M_PAD * a / 8] = (row >> 3) * groups + group0;
    }
  };
  unsigned woff[R], zoff[ZW];
  unit_offsets(unit0, woff, zoff);
  // Under PERSIST the issue side runs up to S - 1 iterations ahead of the compute side: its unit
  // (iunit) and iteration in it (ie) are its own, and woff, zoff are its unit's.
  int iunit = unit0, ie = ie0;
  // x row pr in 16-byte units at the lane's first chunk; a row past m reads row 0 and feeds only
  // discarded columns.
  const uint4* xlane = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + (pr < p.m ? pr : 0) * p.stride_xm) +
                       4 * chunk0;
  const uint4* xs_lane = xs + 4 * pr * kc + chunk0;

  uint4 wr[S][R];
  uint32_t sr[S][R], zr[SYM ? 1 : S][ZW];
  // Issues the loads of the warp's iteration f (nothing past count) into ring entry `slot`; under
  // PERSIST the calls come in order of f, one each.
  auto issue = [&](int f, int slot) {
    if (f >= count) return;
    int e = f;
    if constexpr (PERSIST) {
      if (ie == per_unit) {
        ie = 0;
        unit_offsets(++iunit, woff, zoff);
      }
      e = ie++;
    }
    const unsigned wf = e * step, gf = e * (step >> kGroupShift);
    const bool ok = chunk0 + e * step < kc;
#pragma unroll
    for (int a = 0; a < R; ++a) {
      wr[slot][a] = ok ? detail::load_weights</*PREFETCH=*/false>(qw + (woff[a] + wf)) : make_uint4(0u, 0u, 0u, 0u);
      sr[slot][a] = ok ? W4_LDG(scales + ((woff[a] + wf) >> kGroupShift)) : 0u;
    }
#pragma unroll
    for (int w = 0; w < ZW; ++w) {
      if constexpr (!SYM) zr[SYM ? 0 : slot][w] = ok ? W4_LDG(p.zeros + (zoff[w] + gf)) : 0u;
    }
  };

  float acc[R / 2][4];
#pragma unroll
  for (int i = 0; i < R / 2; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[i][c] = 0.f;

  // C entry c of tile i: A row q (c < 2) or q + 8, column j = 2 t + c % 2. Each kept entry has
  // exactly one lane, and every entry of every row of the slice is written.
  auto keep = [&](float* slice) {
#pragma unroll
    for (int i = 0; i < R / 2; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int j = 2 * t + c % 2;
        if (j % SEG == seg) slice[(M_PAD * (2 * i + c / 2) + pr) * 8 + j] = acc[i][c];
      }
  };

  pdl_trigger();
#pragma unroll
  for (int f = 0; f < S - 1; ++f) issue(f, f);
  pdl_wait();  // x and y only after it
  if constexpr (XS) {  // after the first weight loads are in flight; rows past m are zeros
    for (int i = threadIdx.x; i < M_PAD * 4 * kc; i += kBlockThreads) {
      const int r = i / (4 * kc), piece = i - r * 4 * kc;
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + r * p.stride_xm) + piece;
      xs[(4 * r + piece % 4) * kc + piece / 4] = r < p.m ? detail::load_x(src) : make_uint4(0u, 0u, 0u, 0u);
    }
    __syncthreads();
  }
  int unit = unit0, ce = ie0;  // the compute side's unit and iteration in it (PERSIST)
  // Set a's zero-point nibble in the compute side's unit: row r has nibble r % 8 of its word.
  int zshift[R];
  auto unit_shifts = [&]() {
#pragma unroll
    for (int a = 0; a < R; ++a) zshift[a] = 4 * ((unit * kWarpRows + M_PAD * a + pr) & 7);
  };
  unit_shifts();
  for (int e0 = 0; e0 < count; e0 += S) {
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int f = e0 + u;  // in ring entry u, as e0 % S == 0
      if (f >= count) break;  // the same for the whole warp, as the mma needs
      issue(f + S - 1, (u + S - 1) % S);  // into the entry iteration f - 1 used
      const int e = PERSIST ? ce : f;
      const unsigned xe = e * step;
      const bool ok = chunk0 + e * step < kc;
      uint32_t s2[R], z[R];
#pragma unroll
      for (int a = 0; a < R; ++a) {
        s2[a] = sr[u][a] * 0x10001u;
        z[a] = SYM ? 8u : (zr[SYM ? 0 : u][M_PAD * a / 8] >> zshift[a]) & 0xFu;
      }
      // With kScaleAfter the iteration's mma steps sum (q - z) x exactly into `part`, scaled once.
      float part[R / 2][4];
#pragma unroll
      for (int i = 0; i < R / 2; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) part[i][c] = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b[4];
        const uint4 xv = !ok ? make_uint4(0u, 0u, 0u, 0u)
                         : XS ? xs_lane[j * kc + xe]
                              : detail::load_x(xlane + (4 * xe + j));
        detail::x_fragments(xv, b);
#pragma unroll
        for (int i = 0; i < R / 2; ++i) {
          uint32_t d0[4], d1[4];  // A rows q (set 2 i) and q + 8 (set 2 i + 1)
          detail::a_pairs<T, kScaleAfter>(detail::word(wr[u][2 * i], j), z[2 * i], s2[2 * i], d0);
          detail::a_pairs<T, kScaleAfter>(detail::word(wr[u][2 * i + 1], j), z[2 * i + 1], s2[2 * i + 1], d1);
          const uint32_t a_even[4] = {d0[0], d1[0], d0[1], d1[1]};
          const uint32_t a_odd[4] = {d0[2], d1[2], d0[3], d1[3]};
          float(&c)[4] = kScaleAfter ? part[i] : acc[i];
          detail::mma16816<T>(c, a_even, b[0], b[1]);
          detail::mma16816<T>(c, a_odd, b[2], b[3]);
        }
      }
      if constexpr (kScaleAfter) {
#pragma unroll
        for (int i = 0; i < R / 2; ++i)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[i][c] += bits_to_float<T>(sr[u][2 * i + c / 2]) * part[i][c];
      }
      if constexpr (PERSIST) {
        if (++ce == per_unit) {  // the unit's last iteration
          // Only the warp's first unit can have begun in another warp, and it ends at f =
          // per_unit - ie0 - 1: so the warp ran the unit whole where f + 1 >= per_unit.
          const bool whole = f + 1 >= per_unit;
          float* slot = red + (2 * warp + (whole ? 1 : 0)) * kWarpRows * 8;
          keep(slot);
          if (whole) {  // its outputs, from the warp alone
            __syncwarp();
            detail::store_outputs<T, 8, SEG, 32>(p, slot, unit * kWarpRows, kWarpRows, 1);
            __syncwarp();
          }
#pragma unroll
          for (int i = 0; i < R / 2; ++i)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[i][c] = 0.f;
          ce = 0;
          ++unit;
          unit_shifts();
        }
      }
    }
  }
  if constexpr (PERSIST) {
    const int block_unit0 = block_plan[0], block_iters = block_plan[1];  // written before x's barrier
    if (count > 0 && ce > 0) {  // a unit cut at its end: the warp's first (slot 0) or a later one
      const int first = warp * block_iters / kWarps;
      keep(red + (2 * warp + (count < per_unit - first % per_unit ? 0 : 1)) * kWarpRows * 8);
    }
    __syncthreads();
    detail::store_cut_units<T, SEG, kWarpRows, kWarps>(p, red, block_unit0, block_iters, per_unit);
  } else {
    keep(red + (w_k * block_rows + w_n * kWarpRows) * 8);
    __syncthreads();
    detail::store_outputs<T, 8, SEG>(p, red, blockIdx.x * block_rows, block_rows, split);
  }
}
#endif  // !W4_HIP

#if !W4_HIP
// ---------------------------------------------------------------------------------------------
// The streaming kernel (kVariantStream; mma engine, K % kStreamPieceK == 0, M <= kMaxM).
//
// Why: the register-ring kernels keep at most 2-3 iterations of loads in flight per lane, bounded
// by registers; on the H200 they drew 61% of DRAM bandwidth at M = 1 (ncu_pipes_s17.txt), and at
// M > 4 every warp re-read x from L1. Here the ring lives in shared memory (S slots of 32 rows x
// 128 k per warp, filled by cp.async: kStreamStages, or kStreamFewStages where only that lets two
// blocks share an SM, see stream_stages), and x is read from a permuted shared copy that every
// warp of the block shares.
//
// Block: kBlockThreads / 32 warps, warps_n along N (32 rows each: two 16-row A tiles) and
// warps_k = 8 / warps_n along K. It owns rows [n0, n0 + 32 warps_n) and the K range of its split
// index ks: pieces [ks P / split, (ks + 1) P / split) of the P = K / 128 pieces; warp wk takes a
// contiguous share of those pieces. Fragment map: the mma kernels' (lane 4 quad + t holds rows
// quad + 8 a, a < 4, chunk t of each piece; logical k of steps 2j, 2j + 1 are nibbles of word j).
// Each lane copies exactly the 16-byte chunks it later reads (row crow + 8 i, chunk ccol of the
// slot), so a lane's own cp.async.wait_group makes its data visible, with no warp barrier.
//
// Shared memory (stream_layout): the rings, then x rows m < M in B-fragment order (unit
// (m, piece, j, t) holds x_fragments of x[m][k0 + 32 t + 8 j ..]: lanes read consecutive units,
// and a row's stride is 16 P_block + 4 units, so rows quad and quad + 1 fall in different banks),
// then scales [rows][scale_stride] (a stride = 2 mod 4 halves puts the 8 quads' rows in 8 banks),
// then zero-point words [rows / 8][groups]. After the main loop the rings hold the warps_k partial
// sums of each output, added in warp order.
//
// Outputs: split == 1: y = sums + bias, rounded once. split > 1: the block writes its fp32 sums
// to partials[ks], and skinny_stream_reduce_kernel adds the split of them in ks order plus bias.
// No atomics: the result is deterministic, and row i depends on M only through the plan
// (stream_warps_n(m) and the split).

namespace detail {

// 16 bytes global -> shared, asynchronously, bypassing L1 (weights are read once), with the
// 256-byte L2 prefetch the 64-byte row pieces gain from (see load_weights).
__device__ __forceinline__ void cp_async16(uint4* dst, const uint4* src) {
#if W4_EMU
  *dst = *src;
#else
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if !W4_EMU
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if !W4_EMU
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// A partial sum the previous kernel wrote: a coherent load that stays after pdl_wait (load_x).
__device__ __forceinline__ float load_partial(const float* p) {
#if W4_EMU
  return *p;
#else
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
#endif
}

}  // namespace detail

template <typename T, int M_TILE, int G, bool SYM, int S>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, kStreamMinBlocks) skinny_stream_kernel(const SkinnyParams p) {
  constexpr int kTiles = M_TILE / 8;
  constexpr bool kScaleAfter = detail::scale_after_mma(G);  // a piece is one group
  static_assert(W4_WARP_SIZE == 32 && M_TILE % 8 == 0 && kStreamPieceK % G == 0, "mma tiles; groups tile a piece");
  W4_DYNAMIC_SHARED(uint4, smem);
  const StreamLayout L = stream_layout(p.m, p.k, G, SYM, p.split, S);
  uint4* xs = smem + L.x_offset / 16;
  unsigned short* ss = reinterpret_cast<unsigned short*>(smem + L.scale_offset / 16);
  uint32_t* zs = reinterpret_cast<uint32_t*>(smem + L.zero_offset / 16);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int quad = lane / 4, t = lane % 4;
  const int wn = warp % L.warps_n, wk = warp / L.warps_n;
  const int row_blocks = (p.n + L.rows - 1) / L.rows;
  const int ks = blockIdx.x / row_blocks, n0 = blockIdx.x % row_blocks * L.rows;
  const int total = p.k / kStreamPieceK;
  const int pb0 = static_cast<int>(static_cast<int64_t>(ks) * total / p.split);
  const int pcount = static_cast<int>(static_cast<int64_t>(ks + 1) * total / p.split) - pb0;
  const int pw0 = pb0 + wk * pcount / L.warps_k;
  const int count = pb0 + (wk + 1) * pcount / L.warps_k - pw0;  // the same for the whole warp
  const int groups = p.k / G, g0 = pb0 * (kStreamPieceK / G), gcount = pcount * (kStreamPieceK / G);
  const int kc = p.k / kLaneK;  // 16-byte chunks per row
  pdl_trigger();

  // The lane's copies: rows crow + 8 i of the warp's 32, chunk ccol of each piece. A row past n
  // reads row n - 1 (valid memory) and is never stored.
  uint4* ring = smem + warp * S * kStreamSlotUnits;
  const uint4* src[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = min(n0 + 32 * wn + quad + 8 * i, p.n - 1);
    src[i] = reinterpret_cast<const uint4*>(p.qweight) + static_cast<int64_t>(row) * kc + t;
  }
  auto issue = [&](int f) {  // piece pw0 + f into slot f % S; an empty group past count
    if (f < count) {
      uint4* slot = ring + f % S * kStreamSlotUnits;
      const int off = (pw0 + f) * (kStreamPieceK / kLaneK);
#pragma unroll
      for (int i = 0; i < 4; ++i) detail::cp_async16(slot + (quad + 8 * i) * 4 + t, src[i] + off);
    }
    detail::cp_async_commit();
  };
#pragma unroll
  for (int f = 0; f < S - 1; ++f) issue(f);

  // Scales and zero points of the block's rows and K range (read-only: before the wait).
  const unsigned short* scales = static_cast<const unsigned short*>(p.scales);
  for (int u = threadIdx.x; u < L.rows * gcount; u += kBlockThreads) {
    const int r = u / gcount, gi = u - r * gcount;
    ss[r * L.scale_stride + gi] = W4_LDG(scales + static_cast<int64_t>(min(n0 + r, p.n - 1)) * groups + g0 + gi);
  }
  if constexpr (!SYM) {
    for (int u = threadIdx.x; u < L.rows / 8 * gcount; u += kBlockThreads) {
      const int r = u / gcount, gi = u - r * gcount;
      zs[r * L.groups + gi] = W4_LDG(p.zeros + static_cast<int64_t>(min(n0 / 8 + r, p.n / 8 - 1)) * groups + g0 + gi);
    }
  }
  pdl_wait();  // x and y only after it
  {
    const T* x = static_cast<const T*>(p.x);
    for (int u = threadIdx.x; u < p.m * 16 * pcount; u += kBlockThreads) {
      const int m = u / (16 * pcount), r = u - m * 16 * pcount;
      const int piece = r / 16, j = r / 4 % 4, tt = r % 4;
      const int k0 = (pb0 + piece) * kStreamPieceK + kLaneK * tt + 8 * j;
      uint32_t b[4];
      detail::x_fragments(detail::load_x(reinterpret_cast<const uint4*>(x + m * p.stride_xm + k0)), b);
      xs[m * L.x_units + r] = make_uint4(b[0], b[1], b[2], b[3]);
    }
  }
  __syncthreads();

  // This lane's x rows quad + 8 bt; a row past m reads row 0 and feeds only columns never stored.
  const uint4* xl[kTiles];
#pragma unroll
  for (int bt = 0; bt < kTiles; ++bt) {
    const int m = 8 * bt + quad;
    xl[bt] = xs + (m < p.m ? m : 0) * L.x_units + t;
  }
  const int srow = 32 * wn + quad;  // the lane's first row in the block
  float acc[2][kTiles][4] = {};

  for (int e = 0; e < count; ++e) {
    issue(e + S - 1);  // into the slot piece e - 1 used; this lane has read it
    detail::cp_async_wait<S - 1>();
    const uint4* slot = ring + e % S * kStreamSlotUnits;
    const int piece = pw0 + e - pb0;  // in the block's range
    const int gi = (piece * kStreamPieceK + kLaneK * t) / G;
    uint4 w[4];
    uint32_t s[4], s2[4], z[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      w[a] = slot[(quad + 8 * a) * 4 + t];
      s[a] = ss[(srow + 8 * a) * L.scale_stride + gi];
      s2[a] = s[a] * 0x10001u;
      z[a] = SYM ? 8u : (zs[(srow / 8 + a) * L.groups + gi] >> (4 * quad)) & 0xFu;
    }
    float part[2][kTiles][4] = {};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t d[4][4];
#pragma unroll
      for (int a = 0; a < 4; ++a) detail::a_pairs<T, kScaleAfter>(detail::word(w[a], j), z[a], s2[a], d[a]);
#pragma unroll
      for (int bt = 0; bt < kTiles; ++bt) {
        const uint4 b = xl[bt][16 * piece + 4 * j];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t a_even[4] = {d[2 * i][0], d[2 * i + 1][0], d[2 * i][1], d[2 * i + 1][1]};
          const uint32_t a_odd[4] = {d[2 * i][2], d[2 * i + 1][2], d[2 * i][3], d[2 * i + 1][3]};
          float(&c)[4] = kScaleAfter ? part[i][bt] : acc[i][bt];
          detail::mma16816<T>(c, a_even, b.x, b.y);
          detail::mma16816<T>(c, a_odd, b.z, b.w);
        }
      }
    }
    if constexpr (kScaleAfter) {  // C entries 0, 1 are row quad (+ 16 i), 2, 3 row quad + 8
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int bt = 0; bt < kTiles; ++bt)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[i][bt][c] += bits_to_float<T>(s[2 * i + c / 2]) * part[i][bt][c];
    }
  }

  // Partial sums [warps_k][rows][M_TILE] over the rings, once every warp is done with its ring.
  float* red = reinterpret_cast<float*>(smem);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int bt = 0; bt < kTiles; ++bt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        red[(wk * L.rows + srow + 16 * i + 8 * (c / 2)) * M_TILE + 8 * bt + 2 * t + c % 2] = acc[i][bt][c];
  __syncthreads();
  T* __restrict__ y = static_cast<T*>(p.y);
  const unsigned short* __restrict__ bias = static_cast<const unsigned short*>(p.bias);
  for (int idx = threadIdx.x; idx < L.rows * p.m; idx += kBlockThreads) {
    const int m = idx / L.rows, r = idx - m * L.rows, n = n0 + r;
    if (n >= p.n) continue;
    float v = 0.f;
    for (int w = 0; w < L.warps_k; ++w) v += red[(w * L.rows + r) * M_TILE + m];
    if (p.split > 1) {
      p.partials[(static_cast<int64_t>(ks) * p.m + m) * p.n + n] = v;
    } else {
      if (bias != nullptr) v += bits_to_float<T>(detail::load_bias(bias + n));
      y[static_cast<int64_t>(m) * p.n + n] = from_float<T>(v);
    }
  }
}

// y = the split partial sums of skinny_stream_kernel, added in split order, + bias.
template <typename T>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, 1) skinny_stream_reduce_kernel(const SkinnyParams p) {
  pdl_trigger();
  pdl_wait();
  const int64_t mn = static_cast<int64_t>(p.m) * p.n;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (idx >= mn) return;
  float v = 0.f;
  for (int s = 0; s < p.split; ++s) v += detail::load_partial(p.partials + s * mn + idx);
  if (p.bias != nullptr) {
    v += bits_to_float<T>(detail::load_bias(static_cast<const unsigned short*>(p.bias) + idx % p.n));
  }
  static_cast<T*>(p.y)[idx] = from_float<T>(v);
}
#endif  // !W4_HIP

// ---------------------------------------------------------------------------------------------
// Host side: the launches of a planned call (skinny_host.h plans it). Torch-free, so the CI
// compile check instantiates exactly what the extension ships (skinny_launch.cu).

namespace detail {

template <typename T, Engine E, int V>
void launch_variant(const SkinnyParams& p, stream_t stream);

// One launch of `kernel` over `blocks` blocks, with the programmatic-dependent-launch attribute
// for kOverlapWeights (the host settles it to none where the device lacks it).
template <typename Kernel>
void launch_kernel(Kernel kernel, int blocks, int shared_bytes, const SkinnyParams& p, stream_t stream) {
#if W4_EMU
  (void)stream;
  ::w4emu::launch(kernel, blocks, kBlockThreads, p, shared_bytes);
#elif W4_HIP
  kernel<<<blocks, kBlockThreads, shared_bytes, stream>>>(p);
#else
  if (p.overlap == kOverlapNone) {
    kernel<<<blocks, kBlockThreads, shared_bytes, stream>>>(p);
    return;
  }
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kBlockThreads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  cudaLaunchKernelEx(&config, kernel, p);  // an error stays for the caller's launch check
#endif
}

template <typename T, int M_TILE, int G, bool SYM, Engine E, int V>
void launch_tile(const SkinnyParams& p, stream_t stream) {
  const int block_rows = kTileRows / p.split;
  const int blocks = (p.n + block_rows - 1) / block_rows;
  if constexpr (V == kVariantRegs) {
    launch_kernel(skinny_pipe_kernel<T, M_TILE, G, SYM, E>, blocks, 0, p, stream);
  } else {
    launch_kernel(skinny_kernel<T, M_TILE, G, SYM, E>, blocks, 0, p, stream);
  }
}

#if !W4_HIP
template <typename T, int M_PAD, int G, bool SYM, bool XS, bool PERSIST>
void launch_seg_kernel(const SkinnyParams& p, int blocks, int shared_bytes, stream_t stream) {
  const auto kernel = skinny_seg_kernel<T, M_PAD, G, SYM, XS, PERSIST>;
#if !W4_EMU
  // Above 48 KiB of dynamic shared memory a kernel must opt in (per device, so on every launch).
  if (shared_bytes > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
#endif
  launch_kernel(kernel, blocks, shared_bytes, p, stream);
}

template <typename T, int M_PAD, int G, bool SYM, int V>
void launch_seg_tile(const SkinnyParams& p, stream_t stream) {
  if constexpr (V == kVariantSegPersist) {  // settle_variant leaves it only where x fits in shared memory
    launch_seg_kernel<T, M_PAD, G, SYM, true, true>(p, p.blocks, seg_x_shared_bytes(p.m, p.k, 1), stream);
  } else {
    const int block_rows = kBlockThreads / 32 / p.split * kSegRowSets * M_PAD;
    const int blocks = (p.n + block_rows - 1) / block_rows;
    const int shared_bytes = p.variant == kVariantSegXs ? seg_x_shared_bytes(p.m, p.k, p.split) : 0;
    if (shared_bytes > 0) return launch_seg_kernel<T, M_PAD, G, SYM, true, false>(p, blocks, shared_bytes, stream);
    launch_seg_kernel<T, M_PAD, G, SYM, false, false>(p, blocks, 0, stream);
  }
}

template <typename T, int M_TILE, int G, bool SYM, int S>
void launch_stream_tile(const SkinnyParams& p, stream_t stream) {
  const auto kernel = skinny_stream_kernel<T, M_TILE, G, SYM, S>;
  const StreamLayout L = stream_layout(p.m, p.k, G, SYM, p.split, S);
#if !W4_EMU
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L.bytes);
#endif
  launch_kernel(kernel, (p.n + L.rows - 1) / L.rows * p.split, L.bytes, p, stream);
  if (p.split > 1) {
    const int64_t outputs = static_cast<int64_t>(p.m) * p.n;
    launch_kernel(skinny_stream_reduce_kernel<T>, static_cast<int>((outputs + kBlockThreads - 1) / kBlockThreads), 0,
                  p, stream);
  }
}

template <typename T, int M_TILE, int G, bool SYM>
void launch_stream_stages(const SkinnyParams& p, stream_t stream) {
  if (p.stages == kStreamFewStages) return launch_stream_tile<T, M_TILE, G, SYM, kStreamFewStages>(p, stream);
  launch_stream_tile<T, M_TILE, G, SYM, kStreamStages>(p, stream);
}

template <typename T, int G, bool SYM>
void launch_stream(const SkinnyParams& p, stream_t stream) {
  if (p.m <= 8) return launch_stream_stages<T, 8, G, SYM>(p, stream);
  launch_stream_stages<T, 16, G, SYM>(p, stream);
}

template <typename T, int G, bool SYM, int V>
void launch_seg(const SkinnyParams& p, stream_t stream) {
  switch (seg_m_pad(p.m)) {
    case 1: return launch_seg_tile<T, 1, G, SYM, V>(p, stream);
    case 2: return launch_seg_tile<T, 2, G, SYM, V>(p, stream);
    default: return launch_seg_tile<T, 4, G, SYM, V>(p, stream);
  }
}
#endif

template <typename T, int G, bool SYM, Engine E, int V>
void launch_m(const SkinnyParams& p, stream_t stream) {
  if constexpr (E == Engine::kMma) {
    if (p.m <= 8) return launch_tile<T, 8, G, SYM, E, V>(p, stream);
    return launch_tile<T, 16, G, SYM, E, V>(p, stream);
  } else if constexpr (V == kVariantRegs) {
    // Pipelined simt instances exist for M = 1 only; other M run the base kernel (any split
    // <= warps suits it).
    if (p.m <= 1) return launch_tile<T, 1, G, SYM, E, V>(p, stream);
    return launch_variant<T, E, kVariantBase>(p, stream);
  } else {
    if (p.m <= 1) return launch_tile<T, 1, G, SYM, E, V>(p, stream);
    if (p.m <= 2) return launch_tile<T, 2, G, SYM, E, V>(p, stream);
    if (p.m <= 4) return launch_tile<T, 4, G, SYM, E, V>(p, stream);
    if (p.m <= 8) return launch_tile<T, 8, G, SYM, E, V>(p, stream);
    return launch_tile<T, 16, G, SYM, E, V>(p, stream);
  }
}

// f(std::integral_constant<int, G>, std::bool_constant<SYM>) for p's group size and symmetry,
// so that each kernel family instantiates all six (G, SYM) pairs in one place.
template <typename F>
void with_group(const SkinnyParams& p, F&& f) {
  const bool sym = p.zeros == nullptr;
  switch (p.group_size) {
    case 32: return sym ? f(std::integral_constant<int, 32>{}, std::true_type{})
                        : f(std::integral_constant<int, 32>{}, std::false_type{});
    case 64: return sym ? f(std::integral_constant<int, 64>{}, std::true_type{})
                        : f(std::integral_constant<int, 64>{}, std::false_type{});
    default: return sym ? f(std::integral_constant<int, 128>{}, std::true_type{})
                        : f(std::integral_constant<int, 128>{}, std::false_type{});
  }
}

// Every kernel of one variant and engine for element type T. The extension compiles each
// (T, E, V) in its own translation unit (skinny_inst_v*.cu, declared in skinny_instances.h).
template <typename T, Engine E, int V>
void launch_variant(const SkinnyParams& p, stream_t stream) {
  if constexpr (V == kVariantStream || is_seg(V)) {  // mma-engine kernels; other engines run regs_s4
#if W4_HIP
    return launch_variant<T, E, kVariantRegs>(p, stream);
#else
    if constexpr (E != Engine::kMma) {
      return launch_variant<T, E, kVariantRegs>(p, stream);
    } else if constexpr (V == kVariantStream) {
      with_group(p, [&](auto g, auto sym) { launch_stream<T, decltype(g)::value, decltype(sym)::value>(p, stream); });
    } else {
      if (p.m > kSegMaxM) return launch_variant<T, E, kVariantRegs>(p, stream);
      if (static_cast<int64_t>(p.n) * (p.k / kLaneK) > INT32_MAX) return launch_variant<T, E, kVariantBase>(p, stream);
      with_group(p, [&](auto g, auto sym) { launch_seg<T, decltype(g)::value, decltype(sym)::value, V>(p, stream); });
    }
#endif
  } else {
    if constexpr (V == kVariantRegs) {
      // The pipelined kernel needs k % 128 == 0 (no K tail; always so for G = 128), n >= 8 and row
      // offsets that fit in an int. Other calls run the base kernel.
      if (p.k % kIterK != 0 || p.n < 8 || static_cast<int64_t>(p.n) * (p.k / kLaneK) > INT32_MAX) {
        return launch_variant<T, E, kVariantBase>(p, stream);
      }
    }
    with_group(p, [&](auto g, auto sym) { launch_m<T, decltype(g)::value, decltype(sym)::value, E, V>(p, stream); });
  }
}

template <typename T, Engine E>
void launch_engine(const SkinnyParams& p, stream_t stream) {
  switch (p.variant) {
    case kVariantRegs: return launch_variant<T, E, kVariantRegs>(p, stream);
    case kVariantSeg: return launch_variant<T, E, kVariantSeg>(p, stream);
    case kVariantSegXs: return launch_variant<T, E, kVariantSegXs>(p, stream);
    case kVariantStream: return launch_variant<T, E, kVariantStream>(p, stream);
    case kVariantSegPersist: return launch_variant<T, E, kVariantSegPersist>(p, stream);
    default: return launch_variant<T, E, kVariantBase>(p, stream);
  }
}

}  // namespace detail

// w4::launch (skinny_host.h) for element type T: p as it requires.
template <typename T>
void launch_skinny(const SkinnyParams& p, Engine engine, stream_t stream) {
#if W4_HIP
  (void)engine;
  detail::launch_engine<T, Engine::kSimt>(p, stream);
#else
  if (engine == Engine::kMma) return detail::launch_engine<T, Engine::kMma>(p, stream);
  detail::launch_engine<T, Engine::kSimt>(p, stream);
#endif
}

}  // namespace w4

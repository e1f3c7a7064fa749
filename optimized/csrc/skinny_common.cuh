// What the skinny kernels share: loads, the dequantization of 4-bit weights by magic-number
// arithmetic, the tensor-core mma and its fragment map, the accumulators of both engines, output
// stores, and the launch helpers. Each kernel family lives in its own header (skinny_batch.cuh,
// skinny_ring.cuh, skinny_segment.cuh, skinny_stream.cuh) and translation unit.
//
// Work split of every kernel: a block of kBlockThreads threads owns a tile of output rows (n) for
// all M. Within a warp, lane = 4 * quad + t; the 4 lanes of a quad read 4 consecutive 16-byte
// chunks (32 k each) of a row side by side. Partial sums of each output meet in shared memory (or,
// for the stream kernel's K split, in a workspace) and are added in a fixed order, so results are
// deterministic (no atomics).
//
// Engines, chosen by the plan:
//  * kMma (CUDA, sm_80+): a warp's 16 rows x 128 k are 8 tensor-core m16n8k16 steps with the
//    weight as the 16-row A operand and up to 8 (or 16) rows of x as B. A lane's A values for one
//    step are 4 nibbles of one of its words, so one step's 16 logical k are 4 nibbles from each of
//    the quad's 4 chunks; x is permuted to the same order. Weights are dequantized to T as
//    (q - z) * s (one rounding), products and sums are fp32. At G = 128 the quad's 4 chunks are one
//    group, so the ring, segmented and stream kernels feed the exact q - z instead and scale each
//    group's fp32 sums once (the batch kernel still rounds).
//  * kSimt (everywhere, the only engine on HIP): each lane forms fp32 dot products over its
//    chunk, (q - z) * s exact in fp32, then the quad adds its 4 partial sums with shuffles.
#pragma once

#include <cmath>
#include <type_traits>

#include "compat.h"
#include "skinny_plan.h"

namespace w4 {

namespace detail {

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Weights are read exactly once: keep them out of L1 so that x stays there. PREFETCH adds an L2
// prefetch of 256 bytes, which the batch and ring kernels' 64-byte pieces of a row gain from; the
// segmented kernels' loads are whole 128-byte lines or more, which stream fastest without it.
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
// load is one ptxas may hoist above the pdl_wait that makes that output visible. Volatile keeps it
// after the wait's asm in the compiler too.
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
  // Iterations whose loads are issued together in the batch kernel; fewer at large M, where
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
// An mma accumulator's C fragments into the block's [rows][M_TILE] partial sums: entries 0, 1 are
// row quad, 2, 3 row quad + 8, columns 8 i + 2 t and 8 i + 2 t + 1.
template <int M_TILE, int TILES>
__device__ __forceinline__ void deposit_mma(const float (&acc)[TILES][4], float* red_rows, int quad, int t) {
#pragma unroll
  for (int i = 0; i < TILES; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      red_rows[(quad + 8 * (c / 2)) * M_TILE + 8 * i + 2 * t + c % 2] = acc[i][c];
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
    deposit_mma<M_TILE>(acc, red_rows, quad, t);
  }
};

// ---------------------------------------------------------------------------------------------
// The ring, segmented and stream kernels' mma engine: the fragment map above with fewer
// instructions per weight (one lop3 per nibble pair, scales arriving as splat pairs).

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
// ring, segmented and stream kernels' mma engines.
template <typename T>
__device__ __forceinline__ void scaled_pairs(uint32_t w, uint32_t z, uint32_t s2, uint32_t (&out)[4]) {
  constexpr uint32_t kNegZero = 0x80008000u;
  nibble_pairs<T>(w, z, out);
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = fma2<T>(out[i], s2, kNegZero);
}


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

// piece_mma's sums of a warp's 32 rows: row quad + 16 i + 8 (c / 2) and column (m) 8 bt + 2 t + c % 2
// of acc[i][bt][c] into out[row * row_stride + column * column_stride].
template <int TILES>
__device__ __forceinline__ void store_fragments(const float (&acc)[2][TILES][4], float* out, int row_stride,
                                                int column_stride, int quad, int t) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int bt = 0; bt < TILES; ++bt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        out[(quad + 16 * i + 8 * (c / 2)) * row_stride + (8 * bt + 2 * t + c % 2) * column_stride] = acc[i][bt][c];
}

// One 128-k piece of the stream and tile kernels' 32 rows a warp: a lane's words w[a] of rows
// quad + 8 a (chunk t), their zero points z[a] and scale bits s[a], as two 16-row A tiles, times
// every B tile bt (b(j, bt): the x fragments of steps 2 j, 2 j + 1), into acc[i][bt] for A tile i.
// SCALE_AFTER (the piece's 4 chunks are one group): exact q - z meet x, and each piece's fp32 sums
// are scaled once (C entries 0, 1 are row quad (+ 16 i), 2, 3 row quad + 8).
template <typename T, bool SCALE_AFTER, int TILES, typename B>
__device__ __forceinline__ void piece_mma(const uint4 (&w)[4], const uint32_t (&z)[4], const uint32_t (&s)[4],
                                          float (&acc)[2][TILES][4], B&& b) {
  uint32_t s2[4];
#pragma unroll
  for (int a = 0; a < 4; ++a) s2[a] = s[a] * 0x10001u;
  float part[2][TILES][4] = {};
  float(&c)[2][TILES][4] = SCALE_AFTER ? part : acc;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t d[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a) a_pairs<T, SCALE_AFTER>(word(w[a], j), z[a], s2[a], d[a]);
#pragma unroll
    for (int bt = 0; bt < TILES; ++bt) {
      const uint4 x = b(j, bt);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t a_even[4] = {d[2 * i][0], d[2 * i + 1][0], d[2 * i][1], d[2 * i + 1][1]};
        const uint32_t a_odd[4] = {d[2 * i][2], d[2 * i + 1][2], d[2 * i][3], d[2 * i + 1][3]};
        mma16816<T>(c[i][bt], a_even, x.x, x.y);
        mma16816<T>(c[i][bt], a_odd, x.z, x.w);
      }
    }
  }
  if constexpr (SCALE_AFTER) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int bt = 0; bt < TILES; ++bt)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[i][bt][k] += bits_to_float<T>(s[2 * i + k / 2]) * part[i][bt][k];
  }
}
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
#endif  // !W4_HIP

// Rows [row0, row0 + rows) of the output: each is the sum of its splits * PARTS partials in K
// order, plus bias, rounded once. red: [splits][rows][ROW] with output m of a row at entries
// PARTS m .. PARTS m + PARTS - 1 (the batch and ring kernels: ROW = M_TILE, PARTS = 1). Called
// after a barrier by every thread of a group of THREADS: the block (its tile, split p.split), or
// in the persistent segmented kernel one warp (its row group, split 1).
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

// One launch of `kernel` over `blocks` blocks, with the programmatic-dependent-launch attribute
// for kOverlapWeights (the plan settles it to none where the device lacks it).
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

// launch_kernel with the plan's grid and dynamic shared memory, opted into beyond 48 KiB (per
// device, so on every launch).
template <typename Kernel>
void launch_planned(Kernel kernel, const SkinnyPlan& plan, const SkinnyParams& p, stream_t stream) {
#if !W4_EMU && !W4_HIP
  if (plan.shared_bytes > 48 * 1024) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.shared_bytes);
  }
#endif
  launch_kernel(kernel, plan.blocks, plan.shared_bytes, p, stream);
}

#if !W4_HIP
// y = the fp32 partial sums [split][m][n] of a K-split kernel (stream, tile, wgmma), added in split order,
// + bias.
template <typename T>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, 1) reduce_partials_kernel(const SkinnyParams p) {
  pdl_trigger();
  pdl_wait();
  const int64_t mn = static_cast<int64_t>(p.m) * p.n;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (idx >= mn) return;
  float v = 0.f;
  for (int s = 0; s < p.split; ++s) v += load_partial(p.partials + s * mn + idx);
  if (p.bias != nullptr) v += bits_to_float<T>(load_bias(static_cast<const unsigned short*>(p.bias) + idx % p.n));
  static_cast<T*>(p.y)[idx] = from_float<T>(v);
}

// Output (m, n) of a K-split kernel's block ks: its fp32 sum v into partials[ks] at split > 1,
// else v + bias rounded once into y.
template <typename T>
__device__ __forceinline__ void store_split_output(const SkinnyParams& p, int ks, int m, int n, float v) {
  if (p.split > 1) {
    p.partials[(static_cast<int64_t>(ks) * p.m + m) * p.n + n] = v;
    return;
  }
  if (p.bias != nullptr) v += bits_to_float<T>(load_bias(static_cast<const unsigned short*>(p.bias) + n));
  static_cast<T*>(p.y)[static_cast<int64_t>(m) * p.n + n] = from_float<T>(v);
}

// Where a tile or wgmma block works: blockIdx.x is (split index ks, row block, M tile), the M
// tiles of a row block side by side so that its weights stay in L2; its rows start at n0, its x
// rows at m0, and it adds pieces [pb0, pb0 + count) of the K / kStreamPieceK pieces.
struct TileBlock {
  int n0, m0, ks, pb0, count;
};

__device__ __forceinline__ TileBlock tile_block(const SkinnyParams& p, int rows, int m_tile) {
  const int row_blocks = (p.n + rows - 1) / rows, m_blocks = (p.m + m_tile - 1) / m_tile;
  const int mb = blockIdx.x % m_blocks, nb = blockIdx.x / m_blocks % row_blocks;
  const int ks = blockIdx.x / m_blocks / row_blocks, total = p.k / kStreamPieceK;
  const int pb0 = static_cast<int>(static_cast<int64_t>(ks) * total / p.split);
  return {nb * rows, mb * m_tile, ks, pb0, static_cast<int>(static_cast<int64_t>(ks + 1) * total / p.split) - pb0};
}

// The row stride (in floats) of a tile or wgmma block's sums in shared memory: its rows of N plus
// 4, so that the mma fragments' stores (lanes t = 0..3 of a quad on columns 2t, 2t + 1) fall in
// distinct banks.
__host__ __device__ constexpr int red_stride(int block_rows) { return block_rows + 4; }

// A block's output tile from shared memory, red [m_tile][red_stride(block_rows)] fp32, rows from n0
// and columns from m0 cut at n and m: y (plus bias, rounded once) at split 1, else the partial sums
// of split index ks. Each thread owns 8 consecutive rows of N, its bias loaded once, and stores
// them for every (kBlockThreads / (block_rows / 8))-th column as one 16-byte store of y (two of
// partial sums) where the rows are whole and 16-byte aligned (n % 8 == 0), else one by one.
template <typename T>
__device__ __forceinline__ void store_block_tile(const SkinnyParams& p, int ks, const float* red, int block_rows,
                                                 int m_tile, int n0, int m0) {
  const int rows = min(block_rows, p.n - n0), ms = min(m_tile, p.m - m0);
  const int chunks = block_rows / 8, r0 = 8 * (static_cast<int>(threadIdx.x) % chunks);
  if (r0 >= rows) return;
  const int width = min(8, rows - r0);
  const bool whole = width == 8 && p.n % 8 == 0;
  float bias[8] = {};
  if (p.split == 1 && p.bias != nullptr) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (j < width) bias[j] = bits_to_float<T>(load_bias(static_cast<const unsigned short*>(p.bias) + n0 + r0 + j));
  }
  for (int ml = static_cast<int>(threadIdx.x) / chunks; ml < ms; ml += kBlockThreads / chunks) {
    const uint4* src = reinterpret_cast<const uint4*>(red + ml * red_stride(block_rows) + r0);
    const uint4 lo = src[0], hi = src[1];
    const uint32_t bits[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const int64_t o = static_cast<int64_t>(m0 + ml) * p.n + n0 + r0;
    if (p.split > 1) {
      float* dst = p.partials + static_cast<int64_t>(ks) * p.m * p.n + o;
      if (whole) {
        reinterpret_cast<uint4*>(dst)[0] = lo;
        reinterpret_cast<uint4*>(dst)[1] = hi;
      } else {
        for (int j = 0; j < width; ++j) dst[j] = __uint_as_float(bits[j]);
      }
      continue;
    }
    alignas(16) T out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = from_float<T>(__uint_as_float(bits[j]) + bias[j]);
    T* dst = static_cast<T*>(p.y) + o;
    if (whole) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out);
    } else {
      for (int j = 0; j < width; ++j) dst[j] = out[j];
    }
  }
}

// The reduction of a K-split call's partial sums (nothing at split 1).
template <typename T>
void launch_reduce(const SkinnyParams& p, stream_t stream) {
  if (p.split == 1) return;
  const int64_t outputs = static_cast<int64_t>(p.m) * p.n;
  launch_kernel(reduce_partials_kernel<T>, static_cast<int>((outputs + kBlockThreads - 1) / kBlockThreads), 0, p,
                stream);
}
#endif  // !W4_HIP

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

// Each family's launches of one planned call, for element type T (and engine E): defined in the
// family's header, instantiated in its translation unit (skinny_<family>.cu) for every T and
// engine the platform has, and called by w4::launch (skinny_launch.cu).
template <typename T, Engine E>
void launch_batch(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream);
template <typename T, Engine E>
void launch_ring(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream);
#if !W4_HIP
template <typename T>
void launch_segment(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream);
template <typename T>
void launch_stream(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream);
template <typename T>
void launch_tile(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream);
template <typename T>
void launch_wgmma(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream);
#endif

}  // namespace detail

}  // namespace w4

// The ring kernel (Kernel kRing): a register ring of kRingStages iterations per lane. A lane's work
// is the iterations it = w_k + e * split, e < count, of its rows row0 + kQuads * a (a row past n
// reads a row below n instead and is never stored). Ring entry e % S holds iteration e's loads: the
// loads of e + S - 1 go into the entry that iteration e - 1 has just freed, then the warp computes
// e, so S - 1 iterations stay in flight while it computes. It needs K % 128 == 0 and N >= 8, so no
// chunk lies past K, and its simt engine exists for M = 1 only (the plan runs the batch kernel
// elsewhere).
#pragma once

#include "skinny_common.cuh"

namespace w4 {

namespace detail {

#if !W4_HIP
// The mma engine: the fragment map of skinny_common.cuh with x addressed from per-lane row pointers.
template <typename T, int M_TILE, int G>
struct RingMmaAccumulator {
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
    deposit_mma<M_TILE>(acc, red_rows, quad, t);
  }
};
#endif  // !W4_HIP

// The simt engine behind the ring's interface (x and M kept at init).
template <typename T, int M_TILE>
struct RingSimtAccumulator {
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
struct RingEngine {
  using type = RingSimtAccumulator<T, M_TILE>;
};
#if !W4_HIP
template <typename T, int M_TILE, int G>
struct RingEngine<T, M_TILE, G, Engine::kMma> {
  using type = RingMmaAccumulator<T, M_TILE, G>;
};
#endif

}  // namespace detail

template <typename T, int M_TILE, int G, bool SYM, Engine E>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, kMinBlocks) ring_kernel(const SkinnyParams p) {
  constexpr int R = kLaneRows, S = kRingStages;
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
  const int iters = p.k / kIterK;  // k % 128 == 0 here (the plan checks)
  const int count = w_k < iters ? (iters - 1 - w_k) / p.split + 1 : 0;  // the same for the whole warp

  // The lane's rows row0 + kQuads * a. A row r past n reads row r - 8 c instead, the largest
  // below n that is congruent to r mod 8 (n >= 8 here): valid memory, and its sums are never
  // stored. So every row of the lane has the same r mod 8, the zero point's nibble. Element
  // offsets fit in an int (the plan checks n * k / 32).
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

  using Accum = typename detail::RingEngine<T, M_TILE, G, E>::type;
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

namespace detail {

template <typename T, int M_TILE, int G, bool SYM, Engine E>
void launch_ring_tile(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  launch_kernel(ring_kernel<T, M_TILE, G, SYM, E>, plan.blocks, 0, p, stream);
}

// The mma engine's tiles are 8 or 16 columns of x; the simt engine's 1 (the plan runs it at M = 1).
template <typename T, Engine E>
void launch_ring(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  with_group(p, [&](auto g, auto sym) {
    constexpr int G = decltype(g)::value;
    constexpr bool SYM = decltype(sym)::value;
    if constexpr (E == Engine::kMma) {
      if (p.m <= 8) return launch_ring_tile<T, 8, G, SYM, E>(p, plan, stream);
      return launch_ring_tile<T, 16, G, SYM, E>(p, plan, stream);
    } else {
      launch_ring_tile<T, 1, G, SYM, E>(p, plan, stream);
    }
  });
}

}  // namespace detail

}  // namespace w4

// The stream kernel (Kernel kStream; mma engine, K % kStreamPieceK == 0, every M <= kMaxM) and its
// reduce kernel.
//
// The register kernels keep at most 2-3 iterations of loads in flight per lane, bounded by
// registers, and at M > 4 every warp re-reads x from L1. Here the ring lives in shared memory (S
// slots of 32 rows x 128 k per warp, filled by cp.async: kStreamStages, or kStreamFewStages where
// only that lets two blocks share an SM, see stream_stages in skinny_plan.h), and x is read from a
// permuted shared copy that every warp of the block shares.
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
// to partials[ks], and reduce_partials_kernel adds the split of them in ks order plus bias.
// No atomics: the result is deterministic, and row i depends on M only through the plan
// (stream_warps_n(m) and the split).
#pragma once

#include "skinny_common.cuh"

#if !W4_HIP
namespace w4 {

template <typename T, int M_TILE, int G, bool SYM, int S>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, kStreamMinBlocks) stream_kernel(const SkinnyParams p) {
  constexpr int kTiles = M_TILE / 8;
  constexpr bool kScaleAfter = scale_after_mma(G);  // a piece is one group
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
    uint32_t s[4], z[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      w[a] = slot[(quad + 8 * a) * 4 + t];
      s[a] = ss[(srow + 8 * a) * L.scale_stride + gi];
      z[a] = SYM ? 8u : (zs[(srow / 8 + a) * L.groups + gi] >> (4 * quad)) & 0xFu;
    }
    detail::piece_mma<T, kScaleAfter>(w, z, s, acc, [&](int j, int bt) { return xl[bt][16 * piece + 4 * j]; });
  }

  // Partial sums [warps_k][rows][M_TILE] over the rings, once every warp is done with its ring.
  float* red = reinterpret_cast<float*>(smem);
  __syncthreads();
  detail::store_fragments(acc, red + (wk * L.rows + 32 * wn) * M_TILE, M_TILE, 1, quad, t);
  __syncthreads();
  for (int idx = threadIdx.x; idx < L.rows * p.m; idx += kBlockThreads) {
    const int m = idx / L.rows, r = idx - m * L.rows, n = n0 + r;
    if (n >= p.n) continue;
    float v = 0.f;
    for (int w = 0; w < L.warps_k; ++w) v += red[(w * L.rows + r) * M_TILE + m];
    detail::store_split_output<T>(p, ks, m, n, v);
  }
}

namespace detail {

template <typename T, int M_TILE, int G, bool SYM, int S>
void launch_stream_tile(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  launch_planned(stream_kernel<T, M_TILE, G, SYM, S>, plan, p, stream);
  launch_reduce<T>(p, stream);
}

// Tiles of 8 or 16 columns of x, and the plan's ring depth.
template <typename T>
void launch_stream(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  with_group(p, [&](auto g, auto sym) {
    constexpr int G = decltype(g)::value;
    constexpr bool SYM = decltype(sym)::value;
    const bool few = plan.stages == kStreamFewStages;
    if (p.m <= 8) {
      return few ? launch_stream_tile<T, 8, G, SYM, kStreamFewStages>(p, plan, stream)
                 : launch_stream_tile<T, 8, G, SYM, kStreamStages>(p, plan, stream);
    }
    return few ? launch_stream_tile<T, 16, G, SYM, kStreamFewStages>(p, plan, stream)
               : launch_stream_tile<T, 16, G, SYM, kStreamStages>(p, plan, stream);
  });
}

}  // namespace detail

}  // namespace w4
#endif  // !W4_HIP

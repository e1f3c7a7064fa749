// The tile kernel (Kernel kTile; mma engine, K % kStreamPieceK == 0, any M): the W4A16 GEMM for
// the M the stream kernel cannot hold, whose x (M rows of all of the block's K) would not fit
// shared memory.
//
// Block: an output tile of tile_block_rows(M_TILE) rows of N times M_TILE rows of x, over the K
// range of its split index ks (pieces [ks P / split, (ks + 1) P / split) of the P = K / 128
// pieces). Both operands stream through kTileStages shared-memory stages of one 128-k piece each,
// filled by cp.async by the whole block (a __syncthreads per piece makes a stage visible and frees
// the one the next copies go to). Warps: tile_warps_m(M_TILE) along M (tile_warp_m columns each)
// times the rest along N (32 rows each: two 16-row A tiles), so a warp's weights feed
// tile_warp_m / 8 mma B tiles once dequantized; its accumulators and B fragments take more than
// half an SM's registers a thread, so a block has its SM to itself. Fragment map: the mma kernels'
// (skinny_common.cuh), the weight in its canonical layout as the A operand.
//
// Stage layout: weights [rows][4 chunks] (a lane's 4 rows quad + 8 a of its warp are units apart by
// 32, so a warp reads 512 consecutive bytes), then x [M_TILE][16 chunks] with chunk c of row r at
// tile_x_swizzle(r, c): a warp's B-fragment loads (rows quad, chunks 4 t + j) hit 8 distinct 16-byte
// bank groups per quarter-warp. Scales and zero points of the next piece are loaded into registers
// while the current one computes.
//
// Outputs: the stages are reused as [M_TILE][rows] fp32 sums, so that y (or, at split > 1, the
// partial sums reduce_partials_kernel adds in ks order) is written row-contiguous. No atomics: an
// output's terms are added in K order within a block and in split order across blocks.
#pragma once

#include "skinny_common.cuh"

#if !W4_HIP
namespace w4 {

namespace detail {

__device__ __forceinline__ int tile_x_swizzle(int row, int chunk) {
  return chunk ^ (((chunk >> 3) & 1) << 1) ^ (row & 1);
}

}  // namespace detail

template <typename T, int M_TILE, int G, bool SYM>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, 1) tile_kernel(const SkinnyParams p) {
  constexpr int WM = tile_warp_m(M_TILE);
  constexpr int kWarpsN = kBlockThreads / 32 / tile_warps_m(M_TILE);
  constexpr int kRows = tile_block_rows(M_TILE);
  constexpr int kTiles = WM / 8;
  constexpr int S = kTileStages;
  constexpr bool kScaleAfter = scale_after_mma(G) && WM <= 16;  // registers for part[] at small tiles only
  constexpr int kWeightUnits = kRows * kStreamPieceK / kLaneK;
  constexpr int kXUnits = M_TILE * kStreamPieceK / 8;
  constexpr int kStageUnits = kWeightUnits + kXUnits;
  static_assert(W4_WARP_SIZE == 32 && kWeightUnits % kBlockThreads == 0 && kXUnits % kBlockThreads == 0 &&
                    kStreamPieceK % G == 0, "whole copies a thread; groups tile a piece");
  W4_DYNAMIC_SHARED(uint4, smem);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int quad = lane / 4, t = lane % 4;
  const int wn = warp % kWarpsN, wm = warp / kWarpsN;
  const detail::TileBlock block = detail::tile_block(p, kRows, M_TILE);
  const int n0 = block.n0, m0 = block.m0, ks = block.ks, pb0 = block.pb0, count = block.count;
  const int groups = p.k / G, kc = p.k / kLaneK;
  pdl_trigger();

  // This thread's copies of a stage: weight units u (row u / 4, chunk u % 4) and x units u (row
  // u / 16, chunk u % 16), u = threadIdx.x + kBlockThreads i, addresses recomputed each piece to
  // spare registers. Rows past n or m read row n - 1 or m - 1 (valid memory) and are never stored.
  constexpr int kWeightCopies = kWeightUnits / kBlockThreads, kXCopies = kXUnits / kBlockThreads;
  const uint4* qweight = reinterpret_cast<const uint4*>(p.qweight);
  const T* x = static_cast<const T*>(p.x);
  auto issue_weights = [&](int f) {
    if (f < count) {
      uint4* stage = smem + f % S * kStageUnits;
      const int off = (pb0 + f) * (kStreamPieceK / kLaneK);
#pragma unroll
      for (int i = 0; i < kWeightCopies; ++i) {
        const int u = threadIdx.x + kBlockThreads * i;
        const int64_t row = min(n0 + u / 4, p.n - 1);
        detail::cp_async16(stage + u, qweight + row * kc + off + u % 4);
      }
    }
  };
  auto issue_x = [&](int f) {  // then closes stage f's copy group (an empty one past count)
    if (f < count) {
      uint4* stage = smem + f % S * kStageUnits + kWeightUnits;
      const int off = (pb0 + f) * kStreamPieceK;
#pragma unroll
      for (int i = 0; i < kXCopies; ++i) {
        const int u = threadIdx.x + kBlockThreads * i, r = u / 16, c = u % 16;
        const int64_t row = min(m0 + r, p.m - 1);
        detail::cp_async16(stage + r * 16 + detail::tile_x_swizzle(r, c),
                           reinterpret_cast<const uint4*>(x + row * p.stride_xm + off) + c);
      }
    }
    detail::cp_async_commit();
  };

  // The lane's weight rows n0 + srow + 8 a, a < 4, and their scales and zero points for a piece.
  const int srow = 32 * wn + quad;
  const unsigned short* scales = static_cast<const unsigned short*>(p.scales);
  const unsigned short* srcs[4];
  const uint32_t* zsrc[4];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    srcs[a] = scales + static_cast<int64_t>(min(n0 + srow + 8 * a, p.n - 1)) * groups;
    zsrc[a] = SYM ? nullptr : p.zeros + static_cast<int64_t>(min((n0 + 32 * wn) / 8 + a, p.n / 8 - 1)) * groups;
  }
  uint32_t s[4], z[4];
  auto load_group = [&](int f, uint32_t (&sv)[4], uint32_t (&zv)[4]) {
    const int gi = ((pb0 + min(f, count - 1)) * kStreamPieceK + kLaneK * t) / G;
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      sv[a] = W4_LDG(srcs[a] + gi);
      zv[a] = SYM ? 8u : (W4_LDG(zsrc[a] + gi) >> (4 * quad)) & 0xFu;
    }
  };
  if (count > 0) load_group(0, s, z);

  // Weights may stream while the previous kernel drains; x only after pdl_wait.
#pragma unroll
  for (int f = 0; f < S - 1; ++f) issue_weights(f);
  pdl_wait();
#pragma unroll
  for (int f = 0; f < S - 1; ++f) issue_x(f);

  float acc[2][kTiles][4] = {};
  for (int e = 0; e < count; ++e) {
    detail::cp_async_wait<S - 2>();
    __syncthreads();  // stage e is complete for every thread; every warp is done with stage e - 1
    issue_weights(e + S - 1);
    issue_x(e + S - 1);
    uint32_t s_next[4], z_next[4];
    load_group(e + 1, s_next, z_next);

    const uint4* stage = smem + e % S * kStageUnits;
    const uint4* wl = stage + srow * 4 + t;
    uint4 w[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) w[a] = wl[32 * a];
    const uint4* xl = stage + kWeightUnits;
    detail::piece_mma<T, kScaleAfter>(w, z, s, acc, [&](int j, int bt) {
      const int r = WM * wm + 8 * bt + quad;
      uint32_t b[4];
      detail::x_fragments(xl[r * 16 + detail::tile_x_swizzle(r, 4 * t + j)], b);
      return make_uint4(b[0], b[1], b[2], b[3]);
    });
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      s[a] = s_next[a];
      z[a] = z_next[a];
    }
  }

  // The block's sums [M_TILE][red_stride(rows)] over the stages, once every warp is done with them.
  constexpr int kRed = detail::red_stride(kRows);
  static_assert(M_TILE * kRed * 4 <= tile_shared_bytes(M_TILE), "the sums fit the stages");
  detail::cp_async_wait<0>();
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  detail::store_fragments(acc, red + WM * wm * kRed + 32 * wn, 1, kRed, quad, t);
  __syncthreads();
  detail::store_block_tile<T>(p, ks, red, kRows, M_TILE, n0, m0);
}

namespace detail {

// The tile kernel for the plan's M tile, then the reduction of its split.
template <typename T>
void launch_tile(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  with_group(p, [&](auto g, auto sym) {
    constexpr int G = decltype(g)::value;
    constexpr bool SYM = decltype(sym)::value;
    auto run = [&](auto kernel) { launch_planned(kernel, plan, p, stream); };
    switch (tile_m(p.m)) {
      case 16: run(tile_kernel<T, 16, G, SYM>); break;
      case 32: run(tile_kernel<T, 32, G, SYM>); break;
      case 64: run(tile_kernel<T, 64, G, SYM>); break;
      default: run(tile_kernel<T, 128, G, SYM>);
    }
  });
  launch_reduce<T>(p, stream);
}

}  // namespace detail

}  // namespace w4
#endif  // !W4_HIP

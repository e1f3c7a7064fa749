// The batch kernel (Kernel kBatch): each warp issues the loads of a batch of iterations (weights,
// scales and zero points of Accumulator::kUnroll iterations), waits for them, computes, then issues
// the next batch. It takes any K that is a multiple of 32 (a chunk past K adds exactly 0) and any N,
// on both engines and every platform, so the plan runs it wherever the other kernels' limits exclude
// a call. A warp's iterations are it = w_k + e * split; each lane owns rows (quad, quad + W/4) of the
// warp's rows and chunk t of each iteration's 128 k.
#pragma once

#include "skinny_common.cuh"

namespace w4 {

template <typename T, int M_TILE, int G, bool SYM, Engine E>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, kMinBlocks) batch_kernel(const SkinnyParams p) {
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

namespace detail {

template <typename T, int M_TILE, int G, bool SYM, Engine E>
void launch_batch_tile(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  launch_kernel(batch_kernel<T, M_TILE, G, SYM, E>, plan.blocks, 0, p, stream);
}

// The mma engine's tiles are 8 or 16 columns of x; the simt engine's 1, 2, 4, 8 or 16.
template <typename T, Engine E>
void launch_batch(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  with_group(p, [&](auto g, auto sym) {
    constexpr int G = decltype(g)::value;
    constexpr bool SYM = decltype(sym)::value;
    if constexpr (E == Engine::kMma) {
      if (p.m <= 8) return launch_batch_tile<T, 8, G, SYM, E>(p, plan, stream);
      return launch_batch_tile<T, 16, G, SYM, E>(p, plan, stream);
    } else {
      if (p.m <= 1) return launch_batch_tile<T, 1, G, SYM, E>(p, plan, stream);
      if (p.m <= 2) return launch_batch_tile<T, 2, G, SYM, E>(p, plan, stream);
      if (p.m <= 4) return launch_batch_tile<T, 4, G, SYM, E>(p, plan, stream);
      if (p.m <= 8) return launch_batch_tile<T, 8, G, SYM, E>(p, plan, stream);
      return launch_batch_tile<T, 16, G, SYM, E>(p, plan, stream);
    }
  });
}

}  // namespace detail

}  // namespace w4

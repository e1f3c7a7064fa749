// The segmented kernels (Kernel kSegment, kSegmentSmem, kSegmentPersistent; mma engine, M <=
// kSegMaxM): one kernel template, with x read from global memory, x staged in shared memory (XS),
// or x staged on a persistent grid (PERSIST).
//
// The mma's 16 A rows need not be 16 weight rows. With M_PAD columns of x in use (M rounded up to
// 1, 2 or 4) and SEG = 8 / M_PAD, quad q of a warp holds weight row q / SEG of each row set at k
// segment s = q % SEG (4 chunks, 128 k) of the iteration's SEG segments, and B column q holds x row
// q / SEG at the lane's own k. C entry (row q, column j) is then the dot product over segment s of
// that weight row with x row j / SEG: a partial sum wanted when j % SEG == s, discarded otherwise.
// So a load instruction covers M_PAD rows x SEG * 64 contiguous bytes (at M = 1, 512 bytes of one
// row), with the same mma count per weight as the ring kernel.
// Lane 4 q + t, row set a < R = kSegRowSets (sets 2 i and 2 i + 1 are rows q and q + 8 of A tile i):
//   row   = warp_row0 + M_PAD a + q / SEG (a row past n reads row n - 1 and is never stored);
//   chunk = 4 (SEG it + s) + t in iteration it = w_k + e * split (e < count); a chunk past k
//           reads zeros (weights, scale and x), so it adds exactly 0 and any k % 32 == 0 works.
// The ring holds 3 entries of R chunks per lane (2 iterations, 128 bytes a lane, in flight, in 128
// registers). A warp's rows start at a multiple of kWarpRows, so its sets share ZW zero-point
// words: set a's row is in 8-row block (M_PAD a) / 8 of the warp's.
//
// XS (split 1): a lane's x for word j of its chunk is 16 bytes at 64-byte stride from its
// neighbours', so a warp's global load of them touches 16 cache lines for 512 bytes, four times
// the lines of its weight loads. XS first copies x[:M_PAD] to dynamic shared memory (the plan's
// shared_bytes), piece j of chunk c of row r at xs[(4 r + j) kc + c]: the lanes' loads of one j
// are then consecutive 16-byte pieces, 4 wavefronts per 512 bytes, no bank conflicts.
//
// PERSIST (split 1, XS): the grid is the plan's B blocks. Block b owns row groups (units,
// kWarpRows rows and all of K each) [b U / B, (b + 1) U / B) of all U, and its warps split the I
// iterations of those units evenly: warp w runs [w I / W, (w + 1) I / W) in unit order, so no warp
// has more than one iteration above the block's mean. The iterations run through one ring, so the
// loads of the next unit's first iterations are in flight while the warp finishes a unit. A unit
// the warp runs whole is stored as XS stores it at split 1 (the C entries through the warp's slice
// of `red`, store_outputs over the warp, no block barrier): its rows' bits equal the XS kernel's. A
// unit that warp boundaries cut (at most W - 1 a block) leaves each of its warps a partial slice
// (slot 0 of the warp's two for its first unit, 1 for its last); after a block barrier the block
// adds them in warp order and stores the unit.
#pragma once

#include "skinny_common.cuh"

#if !W4_HIP
namespace w4 {

namespace detail {

// The persistent kernel's units that warp boundaries cut in a block whose I = iters iterations (of
// units [unit0, ...), per_unit each) its WARPS warps split as [w I / WARPS, (w + 1) I / WARPS): each
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

template <typename T, int M_PAD, int G, bool SYM, bool XS, bool PERSIST>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, kMinBlocks) segment_kernel(const SkinnyParams p) {
  constexpr int R = kSegRowSets, SEG = 8 / M_PAD, S = 3;
  constexpr int kIterChunks = 4 * SEG;
  constexpr int kWarps = kBlockThreads / 32;
  constexpr int kWarpRows = R * M_PAD;
  constexpr int ZW = kWarpRows < 8 ? 1 : kWarpRows / 8;
  static_assert(W4_WARP_SIZE == 32 && R % 2 == 0 && 4 % M_PAD == 0, "16-row A tiles of two row sets on 32 lanes");
  static_assert(G % kLaneK == 0, "a lane's 32-k chunk lies in one group");
  constexpr bool kScaleAfter = scale_after_mma(G);  // an iteration is one step group
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
  static_assert(!PERSIST || XS, "the persistent kernel stages x");
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

  // Element offsets fit in an int (the plan checks n * k / 32). A zero-point word's block is that
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

namespace detail {

template <typename T, int M_PAD, int G, bool SYM, bool XS, bool PERSIST>
void launch_segment_kernel(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  launch_planned(segment_kernel<T, M_PAD, G, SYM, XS, PERSIST>, plan, p, stream);
}

template <typename T, int M_PAD, int G, bool SYM>
void launch_segment_tile(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  switch (plan.kernel) {
    case kSegmentPersistent: return launch_segment_kernel<T, M_PAD, G, SYM, true, true>(p, plan, stream);
    case kSegmentSmem: return launch_segment_kernel<T, M_PAD, G, SYM, true, false>(p, plan, stream);
    default: return launch_segment_kernel<T, M_PAD, G, SYM, false, false>(p, plan, stream);
  }
}

template <typename T>
void launch_segment(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  with_group(p, [&](auto g, auto sym) {
    constexpr int G = decltype(g)::value;
    constexpr bool SYM = decltype(sym)::value;
    switch (seg_m_pad(p.m)) {
      case 1: return launch_segment_tile<T, 1, G, SYM>(p, plan, stream);
      case 2: return launch_segment_tile<T, 2, G, SYM>(p, plan, stream);
      default: return launch_segment_tile<T, 4, G, SYM>(p, plan, stream);
    }
  });
}

}  // namespace detail

}  // namespace w4
#endif  // !W4_HIP

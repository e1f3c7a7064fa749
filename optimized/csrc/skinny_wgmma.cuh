// The warpgroup kernel (Kernel kWgmma; CUDA compute capability 9.0, K % kStreamPieceK == 0, any
// M): the tile kernel's output tiles and K split on Hopper's asynchronous warpgroup MMA, with the
// dequantized weights as its register operand A and x as its shared-memory operand B.
//
// Block: kWgmmaRows rows of N (two warpgroups of 64) times M_TILE rows of x, over the K range of
// its split index as in the tile kernel. Per 128-k piece:
//  1. packed weights and x arrive in one of wgmma_stages(M_TILE) shared-memory stages by cp.async;
//  2. each thread loads its two A rows (quad and quad + 8 of its warp's 16) whole, and dequantizes
//     byte t (lane = 4 quad + t) of every word, (q - z) * s rounded once to T: that byte holds k
//     8c + 2t and 8c + 2t + 1 of word c, the A fragment's k (2t, 2t + 1) of step c / 2 (c even)
//     or (2t + 8, 2t + 9) (c odd), so x keeps its k order;
//  3. each warpgroup issues 8 wgmma m64nM_TILEk16 steps from those registers, and dequantizes the
//     next piece into a second register set while they run.
// x is K-major with the 128-byte swizzle: 16-byte chunk c (of 8) of row m of a 64-k half is stored
// at chunk c ^ (m % 8). Packed weights are staged [rows][4 units] with unit u of row r at
// u ^ ((r / 2) % 4), so that 8 consecutive rows' loads of one unit hit 8 distinct 16-byte bank
// groups.
//
// Order: a piece's copies are waited for by each thread, fenced to the asynchronous proxy and met
// at a block barrier. A stage is refilled two pieces after it was consumed: by then every thread
// has waited for its warpgroup's wgmma of that piece (wait_group 1 after each issue), which also
// frees that piece's registers. Outputs go through shared memory to the tile kernel's
// row-contiguous store; K-split partial sums are added in ks order.
#pragma once

#include "skinny_common.cuh"

#if !W4_HIP
namespace w4 {

namespace detail {

// The shared-memory address of a generic pointer into it (the emulator: its offset from the
// block's dynamic shared memory, which starts 1024-byte aligned on the GPU too).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
#if W4_EMU
  return ::w4emu::shared_offset(p);
#else
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

// x as a K-major operand of 128-byte swizzled rows starting at `p` (1024-byte aligned but for the
// 32-byte step of a k16 within the row): 8-row core groups 1024 bytes apart (stride byte offset),
// leading byte offset unused under the swizzle.
__device__ __forceinline__ uint64_t wgmma_descriptor(const void* p) {
  return static_cast<uint64_t>((shared_address(p) & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// The descriptor `units` 16-byte units further on, by a 32-bit add (the address field is the low
// 14 bits and never carries out of the low word in 228 KiB).
__device__ __forceinline__ uint64_t advance(uint64_t desc, uint32_t units) {
  return (desc & 0xFFFFFFFF00000000ull) | (static_cast<uint32_t>(desc) + units);
}

// 16-byte unit of chunk c (< 8) of row r in a 128-byte swizzled half.
__device__ __forceinline__ int swizzle128(int row, int chunk) { return 8 * row + (chunk ^ (row & 7)); }

__device__ __forceinline__ void fence_proxy_async() {
#if !W4_EMU
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if !W4_EMU
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if !W4_EMU
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

// Until at most N of this warpgroup's committed wgmma groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if !W4_EMU
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

// Keeps the compiler from moving accesses of accumulators across a wgmma wait.
template <int R>
__device__ __forceinline__ void fence_accumulators(float (&d)[R]) {
#if !W4_EMU
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
#endif
}

// D (64 x N, fp32, the C fragments of mma.sync per 8 columns, warp w of the warpgroup holding rows
// 16 w ..) += A (64 x 16: the A fragment of mma.sync m16n8k16 per warp, in registers) B (16 x N,
// K-major in shared memory).
#if W4_EMU
template <typename T, int N>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
  ::w4emu::wgmma_rs(d, N, a, b, std::is_same_v<T, bf16_t>);
}
#else
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b);

#define W4_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
    "+f"(d[i + 6]), "+f"(d[i + 7])
#define W4_R32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define W4_R64 W4_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define W4_WGMMA(T, PTX, N, REGS, A, B, S, ...)                                                            \
  template <>                                                                                              \
  __device__ __forceinline__ void wgmma_rs<T, N>(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " S ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N         \
                 "k16.f32." PTX "." PTX " {" REGS "}, {" A "}, " B ", p, 1, 1, 0;\n}\n"                      \
                 : __VA_ARGS__                                                                             \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                            \
  }
W4_WGMMA(half_t, "f16", 64, W4_R32, "%32, %33, %34, %35", "%36", "%37", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24))
W4_WGMMA(bf16_t, "bf16", 64, W4_R32, "%32, %33, %34, %35", "%36", "%37", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24))
W4_WGMMA(half_t, "f16", 128, W4_R64, "%64, %65, %66, %67", "%68", "%69", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24),
         W4_D8(32), W4_D8(40), W4_D8(48), W4_D8(56))
W4_WGMMA(bf16_t, "bf16", 128, W4_R64, "%64, %65, %66, %67", "%68", "%69", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24),
         W4_D8(32), W4_D8(40), W4_D8(48), W4_D8(56))
#undef W4_WGMMA
#undef W4_R64
#undef W4_R32
#undef W4_D8
#endif

// (q - z) * s of nibbles 2t and 2t + 1 of w (byte t) as a pair of T, one rounding each, by the
// magic-number conversion with `neg_magic_z` (neg_magic(z)) and `select` (fragment_select(t)).
// bf16 (7 mantissa bits): byte t of w and of w >> 4 go to the two halves' low bytes, so each
// nibble lands in bits 0..3 of 128. fp16: byte t goes to both halves, the high nibble stays in
// bits 4..7 of 1024 (16 q, exact) and the subtract scales that half by 1/16, exactly.
template <typename T>
__device__ __forceinline__ uint32_t fragment_pair(uint32_t w, uint32_t select, uint32_t neg_magic_z, uint32_t s2) {
  constexpr uint32_t kNegZero = 0x80008000u;
  if constexpr (std::is_same_v<T, bf16_t>) {
    const uint32_t pair = and_or(__byte_perm(w, w >> 4, select), 0x000F000Fu, 0x43004300u);  // 128 + q
    return fma2<T>(fma2<T>(pair, 0x3F803F80u, neg_magic_z), s2, kNegZero);
  } else {
    const uint32_t pair = and_or(__byte_perm(w, w, select), 0x00F0000Fu, 0x64006400u);  // 1024 + (q, 16 q)
    return fma2<T>(fma2<T>(pair, 0x2C003C00u, neg_magic_z), s2, kNegZero);          // times (1, 1/16)
  }
}

// fragment_pair's byte permute for lane t of a quad: byte t to bytes 0 and 1, and byte t of the
// second source (w >> 4 for bf16, w for fp16) to bytes 2 and 3.
__device__ __forceinline__ uint32_t fragment_select(int t) { return 0x4400u + 0x1111u * static_cast<uint32_t>(t); }

// -(magic + z) of each half for fragment_pair: -(128 + z) for bf16; for fp16 -(1024 + z) low and
// -(64 + z) high (64 has spacing 1/16 in fp16).
template <typename T>
__device__ __forceinline__ uint32_t neg_magic(uint32_t z) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    return splat(0xC300u | z);
  } else {
    return ((0xD400u | (z << 4)) << 16) | 0xE400u | z;
  }
}

}  // namespace detail

template <typename T, int M_TILE, int G, bool SYM>
__global__ void W4_LAUNCH_BOUNDS(kBlockThreads, 1) wgmma_kernel(const SkinnyParams p) {
#if W4_EMU || defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kRows = kWgmmaRows;
  constexpr int S = wgmma_stages(M_TILE);
  constexpr int kWeightUnits = kRows * kStreamPieceK / kLaneK;  // [rows][4 units]
  constexpr int kXUnits = M_TILE * kStreamPieceK / 8;          // 2 halves x [M_TILE][8 units]
  constexpr int kStageUnits = kWeightUnits + kXUnits;
  constexpr int kSteps = kStreamPieceK / 16;
  constexpr int kGroups = kStreamPieceK / G;  // groups of a row in a piece
  static_assert(kBlockThreads == 2 * 128 && kWeightUnits % kBlockThreads == 0 && kXUnits % kBlockThreads == 0 &&
                    (kWeightUnits * 16) % 1024 == 0 && (kStageUnits * 16) % 1024 == 0 && kStreamPieceK % G == 0,
                "two warpgroups; whole copies a thread; 1024-byte aligned swizzled x; groups tile a piece");
#if W4_EMU
  uint4* smem = ::w4emu::dynamic_shared<uint4>();
#else
  extern __shared__ __align__(1024) uint4 smem[];
#endif

  const detail::TileBlock block = detail::tile_block(p, kRows, M_TILE);
  const int n0 = block.n0, m0 = block.m0, ks = block.ks, pb0 = block.pb0, count = block.count;
  const int groups = p.k / G, kc = p.k / kLaneK;
  pdl_trigger();

  // Copies of a stage, as in the tile kernel: rows past n or m read row n - 1 or m - 1. A thread's
  // sources are fixed rows (a piece moves them along K), its destinations fixed units of a stage.
  constexpr int kWeightCopies = kWeightUnits / kBlockThreads, kXCopies = kXUnits / kBlockThreads;
  const uint4* wsrc[kWeightCopies];
  const uint4* xsrc[kXCopies];
  const int wc = threadIdx.x % 4, xc = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < kWeightCopies; ++i) {
    const int64_t row = min(n0 + (threadIdx.x + kBlockThreads * i) / 4, p.n - 1);
    wsrc[i] = reinterpret_cast<const uint4*>(p.qweight) + row * kc + wc;
  }
#pragma unroll
  for (int i = 0; i < kXCopies; ++i) {
    const int64_t row = min(m0 + (threadIdx.x + kBlockThreads * i) / 16, p.m - 1);
    xsrc[i] = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + row * p.stride_xm) + xc;
  }
  // Copy i of a thread goes kBlockThreads / 4 weight rows (or / 16 x rows) after copy 0: a multiple
  // of 8 rows, so its swizzled unit is copy 0's plus a constant.
  const int wdst = 4 * (threadIdx.x / 4) + (wc ^ (threadIdx.x / 8 % 4));
  const int xdst = kWeightUnits + xc / 8 * M_TILE * 8 + detail::swizzle128(threadIdx.x / 16, xc % 8);
  auto issue_weights = [&](int f) {
    if (f < count) {
      uint4* stage = smem + f % S * kStageUnits + wdst;
      const int off = (pb0 + f) * (kStreamPieceK / kLaneK);
#pragma unroll
      for (int i = 0; i < kWeightCopies; ++i) detail::cp_async16(stage + kBlockThreads * i, wsrc[i] + off);
    }
  };
  auto issue_x = [&](int f) {  // then closes piece f's copy group (an empty one past count)
    if (f < count) {
      uint4* stage = smem + f % S * kStageUnits + xdst;
      const int off = (pb0 + f) * (kStreamPieceK / 8);
#pragma unroll
      for (int i = 0; i < kXCopies; ++i) detail::cp_async16(stage + 8 * (kBlockThreads / 16) * i, xsrc[i] + off);
    }
    detail::cp_async_commit();
  };

  // This thread's A rows: quad and quad + 8 of its warp's 16 of its warpgroup's 64.
  const int t = threadIdx.x % 4;
  const int row0 = static_cast<int>(threadIdx.x / 32 * 16 + threadIdx.x % 32 / 4);
  const int rows[2] = {row0, row0 + 8};
  const uint32_t select = detail::fragment_select(t);
  const unsigned short* srcs[2];
  const uint32_t* zsrc[2];
  int zshift[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t grow = min(n0 + rows[i], p.n - 1);
    srcs[i] = static_cast<const unsigned short*>(p.scales) + grow * groups;
    zsrc[i] = SYM ? nullptr : p.zeros + grow / 8 * groups;
    zshift[i] = 4 * static_cast<int>(grow % 8);
  }
  // A piece's scales as splat pairs and -(magic + z) of each row and group.
  uint32_t s2[2][kGroups], nz[2][kGroups];
  auto load_groups = [&](int f, uint32_t (&sv)[2][kGroups], uint32_t (&zv)[2][kGroups]) {
    const int g0 = (pb0 + min(f, count - 1)) * kGroups;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        sv[i][g] = W4_LDG(srcs[i] + g0 + g);
        zv[i][g] = SYM ? 8u : (W4_LDG(zsrc[i] + g0 + g) >> zshift[i]) & 0xFu;
      }
  };
  auto to_pairs = [&](uint32_t (&sv)[2][kGroups], uint32_t (&zv)[2][kGroups]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        sv[i][g] *= 0x10001u;
        zv[i][g] = detail::neg_magic<T>(zv[i][g]);
      }
  };
  if (count > 0) {
    load_groups(0, s2, nz);
    to_pairs(s2, nz);
  }

  // Weights may stream while the previous kernel drains; x only after pdl_wait.
#pragma unroll
  for (int f = 0; f < S - 2; ++f) issue_weights(f);
  pdl_wait();
#pragma unroll
  for (int f = 0; f < S - 2; ++f) issue_x(f);

  const uint64_t b_desc = detail::wgmma_descriptor(smem + kWeightUnits);
  float acc[M_TILE / 2] = {};
  // One piece into the A registers `a`, which the wgmma of two pieces before no longer reads.
  auto piece = [&](int e, uint32_t (&a)[kSteps][4]) {
    detail::cp_async_wait<S - 3>();
    detail::fence_proxy_async();
    __syncthreads();  // piece e is in its stage; every warpgroup's wgmma of piece e - 2 is done
    issue_weights(e + S - 2);
    issue_x(e + S - 2);
    uint32_t s_next[2][kGroups], z_next[2][kGroups];
    load_groups(e + 1, s_next, z_next);

    const uint4* stage = smem + e % S * kStageUnits + 4 * row0;
    uint4 wv[2][4];  // rows row0 and row0 + 8: the same swizzle, 32 units apart
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int u = 0; u < 4; ++u) wv[i][u] = stage[32 * i + (u ^ (row0 / 2 % 4))];
    // Step c / 2 takes word c (c even: A k 2t, 2t + 1) and word c + 1 (k 2t + 8, 2t + 9) of both rows.
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int g = 16 * step / G;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = j % 2, c = 2 * step + j / 2;
        a[step][j] = detail::fragment_pair<T>(detail::word(wv[i][c / 4], c % 4), select, nz[i][g], s2[i][g]);
      }
    }

    // A descriptor's address field counts 16-byte units: a k16 step is 2 of them.
    const uint32_t b_units = e % S * kStageUnits;
    detail::wgmma_fence();
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const uint32_t units = b_units + step / 4 * M_TILE * 8 + 2 * (step % 4);
      detail::wgmma_rs<T, M_TILE>(acc, a[step], detail::advance(b_desc, units));
    }
    detail::wgmma_commit();
    detail::wgmma_wait<1>();
    to_pairs(s_next, z_next);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        s2[i][g] = s_next[i][g];
        nz[i][g] = z_next[i][g];
      }
  };
  // Two register sets in turn: a piece's wgmma reads its set until the wait of the next piece.
  uint32_t a_even[kSteps][4], a_odd[kSteps][4];
  int e = 0;
  for (; e + 1 < count; e += 2) {
    piece(e, a_even);
    piece(e + 1, a_odd);
  }
  if (e < count) piece(e, a_even);
  detail::wgmma_wait<0>();
  detail::fence_accumulators(acc);

  // The block's sums [M_TILE][rows] over the stages, once every warp is done with them.
  detail::cp_async_wait<0>();
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  {
    const int wg = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, quad = threadIdx.x % 32 / 4;
#pragma unroll
    for (int i = 0; i < M_TILE / 8; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        red[(8 * i + 2 * t + c % 2) * kRows + 64 * wg + 16 * warp + quad + 8 * (c / 2)] = acc[4 * i + c];
  }
  __syncthreads();
  detail::store_block_tile<T>(p, ks, red, kRows, M_TILE, n0, m0);
#endif
}

namespace detail {

// The warpgroup kernel for the plan's M tile, then the reduction of its split.
template <typename T>
void launch_wgmma(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  with_group(p, [&](auto g, auto sym) {
    constexpr int G = decltype(g)::value;
    constexpr bool SYM = decltype(sym)::value;
    auto run = [&](auto kernel) { launch_planned(kernel, plan, p, stream); };
    switch (wgmma_m(p.m)) {
      case 64: run(wgmma_kernel<T, 64, G, SYM>); break;
      default: run(wgmma_kernel<T, 128, G, SYM>);
    }
  });
  launch_reduce<T>(p, stream);
}

}  // namespace detail

}  // namespace w4
#endif  // !W4_HIP

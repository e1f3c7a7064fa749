// The warpgroup kernel (Kernel kWgmma; CUDA compute capability 9.0, K % kStreamPieceK == 0, any
// M): the tile kernel's output tiles and K split on Hopper's asynchronous warpgroup MMA, whose
// operands the tensor cores read from shared memory, so no warp loads or permutes x.
//
// Block: kWgmmaRows rows of N (two warpgroups of 64) times M_TILE rows of x, over the K range of
// its split index as in the tile kernel. Per 128-k piece:
//  1. packed weights and x arrive in one of wgmma_stages(M_TILE) shared-memory stages by cp.async;
//  2. each thread dequantizes 64 k of one of its warpgroup's rows, (q - z) * s rounded once to T,
//     into that piece's half of a double-buffered [rows][128 k] operand (the canonical weight's
//     k order, so no x permute is needed);
//  3. each warpgroup issues 8 wgmma m64nM_TILEk16 steps (A: its 64 rows of that operand, B: x)
//     and leaves them running while the block goes on to the next piece.
// Both operands are K-major with the 128-byte swizzle: 16-byte chunk c (of 8) of row r of a 64-k
// half is stored at chunk c ^ (r % 8), which also keeps the dequantized stores free of bank
// conflicts. Packed weights are staged [rows][4 units] with unit u of row r at u ^ ((r / 2) % 4),
// so that 8 consecutive rows' loads of one unit hit 8 distinct 16-byte bank groups.
//
// Order: a piece's copies are waited for by each thread, fenced to the asynchronous proxy and met
// at a block barrier; its dequantized operand is fenced and met at a second barrier before the
// wgmma. A stage is refilled two pieces after it was consumed: by then every thread has waited for
// its warpgroup's wgmma of that piece (wait_group 1 after each issue). Outputs go through shared
// memory to the tile kernel's row-contiguous store; K-split partial sums are added in ks order.
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

// A K-major operand of 128-byte swizzled rows starting at `p` (1024-byte aligned but for the
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
// 16 w ..) += A (64 x 16) B (16 x N), both K-major in shared memory.
#if W4_EMU
template <typename T, int N>
inline void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b) {
  ::w4emu::wgmma(d, N, a, b, std::is_same_v<T, bf16_t>);
}
#else
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b);

#define W4_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
    "+f"(d[i + 6]), "+f"(d[i + 7])
#define W4_R32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define W4_R64 W4_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define W4_WGMMA(T, PTX, N, REGS, A, B, S, ...)                                                            \
  template <>                                                                                              \
  __device__ __forceinline__ void wgmma_ss<T, N>(float (&d)[N / 2], uint64_t a, uint64_t b) {              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " S ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N          \
                 "k16.f32." PTX "." PTX " {" REGS "}, " A ", " B ", p, 1, 1, 0, 0;\n}\n"                   \
                 : __VA_ARGS__                                                                             \
                 : "l"(a), "l"(b), "r"(1));                                                                \
  }
W4_WGMMA(half_t, "f16", 64, W4_R32, "%32", "%33", "%34", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24))
W4_WGMMA(bf16_t, "bf16", 64, W4_R32, "%32", "%33", "%34", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24))
W4_WGMMA(half_t, "f16", 128, W4_R64, "%64", "%65", "%66", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24), W4_D8(32),
         W4_D8(40), W4_D8(48), W4_D8(56))
W4_WGMMA(bf16_t, "bf16", 128, W4_R64, "%64", "%65", "%66", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24), W4_D8(32),
         W4_D8(40), W4_D8(48), W4_D8(56))
#undef W4_WGMMA
#undef W4_R64
#undef W4_R32
#undef W4_D8
#endif

// (q - z) * s of one word's 8 nibbles in k order, as 4 pairs of T (one rounding each): byte p
// of w holds q_2p and q_2p+1 in its nibbles, byte p of w >> 4 holds q_2p+1 low, so one byte
// permute places the pair in the two halves' low nibbles for the magic-number conversion.
template <typename T>
__device__ __forceinline__ uint4 ordered_weights(uint32_t w, uint32_t z, uint32_t s2) {
  constexpr uint32_t kMagic = std::is_same_v<T, bf16_t> ? 0x43004300u : 0x64006400u;  // 128 or 1024
  constexpr uint32_t kOne = std::is_same_v<T, bf16_t> ? 0x3F803F80u : 0x3C003C00u;
  constexpr uint32_t kNegZero = 0x80008000u;
  const uint32_t neg_magic_z = splat((std::is_same_v<T, bf16_t> ? 0xC300u : 0xE400u) | z);  // -(magic + z)
  const uint32_t w4 = w >> 4;
  uint32_t out[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const uint32_t pair = and_or(__byte_perm(w, w4, 0x4400u + 0x1111u * p), 0x000F000Fu, kMagic);
    out[p] = fma2<T>(fma2<T>(pair, kOne, neg_magic_z), s2, kNegZero);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
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
  constexpr int kOperandUnits = kRows * kStreamPieceK / 8;     // 2 halves x [rows][8 units]
  constexpr int kGroups = G >= 64 ? 1 : 64 / G;                // groups in a thread's 64 k
  static_assert(kBlockThreads == 2 * 128 && kWeightUnits % kBlockThreads == 0 && kXUnits % kBlockThreads == 0 &&
                    (kWeightUnits * 16) % 1024 == 0 && (kStageUnits * 16) % 1024 == 0,
                "two warpgroups; whole copies a thread; 1024-byte aligned swizzled operands");
#if W4_EMU
  uint4* smem = ::w4emu::dynamic_shared<uint4>();
#else
  extern __shared__ __align__(1024) uint4 smem[];
#endif
  uint4* operands = smem + S * kStageUnits;

  const int wg = threadIdx.x / 128;
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
  auto issue_weights = [&](int f) {
    if (f < count) {
      uint4* stage = smem + f % S * kStageUnits;
      const int off = (pb0 + f) * (kStreamPieceK / kLaneK);
#pragma unroll
      for (int i = 0; i < kWeightCopies; ++i) {
        const int r = (threadIdx.x + kBlockThreads * i) / 4;
        detail::cp_async16(stage + 4 * r + (wc ^ (r / 2 % 4)), wsrc[i] + off);
      }
    }
  };
  auto issue_x = [&](int f) {  // then closes piece f's copy group (an empty one past count)
    if (f < count) {
      uint4* stage = smem + f % S * kStageUnits + kWeightUnits + xc / 8 * M_TILE * 8;
      const int off = (pb0 + f) * (kStreamPieceK / 8);
#pragma unroll
      for (int i = 0; i < kXCopies; ++i) {
        detail::cp_async16(stage + detail::swizzle128((threadIdx.x + kBlockThreads * i) / 16, xc % 8), xsrc[i] + off);
      }
    }
    detail::cp_async_commit();
  };

  // This thread dequantizes row r of the block (its warpgroup's 64 rows) over k half h of a piece.
  const int r = 64 * wg + threadIdx.x % 64, h = threadIdx.x % 128 / 64;
  const int64_t grow = min(n0 + r, p.n - 1);
  const unsigned short* srcs = static_cast<const unsigned short*>(p.scales) + grow * groups;
  const uint32_t* zsrc = SYM ? nullptr : p.zeros + grow / 8 * groups;
  const int zshift = 4 * static_cast<int>(grow % 8);
  uint32_t s[kGroups], z[kGroups];
  auto load_group = [&](int f, uint32_t (&sv)[kGroups], uint32_t (&zv)[kGroups]) {
    const int g0 = ((pb0 + min(f, count - 1)) * kStreamPieceK + 64 * h) / G;
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      sv[i] = W4_LDG(srcs + g0 + i);
      zv[i] = SYM ? 8u : (W4_LDG(zsrc + g0 + i) >> zshift) & 0xFu;
    }
  };
  if (count > 0) load_group(0, s, z);

  // Weights may stream while the previous kernel drains; x only after pdl_wait.
#pragma unroll
  for (int f = 0; f < S - 2; ++f) issue_weights(f);
  pdl_wait();
#pragma unroll
  for (int f = 0; f < S - 2; ++f) issue_x(f);

  const uint64_t a_desc = detail::wgmma_descriptor(operands + 64 * wg * 8);  // this warpgroup's rows
  const uint64_t b_desc = detail::wgmma_descriptor(smem + kWeightUnits);
  float acc[M_TILE / 2] = {};
  for (int e = 0; e < count; ++e) {
    detail::cp_async_wait<S - 3>();
    detail::fence_proxy_async();
    __syncthreads();  // piece e is in its stage; every warpgroup's wgmma of piece e - 2 is done
    issue_weights(e + S - 2);
    issue_x(e + S - 2);
    uint32_t s_next[kGroups], z_next[kGroups];
    load_group(e + 1, s_next, z_next);

    const uint4* stage = smem + e % S * kStageUnits;
    uint4* operand = operands + e % 2 * kOperandUnits;
    uint4 wv[2];  // both loads first: the compiler cannot tell them from the operand stores
#pragma unroll
    for (int half_unit = 0; half_unit < 2; ++half_unit) {
      wv[half_unit] = stage[4 * r + ((2 * h + half_unit) ^ (r / 2 % 4))];
    }
#pragma unroll
    for (int half_unit = 0; half_unit < 2; ++half_unit) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int gi = (4 * half_unit + j) * 8 * kGroups / 64;
        operand[h * kRows * 8 + detail::swizzle128(r, 4 * half_unit + j)] =
            detail::ordered_weights<T>(detail::word(wv[half_unit], j), z[gi], s[gi] * 0x10001u);
      }
    }
    detail::fence_proxy_async();
    __syncthreads();  // the piece's operand is complete

    // A descriptor's address field counts 16-byte units: a k16 step is 2 of them.
    const uint32_t a_units = e % 2 * kOperandUnits, b_units = e % S * kStageUnits;
    detail::wgmma_fence();
#pragma unroll
    for (int step = 0; step < kStreamPieceK / 16; ++step) {
      const int half = step / 4, units = 2 * (step % 4);
      detail::wgmma_ss<T, M_TILE>(acc, detail::advance(a_desc, a_units + half * kRows * 8 + units),
                                  detail::advance(b_desc, b_units + half * M_TILE * 8 + units));
    }
    detail::wgmma_commit();
    detail::wgmma_wait<1>();
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      s[i] = s_next[i];
      z[i] = z_next[i];
    }
  }
  detail::wgmma_wait<0>();
  detail::fence_accumulators(acc);

  // The block's sums [M_TILE][rows] over the stages, once every warp is done with them.
  detail::cp_async_wait<0>();
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  {
    const int warp = threadIdx.x % 128 / 32, quad = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
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

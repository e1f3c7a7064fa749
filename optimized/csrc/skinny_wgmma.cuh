// The warpgroup kernel (Kernel kWgmma; CUDA compute capability 9.0, K % kStreamPieceK == 0, any
// M): the tile kernel's output tiles and K split on Hopper's asynchronous warpgroup MMA, with the
// dequantized weights as its register operand A and x as its shared-memory operand B.
//
// Block: kWgmmaRows rows of N (two warpgroups of 64) times M_TILE rows of x, over the K range of
// its split index as in the tile kernel, plus a copy warpgroup. Per 128-k piece:
//  1. one lane of the copy warpgroup loads packed weights and x into one of wgmma_stages(M_TILE)
//     shared-memory stages by the tensor memory accelerator (TMA), completing the stage's "full"
//     mbarrier;
//  2. each thread loads its two A rows (quad and quad + 8 of its warp's 16) whole, and dequantizes
//     byte t (lane = 4 quad + t) of every word, (q - z) * s rounded once to T: that byte holds k
//     8c + 2t and 8c + 2t + 1 of word c, the A fragment's k (2t, 2t + 1) of step c / 2 (c even)
//     or (2t + 8, 2t + 9) (c odd), so x keeps its k order;
//  3. each warpgroup issues the piece's 8 wgmma m64nM_TILEk16 steps from those registers, and
//     after each one dequantizes that step of the next piece into a second register set, so that
//     the tensor cores and the dequantization overlap within the warp.
// x is K-major with the 128-byte swizzle: 16-byte chunk c (of 8) of row m of a 64-k half is stored
// at chunk c ^ (m % 8). Packed weights are staged [rows][4 units] with the 64-byte swizzle, unit u
// of row r at u ^ ((r / 2) % 4), so that 8 consecutive rows' loads of one unit hit 8 distinct
// 16-byte bank groups. Rows past n or m arrive as zeros (TMA bounds) and their outputs are not
// stored.
//
// Order: TMA writes and wgmma reads are both in the asynchronous proxy, so no proxy fence is
// needed and no thread waits on another's copies. A warp releases a stage (its "empty" mbarrier)
// once the waits of the next piece's steps have retired its warpgroup's wgmma of that stage, and
// the copy lane refills it when all 8 warps have. Outputs go through shared memory to the tile
// kernel's row-contiguous store; K-split partial sums are added in ks order.
#pragma once

#include "skinny_common.cuh"

#if !W4_HIP
#if !W4_EMU
#include <cuda.h>
#include <cudaTypedefs.h>

#include <stdexcept>
#include <string>
#endif

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

// Keeps the compiler from computing a (a wgmma's A fragment) before this point: after the wait
// that retired the wgmma reading its registers.
__device__ __forceinline__ void pin(uint32_t (&a)[4]) {
#if !W4_EMU
  asm volatile("" : "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3]));
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
#define W4_R16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
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
W4_WGMMA(half_t, "f16", 32, W4_R16, "%16, %17, %18, %19", "%20", "%21", W4_D8(0), W4_D8(8))
W4_WGMMA(bf16_t, "bf16", 32, W4_R16, "%16, %17, %18, %19", "%20", "%21", W4_D8(0), W4_D8(8))
W4_WGMMA(half_t, "f16", 64, W4_R32, "%32, %33, %34, %35", "%36", "%37", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24))
W4_WGMMA(bf16_t, "bf16", 64, W4_R32, "%32, %33, %34, %35", "%36", "%37", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24))
W4_WGMMA(half_t, "f16", 128, W4_R64, "%64, %65, %66, %67", "%68", "%69", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24),
         W4_D8(32), W4_D8(40), W4_D8(48), W4_D8(56))
W4_WGMMA(bf16_t, "bf16", 128, W4_R64, "%64, %65, %66, %67", "%68", "%69", W4_D8(0), W4_D8(8), W4_D8(16), W4_D8(24),
         W4_D8(32), W4_D8(40), W4_D8(48), W4_D8(56))
#undef W4_WGMMA
#undef W4_R64
#undef W4_R32
#undef W4_R16
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


// The tensor maps of a call: packed weights int32 [n][k / 8] in boxes of kWgmmaRows rows x 16
// words (one piece) with the 64-byte swizzle, and x [m][k] (rows stride_xm apart) in boxes of M_TILE
// rows x 64 k (half a piece) with the 128-byte swizzle. A kernel parameter (__grid_constant__).
#if W4_EMU
struct WgmmaMaps {
  ::w4emu::TensorMap w, x;
};
#else
struct WgmmaMaps {
  CUtensorMap w, x;
};
#endif

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
#if W4_EMU
  ::w4emu::mbarrier_init(shared_address(bar), count);
#else
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
#endif
}

// Makes this thread's mbarrier initializations visible to the TMA unit (a block barrier follows).
__device__ __forceinline__ void fence_barrier_init() {
#if !W4_EMU
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if W4_EMU
  ::w4emu::mbarrier_arrive(shared_address(bar), 0);
#else
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
#endif
}

// An arrival that also expects `bytes` of copies to complete the phase.
__device__ __forceinline__ void mbarrier_arrive_expect(uint64_t* bar, uint32_t bytes) {
#if W4_EMU
  ::w4emu::mbarrier_arrive(shared_address(bar), bytes);
#else
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#endif
}

// Until the mbarrier's phase of this parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if W4_EMU
  ::w4emu::mbarrier_wait(shared_address(bar), parity);
#else
  asm volatile(
      "{\n.reg .pred done;\nwait:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra wait;\n}\n" ::"r"(
          shared_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

// The box of `map` at element (c0, c1) into shared memory at dst, completing on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const WgmmaMaps& maps, bool x, int c0, int c1, uint64_t* bar) {
#if W4_EMU
  ::w4emu::tma_load_2d(shared_address(dst), x ? maps.x : maps.w, c0, c1, shared_address(bar));
#else
  const CUtensorMap* map = x ? &maps.x : &maps.w;
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(shared_address(bar))
      : "memory");
#endif
}

// This warpgroup's registers a thread, from the launch's even share (setmaxnreg; all its threads).
template <int N, bool MORE>
__device__ __forceinline__ void set_registers() {
#if !W4_EMU
  if constexpr (MORE) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
  }
#endif
}

// A barrier of the two warpgroups alone (the copy warpgroup has returned).
__device__ __forceinline__ void warpgroups_sync() {
#if W4_EMU
  ::w4emu::named_sync(1, kBlockThreads);
#else
  asm volatile("bar.sync 1, %0;" ::"n"(kBlockThreads) : "memory");
#endif
}

}  // namespace detail

template <typename T, int M_TILE, int G, bool SYM>
__global__ void W4_LAUNCH_BOUNDS(kWgmmaThreads, 1)
    wgmma_kernel(const SkinnyParams p, const __grid_constant__ detail::WgmmaMaps maps) {
#if W4_EMU || defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kRows = kWgmmaRows;
  constexpr int S = wgmma_stages(M_TILE);
  constexpr int kWeightUnits = kRows * kStreamPieceK / kLaneK;  // [rows][4 units]
  constexpr int kXUnits = M_TILE * kStreamPieceK / 8;          // 2 halves x [M_TILE][8 units]
  constexpr int kStageUnits = kWeightUnits + kXUnits;
  constexpr int kSteps = kStreamPieceK / 16;
  constexpr int kGroups = kStreamPieceK / G;  // groups of a row in a piece
  // Registers a thread: the copy warpgroup gives its share to the two that dequantize and multiply
  // (an SM sub-partition's 16384 holds a warp of each: 32 (40 + 2 x 232)).
  constexpr int kCopyRegisters = 40, kMathRegisters = 232;
  static_assert(kBlockThreads == 2 * 128 && kWgmmaThreads == kBlockThreads + 128 && (kWeightUnits * 16) % 1024 == 0 &&
                    (kStageUnits * 16) % 1024 == 0 && kStreamPieceK % G == 0 && S >= 3 &&
                    S * kStageUnits * 16 + 2 * S * 8 <= wgmma_shared_bytes(M_TILE),
                "two warpgroups and a copy warpgroup; 1024-byte aligned swizzled stages; groups tile a piece; barriers fit");
#if W4_EMU
  uint4* smem = ::w4emu::dynamic_shared<uint4>();
#else
  extern __shared__ __align__(1024) uint4 smem[];
#endif
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * kStageUnits);  // a stage's copies are in
  uint64_t* empty = full + S;                                            // its wgmma are retired

  const detail::TileBlock block = detail::tile_block(p, kRows, M_TILE);
  const int n0 = block.n0, m0 = block.m0, pb0 = block.pb0, count = block.count;
  const int groups = p.k / G;
  pdl_trigger();
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      detail::mbarrier_init(full + s, 1);
      detail::mbarrier_init(empty + s, kBlockThreads / 32);
    }
    detail::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x >= kBlockThreads) {
    detail::set_registers<kCopyRegisters, false>();
    // The copy lane: the first S pieces' weights while the previous kernel drains, their x after
    // pdl_wait, then each further piece once its stage's previous piece is released.
    if (threadIdx.x == kBlockThreads) {
      auto copy = [&](int f, bool weights, bool x) {
        uint4* stage = smem + f % S * kStageUnits;
        if (weights) detail::tma_load(stage, maps, false, (pb0 + f) * (kStreamPieceK / 8), n0, full + f % S);
        if (x)
          for (int h = 0; h < 2; ++h)
            detail::tma_load(stage + kWeightUnits + h * M_TILE * 8, maps, true, (pb0 + f) * kStreamPieceK + 64 * h, m0,
                             full + f % S);
      };
      const int early = min(count, S);
      for (int f = 0; f < early; ++f) {
        detail::mbarrier_arrive_expect(full + f, kStageUnits * 16);
        copy(f, true, false);
      }
      pdl_wait();
      for (int f = 0; f < early; ++f) copy(f, false, true);
      for (int f = S; f < count; ++f) {
        detail::mbarrier_wait(empty + f % S, (f / S - 1) & 1);
        detail::mbarrier_arrive_expect(full + f % S, kStageUnits * 16);
        copy(f, true, true);
      }
    }
    return;
  }

  detail::set_registers<kMathRegisters, true>();
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
  // Loaded groups as the pairs dequantization takes: piece e + 2's at the end of piece e.
  auto next_groups = [&](uint32_t (&sv)[2][kGroups], uint32_t (&zv)[2][kGroups]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        s2[i][g] = sv[i][g] * 0x10001u;
        nz[i][g] = detail::neg_magic<T>(zv[i][g]);
      }
  };
  pdl_wait();  // y (and the partial sums) may still be read by the previous kernel
  if (count <= 0) return;

  const uint64_t b_desc = detail::wgmma_descriptor(smem + kWeightUnits);
  float acc[M_TILE / 2] = {};
  // Piece f's two A rows (row0 and row0 + 8: the same swizzle, 32 units apart) from its stage.
  uint4 wv[2][4];
  auto load_rows = [&](int f) {
    const uint4* stage = smem + f % S * kStageUnits + 4 * row0;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int u = 0; u < 4; ++u) wv[i][u] = stage[32 * i + (u ^ (row0 / 2 % 4))];
  };
  // Step `step` of the loaded piece into `a`: word c = 2 step (A k 2t, 2t + 1) and c + 1 (k 2t + 8,
  // 2t + 9) of both rows.
  auto dequant_step = [&](int step, uint32_t (&a)[4]) {
    const int g = 16 * step / G;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = j % 2, c = 2 * step + j / 2;
      a[j] = detail::fragment_pair<T>(detail::word(wv[i][c / 4], c % 4), select, nz[i][g], s2[i][g]);
    }
  };
  auto wait_full = [&](int f) { detail::mbarrier_wait(full + f % S, (f / S) & 1); };
  // Piece e's wgmma from `a` (dequantized during piece e - 1), step by step, each followed by step s
  // of piece e + 1 into `b`: the wgmma that read b[s] (piece e - 1's step s) is retired by the wait
  // for at most 8 pending groups, and the warp dequantizes while the tensor cores run. The scales and
  // zeros of piece e + 3 are loaded into (ls, lz) and those of piece e + 2, loaded a piece earlier,
  // converted from (cs, cz), so that two pieces' time rather than one covers their load latency.
  auto piece = [&](int e, uint32_t (&a)[kSteps][4], uint32_t (&b)[kSteps][4], uint32_t (&ls)[2][kGroups],
                   uint32_t (&lz)[2][kGroups], uint32_t (&cs)[2][kGroups], uint32_t (&cz)[2][kGroups]) {
    if (e + 1 < count) wait_full(e + 1);
    load_groups(e + 3, ls, lz);
    load_rows(e + 1);
    // A descriptor's address field counts 16-byte units: a k16 step is 2 of them.
    const uint32_t b_units = e % S * kStageUnits;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const uint32_t units = b_units + step / 4 * M_TILE * 8 + 2 * (step % 4);
      detail::wgmma_fence();  // b's writes of the step before are ordered before this wgmma
      detail::wgmma_rs<T, M_TILE>(acc, a[step], detail::advance(b_desc, units));
      detail::wgmma_commit();
      detail::wgmma_wait<kSteps>();
      dequant_step(step, b[step]);
      detail::pin(b[step]);
    }
    // Every wgmma of piece e - 1 is retired: this warp is done with its stage.
    if (e > 0 && threadIdx.x % 32 == 0) detail::mbarrier_arrive(empty + (e - 1) % S);
    next_groups(cs, cz);
  };
  // Piece 0 into the first register set; then the two sets in turn.
  uint32_t a_even[kSteps][4], a_odd[kSteps][4];
  uint32_t rs[2][2][kGroups], rz[2][2][kGroups];
  {
    uint32_t s_first[2][kGroups], z_first[2][kGroups], s_next[2][kGroups], z_next[2][kGroups];
    load_groups(0, s_first, z_first);
    load_groups(1, s_next, z_next);
    load_groups(2, rs[0], rz[0]);
    next_groups(s_first, z_first);
    wait_full(0);
    load_rows(0);
#pragma unroll
    for (int step = 0; step < kSteps; ++step) dequant_step(step, a_even[step]);
    next_groups(s_next, z_next);
  }
  int e = 0;
  for (; e + 1 < count; e += 2) {
    piece(e, a_even, a_odd, rs[1], rz[1], rs[0], rz[0]);
    piece(e + 1, a_odd, a_even, rs[0], rz[0], rs[1], rz[1]);
  }
  if (e < count) piece(e, a_even, a_odd, rs[1], rz[1], rs[0], rz[0]);
  detail::wgmma_wait<0>();
  detail::fence_accumulators(acc);

  // The block's sums [M_TILE][red_stride(rows)], once every warp's wgmma are done with the stages.
  constexpr int kRed = detail::red_stride(kRows);
  static_assert(M_TILE * kRed * 4 <= S * kStageUnits * 16, "the sums fit the stages");
  detail::warpgroups_sync();
  float* red = reinterpret_cast<float*>(smem);
  {
    const int wg = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, quad = threadIdx.x % 32 / 4;
#pragma unroll
    for (int i = 0; i < M_TILE / 8; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        red[(8 * i + 2 * t + c % 2) * kRed + 64 * wg + 16 * warp + quad + 8 * (c / 2)] = acc[4 * i + c];
  }
  detail::warpgroups_sync();
  detail::store_block_tile<T>(p, block.ks, red, kRows, M_TILE, n0, m0);
#endif
}

namespace detail {

#if W4_EMU
inline WgmmaMaps wgmma_maps(const SkinnyParams& p, int m_tile) {
  WgmmaMaps maps;
  maps.w = {reinterpret_cast<const unsigned char*>(p.qweight), {p.k / 8, p.n}, p.k / 2, {16, kWgmmaRows}, 4, 64};
  maps.x = {static_cast<const unsigned char*>(p.x), {p.k, p.m}, 2 * p.stride_xm, {64, m_tile}, 2, 128};
  return maps;
}
#else
// One 2D tensor map (cuTensorMapEncodeTiled through the runtime's driver entry point, so that the
// extension needs no link to the driver library).
inline void encode_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, uint64_t cols, uint64_t rows,
                       uint64_t row_bytes, uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) throw std::runtime_error("the wgmma kernel needs cuTensorMapEncodeTiled, which this CUDA driver lacks");
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t unit[2] = {1, 1};
  const CUresult r = encode(map, type, 2, const_cast<void*>(base), dims, strides, box, unit,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw std::runtime_error("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(static_cast<int>(r)) +
                             ") for a tensor of " + std::to_string(rows) + " rows x " + std::to_string(cols) +
                             " elements, rows " + std::to_string(row_bytes) + " bytes apart");
  }
}

inline WgmmaMaps wgmma_maps(const SkinnyParams& p, int m_tile) {
  WgmmaMaps maps;
  encode_map(&maps.w, CU_TENSOR_MAP_DATA_TYPE_UINT32, p.qweight, p.k / 8, p.n, p.k / 2, 16, kWgmmaRows,
             CU_TENSOR_MAP_SWIZZLE_64B);
  encode_map(&maps.x, CU_TENSOR_MAP_DATA_TYPE_UINT16, p.x, p.k, p.m, 2 * p.stride_xm, 64, m_tile,
             CU_TENSOR_MAP_SWIZZLE_128B);
  return maps;
}
#endif

// The warpgroup kernel for the plan's M tile, then the reduction of its split.
template <typename T>
void launch_wgmma(const SkinnyParams& p, const SkinnyPlan& plan, stream_t stream) {
  with_group(p, [&](auto g, auto sym) {
    constexpr int G = decltype(g)::value;
    constexpr bool SYM = decltype(sym)::value;
    auto run = [&](auto kernel, int m_tile) {
      const WgmmaMaps maps = wgmma_maps(p, m_tile);
#if W4_EMU
      (void)stream;
      ::w4emu::launch_args(kernel, plan.blocks, kWgmmaThreads, plan.shared_bytes, p, maps);
#else
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.shared_bytes);
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr.val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(plan.blocks);
      config.blockDim = dim3(kWgmmaThreads);
      config.dynamicSmemBytes = plan.shared_bytes;
      config.stream = stream;
      config.attrs = &attr;
      config.numAttrs = p.overlap == kOverlapNone ? 0 : 1;
      cudaLaunchKernelEx(&config, kernel, p, maps);  // an error stays for the caller's launch check
#endif
    };
    switch (wgmma_m(p.m)) {
      case 32: run(wgmma_kernel<T, 32, G, SYM>, 32); break;
      case 64: run(wgmma_kernel<T, 64, G, SYM>, 64); break;
      default: run(wgmma_kernel<T, 128, G, SYM>, 128);
    }
  });
  launch_reduce<T>(p, stream);
}

}  // namespace detail

}  // namespace w4
#endif  // !W4_HIP

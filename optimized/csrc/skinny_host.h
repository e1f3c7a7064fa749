// What the host needs of the skinny kernels, free of torch and of any GPU runtime header: the
// limits, the variants and overlap modes, one call's parameters (SkinnyParams), the plan of a
// call (variant, split, shared memory, workspace) and the launch entry point. The kernels
// (skinny_core.cuh) include it too; the torch binding (skinny_binding.cpp) includes only this,
// so that the host C++ compiler, not nvcc, builds the code that checks arguments and raises.
#pragma once

#include <cmath>
#include <cstdint>

// W4_HIP: 1 on ROCm. compat.h sets it for the kernels' units; a host-only unit (the binding,
// hipified and built by the host compiler on ROCm) sees the platform macro PyTorch passes.
#ifndef W4_HIP
#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(USE_ROCM)
#define W4_HIP 1
#else
#define W4_HIP 0
#endif
#endif

// Functions the kernels call too.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define W4_HD __host__ __device__
#else
#define W4_HD
#endif

namespace w4 {

constexpr int kBlockThreads = 256;
constexpr int kMaxM = 16;
constexpr int kLaneK = 32;          // k per lane, row and iteration: one 16-byte load
constexpr int kIterK = 4 * kLaneK;  // k per iteration: the 4 lanes of a quad side by side
constexpr int kLaneRows = 2;        // rows per lane, in both kernels
// A row's K is split over a quad, so a block covers kBlockThreads / 4 * kLaneRows (row, K-slice)
// pairs whatever the warp size: rows per block = kTileRows / split.
constexpr int kTileRows = kBlockThreads / 4 * kLaneRows;
constexpr int kMinBlocks = 2;   // both kernels' launch bounds: blocks resident per SM
// The segmented kernel's largest M (at M_PAD = 8 a segment is the pipelined kernel's 64 bytes,
// so it would only repeat regs_s4), and its rows per lane.
constexpr int kSegMaxM = 4;
constexpr int kSegRowSets = 4;
constexpr int kPipeStages = 4;  // the pipelined kernel's ring entries per lane

enum class Engine : int { kSimt = 0, kMma = 1 };

// The kernels, for the op's `variant` argument; optimized/skinny.py VARIANTS lists the names in
// the same order:
// kVariantNames: base, regs_s4, seg_r4, seg_xs, stream, seg_p
enum Variant : int {
  kVariantBase = 0,
  kVariantRegs = 1,
  kVariantSeg = 2,
  kVariantSegXs = 3,
  kVariantStream = 4,
  kVariantSegPersist = 5
};
constexpr int kNumVariants = 6;
constexpr int kAutoVariant = -1;  // default_variant(m, n, k), per call

// How a call overlaps the kernel before it on the stream; optimized/skinny.py OVERLAPS lists the
// names in the same order:
//  * kOverlapNone: a plain launch; the kernel starts when the previous one has finished.
//  * kOverlapWeights (CUDA sm_90+, programmatic dependent launch; the host settles it to
//    kOverlapNone elsewhere): the kernel may launch while the previous one drains. Its warps load
//    their first ring entries (the base kernel: its first batch) of weights, scales and zero
//    points, then wait for the previous kernel (pdl_wait) before reading x or writing y, so HBM
//    stays busy through that kernel's tail. Only for weights, scales and zero points that the
//    previous kernel does not write (prepared once, then read-only): they are read-only (.nc)
//    loads, which ptxas moves across the wait at will, while x and bias (which the hybrid op pads
//    just before a call) are read with coherent loads (load_x, load_bias) that stay after it.
// Every kernel calls pdl_trigger first, so that the next call may overlap this one in turn, and
// pdl_wait, which returns at once after a plain launch.
enum Overlap : int { kOverlapNone = 0, kOverlapWeights = 1 };
constexpr int kNumOverlaps = 2;

// The default: seg_p up to M = kSegMaxM (seg_xs's kernel on a persistent grid with each block's
// iterations split evenly over its warps, where seg_persist_blocks gives it a grid; seg_xs
// elsewhere; seg_xs is seg_r4 at split 1, see seg_x_shared_bytes), above it by the shape regs_s4
// (to kRegsMaxM) or base, or stream (see kStreamMinK below; where stream cannot run, regs_s4 or
// base, see settle_variant). seg_p's grid rule is fitted over M = 1, 2 and 4 (seg_persist_blocks);
// before it (whole row groups a warp) seg_p ran at M = 1 alone. Stream
// against base at M = 9 and 16 on an H100 (session 22; 5 decode shapes x fp16 sym / bf16 asym,
// bench/results/h100/skinny_variants_s22.txt): 1.04-1.65x faster at M = 16 in all 10 cells,
// 1.16-1.39x at M = 9 in 8 of 10 and 4% slower on K14336 x N4096; at M = 5..8 it was slower than
// regs_s4 in 9 of 20 cells (0.83x at worst), so regs_s4 kept them then. Before it, on the H200
// (mma engine, 5 decode shapes x fp16 sym / bf16 asym at M in {1, 2, 4, 5, 8, 9, 16};
// bench/results/h200/skinny_variants_log.txt, v0/v1 = base under its
// old and its present split policy, v2 = regs_s4), regs_s4 was the fastest of the three in 42 of
// 50 cells at M <= 8, base in 13 of 20 at M = 9 and 16. Against seg_r4 at M = 1..4 on every
// fixture shape (27 shapes; skinny_h200_seg_r4.md against skinny_h200_regs_default.md), regs_s4
// took 1.074x seg_r4's time with zero points (geometric mean; 1.097x where the floor is >= 7 us;
// faster in 20 of 108 cells) and 0.999x without (faster in 53 of 108), so symmetric weights kept
// regs_s4 until both kernels scaled after the mma at G = 128: then seg_xs was faster than or within
// 1% of regs_s4 in all 15 fp16 symmetric cells at M 1, 2, 4 (skinny_variants_s16.txt).
constexpr int kRegsMaxM = 8;

// Above kSegMaxM the kernel follows the shape. The streaming kernel has fixed costs the
// register-ring kernels lack (x staged in every block, and over a K split a second kernel and fp32
// partial sums), but it streams at a steadier rate and splits a long K over blocks, which gives a
// few rows of long K the blocks the other kernels cannot; so it runs from a K or a size of the
// weights (N K / 2) on. Every fixture shape x fp16 sym / bf16 asym at M 5, 8, 9, 12, 16 on the
// H200, each cell against the fastest of regs_s4, stream and base
// (bench/results/h200/skinny_variants_s29.txt, fit_policy_s29.md): at M = 5..8, stream from
// K 6144 or 28 MiB and regs_s4 elsewhere took 1.032x the fastest's time (geometric mean; 1.31x at
// worst; the size alone: 1.049x; regs_s4 everywhere, the rule before: 1.089x, 1.53x at worst); at
// M 9..16, stream from K 6144 or 20 MiB and base elsewhere 1.020x (1.31x; the size alone 1.027x;
// stream everywhere, the rule before: 1.141x, 2.23x at worst). Against the rule before, cell by
// cell: 0.915x its time (geometric mean over the 250 cells), 0.48x at best, 1.21x at worst.
constexpr int kStreamMinK = 6144;
constexpr int64_t kStreamMinBytesMid = 28ll << 20;   // M = kSegMaxM + 1 .. kRegsMaxM
constexpr int64_t kStreamMinBytesHigh = 20ll << 20;  // above kRegsMaxM

W4_HD constexpr int default_variant(int m, int n, int k) {
  if (m <= kSegMaxM) return kVariantSegPersist;
  const int64_t stream_from = m <= kRegsMaxM ? kStreamMinBytesMid : kStreamMinBytesHigh;
  if (k >= kStreamMinK || static_cast<int64_t>(n) * k / 2 >= stream_from) return kVariantStream;
  return m <= kRegsMaxM ? kVariantRegs : kVariantBase;
}

// The variant asked for: `variant` itself, or for kAutoVariant the default for the call's shape.
W4_HD constexpr int resolve_variant(int variant, int m, int n, int k) {
  return variant == kAutoVariant ? default_variant(m, n, k) : variant;
}

W4_HD constexpr bool is_seg(int variant) {
  return variant == kVariantSeg || variant == kVariantSegXs || variant == kVariantSegPersist;
}

// The streaming kernel's unit of K: one ring slot holds 32 rows x kStreamPieceK k.
constexpr int kStreamPieceK = 128;

// Columns of x the segmented kernel's mma tile holds: M rounded up to a power of two.
W4_HD constexpr int seg_m_pad(int m) { return m <= 1 ? 1 : m <= 2 ? 2 : 4; }

// seg_xs's shared copy of x: M_PAD rows of K 16-bit values, at most kSegXsMaxBytes so that
// kMinBlocks blocks still share an SM (the H200 has 228 KiB per SM). Every block copies all of
// it, 4 / (rows per block) of the bytes of its weights (1/8 at split 1). Against seg_r4 on the
// H200 (skinny_variants_xs.md, M <= 4 on 5 large shapes): 6-9% faster in the 4 cells at split 1,
// -3% to +3% at split 2, up to 15% and 33% slower at split 4 and 8. 0: the call runs seg_r4.
constexpr int kSegXsMaxBytes = 96 * 1024;
W4_HD constexpr int seg_x_shared_bytes(int m, int k, int split) {
  return split == 1 && static_cast<long long>(seg_m_pad(m)) * 2 * k <= kSegXsMaxBytes ? seg_m_pad(m) * 2 * k : 0;
}

// The kernel that runs for a resolved variant: the segmented ones exist for the mma engine at
// M <= kSegMaxM, other calls of them run regs_s4, and seg_p where x fits in shared memory
// (seg_x_shared_bytes at split 1), seg_r4 elsewhere; the streaming one for the mma engine at
// K % kStreamPieceK == 0, other calls of it run what the default ran before it: regs_s4 up to
// kRegsMaxM, base above.
W4_HD constexpr int settle_variant(int variant, int m, bool mma, int k) {
  return is_seg(variant) && (!mma || m > kSegMaxM)                             ? kVariantRegs
         : variant == kVariantSegPersist && seg_x_shared_bytes(m, k, 1) == 0 ? kVariantSeg
         : variant == kVariantStream && (!mma || k % kStreamPieceK != 0)     ? (m <= kRegsMaxM ? kVariantRegs : kVariantBase)
                                                                              : variant;
}

// One call's arguments, in the layout of optimized/contract.py (T = half_t or bf16_t):
//   x        T [m, k], row stride stride_xm elements, unit stride along k; 16-byte aligned rows.
//   qweight  [n, k/8] 32-bit words, contiguous, 16-byte aligned (k % 32 == 0 follows from
//            group_size | k).
//   scales   T [n, k/group_size], contiguous.
//   zeros    [n/8, k/group_size] 32-bit words packed along n, or nullptr (symmetric, z = 8).
//   bias     T [n] or nullptr.
//   y        T [m, n], contiguous.
//   partials fp32 [split][m][n], the streaming kernel's workspace when split > 1 (else unused).
struct SkinnyParams {
  const void* x;
  const uint32_t* qweight;
  const void* scales;
  const uint32_t* zeros;
  const void* bias;
  void* y;
  float* partials;
  int64_t stride_xm;
  int m, n, k;
  int group_size;  // 32, 64 or 128
  int split;       // warps of a block sharing each row, splitting K: 1, 2, 4 (or 8 on wave32);
                   // the streaming kernel: blocks sharing each row (stream_workspace_floats);
                   // seg_p: 1
  int blocks;      // seg_p: its grid (plan_persist); other kernels size their own grid
  int stages;      // the streaming kernel: ring slots per warp (stream_stages); other kernels: unused
  int variant;     // a Variant (resolve_variant)
  int overlap;     // an Overlap
};

// What the plan needs of the device.
struct DeviceLimits {
  int num_sms;
  int warp_size;
  int max_shared;   // dynamic shared memory a block may opt into
  int smem_per_sm;  // shared memory an SM holds
};

// The streaming kernel's tiling and shared-memory layout (host and device; see below).
constexpr int kStreamStages = 4;                              // ring slots per warp
constexpr int kStreamFewStages = 2;                           // the shallow ring (stream_stages)
constexpr int kStreamSlotUnits = 32 * kStreamPieceK / 32;     // 16-byte units a slot: 32 rows x 4
constexpr int kStreamMinBlocks = 2;  // launch bounds: registers for two blocks an SM
// Shared memory the CUDA driver keeps for itself in each resident block (sm_80 and later).
constexpr int kSharedReservePerBlock = 1024;

// Warps along N: 32 warps_n rows a block, so that x (M rows, staged once a block) is at most a
// quarter of the bytes of the weights it meets (4 M / rows).
W4_HD constexpr int stream_warps_n(int m) { return m <= 2 ? 1 : m <= 4 ? 2 : m <= 8 ? 4 : 8; }

// The largest M with m's block layout (M 1..2, 3..4, 5..8, 9..16 share one each). The split is
// planned for it, so that every M of a bucket runs the same tiles, split and summation order, and
// row i of the output does not depend on M within the bucket.
W4_HD constexpr int stream_bucket_m(int m) { return m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : kMaxM; }

struct StreamLayout {
  int stages;                  // ring slots per warp
  int warps_n, warps_k, rows;  // rows = 32 warps_n
  int pieces;                  // the most pieces (128 k) of any block's K range
  int groups;                  // groups in `pieces`
  int x_units;                 // 16-byte units of one staged x row
  int scale_stride;            // halves of one staged scale row
  int x_offset, scale_offset, zero_offset, bytes;  // byte offsets into dynamic shared memory
};

W4_HD inline StreamLayout stream_layout(int m, int k, int group_size, bool sym, int split, int stages) {
  StreamLayout L{};
  L.stages = stages;
  L.warps_n = stream_warps_n(m);
  L.warps_k = kBlockThreads / 32 / L.warps_n;
  L.rows = 32 * L.warps_n;
  const int total = k / kStreamPieceK;
  L.pieces = (total + split - 1) / split;
  L.groups = L.pieces * (kStreamPieceK / group_size);
  L.x_units = 16 * L.pieces + 4;
  L.scale_stride = L.groups + (6 - L.groups % 4) % 4;
  L.x_offset = kBlockThreads / 32 * stages * kStreamSlotUnits * 16;
  L.scale_offset = L.x_offset + m * L.x_units * 16;
  L.zero_offset = L.scale_offset + (L.rows * L.scale_stride * 2 + 15) / 16 * 16;
  L.bytes = L.zero_offset + (sym ? 0 : L.rows / 8 * L.groups * 4);
  return L;
}

// The streaming kernel's ring depth at a split. Its blocks need so much shared memory (x of the
// block's K range, 2 bytes x M per k, beside the rings) that at M = 10..16 often one block fits an
// SM. Where the grid has more blocks than SMs, an SM then runs its blocks one after another, each
// ramping up and draining alone with 8 warps' loads in flight: on an H100 that took 1.26x as long
// (K8192 x N57344 at split 4, 150.4 us at M = 10 against 119.8 us at M = 9, whose 4 KB less x
// let two blocks in; bench/results/h100/skinny_s27_before.md). So there the ring is kStreamStages
// slots where kStreamMinBlocks blocks fit an SM with them, else kStreamFewStages where that lets
// them fit (0.79-0.89x the time at M 10..16 of that shape, skinny_s27_stages.md). A grid of at
// most one block an SM keeps the deep ring: 2 slots were 1.16-1.33x slower there (K4096 x N28672,
// K2048 x N32768 at M 10..16, where a block had its SM to itself either way).
W4_HD inline int stream_blocks(int n, int m, int split) {
  const int rows = 32 * stream_warps_n(m);
  return (n + rows - 1) / rows * split;
}
W4_HD inline int stream_resident_blocks(const StreamLayout& L, int smem_per_sm) {
  return smem_per_sm / (L.bytes + kSharedReservePerBlock);
}
W4_HD inline int stream_stages(int n, int m, int k, int group_size, bool sym, int split, const DeviceLimits& d) {
  const int depths[2] = {kStreamStages, kStreamFewStages};
  for (int blocks = stream_blocks(n, m, split) > d.num_sms ? kStreamMinBlocks : 1; blocks >= 1; --blocks) {
    for (int stages : depths) {
      if (stream_resident_blocks(stream_layout(m, k, group_size, sym, split, stages), d.smem_per_sm) >= blocks) {
        return stages;
      }
    }
  }
  return kStreamStages;
}
W4_HD inline StreamLayout stream_plan_layout(int n, int m, int k, int group_size, bool sym, int split,
                                             const DeviceLimits& d) {
  return stream_layout(m, k, group_size, sym, split, stream_stages(n, m, k, group_size, sym, split, d));
}

// ---------------------------------------------------------------------------------------------
// The K split of a call.

// Larger blocks (split 1: tile_rows rows) fetch each x element once for more rows; smaller ones
// make more blocks, so that every SM has work and the last wave is short. Decode at small M
// needs little x traffic, so it favours many blocks.
//
// The base kernel: the smallest split that gives num_sms * 8 blocks (or the largest split). On
// the H200 this policy was never slower than aiming at num_sms * 2 blocks above M = 4 beyond
// noise, and it removed a step in time from M = 4 to 5 (skinny_variants_log.txt: v1 against v0).
//
// The segmented kernels (seg_r4, seg_xs): the smallest split whose grid has a block for every SM
// (else the largest that leaves every warp an iteration of K). Fewer, larger blocks keep x in
// shared memory (split 1) and share it over more rows, but a grid short of the SMs leaves some
// idle. Against every forced split on an H100 (bench/results/h100/seg_xs_split_s28_{a,b}.md, 25
// fixture shapes x M 1..4, bf16 asym) this took 1.0016x the fastest split's time (geometric mean),
// 1.04x at worst. Aiming at 120% of the SMs instead: 1.010x, 1.23x at worst (K3584 x N4608 at
// M = 1: 144 blocks, short of 158, so split 2, 8.1 us against 6.5 at split 1); at 95%: 1.087x,
// 1.62x at worst (K28672 x N8192 at M = 2: split 1's 128 blocks on 132 SMs, 79.4 against 49.1 us
// at split 2). The wave model below (the rule before session 28) took 1.22x.
//
// The pipelined kernel: the split with the least modelled wave quantization,
// among those that leave every warp an iteration of K. Its blocks are
// equal, so they run in waves of num_sms * kMinBlocks (its occupancy); counting time in
// block-times of a busy SM, a full wave takes kMinBlocks and a last partial wave takes its most
// loaded SM's block count, at least 2 (an SM with one block is assumed to run at half speed, as a
// block's loads in flight cover about half an SM's share of the bandwidth). Efficiency = ideal /
// modelled time; a larger split must beat a smaller one by 2% (larger blocks share x better).
//
// variant: the kernel that runs (settle_variant's result).

// Rows a block covers at split 1.
inline int tile_rows(int variant, int m) {
  return is_seg(variant) ? kBlockThreads / 32 * kSegRowSets * seg_m_pad(m) : kTileRows;
}

inline int choose_split(int n, int m, int k, int num_sms, int warp_size, int variant) {
  const int warps = kBlockThreads / warp_size;
  const int rows = tile_rows(variant, m);
  if (variant == kVariantSegPersist) return 1;
  if (is_seg(variant)) {
    const int iters = (k + 8 / seg_m_pad(m) * kIterK - 1) / (8 / seg_m_pad(m) * kIterK);
    int split = 1;
    while (split * 2 <= warps && split * 2 <= iters && (n + rows / split - 1) / (rows / split) < num_sms) {
      split *= 2;
    }
    return split;
  }
  if (variant != kVariantBase) {
    const int iters = (k + kIterK - 1) / kIterK;
    const int slots = num_sms * kMinBlocks;
    double best = -1.0;
    int best_split = 1;
    for (int split = 1; split <= warps && split <= iters; split *= 2) {
      const int blocks = (n + rows / split - 1) / (rows / split);
      const int tail = (blocks % slots + num_sms - 1) / num_sms;
      const double time = static_cast<double>(blocks / slots) * kMinBlocks + (tail == 0 ? 0 : tail < 2 ? 2 : tail);
      const double efficiency = static_cast<double>(blocks) / num_sms / time;
      if (efficiency > best + 0.02) {
        best = efficiency;
        best_split = split;
      }
    }
    return best_split;
  }
  const int target_blocks = num_sms * 8;
  int split = 1;
  while (split < warps && (n + rows / split - 1) / (rows / split) < target_blocks) split *= 2;
  return split;
}

#if !W4_HIP
// The streaming kernel's split (blocks along K), from a model of its time in microseconds:
//  * weights at 4 TB/s, spread over SMs in whole blocks: the most loaded SM sets the time
//    (ceil(blocks / num_sms) blocks' bytes at an SM's share), and an SM with fewer than 1.5 blocks
//    on average is taken to reach 1/1.15 of its share (one block's ring in flight);
//  * a split of more blocks than SMs whose blocks fit one an SM (stream_stages) takes
//    kStreamOneBlockCost times as long;
//  * split > 1 adds the partial sums (16 M split / K of the weight bytes, written and read at
//    about twice HBM speed in L2) and the reduce kernel's launch (1.5 us);
// among the splits whose shared memory fits max_shared and that leave every warp a piece. A
// larger split must win by 2%. Planned for stream_bucket_m(m), so the split is the same for
// every M of a bucket.
constexpr double kStreamOneBlockCost = 1.26;
inline int choose_stream_split(int n, int m_call, int k, int group_size, bool sym, const DeviceLimits& d) {
  const int m = stream_bucket_m(m_call);
  const int warps_k = kBlockThreads / 32 / stream_warps_n(m);
  const int rows = 32 * stream_warps_n(m);
  const int total = k / kStreamPieceK;
  const int row_blocks = (n + rows - 1) / rows;
  const double weight_us = static_cast<double>(n) * k / 2 / 4.0e6;
  double best = 0.0;
  int best_split = 0;
  for (int split = 1; split <= total && (split == 1 || split * warps_k <= total); ++split) {
    const StreamLayout L = stream_plan_layout(n, m, k, group_size, sym, split, d);
    if (L.bytes > d.max_shared) continue;
    const double per_sm = static_cast<double>(row_blocks) * split / d.num_sms;
    double time = weight_us * std::ceil(per_sm) / per_sm * (per_sm < 1.5 ? 1.15 : 1.0);
    if (per_sm > 1.0 && stream_resident_blocks(L, d.smem_per_sm) < kStreamMinBlocks) time *= kStreamOneBlockCost;
    if (split > 1) time += weight_us * 16.0 * m * split / k * 0.5 + 1.5;
    if (best_split == 0 || time < best * 0.98) {
      best = time;
      best_split = split;
    }
  }
  return best_split > 0 ? best_split : total;
}
#endif

// p.split for a call whose p.variant is settled and whose other fields are set.
inline int plan_split(const SkinnyParams& p, const DeviceLimits& d) {
#if !W4_HIP
  if (p.variant == kVariantStream) {
    return choose_stream_split(p.n, p.m, p.k, p.group_size, p.zeros == nullptr, d);
  }
#endif
  return choose_split(p.n, p.m, p.k, d.num_sms, d.warp_size, p.variant);
}

// p.stages, once p.split is set (planned or forced): the streaming kernel's ring depth.
inline void plan_stages(SkinnyParams& p, const DeviceLimits& d) {
  p.stages = p.variant == kVariantStream
                 ? stream_stages(p.n, p.m, p.k, p.group_size, p.zeros == nullptr, p.split, d)
                 : 0;
}

// seg_p's grid: every SM's kMinBlocks blocks (fewer where there are fewer row groups), each
// running its share of the row groups (kSegRowSets x M_PAD rows, all of K) with the iterations
// split evenly over its warps (see skinny_seg_kernel), so that loads run on from one row group
// into the next with no block launch, wave or tail between them; or 0 blocks, and seg_xs runs.
// seg_p has costs seg_xs lacks under a split (every block stages all of x, and row groups the
// warps cut are added at the end of the block), so it runs only where seg_xs leaves time to win:
// where seg_xs's grid at split 1 is more than one wave of kMinBlocks blocks an SM, or where its
// planned grid loads the SMs unevenly (blocks under kSegPersistMaxLoad % of the most an SM gets,
// times the SMs), and only where a warp gets kSegPersistMinIters iterations or more (the ring
// never fills on fewer). On one H100 (bench/results/h100/seg_p_s30.md; every fixture shape x
// fp16 sym / bf16 asym at M 1, 2, 4, 150 cells) this took 1.0008x the faster kernel's time
// (geometric mean; 1.059x at worst), seg_xs alone 1.022x (1.31x), seg_p alone 1.12x (1.81x; up to
// 1.4x on shapes of one wave or less); the thresholds gave the same choices from 4 to 5.5
// iterations and from 75 to 85 %. seg_p took 0.80-0.88x seg_xs's time on K8192 x N10240 at
// M 1 and 2 (1.21 waves), 0.76-0.93x on K3584 x N37888.
// The plan before (whole row groups a warp where that gave 2 or more a warp on 75% of the warp
// slots; M = 1 only) took 0.82-0.995x seg_xs's time in the 36 cells it covered on one H100
// (skinny_s26.md against skinny_s26_seg_xs.md).
constexpr int kSegPersistMinIters = 4;
constexpr int kSegPersistMaxLoad = 80;
inline int seg_persist_blocks(int n, int m, int k, int num_sms) {
  const int warps_per_block = kBlockThreads / 32;
  const int64_t unit_rows = static_cast<int64_t>(kSegRowSets) * seg_m_pad(m);
  const int64_t units = (n + unit_rows - 1) / unit_rows;
  const int64_t iter_k = static_cast<int64_t>(8 / seg_m_pad(m)) * kIterK;
  const int64_t iters = units * ((k + iter_k - 1) / iter_k);
  const int64_t max_blocks = static_cast<int64_t>(num_sms) * kMinBlocks;
  if (iters < kSegPersistMinIters * max_blocks * warps_per_block) return 0;
  // The segmented kernels run on 32-lane warps only (skinny_seg_kernel).
  const int rows = tile_rows(kVariantSegXs, m) / choose_split(n, m, k, num_sms, 32, kVariantSegXs);
  const int64_t xs_blocks = (n + rows - 1) / rows;
  const int64_t most_per_sm = (xs_blocks + num_sms - 1) / num_sms;
  const bool waves = units > max_blocks * warps_per_block;
  const bool uneven = 100 * xs_blocks < kSegPersistMaxLoad * most_per_sm * num_sms;
  if (!waves && !uneven) return 0;
  return static_cast<int>(units < max_blocks ? units : max_blocks);
}

// For a call whose p.variant is settled and whose other fields but the split are set: seg_p's
// grid (p.blocks), or p.variant = seg_xs where it has none. Before plan_split.
inline void plan_persist(SkinnyParams& p, int num_sms) {
  if (p.variant != kVariantSegPersist) return;
  p.blocks = seg_persist_blocks(p.n, p.m, p.k, num_sms);
  if (p.blocks == 0) p.variant = kVariantSegXs;
}

// fp32 elements of p.partials the call needs (0: none).
inline int64_t stream_workspace_floats(const SkinnyParams& p) {
  return p.variant == kVariantStream && p.split > 1 ? static_cast<int64_t>(p.split) * p.m * p.n : 0;
}

// Queues the kernels of one call on `stream` (a cudaStream_t, or hipStream_t on ROCm). p must be
// complete: validated arguments (1 <= m <= kMaxM, group_size in {32, 64, 128}, alignment), p.variant
// settled (settle_variant(resolve_variant(...), ...)), p.split set (plan_split, or a checked forced
// split), plan_persist and plan_stages applied, p.partials set where stream_workspace_floats(p) > 0,
// p.overlap settled for the device.
// x, scales, bias and y are bfloat16 when bf16, else float16. kMma needs CUDA sm_80+; on HIP only
// kSimt is compiled. Defined in skinny_launch.cu; a launch error is left for the caller's check.
void launch(const SkinnyParams& p, Engine engine, bool bf16, void* stream);

}  // namespace w4

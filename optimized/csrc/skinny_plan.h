// The skinny kernel's host side, free of torch and of any GPU runtime header: its structural
// limits, the kernels, engines and overlap modes, one call's arguments (SkinnyParams), what a plan
// reads (PlanRequest, SkinnyPolicy, DeviceLimits) and plan_call, the one function that decides what
// a call runs. The kernels include it for the limits; the torch binding and the emulator's plan mode
// include only this, so the host compiler alone builds the code that checks requests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

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

// ---------------------------------------------------------------------------------------------
// Structural limits: tile sizes and warp layout the kernels are written for.

constexpr int kBlockThreads = 256;
constexpr int kMaxM = 16;  // the register, segmented and stream kernels' largest M; the tile kernel takes any
constexpr int kLaneK = 32;          // k per lane, row and iteration: one 16-byte load
constexpr int kIterK = 4 * kLaneK;  // k per iteration: the 4 lanes of a quad side by side
constexpr int kLaneRows = 2;        // rows per lane in the batch and ring kernels
// A row's K is split over a quad, so a batch or ring block covers kBlockThreads / 4 * kLaneRows
// (row, K-slice) pairs whatever the warp size: rows per block = kTileRows / split.
constexpr int kTileRows = kBlockThreads / 4 * kLaneRows;
constexpr int kMinBlocks = 2;  // the register kernels' launch bounds: blocks resident per SM
// The segmented kernels' largest M (at 8 padded rows a segment would be the ring's 64 bytes, so the
// kernel would only repeat the ring) and their row sets per lane.
constexpr int kSegMaxM = 4;
constexpr int kSegRowSets = 4;
constexpr int kRingStages = 4;  // the ring kernel's register ring entries per lane
// The segmented kernels' static shared memory at most (the persistent kernel's two partial-sum
// slots a warp and its block plan); x staged in dynamic shared memory must fit beside it.
constexpr int kSegStaticShared = 2 * (kBlockThreads / 32) * kSegRowSets * 4 * 8 * 4 + 2 * 4;

// The streaming kernel's tiling and shared-memory layout (host and device; see stream_layout).
constexpr int kStreamPieceK = 128;                         // one ring slot: 32 rows x kStreamPieceK k
constexpr int kStreamStages = 4;                           // ring slots per warp
constexpr int kStreamFewStages = 2;                        // the shallow ring (stream_stages)
constexpr int kStreamSlotUnits = 32 * kStreamPieceK / 32;  // 16-byte units a slot: 32 rows x 4
constexpr int kStreamMinBlocks = 2;                        // launch bounds: registers for two blocks an SM
constexpr int kTileStages = 4;                             // the tile kernel's shared-memory stages
constexpr int kWgmmaRows = 128;                            // the warpgroup kernel's rows: two warpgroups of 64
constexpr int kWgmmaThreads = kBlockThreads + 128;         // its block: those two and a copy warpgroup
// Shared memory the CUDA driver keeps for itself in each resident block (sm_80 and later).
constexpr int kSharedReservePerBlock = 1024;

// ---------------------------------------------------------------------------------------------
// Names the op's string arguments take; optimized/skinny.py ENGINES, KERNELS and OVERLAPS list
// the same names in the same order.

// How each weight meets x: kMma, tensor-core mma.sync (CUDA sm_80+); kSimt, fp32 dot products on
// every platform (the only engine on HIP). An engine request may also be "auto".
enum class Engine : int { kSimt = 0, kMma = 1 };
constexpr int kNumEngineNames = 3;
constexpr const char* kEngineNames[kNumEngineNames] = {"auto", "mma", "simt"};
constexpr int kEngineNameMma = 1, kEngineNameSimt = 2;  // indices into kEngineNames

// The kernels, by mechanism (one header each):
//  * kBatch (skinny_batch.cuh): a warp issues the loads of a batch of iterations, waits, computes.
//  * kRing (skinny_ring.cuh): a register ring keeps the loads of the next iterations in flight
//    while the warp computes one.
//  * kSegment, kSegmentSmem, kSegmentPersistent (skinny_segment.cuh; mma engine, M <= kSegMaxM):
//    a register ring whose quads read consecutive K segments of the same rows, so one load reads
//    up to 512 contiguous bytes; x read from global memory, x staged in shared memory, and x staged
//    on a persistent grid whose warps run their share of row groups back to back.
//  * kStream (skinny_stream.cuh; mma engine, K % kStreamPieceK == 0): weights stream through a
//    shared-memory ring by asynchronous copies; blocks may split K, a second kernel adding their
//    fp32 partial sums in a fixed order.
//  * kTile (skinny_tile.cuh; mma engine, K % kStreamPieceK == 0, any M): weights and x stream
//    through shared-memory stages shared by the block, which owns an output tile of N x M rows;
//    the only kernel above kMaxM on devices without wgmma. It splits K as the stream kernel does.
//  * kWgmma (skinny_wgmma.cuh; compute capability 9.0, K % kStreamPieceK == 0, M > kMaxM): the
//    tile kernel's tiles and split on warpgroup MMA, the weights dequantized into its register operand.
enum Kernel : int { kBatch = 0, kRing = 1, kSegment = 2, kSegmentSmem = 3, kSegmentPersistent = 4, kStream = 5,
                    kTile = 6, kWgmma = 7 };
constexpr int kNumKernels = 8;
constexpr const char* kKernelNames[kNumKernels] = {"batch", "ring", "segment", "segment_smem", "segment_persistent",
                                                   "stream", "tile", "wgmma"};

W4_HD constexpr bool is_segment(int kernel) {
  return kernel == kSegment || kernel == kSegmentSmem || kernel == kSegmentPersistent;
}

// The kernels whose split is blocks along K (whole 128-k pieces each), not warps of a block.
W4_HD constexpr bool splits_blocks(int kernel) { return kernel == kStream || kernel == kTile || kernel == kWgmma; }

// How a call overlaps the kernel before it on the stream:
//  * kOverlapNone: a plain launch; the kernel starts when the previous one has finished.
//  * kOverlapWeights (CUDA sm_90+, programmatic dependent launch; the plan settles it to
//    kOverlapNone elsewhere): the kernel may launch while the previous one drains. Its warps load
//    their first weights, scales and zero points, then wait for the previous kernel (pdl_wait)
//    before reading x or writing y, so HBM stays busy through that kernel's tail. Only for weights,
//    scales and zero points the previous kernel does not write: they are read-only (.nc) loads,
//    which ptxas may move across the wait, while x and bias (which the hybrid op pads just before a
//    call) are read with coherent loads (load_x, load_bias) that stay after it.
// Every kernel calls pdl_trigger first, so that the next call may overlap it in turn, and pdl_wait,
// which returns at once after a plain launch.
enum Overlap : int { kOverlapNone = 0, kOverlapWeights = 1 };
constexpr int kNumOverlaps = 2;
constexpr const char* kOverlapNames[kNumOverlaps] = {"none", "weights"};

inline int name_index(const char* const* names, int count, const std::string& name) {
  for (int i = 0; i < count; ++i) {
    if (name == names[i]) return i;
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------
// One call's arguments, in the layout of optimized/contract.py (T = half_t or bf16_t):
//   x        T [m, k], row stride stride_xm elements, unit stride along k; 16-byte aligned rows.
//   qweight  [n, k/8] 32-bit words, contiguous, 16-byte aligned (k % 32 == 0 follows from
//            group_size | k).
//   scales   T [n, k/group_size], contiguous.
//   zeros    [n/8, k/group_size] 32-bit words packed along n, or nullptr (symmetric, z = 8).
//   bias     T [n] or nullptr.
//   y        T [m, n], contiguous.
//   partials fp32 [split][m][n], the stream kernel's workspace when it splits K (else unused).
// split and overlap are the plan's: launch copies them from it.
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
  int split;       // the register kernels: warps of a block sharing each row, splitting K (1, 2, 4,
                   // or 8 on 32-lane warps); the stream and tile kernels: blocks sharing each row
  int overlap;     // an Overlap
};

// ---------------------------------------------------------------------------------------------
// The measured thresholds of the plan, one set per device in optimized/policies/<device>.json
// (optimized/policy.py SkinnyPolicy: the same fields in the same order; see the skinny section of
// the device policy file for the evidence of each).
struct SkinnyPolicy {
  int ring_max_m;                          // above kSegMaxM, the ring runs up to this M, batch above
  int stream_min_k;                        // the stream kernel runs from this K,
  int64_t stream_min_weight_bytes_ring;    // or from these weight bytes (N K / 2) at M <= ring_max_m,
  int64_t stream_min_weight_bytes_batch;   // or from these above it
  int persistent_min_iters;                // the persistent grid needs this many iterations a warp,
  int persistent_max_load_pct;             // and runs where the shared-x grid loads the SMs below this
                                           // % of even (or runs several waves)
  int shared_x_max_bytes;                  // x is staged in shared memory up to this size
  double stream_one_block_cost;            // the stream split model's time factor where one block fits an SM
};
constexpr int kPolicyFields = 8;

// The device facts a plan reads.
struct DeviceLimits {
  int num_sms;
  int warp_size;
  int max_shared;          // dynamic shared memory a block may opt into
  int smem_per_sm;         // shared memory an SM holds
  int compute_capability;  // 10 major + minor on CUDA (80: mma.sync, 90: programmatic dependent launch); 0 on ROCm
};
constexpr int kDeviceLimitFields = 5;

namespace detail {

inline std::string num(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15) return std::to_string(static_cast<long long>(v));
  return std::to_string(v);
}

}  // namespace detail

// Fills `out` from the op's `policy` list (SkinnyPolicy.values() in optimized/policy.py); returns ""
// or what is wrong with it. Every field is range-checked, so a plan never reads a nonsense value.
inline std::string parse_policy(const double* values, size_t count, SkinnyPolicy& out) {
  struct Field {
    const char* name;
    double lo, hi;
    bool integral;
  };
  static constexpr Field kFields[kPolicyFields] = {
      {"ring_max_m", kSegMaxM, kMaxM, true},
      {"stream_min_k", 0, 2147483647.0, true},
      {"stream_min_weight_bytes_ring", 0, 9.0e15, true},
      {"stream_min_weight_bytes_batch", 0, 9.0e15, true},
      {"persistent_min_iters", 0, 1 << 20, true},
      {"persistent_max_load_pct", 0, 100, true},
      {"shared_x_max_bytes", 0, 1 << 30, true},
      {"stream_one_block_cost", 1, 100, false},
  };
  if (count != kPolicyFields) {
    return "policy must hold " + std::to_string(kPolicyFields) +
           " values (optimized/policy.py SkinnyPolicy.values()), got " + std::to_string(count);
  }
  for (int i = 0; i < kPolicyFields; ++i) {
    const Field& f = kFields[i];
    const double v = values[i];
    if (!(v >= f.lo && v <= f.hi) || (f.integral && v != std::floor(v))) {
      return std::string("policy field ") + f.name + " must be " + (f.integral ? "an integer" : "a number") +
             " in [" + detail::num(f.lo) + ", " + detail::num(f.hi) + "], got " + detail::num(v);
    }
  }
  out.ring_max_m = static_cast<int>(values[0]);
  out.stream_min_k = static_cast<int>(values[1]);
  out.stream_min_weight_bytes_ring = static_cast<int64_t>(values[2]);
  out.stream_min_weight_bytes_batch = static_cast<int64_t>(values[3]);
  out.persistent_min_iters = static_cast<int>(values[4]);
  out.persistent_max_load_pct = static_cast<int>(values[5]);
  out.shared_x_max_bytes = static_cast<int>(values[6]);
  out.stream_one_block_cost = values[7];
  return "";
}

// Fills `out` from the plan op's `device_limits` list (the DeviceLimits fields in order); returns
// "" or what is wrong with it.
inline std::string parse_device_limits(const int64_t* values, size_t count, DeviceLimits& out) {
  if (count != kDeviceLimitFields) {
    return "device_limits must hold " + std::to_string(kDeviceLimitFields) +
           " values (num_sms, warp_size, max_shared, smem_per_sm, compute_capability), or none for the "
           "current device, got " + std::to_string(count);
  }
  for (size_t i = 0; i < count; ++i) {
    if (values[i] < 0 || values[i] > 2147483647) {
      return "device_limits values must be in [0, 2^31), got " + std::to_string(values[i]) + " at index " +
             std::to_string(i);
    }
  }
  if (values[0] < 1 || (values[1] != 32 && values[1] != 64)) {
    return "device_limits must name at least one SM and a warp size of 32 or 64, got num_sms=" +
           std::to_string(values[0]) + ", warp_size=" + std::to_string(values[1]);
  }
  out = DeviceLimits{static_cast<int>(values[0]), static_cast<int>(values[1]), static_cast<int>(values[2]),
                     static_cast<int>(values[3]), static_cast<int>(values[4])};
  return "";
}

// ---------------------------------------------------------------------------------------------
// Geometry the plan and the kernels share.

// Columns of x the segmented kernels' mma tile holds: M rounded up to a power of two.
W4_HD constexpr int seg_m_pad(int m) { return m <= 1 ? 1 : m <= 2 ? 2 : 4; }

// An mma step's 16 k of a row are 4 nibbles from each of the quad's 4 chunks: kIterK k. Where
// that is one group, the weights go into the mma as exact q - z and each step group's fp32 sums
// are scaled once: one multiply per 16 weights instead of one per 2.
W4_HD constexpr bool scale_after_mma(int group_size) { return group_size == kIterK; }

// The stream kernel's warps along N: 32 warps_n rows a block, so that x (M rows, staged once a
// block) is at most a quarter of the bytes of the weights it meets (4 M / rows).
W4_HD constexpr int stream_warps_n(int m) { return m <= 2 ? 1 : m <= 4 ? 2 : m <= 8 ? 4 : 8; }

// The largest M with m's stream block layout (M 1..2, 3..4, 5..8, 9..16 share one each). The split
// is planned for it, so that every M of a bucket runs the same tiles, split and summation order.
W4_HD constexpr int stream_bucket_m(int m) { return m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : kMaxM; }

// The tile kernel's M tile for a call of m rows (a call of more runs several along M), the columns
// of x each warp multiplies (2 * tile_warp_m / 8 mma per 16 k of its dequantized weights), its warps
// along M, the rows of N a block owns (32 per warp along N) and its dynamic shared memory: stages of
// weights (rows x 64 bytes) and x (M tile x 256 bytes). On an H100, 32 columns a warp (each weight
// dequantized by more warps) and 8 stages were both slower from M = 32 on.
W4_HD constexpr int tile_m(int m) { return m <= 16 ? 16 : m <= 32 ? 32 : m <= 64 ? 64 : 128; }
W4_HD constexpr int tile_warp_m(int m_tile) { return m_tile < 64 ? m_tile : 64; }
W4_HD constexpr int tile_warps_m(int m_tile) { return m_tile / tile_warp_m(m_tile); }
W4_HD constexpr int tile_block_rows(int m_tile) { return 32 * (kBlockThreads / 32 / tile_warps_m(m_tile)); }
W4_HD constexpr int tile_shared_bytes(int m_tile) {
  return kTileStages * (tile_block_rows(m_tile) * kStreamPieceK / 2 + m_tile * kStreamPieceK * 2);
}

// The M from which the warpgroup kernel runs whatever its grid (on an H100 it was faster than the
// tile kernel on the 4 Llama-3.1-8B shapes at every M from 64 to 1024, by 1.16-1.85x; at M = 17 and
// 32 on the three whose grids take as many waves on both, by 0.96-1.12x (1.02x geometric mean), and
// 0.89-0.90x on the fourth, where its grid takes two waves to the tile kernel's one), its M tile
// (the wgmma N), its stages (as many as fit in 227 KiB) and its dynamic shared memory: the stages,
// then each stage's two mbarriers (full, empty).
constexpr int kWgmmaMinM = 33;
constexpr int kWgmmaBarrierBytes = 1024;
W4_HD constexpr int wgmma_m(int m) { return m <= 32 ? 32 : m <= 64 ? 64 : 128; }
W4_HD constexpr int wgmma_stage_bytes(int m_tile) {
  return kWgmmaRows * kStreamPieceK / 2 + m_tile * kStreamPieceK * 2;
}
W4_HD constexpr int wgmma_stages(int m_tile) {
  return (227 * 1024 - kWgmmaBarrierBytes) / wgmma_stage_bytes(m_tile);
}
W4_HD constexpr int wgmma_shared_bytes(int m_tile) {
  return wgmma_stages(m_tile) * wgmma_stage_bytes(m_tile) + kWgmmaBarrierBytes;
}

// The M tile and rows of N of a tile or wgmma kernel's block for a call of m rows.
struct BlockTile {
  int m_tile, rows;
};
W4_HD constexpr BlockTile block_tile(int kernel, int m) {
  return kernel == kWgmma ? BlockTile{wgmma_m(m), kWgmmaRows} : BlockTile{tile_m(m), tile_block_rows(tile_m(m))};
}

// The blocks of a tile or wgmma kernel's grid for a call of m rows on weights of n rows at a split.
W4_HD constexpr int64_t tile_blocks(int kernel, int n, int m, int split) {
  const BlockTile b = block_tile(kernel, m);
  return static_cast<int64_t>((n + b.rows - 1) / b.rows) * ((m + b.m_tile - 1) / b.m_tile) * split;
}

struct StreamLayout {
  int stages;                  // ring slots per warp
  int warps_n, warps_k, rows;  // rows = 32 warps_n
  int pieces;                  // the most pieces (128 k) of any block's K range
  int groups;                  // groups in `pieces`
  int x_units;                 // 16-byte units of one staged x row
  int scale_stride;            // halves of one staged scale row
  int x_offset, scale_offset, zero_offset, bytes;  // byte offsets into dynamic shared memory
};

// The stream kernel's dynamic shared memory: the rings, then x rows of the block's K range, then
// scales, then zero-point words (see skinny_stream.cuh).
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

// ---------------------------------------------------------------------------------------------
// The plan's parts. Each takes the kernel that runs; plan_call below puts them together.

namespace plan_detail {

// Bytes of x the segmented kernels stage in shared memory at split 1: M_PAD rows of K 16-bit
// values, where they fit under the policy's limit and beside the kernel's static shared memory;
// 0 where they do not (x is then read from global memory).
inline int segment_x_bytes(int m, int k, const SkinnyPolicy& policy, const DeviceLimits& d) {
  const int64_t bytes = static_cast<int64_t>(seg_m_pad(m)) * 2 * k;
  const int64_t limit = d.max_shared - kSegStaticShared;
  return bytes <= policy.shared_x_max_bytes && bytes <= limit ? static_cast<int>(bytes) : 0;
}

// Rows a block of `kernel` covers at split 1.
inline int tile_rows(int kernel, int m) {
  return is_segment(kernel) ? kBlockThreads / 32 * kSegRowSets * seg_m_pad(m) : kTileRows;
}

// The K split of the register kernels: warps of a block sharing each row. Larger blocks (split 1)
// fetch each x element once for more rows; smaller ones make more blocks, so that every SM has work
// and the last wave is short.
//  * persistent segmented: 1 (its grid is planned instead).
//  * segmented: the smallest split whose grid has a block for every SM (else the largest that leaves
//    every warp an iteration of K): fewer, larger blocks share x over more rows, but a grid short of
//    the SMs leaves some idle.
//  * ring: the split with the least modelled wave quantization among those that leave every warp
//    an iteration of K. Its blocks are equal, so they run in waves of num_sms * kMinBlocks; counting
//    time in block-times of a busy SM, a full wave takes kMinBlocks and a last partial wave its most
//    loaded SM's block count, at least 2 (an SM with one block runs at about half speed, as one
//    block's loads in flight cover about half an SM's share of the bandwidth). A larger split must
//    beat a smaller one by 2% (larger blocks share x better).
//  * batch: the smallest split that gives num_sms * 8 blocks (or the largest split).
inline int register_split(int n, int m, int k, int num_sms, int warp_size, int kernel) {
  const int warps = kBlockThreads / warp_size;
  const int rows = tile_rows(kernel, m);
  if (kernel == kSegmentPersistent) return 1;
  if (is_segment(kernel)) {
    const int iters = (k + 8 / seg_m_pad(m) * kIterK - 1) / (8 / seg_m_pad(m) * kIterK);
    int split = 1;
    while (split * 2 <= warps && split * 2 <= iters && (n + rows / split - 1) / (rows / split) < num_sms) {
      split *= 2;
    }
    return split;
  }
  if (kernel == kRing) {
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

// The stream kernel's grid: row blocks of 32 stream_warps_n(m) rows, times the split.
inline int stream_blocks(int n, int m, int split) {
  const int rows = 32 * stream_warps_n(m);
  return (n + rows - 1) / rows * split;
}

inline int stream_resident_blocks(const StreamLayout& L, int smem_per_sm) {
  return smem_per_sm / (L.bytes + kSharedReservePerBlock);
}

// The stream kernel's ring depth at a split. Its blocks need so much shared memory (x of the
// block's K range beside the rings) that at M = 10..16 often one block fits an SM; where the grid
// has more blocks than SMs, an SM then runs its blocks one after another, each ramping up and
// draining alone. So the ring is kStreamStages slots where kStreamMinBlocks blocks fit an SM with
// them, else kStreamFewStages where that lets them fit; a grid of at most one block an SM keeps the
// deep ring, whose block has its SM to itself either way.
inline int stream_stages(int n, int m, int k, int group_size, bool sym, int split, const DeviceLimits& d) {
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

inline StreamLayout stream_plan_layout(int n, int m, int k, int group_size, bool sym, int split, const DeviceLimits& d) {
  return stream_layout(m, k, group_size, sym, split, stream_stages(n, m, k, group_size, sym, split, d));
}

// The stream kernel's split (blocks along K), from a model of its time in microseconds:
//  * weights at 4 TB/s, spread over SMs in whole blocks: the most loaded SM sets the time
//    (ceil(blocks / num_sms) blocks' bytes at an SM's share), and an SM with fewer than 1.5 blocks
//    on average is taken to reach 1/1.15 of its share (one block's ring in flight);
//  * a split of more blocks than SMs whose blocks fit one an SM (stream_stages) takes
//    stream_one_block_cost times as long;
//  * split > 1 adds the partial sums (16 M split / K of the weight bytes, written and read at
//    about twice HBM speed in L2) and the reduce kernel's launch (1.5 us);
// among the splits whose shared memory fits max_shared and that leave every warp a piece. A
// larger split must win by 2%. Planned for stream_bucket_m(m), so the split is the same for
// every M of a bucket.
inline int stream_split(int n, int m_call, int k, int group_size, bool sym, const DeviceLimits& d,
                        double one_block_cost) {
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
    if (per_sm > 1.0 && stream_resident_blocks(L, d.smem_per_sm) < kStreamMinBlocks) time *= one_block_cost;
    if (split > 1) time += weight_us * 16.0 * m * split / k * 0.5 + 1.5;
    if (best_split == 0 || time < best * 0.98) {
      best = time;
      best_split = split;
    }
  }
  return best_split > 0 ? best_split : total;
}

// The tile and warpgroup kernels' split (blocks along K), from a model of their time in
// microseconds: the grid runs in waves of num_sms blocks, a block's piece taking the longer of its
// weights at 3 TB/s and its matrix work at the kernel's rate (400 TFLOP/s for mma.sync, 600 for
// wgmma), both shared by a wave's blocks; split > 1 adds the partial sums (4 M N split bytes written
// and read, at 3 TB/s) and the reduce kernel's launch (2 us). Every block keeps a piece. A larger
// split must win by 2%. Planned for whole M tiles, so that the M of a tile count share it.
inline int tile_split(int n, int m_call, int k, const DeviceLimits& d, int kernel) {
  const auto [m_tile, rows] = block_tile(kernel, m_call);
  const int64_t m_blocks = (m_call + m_tile - 1) / m_tile;
  const double flops_per_us = kernel == kWgmma ? 6.0e8 : 4.0e8;
  const int total = k / kStreamPieceK;
  const int64_t tiles = tile_blocks(kernel, n, m_call, 1);
  const int64_t slots = d.num_sms;  // one block an SM: its registers (launch bounds) allow no more
  const double piece_bytes = static_cast<double>(slots) * rows * kStreamPieceK / 2;
  const double piece_flops = static_cast<double>(slots) * rows * kStreamPieceK * m_tile * 2;
  const double piece_us = std::max(piece_bytes / 3.0e6, piece_flops / flops_per_us);
  double best = 0.0;
  int best_split = 1;
  for (int split = 1; split <= total; ++split) {
    const int64_t waves = (tiles * split + slots - 1) / slots;
    const int pieces = (total + split - 1) / split;
    double time = static_cast<double>(waves) * pieces * piece_us;
    if (split > 1) time += static_cast<double>(m_blocks * m_tile) * n * split * 8 / 3.0e6 + 2.0;
    if (split == 1 || time < best * 0.98) {
      best = time;
      best_split = split;
    }
  }
  return best_split;
}

// The default kernel for an M on weights [n, k]: above kMaxM the wgmma kernel where it runs, from
// kWgmmaMinM or where its grid needs no more waves than the tile kernel's (below kWgmmaMinM its
// blocks cover half the tile kernel's rows of N), else the tile kernel; the persistent segmented
// kernel up to kSegMaxM (plan_call settles it where it cannot run), above it the stream kernel from
// a K or a weight size on (it splits a long K over blocks, which a few rows of long K need to fill
// the GPU), else the ring up to ring_max_m and the batch kernel above.
inline int default_kernel(int m, int n, int k, const SkinnyPolicy& policy, const DeviceLimits& d, bool wgmma_runs) {
  if (m > kMaxM) {
    if (!wgmma_runs) return kTile;
    auto waves = [&](int kernel) {
      return (tile_blocks(kernel, n, m, tile_split(n, m, k, d, kernel)) + d.num_sms - 1) / d.num_sms;
    };
    return m >= kWgmmaMinM || waves(kWgmma) <= waves(kTile) ? kWgmma : kTile;
  }
  if (m <= kSegMaxM) return kSegmentPersistent;
  const bool ring = m <= policy.ring_max_m;
  const int64_t stream_from = ring ? policy.stream_min_weight_bytes_ring : policy.stream_min_weight_bytes_batch;
  if (k >= policy.stream_min_k || static_cast<int64_t>(n) * k / 2 >= stream_from) return kStream;
  return ring ? kRing : kBatch;
}

// The persistent segmented kernel's grid: every SM's kMinBlocks blocks (fewer where there are fewer
// row groups), each running its share of the row groups (kSegRowSets x M_PAD rows, all of K) with
// the iterations split evenly over its warps, so that loads run on from one row group into the next
// with no block launch, wave or tail between them; or 0 blocks, where the shared-x kernel is the
// better choice. The persistent kernel has costs the shared-x one lacks (every block stages all of
// x, and row groups the warps cut are added at the end of the block), so it runs only where the
// shared-x grid at its planned split is more than one wave of kMinBlocks blocks an SM or loads the
// SMs unevenly (blocks under persistent_max_load_pct % of the most an SM gets, times the SMs), and
// only where a warp gets persistent_min_iters iterations or more (the ring never fills on fewer).
inline int persistent_blocks(int n, int m, int k, int num_sms, const SkinnyPolicy& policy) {
  const int warps_per_block = kBlockThreads / 32;
  const int64_t unit_rows = static_cast<int64_t>(kSegRowSets) * seg_m_pad(m);
  const int64_t units = (n + unit_rows - 1) / unit_rows;
  const int64_t iter_k = static_cast<int64_t>(8 / seg_m_pad(m)) * kIterK;
  const int64_t iters = units * ((k + iter_k - 1) / iter_k);
  const int64_t max_blocks = static_cast<int64_t>(num_sms) * kMinBlocks;
  if (iters < policy.persistent_min_iters * max_blocks * warps_per_block) return 0;
  // The segmented kernels run on 32-lane warps only.
  const int rows = tile_rows(kSegmentSmem, m) / register_split(n, m, k, num_sms, 32, kSegmentSmem);
  const int64_t smem_blocks = (n + rows - 1) / rows;
  const int64_t most_per_sm = (smem_blocks + num_sms - 1) / num_sms;
  const bool waves = units > max_blocks * warps_per_block;
  const bool uneven = 100 * smem_blocks < policy.persistent_max_load_pct * most_per_sm * num_sms;
  if (!waves && !uneven) return 0;
  return static_cast<int>(units < max_blocks ? units : max_blocks);
}

}  // namespace plan_detail

// ---------------------------------------------------------------------------------------------
// The plan of one call.

// What the caller asks: the shape, the zero points' presence, and the op's string arguments.
struct PlanRequest {
  int m = 0, n = 0, k = 0, group_size = 0;
  bool symmetric = true;        // no zero points (z = 8)
  std::string engine = "auto";  // a kEngineNames entry
  std::string kernel = "auto";  // "auto" or a kKernelNames entry; a named kernel is for benchmarking
  int split = 0;                // 0: the plan's; else forced, for benchmarking a named kernel
  std::string overlap = "none";  // a kOverlapNames entry
};

// What a call runs. Plans with equal `summation` add every output's terms in the same order, so an
// output row keeps its bits across them (the M that share it run the same kernel configuration).
struct SkinnyPlan {
  std::string error;             // empty, or why the request cannot run (nothing below is set then)
  int kernel = kBatch;           // the Kernel that runs
  Engine engine = Engine::kSimt;
  int split = 1;                 // SkinnyParams.split
  int blocks = 0;                // the main kernel's grid
  int stages = 0;                // the stream kernel's ring slots per warp, the tile kernel's stages; else 0
  int shared_bytes = 0;          // the main kernel's dynamic shared memory
  int64_t workspace_floats = 0;  // fp32 partial sums the stream or tile kernel needs when it splits K
  int overlap = kOverlapNone;    // the Overlap that runs
  // (engine, kernel whose summation order runs, its M-dependent tile, split, persistent grid)
  int64_t summation[5] = {0, 0, 0, 0, 0};
};

// The plan op's output, in this order: kernel, engine (an index into kEngineNames), split, blocks,
// stages, shared_bytes, workspace_floats, then the 5 summation values (optimized/skinny.py
// SkinnyPlan.from_values reads them in the same order).
constexpr int kPlanFields = 12;
inline void plan_values(const SkinnyPlan& plan, int64_t (&out)[kPlanFields]) {
  const int64_t engine = plan.engine == Engine::kMma ? kEngineNameMma : kEngineNameSimt;
  const int64_t head[7] = {plan.kernel, engine, plan.split, plan.blocks, plan.stages,
                           plan.shared_bytes, plan.workspace_floats};
  for (int i = 0; i < 7; ++i) out[i] = head[i];
  for (int i = 0; i < 5; ++i) out[7 + i] = plan.summation[i];
}

// The one place that decides what a call runs: the engine, the kernel (the default, or the one
// asked for, settled to one that can run the call), its split, grid, ring depth, shared memory and
// workspace, and the overlap mode; or an error naming what is wrong with the request.
inline SkinnyPlan plan_call(const PlanRequest& r, const SkinnyPolicy& policy, const DeviceLimits& d) {
  using namespace plan_detail;
  using detail::num;
  SkinnyPlan plan;
  auto fail = [&plan](std::string why) {
    plan.error = std::move(why);
    return plan;
  };

  // The request.
  if (r.m < 1) return fail("M must be at least 1, got M=" + num(r.m));
  if (r.group_size != 32 && r.group_size != 64 && r.group_size != 128) {
    return fail("group_size must be 32, 64 or 128, got " + num(r.group_size));
  }
  if (r.n < 0 || r.k < 0 || r.k % r.group_size != 0) {
    return fail("K must be a multiple of group_size (and N, K non-negative), got N=" + num(r.n) + ", K=" + num(r.k) +
                ", group_size=" + num(r.group_size));
  }
  if (!r.symmetric && r.n % 8 != 0) {
    return fail("N must be a multiple of 8 with zero points (8 rows a packed word), got N=" + num(r.n));
  }
  const int engine_asked = name_index(kEngineNames, kNumEngineNames, r.engine);
  if (engine_asked < 0) return fail("engine must be 'auto', 'mma' or 'simt', got '" + r.engine + "'");
  const int asked = r.kernel == "auto" ? -1 : name_index(kKernelNames, kNumKernels, r.kernel);
  if (asked < 0 && r.kernel != "auto") {
    return fail("kernel must be 'auto' or one of batch, ring, segment, segment_smem, segment_persistent, stream, "
                "tile, wgmma; got '" + r.kernel + "'");
  }
  const int overlap = name_index(kOverlapNames, kNumOverlaps, r.overlap);
  if (overlap < 0) return fail("overlap must be 'none' or 'weights', got '" + r.overlap + "'");
  if (r.split < 0) return fail("split must be 0 (the plan's) or positive, got " + num(r.split));
  if (r.split > 0 && (asked < 0 || asked == kSegmentPersistent)) {
    return fail("split must be 0 (the plan's) unless kernel names one other than segment_persistent (which plans "
                "its own grid), got split=" + num(r.split) + " with kernel '" + r.kernel + "'");
  }
  const int warps = kBlockThreads / d.warp_size;
  if (r.split > 0 && !splits_blocks(asked) && (r.split > warps || (r.split & (r.split - 1)) != 0)) {
    return fail("a forced split of kernel " + r.kernel + " must be a power of two up to the " + num(warps) +
                " warps of a block, got " + num(r.split));
  }

  // The engine: tensor cores where the device has mma.sync (CUDA sm_80+), asked for or by default.
  const bool has_mma = !W4_HIP && d.compute_capability >= 80;
  if (engine_asked == kEngineNameMma && !has_mma) {
    return fail(W4_HIP ? "engine 'mma' is CUDA-only (tensor-core mma.sync); use 'simt'"
                       : "engine 'mma' needs compute capability 8.0+, the device has " + num(d.compute_capability));
  }
  const bool mma = engine_asked != kEngineNameSimt && has_mma;
  plan.engine = mma ? Engine::kMma : Engine::kSimt;

  // The kernel that takes the request, which sets the split rule. The segmented kernels are mma
  // kernels of at most kSegMaxM rows, the stream kernel an mma kernel of whole 128-k pieces; in
  // their place the ring runs (the batch kernel for the stream kernel above ring_max_m).
  const int m = r.m, n = r.n, k = r.k;
  // Above kMaxM only the tile and wgmma kernels run: a request for another gets the default.
  const bool wgmma_runs = mma && k % kStreamPieceK == 0 && d.compute_capability == 90;
  const bool any_m = asked == kTile || asked == kWgmma;
  int kernel = asked < 0 || (m > kMaxM && !any_m) ? default_kernel(m, n, k, policy, d, wgmma_runs) : asked;
  if (kernel == kWgmma && (!wgmma_runs || m <= kMaxM)) {
    kernel = m > kMaxM ? kTile : default_kernel(m, n, k, policy, d, false);  // settled below like those
  }
  if (kernel == kTile && (!mma || k % kStreamPieceK != 0)) {
    if (m > kMaxM) {
      return fail("M > " + num(kMaxM) + " runs on the tile kernel only, which needs the mma engine (CUDA, compute "
                  "capability 8.0+) and K a multiple of " + num(kStreamPieceK) + ", got M=" + num(m) + ", K=" +
                  num(k) + (mma ? "" : ", engine simt"));
    }
    kernel = kStream;  // settled below like the stream kernel
  }
  if (is_segment(kernel) && (!mma || m > kSegMaxM)) kernel = kRing;
  if (kernel == kStream && (!mma || k % kStreamPieceK != 0)) kernel = m <= policy.ring_max_m ? kRing : kBatch;
  // The persistent kernel stages x and needs a grid; where x does not fit the segmented kernel reads
  // it from global memory, and where the persistent grid would not pay the shared-x kernel runs.
  const int x_bytes = segment_x_bytes(m, k, policy, d);
  if (kernel == kSegmentPersistent) {
    plan.blocks = x_bytes > 0 ? persistent_blocks(n, m, k, d.num_sms, policy) : 0;
    if (plan.blocks == 0) kernel = x_bytes > 0 ? kSegmentSmem : kSegment;
  }

  // The split: a forced one steers the kernel it was asked for (where another one runs, that one
  // takes its own plan's split); the stream and tile kernels' must leave their blocks a piece, and
  // the stream kernel's must fit shared memory.
  if (r.split > 0 && kernel == asked) {
    if (splits_blocks(kernel) && r.split > k / kStreamPieceK) {
      return fail(std::string("the ") + kKernelNames[kernel] + " kernel's split must be in [1, K/" +
                  num(kStreamPieceK) + "] = [1, " + num(k / kStreamPieceK) + "], got " + num(r.split));
    }
    const int shared = kernel == kStream ? stream_plan_layout(n, m, k, r.group_size, r.symmetric, r.split, d).bytes : 0;
    if (shared > d.max_shared) {
      return fail("the stream kernel at split " + num(r.split) + " needs " + num(shared) +
                  " bytes of shared memory a block, the device allows " + num(d.max_shared) + " (use a larger split)");
    }
    plan.split = r.split;
  } else if (kernel == kTile || kernel == kWgmma) {
    plan.split = tile_split(n, m, k, d, kernel);
  } else if (kernel == kStream) {
    plan.split = stream_split(n, m, k, r.group_size, r.symmetric, d, policy.stream_one_block_cost);
  } else {
    plan.split = register_split(n, m, k, d.num_sms, d.warp_size, kernel);
  }
  // x is staged at split 1 only.
  if (kernel == kSegmentSmem && (plan.split != 1 || x_bytes == 0)) kernel = kSegment;
  // The kernels' own limits, where the batch kernel runs with the split already planned (so that on
  // the simt engine, where the ring exists at M = 1 only, rows keep their bits from M = 1 to the
  // ring's M): the ring needs whole iterations (K % 128 == 0) and 8 rows, and the ring and segmented
  // kernels keep weight offsets in 32-bit integers.
  const bool offsets_fit = static_cast<int64_t>(n) * (k / kLaneK) <= INT32_MAX;
  if (kernel == kRing && (k % kIterK != 0 || n < 8 || !offsets_fit || (!mma && m > 1))) kernel = kBatch;
  if (is_segment(kernel) && !offsets_fit) kernel = kBatch;
  plan.kernel = kernel;

  // Grid, shared memory, ring depth and workspace of the kernel that runs.
  const int m_pad = seg_m_pad(m);
  switch (kernel) {
    case kSegment:
    case kSegmentSmem: {
      const int rows = tile_rows(kernel, m) / plan.split;
      plan.blocks = (n + rows - 1) / rows;
      plan.shared_bytes = kernel == kSegmentSmem ? x_bytes : 0;
      break;
    }
    case kSegmentPersistent:
      plan.shared_bytes = x_bytes;
      break;
    case kStream: {
      plan.stages = stream_stages(n, m, k, r.group_size, r.symmetric, plan.split, d);
      plan.shared_bytes = stream_layout(m, k, r.group_size, r.symmetric, plan.split, plan.stages).bytes;
      plan.blocks = stream_blocks(n, m, plan.split);
      plan.workspace_floats = plan.split > 1 ? static_cast<int64_t>(plan.split) * m * n : 0;
      break;
    }
    case kTile:
    case kWgmma: {
      const auto [m_tile, rows] = block_tile(kernel, m);
      const bool wg = kernel == kWgmma;
      plan.shared_bytes = wg ? wgmma_shared_bytes(m_tile) : tile_shared_bytes(m_tile);
      if (plan.shared_bytes > d.max_shared) {
        return fail(std::string("the ") + kKernelNames[kernel] + " kernel at M=" + num(m) + " needs " +
                    num(plan.shared_bytes) + " bytes of shared memory a block, the device allows " + num(d.max_shared));
      }
      const int64_t blocks = tile_blocks(kernel, n, m, plan.split);
      if (blocks > INT32_MAX) {
        return fail(std::string("the ") + kKernelNames[kernel] + " kernel's grid of " + num(blocks) +
                    " blocks is over 2^31 - 1");
      }
      plan.blocks = static_cast<int>(blocks);
      plan.stages = wg ? wgmma_stages(m_tile) : kTileStages;
      plan.workspace_floats = plan.split > 1 ? static_cast<int64_t>(plan.split) * m * n : 0;
      break;
    }
    default: {  // batch, ring
      const int rows = kTileRows / plan.split;
      plan.blocks = (n + rows - 1) / rows;
    }
  }
  plan.overlap = !W4_HIP && d.compute_capability >= 90 ? overlap : kOverlapNone;

  // The summation order: the simt ring and batch kernels add the same terms in the same order, and
  // so do the segmented kernels with x in global or shared memory; the segmented kernels' order
  // follows M_PAD, the stream kernel's its warps along N, the tile kernel's its warps' columns (its
  // G = 128 sums are scaled after the mma at 16), the persistent one's its grid too.
  const int order = kernel == kRing && !mma ? kBatch : kernel == kSegmentSmem ? kSegment : kernel;
  const int tile = is_segment(kernel) ? m_pad : kernel == kStream ? stream_warps_n(m)
                 : kernel == kTile ? tile_warp_m(tile_m(m)) : kernel == kWgmma ? wgmma_m(m) : 0;
  const int64_t summation[5] = {mma ? kEngineNameMma : kEngineNameSimt, order, tile, plan.split,
                                kernel == kSegmentPersistent ? plan.blocks : 0};
  for (int i = 0; i < 5; ++i) plan.summation[i] = summation[i];
  return plan;
}

// Queues the kernels of one call on `stream` (a cudaStream_t, or hipStream_t on ROCm): the
// plan's kernel with p's arguments, validated as the binding does (contract.py; alignment), p.partials
// set where plan.workspace_floats > 0. x, scales, bias and y are bfloat16 when bf16, else float16.
// Defined in skinny_launch.cu; a launch error is left for the caller's check.
void launch(const SkinnyParams& p, const SkinnyPlan& plan, bool bf16, void* stream);

}  // namespace w4

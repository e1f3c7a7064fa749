"""How fast can a decode kernel's weight reads go on this GPU? Load-only kernels with the skinny
kernel's work split and ring, each load's words folded into a register and nothing computed, next
to a plain streaming read, on cold weights (written for the H200).

    python bench/skinny_load_probe.py --out DIR    # ~1 minute; DIR/skinny_load_probe.{json,md}

A pattern is (lanes per row, 16-byte chunks per lane and row, row sets per warp): lanes
4 quad + t of a warp read rows quad and quad + 8 as the skinny kernel does for (4, 1, 2); (32, 1, 4)
puts a whole warp on one row per load (512 contiguous bytes). Each warp keeps S - 1 iterations of
loads in flight in a register ring; `split` warps of a block share a row along K, interleaved as
in skinny_pipe_kernel. Hints: plain ld.global.nc with L1::no_allocate, or with an L2 prefetch of
128 or 256 bytes. `meta` adds the per-group scale (and zero point) loads of the asymmetric kernel.
If the skinny kernel's own pattern reads near the streaming rate here, its shortfall is not in the
reads; if not, the pattern that does points at the layout to use.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cuda_timing import graph_seconds, hbm_bandwidth  # noqa: E402

SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

template <int HINT>
__device__ __forceinline__ uint4 ld(const uint4* p) {
  uint4 v;
  if constexpr (HINT == 0) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if constexpr (HINT == 1) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}

// Rows: N; a row is kc 16-byte chunks. Lane l: row slot l / LPR of each of SETS row sets, chunk
// CPL * (l % LPR) + c of each iteration's LPR * CPL chunks. META: 0 none, 1 scale, 2 scale + zero.
template <int LPR, int CPL, int SETS, int S, int HINT, int META>
__global__ void __launch_bounds__(256, 2) probe(const uint4* __restrict__ w, const unsigned short* __restrict__ sc,
                                                const uint32_t* __restrict__ zp, int n, int kc, int groups,
                                                int split, uint32_t* out) {
  constexpr int kSlots = 32 / LPR, kWarpRows = kSlots * SETS, kIterChunks = LPR * CPL;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int w_k = warp % split, w_n = warp / split;
  const int block_rows = 8 / split * kWarpRows;
  const int row0 = blockIdx.x * block_rows + w_n * kWarpRows + lane / LPR;
  const int sub = lane % LPR;
  const int iters = kc / kIterChunks;
  const int count = w_k < iters ? (iters - 1 - w_k) / split + 1 : 0;
  int rows[SETS];
#pragma unroll
  for (int a = 0; a < SETS; ++a) rows[a] = min(row0 + kSlots * a, n - 1);
  uint4 ring[S][SETS][CPL];
  uint32_t meta[S][SETS];
  uint32_t acc = 0;
  auto issue = [&](int f, int slot) {
    if (f >= count) return;
    const int it = w_k + f * split;
    const int chunk = it * kIterChunks + sub * CPL;
#pragma unroll
    for (int a = 0; a < SETS; ++a) {
#pragma unroll
      for (int c = 0; c < CPL; ++c) ring[slot][a][c] = ld<HINT>(w + (int64_t)rows[a] * kc + chunk + c);
      const int group = chunk / 8;  // 128-k groups: 8 chunks
      meta[slot][a] = 0;
      if constexpr (META >= 1) meta[slot][a] = __ldg(sc + (int64_t)rows[a] * groups + group);
      if constexpr (META >= 2) meta[slot][a] ^= __ldg(zp + (int64_t)(rows[a] >> 3) * groups + group);
    }
  };
#pragma unroll
  for (int f = 0; f < S - 1; ++f) issue(f, f);
  for (int e0 = 0; e0 < count; e0 += S) {
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int e = e0 + u;
      if (e >= count) break;
      issue(e + S - 1, (u + S - 1) % S);
#pragma unroll
      for (int a = 0; a < SETS; ++a) {
#pragma unroll
        for (int c = 0; c < CPL; ++c) acc ^= ring[u][a][c].x ^ ring[u][a][c].y ^ ring[u][a][c].z ^ ring[u][a][c].w;
        acc += meta[u][a];
      }
    }
  }
  if (acc == 0x9E3779B9u) out[blockIdx.x * 256 + threadIdx.x] = acc;  // keeps the loads alive
}

// Streaming read of the whole buffer, grid-stride, UNROLL loads in flight per thread.
template <int UNROLL>
__global__ void __launch_bounds__(256) stream(const uint4* __restrict__ w, int64_t chunks, uint32_t* out) {
  uint32_t acc = 0;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < chunks; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = ld<0>(w + i + u * stride);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < chunks; i += stride) { uint4 v = ld<0>(w + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x9E3779B9u) out[threadIdx.x] = acc;
}

#define PATTERNS(X)                                                                         \
  X(4, 1, 2) X(4, 2, 2) X(8, 1, 2) X(16, 1, 4) X(32, 1, 4) X(32, 2, 2)

template <int LPR, int CPL, int SETS, int S, int HINT, int META>
void launch(const at::Tensor& w, const at::Tensor& sc, const at::Tensor& zp, int n, int kc, int split,
            at::Tensor& out) {
  constexpr int kWarpRows = 32 / LPR * SETS;
  const int block_rows = 8 / split * kWarpRows;
  const int blocks = (n + block_rows - 1) / block_rows;
  probe<LPR, CPL, SETS, S, HINT, META><<<blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const uint4*>(w.data_ptr()), reinterpret_cast<const unsigned short*>(sc.data_ptr()),
      reinterpret_cast<const uint32_t*>(zp.data_ptr()), n, kc, (int)sc.size(1), split,
      reinterpret_cast<uint32_t*>(out.data_ptr()));
}

template <int LPR, int CPL, int SETS>
bool dispatch_pattern(int s, int hint, int meta, const at::Tensor& w, const at::Tensor& sc, const at::Tensor& zp,
                      int n, int kc, int split, at::Tensor& out) {
#define W4P_CASE(SV, HV, MV) \
  if (s == SV && hint == HV && meta == MV) { launch<LPR, CPL, SETS, SV, HV, MV>(w, sc, zp, n, kc, split, out); return true; }
  W4P_CASE(4, 0, 0) W4P_CASE(4, 1, 0) W4P_CASE(4, 2, 0) W4P_CASE(8, 0, 0) W4P_CASE(8, 2, 0)
  W4P_CASE(4, 0, 2) W4P_CASE(4, 2, 2) W4P_CASE(8, 0, 2)
#undef W4P_CASE
  return false;
}

void run_probe(at::Tensor w, at::Tensor sc, at::Tensor zp, at::Tensor out, int64_t lpr, int64_t cpl, int64_t sets,
               int64_t s, int64_t hint, int64_t meta, int64_t n, int64_t kc, int64_t split) {
  bool ok = false;
#define W4P_PATTERN(L, C, R) \
  if (!ok && lpr == L && cpl == C && sets == R) ok = dispatch_pattern<L, C, R>(s, hint, meta, w, sc, zp, n, kc, split, out);
  PATTERNS(W4P_PATTERN)
#undef W4P_PATTERN
  TORCH_CHECK(ok, "no probe instance for lpr ", lpr, " cpl ", cpl, " sets ", sets, " s ", s, " hint ", hint, " meta ", meta);
}

void run_stream(at::Tensor w, at::Tensor out, int64_t blocks) {
  stream<4><<<blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(reinterpret_cast<const uint4*>(w.data_ptr()),
                                                                    w.numel() / 4, reinterpret_cast<uint32_t*>(out.data_ptr()));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run_probe", &run_probe);
  m.def("run_stream", &run_stream);
}
"""

PATTERNS = ((4, 1, 2), (4, 2, 2), (8, 1, 2), (16, 1, 4), (32, 1, 4), (32, 2, 2))
# (stages, hint, meta) per pattern: the skinny kernel's own is (4, 2, 2) on pattern (4, 1, 2).
CONFIGS = ((4, 0, 0), (4, 1, 0), (4, 2, 0), (8, 0, 0), (8, 2, 0), (4, 0, 2), (4, 2, 2), (8, 0, 2))
SHAPES = ((8192, 57344), (4096, 28672), (28672, 8192), (14336, 4096))
SPLITS = (1, 2, 4)
COLD_BYTES = 600 << 20


def log(msg: str) -> None:
    print(msg, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/skinny_load_probe"))
    parser.add_argument("--budget-s", type=float, default=240.0)
    args = parser.parse_args()
    from torch.utils.cpp_extension import load_inline

    start = time.perf_counter()
    mod = load_inline("w4a16_load_probe", cpp_sources="", cuda_sources=SOURCE, with_cuda=True,
                      extra_cuda_cflags=["-O3", "-gencode", "arch=compute_90a,code=sm_90a"], verbose=False)
    log(f"[build] {time.perf_counter() - start:.1f}s")
    bw = hbm_bandwidth()
    log(f"[bandwidth] copy {bw['copy_bytes_per_s'] / 1e12:.2f} TB/s, read {bw['read_bytes_per_s'] / 1e12:.2f} TB/s")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(1 << 22, dtype=torch.int32, device="cuda")
    rows = []
    for k, n in SHAPES:
        weight_bytes = n * k // 2
        copies = max(2, min(64, -(-COLD_BYTES // weight_bytes)))
        groups = k // 128
        packs = [(torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device="cuda"),
                  torch.randint(0, 2**15, (n, groups), dtype=torch.int16, device="cuda"),
                  torch.randint(-2**31, 2**31 - 1, (n // 8, groups), dtype=torch.int32, device="cuda"))
                 for _ in range(copies)]
        sec = graph_seconds([lambda p=p: mod.run_stream(p[0], out, sms * 8) for p in packs], replays=8)
        rows.append({"k": k, "n": n, "kernel": "stream", "us": sec * 1e6, "tbps": weight_bytes / sec / 1e12})
        log(f"K{k}xN{n} stream: {sec * 1e6:.1f} us, {weight_bytes / sec / 1e12:.2f} TB/s")
        for (lpr, cpl, sets), (s, hint, meta) in itertools.product(PATTERNS, CONFIGS):
            if s * sets * cpl > 16:
                continue  # a ring of more than 16 uint4 spills at 128 registers
            if time.perf_counter() - start > args.budget_s:
                rows.append({"k": k, "n": n, "skipped": "time budget"})
                break
            best = None
            for split in SPLITS:
                sec = graph_seconds([lambda p=p, split=split: mod.run_probe(
                    p[0], p[1], p[2], out, lpr, cpl, sets, s, hint, meta, n, k // 32, split) for p in packs],
                    replays=6)
                meta_bytes = (n * groups * 2 + (n // 8) * groups * 4 * (meta >= 2)) if meta else 0
                row = {"k": k, "n": n, "kernel": "probe", "lanes_per_row": lpr, "chunks_per_lane": cpl,
                       "row_sets": sets, "stages": s, "hint": (0, 128, 256)[hint], "meta": meta, "split": split,
                       "us": sec * 1e6, "tbps": (weight_bytes + meta_bytes) / sec / 1e12}
                rows.append(row)
                if best is None or row["us"] < best["us"]:
                    best = row
            log(f"K{k}xN{n} lpr{lpr} cpl{cpl} sets{sets} S{s} hint{(0, 128, 256)[hint]} meta{meta}: best split "
                f"{best['split']} {best['us']:.1f} us {best['tbps']:.2f} TB/s")
        del packs
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"gpu": torch.cuda.get_device_name(), "bandwidth": bw, "rows": rows,
              "seconds": time.perf_counter() - start}
    (args.out / "skinny_load_probe.json").write_text(json.dumps(result, indent=1))
    lines = ["# Load-only probe of decode read patterns", "",
             f"GPU {result['gpu']}; copy {bw['copy_bytes_per_s'] / 1e12:.2f} TB/s, read-only sum "
             f"{bw['read_bytes_per_s'] / 1e12:.2f} TB/s. Best split per row; TB/s counts weights (+ meta).", "",
             "| shape | kernel | lanes/row | chunks/lane | row sets | stages | L2 prefetch | meta | split | us | TB/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    best_rows = {}
    for r in rows:
        if "us" not in r:
            continue
        key = (r["k"], r["n"], r["kernel"], r.get("lanes_per_row"), r.get("chunks_per_lane"), r.get("row_sets"),
               r.get("stages"), r.get("hint"), r.get("meta"))
        if key not in best_rows or r["us"] < best_rows[key]["us"]:
            best_rows[key] = r
    for r in best_rows.values():
        lines.append(f"| K{r['k']}xN{r['n']} | {r['kernel']} | {r.get('lanes_per_row', '-')} | "
                     f"{r.get('chunks_per_lane', '-')} | {r.get('row_sets', '-')} | {r.get('stages', '-')} | "
                     f"{r.get('hint', '-')} | {r.get('meta', '-')} | {r.get('split', '-')} | {r['us']:.1f} | "
                     f"{r['tbps']:.2f} |")
    (args.out / "skinny_load_probe.md").write_text("\n".join(lines) + "\n")
    log(f"total {result['seconds']:.0f}s; by pattern (median TB/s over shapes):")
    for (lpr, cpl, sets), (s, hint, meta) in itertools.product(PATTERNS, CONFIGS):
        vals = [r["tbps"] for key, r in best_rows.items() if key[3:] == (lpr, cpl, sets, s, (0, 128, 256)[hint], meta)]
        if vals:
            log(f"  lpr{lpr} cpl{cpl} sets{sets} S{s} hint{(0, 128, 256)[hint]} meta{meta}: "
                f"{statistics.median(vals):.2f} (min {min(vals):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

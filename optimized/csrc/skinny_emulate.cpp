// Runs one call of the skinny kernel on the CPU emulation (skinny_emu.h), through the same host
// dispatch as the extension (resolve_variant, settle_variant, plan_split, launch_skinny). Built and driven by
// tests/test_skinny_compile.py; not part of the extension.
//
//   skinny_emulate IN OUT
//
// IN: 13 int64 [m, n, k, group_size, is_bf16, symmetric, has_bias, stride_xm, variant (-1: the
// default), engine, num_sms, scale_offset, split (0: plan_split's)], then little-endian arrays:
// x (m * stride_xm u16), qweight (n * k / 8 u32), scales (n * k / group_size u16), zeros
// (n / 8 * k / group_size u32, asymmetric only), bias (n u16, if any). scale_offset > 0 places
// the scales that many elements into their buffer (a view only 2-byte aligned). OUT: y (m * n
// u16); stderr ends with the variant and split that ran. Exit status 3: the launch did not finish
// in time (a warp whose lanes disagree on a collective operation deadlocks).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <vector>

#include "skinny_core.cuh"

namespace {

// An exact-size heap buffer (so that AddressSanitizer sees every overrun), 16-byte aligned.
void* alloc_exact(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 16, bytes == 0 ? 16 : bytes) != 0) std::abort();
  return p;
}

bool read_into(std::FILE* f, void* dst, size_t bytes) { return std::fread(dst, 1, bytes, f) == bytes; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
    return 2;
  }
  std::FILE* in = std::fopen(argv[1], "rb");
  if (in == nullptr) return 2;
  int64_t h[13];
  if (!read_into(in, h, sizeof(h))) return 2;
  const int64_t m = h[0], n = h[1], k = h[2], g = h[3], stride = h[7], scale_offset = h[11];
  const bool bf16 = h[4] != 0, sym = h[5] != 0, has_bias = h[6] != 0;
  const size_t x_bytes = static_cast<size_t>(m * stride * 2), q_bytes = static_cast<size_t>(n * k / 2);
  const size_t s_count = static_cast<size_t>(n * (k / g)), z_bytes = sym ? 0 : static_cast<size_t>(n / 8 * (k / g) * 4);
  void* x = alloc_exact(x_bytes);
  void* q = alloc_exact(q_bytes);
  auto* s_buf = static_cast<unsigned short*>(alloc_exact((s_count + static_cast<size_t>(scale_offset)) * 2));
  void* z = sym ? nullptr : alloc_exact(z_bytes);
  void* bias = has_bias ? alloc_exact(static_cast<size_t>(n) * 2) : nullptr;
  void* y = alloc_exact(static_cast<size_t>(m * n * 2));
  bool ok = read_into(in, x, x_bytes) && read_into(in, q, q_bytes) && read_into(in, s_buf + scale_offset, s_count * 2);
  if (!sym) ok = ok && read_into(in, z, z_bytes);
  if (has_bias) ok = ok && read_into(in, bias, static_cast<size_t>(n) * 2);
  std::fclose(in);
  if (!ok) {
    std::fprintf(stderr, "short input file\n");
    return 2;
  }

  w4::SkinnyParams p{};
  p.x = x;
  p.qweight = static_cast<const uint32_t*>(q);
  p.scales = s_buf + scale_offset;
  p.zeros = static_cast<const uint32_t*>(z);
  p.bias = bias;
  p.y = y;
  p.stride_xm = stride;
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.group_size = static_cast<int>(g);
  const w4::Engine engine = h[9] ? w4::Engine::kMma : w4::Engine::kSimt;
  p.variant = w4::settle_variant(w4::resolve_variant(static_cast<int>(h[8]), p.m, p.n, p.k), p.m,
                                 engine == w4::Engine::kMma, p.k);
  w4::plan_persist(p, static_cast<int>(h[10]));
  // The H100/H200 limits of shared memory a block (opt-in) and an SM.
  const w4::DeviceLimits limits{static_cast<int>(h[10]), 32, 227 * 1024, 228 * 1024};
  // A forced split (h[12]) steers the kernels that take one; seg_p always runs at split 1.
  p.split = h[12] > 0 && p.variant != w4::kVariantSegPersist ? static_cast<int>(h[12]) : w4::plan_split(p, limits);
  w4::plan_stages(p, limits);
  std::vector<float> partials(static_cast<size_t>(w4::stream_workspace_floats(p)));
  p.partials = partials.empty() ? nullptr : partials.data();

  auto run = std::async(std::launch::async, [&] {
    if (bf16) {
      w4::launch_skinny<w4::bf16_t>(p, engine, nullptr);
    } else {
      w4::launch_skinny<w4::half_t>(p, engine, nullptr);
    }
  });
  if (run.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    std::fprintf(stderr, "the emulated launch did not finish in 120 s (deadlock?)\n");
    std::fflush(stderr);
    std::_Exit(3);
  }
  run.get();

  std::FILE* out = std::fopen(argv[2], "wb");
  const size_t y_bytes = static_cast<size_t>(m * n * 2);
  if (out == nullptr || std::fwrite(y, 1, y_bytes, out) != y_bytes) return 2;
  std::fclose(out);
  std::fprintf(stderr, "variant %d split %d stages %d blocks %d\n", p.variant, p.split, p.stages, p.blocks);
  std::free(x);
  std::free(q);
  std::free(s_buf);
  std::free(z);
  std::free(bias);
  std::free(y);
  return 0;
}

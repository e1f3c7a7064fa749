// CPU emulation of the CUDA features the skinny kernel uses, so that its index arithmetic, ring
// and reductions can be executed without a GPU (tests/test_skinny_compile.py builds
// skinny_emulate.cpp with -DW4_EMU=1). One std::thread per GPU thread, one block at a time:
//  * __syncthreads, and the warp-collective mma.sync and shuffles, meet at barriers (a warp
//    whose lanes reach a different number of them deadlocks; the driver's watchdog reports it);
//  * fp16/bf16 fma and the tensor-core mma round exactly once from an exact (double) value.
// Not a model of timing or of the hardware's own accumulation order.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __shared__ static  // blocks run one at a time, so a static is exactly one block's copy

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }

struct __half {
  unsigned short bits;
};
struct __nv_bfloat16 {
  unsigned short bits;
};
using cudaStream_t = void*;

struct w4emu_dim {
  unsigned int x;
};

namespace w4emu {

// Exact rounding of a double to a binary format with `mbits` stored mantissa bits and `ebits`
// exponent bits (round to nearest even, subnormals, overflow to infinity).
inline uint32_t encode(double v, int mbits, int ebits) {
  const int bias = (1 << (ebits - 1)) - 1;
  const int emin = 1 - bias;
  const uint32_t sign = std::signbit(v) ? 1u << (mbits + ebits) : 0u;
  const uint32_t inf = ((1u << ebits) - 1) << mbits;
  if (std::isnan(v)) return sign | inf | (1u << (mbits - 1));
  const double a = std::fabs(v);
  if (std::isinf(a)) return sign | inf;
  if (a == 0.0) return sign;
  int ex;
  std::frexp(a, &ex);
  int e = ex - 1;  // a in [2^e, 2^(e+1))
  if (e < emin) e = emin;
  double q = std::nearbyint(std::ldexp(a, mbits - e));  // units of 2^(e - mbits)
  if (q >= std::ldexp(1.0, mbits + 1)) {
    q /= 2;
    e += 1;
  }
  if (e > bias) return sign | inf;
  const uint32_t qi = static_cast<uint32_t>(q);
  if (qi < (1u << mbits)) return sign | qi;  // subnormal
  return sign | (static_cast<uint32_t>(e + bias) << mbits) | (qi - (1u << mbits));
}

inline double decode(uint32_t bits, int mbits, int ebits) {
  const int bias = (1 << (ebits - 1)) - 1;
  const bool neg = (bits >> (mbits + ebits)) & 1u;
  const uint32_t e = (bits >> mbits) & ((1u << ebits) - 1);
  const uint32_t m = bits & ((1u << mbits) - 1);
  double v;
  if (e == (1u << ebits) - 1) {
    v = m ? std::nan("") : INFINITY;
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - mbits);
  } else {
    v = std::ldexp(static_cast<double>(m | (1u << mbits)), static_cast<int>(e) - bias - mbits);
  }
  return neg ? -v : v;
}

inline double half_value(uint32_t b) { return decode(b & 0xFFFFu, 10, 5); }
inline double bf16_value(uint32_t b) { return decode(b & 0xFFFFu, 7, 8); }

inline uint32_t fma_f16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const double r = half_value(a >> (16 * h)) * half_value(b >> (16 * h)) + half_value(c >> (16 * h));
    d |= encode(r, 10, 5) << (16 * h);
  }
  return d;
}

inline uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const double r = bf16_value(a >> (16 * h)) * bf16_value(b >> (16 * h)) + bf16_value(c >> (16 * h));
    d |= encode(r, 7, 8) << (16 * h);
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// Blocks and threads.

struct Warp {
  std::barrier<> sync{32};
  float shfl[32];
  uint32_t a[32][4], b[32][2];
  float c[32][4];
};

struct Block {
  // Dynamic shared memory starts as all-ones bits (NaN in both 16-bit types), so that a kernel
  // reading what it never wrote shows in the emulated result.
  Block(int threads, int shared_bytes)
      : sync(threads), warps(threads / 32), dynamic_shared(static_cast<size_t>(shared_bytes + 15) / 16) {
    for (auto& w : warps) w = std::make_unique<Warp>();
    std::memset(static_cast<void*>(dynamic_shared.data()), 0xFF, dynamic_shared.size() * sizeof(uint4));
  }
  std::barrier<> sync;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<uint4> dynamic_shared;
};

struct ThreadState {
  Block* block = nullptr;
  unsigned int tid = 0, bid = 0, blocks = 0;
};

inline thread_local ThreadState self;

inline Warp& my_warp() { return *self.block->warps[self.tid / 32]; }

template <typename T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(self.block->dynamic_shared.data());
}

inline float shfl_xor(float v, int mask) {
  Warp& w = my_warp();
  const unsigned lane = self.tid % 32;
  w.shfl[lane] = v;
  w.sync.arrive_and_wait();
  const float r = w.shfl[lane ^ static_cast<unsigned>(mask)];
  w.sync.arrive_and_wait();
  return r;
}

// m16n8k16, row.col, f32 accumulate (see the PTX ISA fragment layouts).
inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16) {
  Warp& w = my_warp();
  const unsigned lane = self.tid % 32;
  for (int i = 0; i < 4; ++i) {
    w.a[lane][i] = a[i];
    w.c[lane][i] = c[i];
  }
  w.b[lane][0] = b0;
  w.b[lane][1] = b1;
  w.sync.arrive_and_wait();
  auto val = [bf16](uint32_t reg, int h) { return bf16 ? bf16_value(reg >> (16 * h)) : half_value(reg >> (16 * h)); };
  auto A = [&](int row, int k) {  // lane (row % 8, (k % 8) / 2)
    const int src = 4 * (row % 8) + (k % 8) / 2;
    const int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return val(w.a[src][reg], k % 2);
  };
  auto B = [&](int k, int col) {  // lane (col, (k % 8) / 2)
    const int src = 4 * col + (k % 8) / 2;
    return val(w.b[src][k >= 8 ? 1 : 0], k % 2);
  };
  const int g = static_cast<int>(lane) / 4, t = static_cast<int>(lane) % 4;
  float d[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    double s = 0.0;
    for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, col);
    d[i] = static_cast<float>(s + static_cast<double>(w.c[lane][i]));
  }
  w.sync.arrive_and_wait();
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

inline void syncthreads() { self.block->sync.arrive_and_wait(); }
inline void syncwarp() { my_warp().sync.arrive_and_wait(); }

template <typename P>
void launch(void (*kernel)(P), int blocks, int threads, const P& p, int shared_bytes = 0) {
  for (int b = 0; b < blocks; ++b) {
    Block block(threads, shared_bytes);
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(threads));
    for (int tid = 0; tid < threads; ++tid) {
      pool.emplace_back([&, tid] {
        self = ThreadState{};
        self.block = &block;
        self.tid = static_cast<unsigned>(tid);
        self.bid = static_cast<unsigned>(b);
        self.blocks = static_cast<unsigned>(blocks);
        kernel(p);
      });
    }
    for (auto& th : pool) th.join();
  }
}

}  // namespace w4emu

// The CUDA spellings the kernel and compat.h use.
#define threadIdx (w4emu_dim{w4emu::self.tid})
#define blockIdx (w4emu_dim{w4emu::self.bid})
#define gridDim (w4emu_dim{w4emu::self.blocks})

inline void __syncthreads() { w4emu::syncthreads(); }
inline void __syncwarp() { w4emu::syncwarp(); }
inline float __shfl_xor_sync(unsigned, float v, int mask) { return w4emu::shfl_xor(v, mask); }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t bytes = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = (s >> (4 * i)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(bytes >> (8 * (sel & 7u))) & 0xFFu;
    if (sel & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * i);
  }
  return r;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline __half __ushort_as_half(unsigned short b) { return {b}; }
inline float __half2float(__half h) { return static_cast<float>(w4emu::half_value(h.bits)); }
inline __half __float2half_rn(float f) { return {static_cast<unsigned short>(w4emu::encode(f, 10, 5))}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return {static_cast<unsigned short>(w4emu::encode(f, 7, 8))};
}

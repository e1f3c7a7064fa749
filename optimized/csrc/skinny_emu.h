// CPU emulation of the CUDA features the skinny kernels use, so that their index arithmetic, rings
// and reductions run without a GPU (skinny_emulate.cpp, built with -DW4_EMU=1 by the tests). Each
// GPU thread is a fiber of one OS thread, and blocks run one at a time:
//  * __syncthreads, and the warp-collective mma.sync and shuffles, meet at barriers; a fiber that
//    reaches one waits until every thread of its block or warp has, and a block whose fibers all
//    wait (a warp whose lanes reach a different number of collectives) is reported as a deadlock;
//  * fp16/bf16 fma and the tensor-core mma round exactly once from an exact (double) value.
// Not a model of timing, of concurrency or of the hardware's own accumulation order.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define W4EMU_ASAN 1
#else
#define W4EMU_ASAN 0
#endif

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __grid_constant__
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

// Every 16-bit pattern's value, fp16 then bf16 (decode, once).
inline const double* value_table(bool bf16) {
  static const std::vector<double> table = [] {
    std::vector<double> t(2 * 65536);
    for (uint32_t b = 0; b < 65536; ++b) {
      t[b] = decode(b, 10, 5);
      t[65536 + b] = decode(b, 7, 8);
    }
    return t;
  }();
  return table.data() + (bf16 ? 65536 : 0);
}

inline double half_value(uint32_t b) { return value_table(false)[b & 0xFFFFu]; }
inline double bf16_value(uint32_t b) { return value_table(true)[b & 0xFFFFu]; }

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
// Blocks, warps and threads (fibers).

// `expected` fibers arrive; the last one runs the completion (if any) and releases the others.
struct Barrier {
  int expected = 0;
  int arrived = 0;
  unsigned phase = 0;
};

struct Warp {
  Barrier sync;
  float shfl_in[32], shfl_out[32];
  uint32_t a[32][4], b[32][2];
  float c[32][4], d[32][4];
};

// Switching between fibers: on x86-64 a minimal switch of the callee-saved registers (ucontext's
// swapcontext makes a system call each time, which dominated the emulator's run time), elsewhere
// ucontext.
#if defined(__x86_64__)
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
// the stack pointer in *from and continues on the stack `to` (one that this function saved, or a
// fresh one from new_context).
extern "C" void w4emu_switch(void** from, void* to);
asm(R"(
.text
.weak w4emu_switch
.type w4emu_switch, @function
w4emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size w4emu_switch, .-w4emu_switch
)");

struct Context {
  void* sp = nullptr;
};

// A stack [stack, stack + bytes) that w4emu_switch enters at entry(), which must never return.
inline void new_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15});
  *--top = 0;                                    // entry's return address: none
  *--top = reinterpret_cast<uint64_t>(entry);    // where the switch's ret goes
  for (int i = 0; i < 6; ++i) *--top = 0;        // rbp, rbx, r12..r15
  *--top = 0x1F80ull | (0x037Full << 32);        // MXCSR, x87 control word: the defaults
  c.sp = top;
}

inline void switch_context(Context& from, Context& to) { w4emu_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};

inline void new_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}

inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

struct Fiber {
  Context context;
  char* stack = nullptr;
  unsigned tid = 0;
  const Barrier* waiting = nullptr;  // the barrier it waits at, until its phase moves on
  unsigned waiting_phase = 0;
  const unsigned* waiting_mbar = nullptr;  // or the phase count of an mbarrier, until its parity
  unsigned waiting_parity = 0;             // differs from this one
  bool done = false;
};

// An mbarrier: `expected` arrivals and `tx` bytes complete its phase; `phase` counts completed
// phases.
struct Mbarrier {
  int expected = 0, pending = 0;
  int64_t tx = 0;
  unsigned phase = 0;
};

constexpr size_t kStackBytes = 256 * 1024;

// One launch: its fibers (stacks kept from block to block) and the running block's shared state.
struct Launch {
  std::function<void()> body;
  std::vector<Fiber> fibers;
  char* stacks = nullptr;
  size_t stacks_bytes = 0;
  Context main;  // the scheduler's context
  const void* main_bottom = nullptr;
  size_t main_size = 0;
  Barrier block_sync;
  Barrier named_sync[16];  // bar.sync id, count (id 0 is block_sync)
  std::map<uint32_t, Mbarrier> mbarriers;  // by shared-memory offset
  std::vector<Warp> warps;
  std::vector<uint4> dynamic_shared;
  unsigned bid = 0, blocks = 0;
};

inline Launch* launch_state = nullptr;  // the launch running (one at a time)
inline Fiber* current = nullptr;        // the GPU thread running in it

inline Warp& my_warp() { return launch_state->warps[current->tid / 32]; }

template <typename T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(launch_state->dynamic_shared.data());
}

// From the running fiber back to the scheduler, until the scheduler resumes it.
inline void yield() {
  Fiber* self = current;
#if W4EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, launch_state->main_bottom, launch_state->main_size);
#endif
  switch_context(self->context, launch_state->main);
#if W4EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

template <typename Completion>
inline void arrive_and_wait(Barrier& b, Completion&& completion) {
  const unsigned phase = b.phase;
  if (++b.arrived == b.expected) {
    completion();
    b.arrived = 0;
    ++b.phase;
    return;
  }
  current->waiting = &b;
  current->waiting_phase = phase;
  yield();
}

inline void arrive_and_wait(Barrier& b) {
  arrive_and_wait(b, [] {});
}

inline float shfl_xor(float v, int mask) {
  Warp& w = my_warp();
  const unsigned lane = current->tid % 32;
  w.shfl_in[lane] = v;
  arrive_and_wait(w.sync, [&w] { std::memcpy(w.shfl_out, w.shfl_in, sizeof(w.shfl_in)); });
  return w.shfl_out[lane ^ static_cast<unsigned>(mask)];
}

// m16n8k16, row.col, f32 accumulate, for the whole warp (see the PTX ISA fragment layouts): each
// output is the 16 products summed in k order in double, plus C, rounded once to fp32.
inline void warp_mma(Warp& w, bool bf16) {
  const double* value = value_table(bf16);
  double A[16][16], B[16][8];
  for (int row = 0; row < 16; ++row) {
    for (int k = 0; k < 16; ++k) {  // lane (row % 8, (k % 8) / 2)
      const uint32_t reg = w.a[4 * (row % 8) + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
      A[row][k] = value[(reg >> (16 * (k % 2))) & 0xFFFFu];
    }
  }
  for (int k = 0; k < 16; ++k) {
    for (int col = 0; col < 8; ++col) {  // lane (col, (k % 8) / 2)
      const uint32_t reg = w.b[4 * col + (k % 8) / 2][k >= 8 ? 1 : 0];
      B[k][col] = value[(reg >> (16 * (k % 2))) & 0xFFFFu];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
      double s = 0.0;
      for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
      w.d[lane][i] = static_cast<float>(s + static_cast<double>(w.c[lane][i]));
    }
  }
}

inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16) {
  Warp& w = my_warp();
  const unsigned lane = current->tid % 32;
  for (int i = 0; i < 4; ++i) {
    w.a[lane][i] = a[i];
    w.c[lane][i] = c[i];
  }
  w.b[lane][0] = b0;
  w.b[lane][1] = b1;
  arrive_and_wait(w.sync, [&w, bf16] { warp_mma(w, bf16); });
  for (int i = 0; i < 4; ++i) c[i] = w.d[lane][i];
}

inline uint32_t shared_offset(const void* p) {
  return static_cast<uint32_t>(static_cast<const char*>(p) - dynamic_shared<char>());
}

// wgmma.mma_async m64nNk16, f32 accumulate, A from registers (each warp's 16 rows of the 64 in
// the m16n8k16 A fragment map) and B K-major with the 128-byte swizzle in shared memory
// (descriptor: address / 16 in bits 0..13, 8-row groups 1024 bytes apart), for one thread: its
// warp's rows quad, quad + 8 (the mma C fragment map per 8 columns), each output the 16 products
// summed in k order in double, plus the accumulator, rounded once to fp32. The warp meets twice:
// once its A fragments are in, and before any lane may replace them. Synchronous: the kernel's
// waits have nothing left to wait for.
inline void wgmma_rs(float* d, int n, const uint32_t (&a)[4], uint64_t b, bool bf16) {
  Warp& w = my_warp();
  const unsigned lane = current->tid % 32;
  for (int i = 0; i < 4; ++i) w.a[lane][i] = a[i];
  arrive_and_wait(w.sync);
  const double* value = value_table(bf16);
  const auto* base = dynamic_shared<unsigned char>();
  auto b_element = [&](int col, int k) {
    uint32_t at = static_cast<uint32_t>(b & 0x3FFFu) * 16 + (col / 8) * 1024 + (col % 8) * 128 + 2 * k;
    at ^= ((at >> 7) & 7u) << 4;  // the swizzle: 16-byte chunk ^= row % 8 (address bits 7..9)
    return value[base[at] | (base[at + 1] << 8)];
  };
  auto a_element = [&](int row, int k) {  // lane (row % 8, (k % 8) / 2) of the warp
    const uint32_t reg = w.a[4 * (row % 8) + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
    return value[(reg >> (16 * (k % 2))) & 0xFFFFu];
  };
  const int quad = static_cast<int>(lane) / 4, t = static_cast<int>(lane) % 4;
  for (int i = 0; i < n / 8; ++i) {
    for (int c = 0; c < 4; ++c) {
      const int row = quad + 8 * (c / 2), col = 8 * i + 2 * t + c % 2;
      double sum = 0.0;
      for (int k = 0; k < 16; ++k) sum += a_element(row, k) * b_element(col, k);
      d[4 * i + c] = static_cast<float>(sum + static_cast<double>(d[4 * i + c]));
    }
  }
  arrive_and_wait(w.sync);
}

inline void syncthreads() { arrive_and_wait(launch_state->block_sync); }
inline void syncwarp() { arrive_and_wait(my_warp().sync); }

// bar.sync id, threads: the first `threads` to arrive meet (named barriers of warp-specialized kernels).
inline void named_sync(int id, int threads) {
  Barrier& b = launch_state->named_sync[id];
  b.expected = threads;
  arrive_and_wait(b);
}

// mbarriers, by their shared-memory offset.
inline Mbarrier& mbarrier(uint32_t offset) {
  const auto found = launch_state->mbarriers.find(offset);
  if (found == launch_state->mbarriers.end()) {
    std::fprintf(stderr, "the emulated block %u used an mbarrier at shared offset %u before initializing it\n",
                 launch_state->bid, offset);
    std::_Exit(3);
  }
  return found->second;
}

inline void mbarrier_init(uint32_t offset, int count) {
  launch_state->mbarriers[offset] = Mbarrier{count, count, 0, 0};
}

inline void mbarrier_settle(Mbarrier& m) {
  if (m.pending == 0 && m.tx == 0) {
    ++m.phase;
    m.pending = m.expected;
  }
}

// One arrival, after adding `tx` expected bytes (mbarrier.arrive.expect_tx; 0: mbarrier.arrive).
inline void mbarrier_arrive(uint32_t offset, int64_t tx) {
  Mbarrier& m = mbarrier(offset);
  m.tx += tx;
  --m.pending;
  mbarrier_settle(m);
}

inline void mbarrier_complete_tx(uint32_t offset, int64_t bytes) {
  Mbarrier& m = mbarrier(offset);
  m.tx -= bytes;
  mbarrier_settle(m);
}

// Until the phase of parity `parity` has completed (mbarrier.try_wait.parity in a loop).
inline void mbarrier_wait(uint32_t offset, unsigned parity) {
  const Mbarrier& m = mbarrier(offset);
  if ((m.phase & 1u) != parity) return;
  current->waiting_mbar = &m.phase;
  current->waiting_parity = parity;
  yield();
}

// A 2D tensor map as cuTensorMapEncodeTiled describes one: dims[0] elements of `element_bytes`
// contiguous, dims[1] rows `stride` bytes apart; a box of box[0] x box[1] elements lands row by
// row in shared memory, 16-byte chunk c of each 64- or 128-byte row (swizzle = 64 or 128; 0: none)
// stored at c ^ (address bits 7.. of the chunk); elements outside dims read as zero.
struct TensorMap {
  const unsigned char* base;
  int64_t dims[2];
  int64_t stride;
  int box[2];
  int element_bytes;
  int swizzle;
};

// cp.async.bulk.tensor.2d: the box at element (c0, c1) of `map` into shared memory at `dst`, done at
// once, its bytes completing on the mbarrier at `mbar`.
inline void tma_load_2d(uint32_t dst, const TensorMap& map, int c0, int c1, uint32_t mbar) {
  unsigned char* smem = dynamic_shared<unsigned char>();
  const int row_bytes = map.box[0] * map.element_bytes;
  for (int r = 0; r < map.box[1]; ++r) {
    for (int byte = 0; byte < row_bytes; ++byte) {
      uint32_t at = static_cast<uint32_t>(r * row_bytes + byte);
      if (map.swizzle == 128) at ^= ((at >> 7) & 7u) << 4;
      if (map.swizzle == 64) at ^= ((at >> 7) & 3u) << 4;
      const int64_t e0 = c0 + byte / map.element_bytes, e1 = c1 + r;
      const bool inside = e0 >= 0 && e0 < map.dims[0] && e1 >= 0 && e1 < map.dims[1];
      smem[dst + at] = inside ? map.base[e1 * map.stride + e0 * map.element_bytes + byte % map.element_bytes] : 0;
    }
  }
  mbarrier_complete_tx(mbar, static_cast<int64_t>(row_bytes) * map.box[1]);
}

inline void fiber_entry() {
#if W4EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &launch_state->main_bottom, &launch_state->main_size);
#endif
  launch_state->body();
  current->done = true;
#if W4EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, launch_state->main_bottom, launch_state->main_size);
#endif
  switch_context(current->context, launch_state->main);  // never resumed
}

inline void resume(Fiber& f) {
  current = &f;
#if W4EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, f.stack, kStackBytes);
#endif
  switch_context(launch_state->main, f.context);
#if W4EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// Runs block `bid` to its end: every fiber until it waits at a barrier or finishes, round and
// round, until all have finished.
inline void run_block(Launch& l, int threads, int shared_bytes) {
  l.block_sync = Barrier{threads};
  for (Barrier& b : l.named_sync) b = Barrier{};
  l.mbarriers.clear();
  l.warps.assign(static_cast<size_t>(threads / 32), Warp{});
  for (Warp& w : l.warps) w.sync.expected = 32;
  // Dynamic shared memory starts as all-ones bits (NaN in both 16-bit types), so that a kernel
  // reading what it never wrote shows in the emulated result.
  l.dynamic_shared.assign(static_cast<size_t>(shared_bytes + 15) / 16, make_uint4(~0u, ~0u, ~0u, ~0u));
  for (Fiber& f : l.fibers) {
    f.done = false;
    f.waiting = nullptr;
    f.waiting_mbar = nullptr;
    new_context(f.context, f.stack, kStackBytes, fiber_entry);
  }
  for (;;) {
    bool ran = false, all_done = true;
    for (Fiber& f : l.fibers) {
      if (f.done) continue;
      all_done = false;
      if (f.waiting != nullptr && f.waiting->phase == f.waiting_phase) continue;
      if (f.waiting_mbar != nullptr && (*f.waiting_mbar & 1u) == f.waiting_parity) continue;
      f.waiting = nullptr;
      f.waiting_mbar = nullptr;
      resume(f);
      ran = true;
    }
    if (all_done) return;
    if (!ran) {
      int waiting = 0;
      for (const Fiber& f : l.fibers) waiting += f.done ? 0 : 1;
      std::fprintf(stderr, "the emulated block %u deadlocked: %d of its %d threads wait at a barrier that the others "
                   "never reach, or at an mbarrier that never completes (a warp's lanes disagree on a collective operation?)\n", l.bid, waiting, threads);
      std::fflush(stderr);
      std::_Exit(3);
    }
  }
}

template <typename... P>
void launch_args(void (*kernel)(P...), int blocks, int threads, int shared_bytes, const P&... p) {
  Launch l;
  l.body = [kernel, &p...] { kernel(p...); };
  l.blocks = static_cast<unsigned>(blocks);
  // Each stack with an inaccessible page below it, so that an overflow faults.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  l.stacks_bytes = static_cast<size_t>(threads) * (kStackBytes + page);
  void* region = mmap(nullptr, l.stacks_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
  if (region == MAP_FAILED) {
    std::fprintf(stderr, "could not map the emulated threads' stacks\n");
    std::_Exit(2);
  }
  l.stacks = static_cast<char*>(region);
  l.fibers.resize(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    char* guard = l.stacks + static_cast<size_t>(t) * (kStackBytes + page);
    mprotect(guard, page, PROT_NONE);
    l.fibers[static_cast<size_t>(t)].stack = guard + page;
    l.fibers[static_cast<size_t>(t)].tid = static_cast<unsigned>(t);
  }
  Launch* outer = launch_state;
  launch_state = &l;
  for (int b = 0; b < blocks; ++b) {
    l.bid = static_cast<unsigned>(b);
    run_block(l, threads, shared_bytes);
  }
  launch_state = outer;
  current = nullptr;
  munmap(region, l.stacks_bytes);
}

template <typename P>
void launch(void (*kernel)(P), int blocks, int threads, const P& p, int shared_bytes = 0) {
  launch_args(kernel, blocks, threads, shared_bytes, p);
}

}  // namespace w4emu

// The CUDA spellings the kernels and compat.h use.
#define threadIdx (w4emu_dim{w4emu::current->tid})
#define blockIdx (w4emu_dim{w4emu::launch_state->bid})
#define gridDim (w4emu_dim{w4emu::launch_state->blocks})

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

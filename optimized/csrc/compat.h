// One spelling for what differs between CUDA and HIP, so the skinny kernel is a single source.
//
// Compiled three ways: nvcc (CUDA), hipcc directly (the CI compile check), and hipcc after
// PyTorch's hipify on ROCm builds (which rewrites the CUDA branch below; harmless, it is not
// compiled there).
#pragma once

#include <cstdint>

#if defined(W4_EMU)
// CPU emulation (skinny_emu.h, built by tests/support/skinny_emulator.py): the CUDA code path
// with every intrinsic and inline-asm instruction replaced by a host function, one fiber per GPU
// thread. Not a build target of the extension.
#define W4_HIP 0
#include "skinny_emu.h"
#elif defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define W4_HIP 1
#define W4_EMU 0
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
// ROCm >= 5.7 ships __hip_bfloat16 in hip_bf16.h; older releases (Debian's HIP 5.2) only the
// hip_bfloat16 class, which converts through explicit constructors.
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
#define W4_HIP_BF16_INTRINSICS 1
#else
#include <hip/hip_bfloat16.h>
#endif
#else
#define W4_HIP 0
#define W4_EMU 0
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

// Threads per warp (wavefront). Device code sees the target's value: 64 on CDNA (gfx9), 32 on
// RDNA (gfx10+, wave32 by default) and NVIDIA. The HIP host pass has no target, so the fallback
// value there must never size anything the device relies on.
#if W4_HIP
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define W4_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define W4_WARP_SIZE 64
#endif
#else
#define W4_WARP_SIZE 32
#endif

// Read-only load: through the non-coherent texture path on CUDA. AMD has no separate path and
// its compiler already treats `const __restrict__` loads as read-only.
#if W4_HIP
#define W4_LDG(ptr) (*(ptr))
#else
#define W4_LDG(ptr) __ldg(ptr)
#endif

// The kernel's dynamic shared memory (sized at launch) as `type name[]`.
#if W4_EMU
#define W4_DYNAMIC_SHARED(type, name) type* name = ::w4emu::dynamic_shared<type>()
#else
#define W4_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

// Caps registers so that `min_blocks` blocks share one SM (CUDA). HIP reads a second argument
// as waves per execution unit, a different quantity, so it gets none.
#if W4_EMU
#define W4_LAUNCH_BOUNDS(threads, min_blocks)
#elif W4_HIP
#define W4_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads)
#else
#define W4_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
#endif

namespace w4 {

#if W4_HIP
using half_t = __half;
#if defined(W4_HIP_BF16_INTRINSICS)
using bf16_t = __hip_bfloat16;
#else
using bf16_t = hip_bfloat16;
#endif
using stream_t = hipStream_t;
#else
using half_t = __half;
using bf16_t = __nv_bfloat16;
using stream_t = cudaStream_t;
#endif

static_assert(sizeof(half_t) == 2 && sizeof(bf16_t) == 2, "16-bit activation types");

// Programmatic dependent launch (CUDA sm_90+; a no-op elsewhere and when the launch did not ask
// for it). pdl_trigger lets the next kernel on the stream launch once every block of this one has
// called it or exited, so its blocks take SM slots as this kernel's last blocks drain; pdl_wait
// blocks until the previous kernel has completed and its writes are visible. Reads of anything the
// previous kernel may have written, and every write, must come after pdl_wait, by instructions
// that cannot be moved above it (not read-only .nc loads: see skinny_common.cuh load_x).
__device__ __forceinline__ void pdl_trigger() {
#if !W4_HIP && !W4_EMU && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if !W4_HIP && !W4_EMU && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
#if W4_HIP
  return __shfl_xor(v, lane_mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#endif
}

// Raw 16-bit patterns to float (exact). Kernels move activations as bits so that 16-byte vector
// loads need no per-platform vector types of half/bfloat16.
template <typename T>
__device__ __forceinline__ float bits_to_float(uint32_t bits16);

template <>
__device__ __forceinline__ float bits_to_float<half_t>(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

// bfloat16 is the top half of a float32, so the conversion is a shift on every platform.
template <>
__device__ __forceinline__ float bits_to_float<bf16_t>(uint32_t bits16) {
  return __uint_as_float(bits16 << 16);
}

// Round to nearest even, the one rounding of each output element.
template <typename T>
__device__ __forceinline__ T from_float(float v);

template <>
__device__ __forceinline__ half_t from_float<half_t>(float v) {
  return __float2half_rn(v);
}

template <>
__device__ __forceinline__ bf16_t from_float<bf16_t>(float v) {
#if W4_HIP && defined(W4_HIP_BF16_INTRINSICS)
  return __float2bfloat16(v);  // HIP's spelling rounds to nearest even; it has no _rn variant
#elif W4_HIP
  return bf16_t(v);
#else
  return __float2bfloat16_rn(v);
#endif
}

}  // namespace w4

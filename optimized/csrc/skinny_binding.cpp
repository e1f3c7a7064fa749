// Torch binding of the skinny kernel: the CUDA (and, hipified, ROCm) implementation of the op
// w4a16::skinny_matmul, whose schema and fake implementation live in optimized/skinny.py.
// Every contract violation is a TORCH_CHECK here too, for callers that reach the op directly.
// A .cpp unit, built by the host C++ compiler like PyTorch itself: only the kernels go through
// nvcc (skinny_launch.cu, skinny_inst_v*.cu).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>

#include "skinny_host.h"

namespace {

// Numbers enter messages as text from std::to_string, never streamed. On the device image (Ubuntu
// g++ 13.3, PyTorch 2.11.0+cu130) an integer streamed into a std::ostream from extension code
// crashed the process (SIGSEGV) whether nvcc or g++ built it, while text, dtypes, devices and
// PyTorch's own messages worked (bench/results/h100/torch_check_probe_s25.md); c10::str streams
// its arguments, and so does printing sizes().
std::string num(int64_t v) { return std::to_string(v); }

std::string dims(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

bool is_packed_dtype(at::ScalarType t) { return t == at::kInt || t == at::ScalarType::UInt32; }

bool is_byte_dtype(at::ScalarType t) { return t == at::kChar || t == at::kByte; }

// Whether a pointer and a row stride (in elements of `elem` bytes) keep every row 16-byte aligned.
bool rows_aligned(const void* ptr, int64_t row_stride, int64_t rows, int64_t elem) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (rows == 1 || row_stride * elem % 16 == 0);
}

at::Tensor skinny_matmul_cuda(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                              const std::optional<at::Tensor>& zeros, int64_t group_size,
                              const std::optional<at::Tensor>& bias, c10::string_view engine, int64_t variant,
                              c10::string_view overlap, int64_t split) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16),
              "skinny_matmul: x must be float16 or bfloat16 [M, K], got ", x.scalar_type(), " ", dims(x.sizes()));
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(m >= 1 && m <= w4::kMaxM, "skinny_matmul: M must be in [1, ", num(w4::kMaxM), "], got M=", num(m),
              " (use a prefill kernel for larger batches)");
  TORCH_CHECK(group_size == 32 || group_size == 64 || group_size == 128,
              "skinny_matmul: group_size must be 32, 64 or 128, got ", num(group_size));
  TORCH_CHECK(k % group_size == 0, "skinny_matmul: K must be a multiple of group_size, got K=", num(k),
              ", group_size=", num(group_size));
  TORCH_CHECK(x.stride(1) == 1, "skinny_matmul: x must be contiguous along K (stride(1) == 1), got strides ",
              dims(x.strides()));
  TORCH_CHECK(rows_aligned(x.data_ptr(), x.stride(0), m, 2),
              "skinny_matmul: x rows must start on 16-byte boundaries (data pointer and stride(0) * 2 bytes "
              "multiples of 16), got stride(0)=", num(x.stride(0)));

  TORCH_CHECK(qweight.dim() == 2, "skinny_matmul: qweight must be 2-D: int32 [N, K/8] or int8 [N, K/2], got ",
              dims(qweight.sizes()));
  const int64_t n = qweight.size(0);
  const int64_t weight_bytes = qweight.numel() * static_cast<int64_t>(qweight.element_size());
  TORCH_CHECK(weight_bytes >= n * k / 2, "skinny_matmul: qweight holds ", num(weight_bytes),
              " bytes but N*K/2 = ", num(n * k / 2), " are needed (N=", num(n), ", K=", num(k), ")");
  const bool packed = is_packed_dtype(qweight.scalar_type());
  TORCH_CHECK(packed || is_byte_dtype(qweight.scalar_type()),
              "skinny_matmul: qweight must be int32/uint32 [N, K/8] packed along K (or the same bytes as "
              "int8/uint8 [N, K/2]), got ", qweight.scalar_type());
  TORCH_CHECK(qweight.size(1) == (packed ? k / 8 : k / 2), "skinny_matmul: qweight must be ",
              packed ? "[N, K/8] = [" : "[N, K/2] = [", num(n), ", ", num(packed ? k / 8 : k / 2), "], got ",
              dims(qweight.sizes()));
  TORCH_CHECK(qweight.is_contiguous() && rows_aligned(qweight.data_ptr(), 1, 1, 1),
              "skinny_matmul: qweight must be contiguous and 16-byte aligned, got strides ", dims(qweight.strides()));

  const int64_t groups = k / group_size;
  TORCH_CHECK(scales.scalar_type() == x.scalar_type() && scales.dim() == 2 && scales.size(0) == n &&
                  scales.size(1) == groups,
              "skinny_matmul: scales must be ", x.scalar_type(), " [N, K/G] = [", num(n), ", ", num(groups), "], got ",
              scales.scalar_type(), " ", dims(scales.sizes()));
  TORCH_CHECK(scales.is_contiguous(), "skinny_matmul: scales must be contiguous");
  if (zeros.has_value()) {
    const at::Tensor& z = *zeros;
    TORCH_CHECK(is_packed_dtype(z.scalar_type()),
                "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0), got ", z.scalar_type(),
                " ", dims(z.sizes()));
    TORCH_CHECK(n % 8 == 0 && z.dim() == 2 && z.size(0) * 8 == n && z.size(1) == groups,
                "skinny_matmul: packed zero points must be [N/8, K/G] = [", num(n / 8), ", ", num(groups),
                "] with N % 8 == 0, got ", dims(z.sizes()), " for N=", num(n));
    TORCH_CHECK(z.is_contiguous(), "skinny_matmul: zero points must be contiguous");
  }
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->dim() == 1 && bias->size(0) == n,
                "skinny_matmul: bias must be ", x.scalar_type(), " [N] = [", num(n), "], got ", bias->scalar_type(),
                " ", dims(bias->sizes()));
    TORCH_CHECK(bias->is_contiguous(), "skinny_matmul: bias must be contiguous");
  }
  TORCH_CHECK(x.is_cuda(), "skinny_matmul: tensors must be on a CUDA/ROCm device, got ", x.device());
  for (const at::Tensor* t : {&qweight, &scales, zeros ? &*zeros : nullptr, bias ? &*bias : nullptr}) {
    TORCH_CHECK(t == nullptr || t->device() == x.device(), "skinny_matmul: all tensors must be on ", x.device(),
                ", got one on ", t->device());
  }
  TORCH_CHECK(n <= INT32_MAX && k <= INT32_MAX, "skinny_matmul: N and K must fit in int32");
  TORCH_CHECK(variant >= w4::kAutoVariant && variant < w4::kNumVariants,
              "skinny_matmul: variant must be -1 (the default) or in [0, ", num(w4::kNumVariants), "), got ",
              num(variant));

  // The Overlap names, in enum order (optimized/skinny.py OVERLAPS).
  static constexpr const char* kOverlapNames[w4::kNumOverlaps] = {"none", "weights"};
  int overlap_mode = -1;
  for (int i = 0; i < w4::kNumOverlaps; ++i) {
    if (overlap == kOverlapNames[i]) overlap_mode = i;
  }
  TORCH_CHECK(overlap_mode >= 0, "skinny_matmul: overlap must be 'none' or 'weights', got '",
              std::string(overlap), "'");

  const c10::cuda::CUDAGuard guard(x.device());
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  w4::Engine kind = w4::Engine::kSimt;
  if (engine == "mma" || engine == "auto") {
#if W4_HIP
    TORCH_CHECK(engine == "auto", "skinny_matmul: engine 'mma' is CUDA-only (tensor-core mma.sync); use 'simt'");
#else
    TORCH_CHECK(engine == "auto" || prop->major >= 8, "skinny_matmul: engine 'mma' needs compute capability 8.0+");
    if (prop->major >= 8) kind = w4::Engine::kMma;
#endif
  } else {
    TORCH_CHECK(engine == "simt", "skinny_matmul: engine must be 'auto', 'mma' or 'simt', got '",
                std::string(engine), "'");
  }

  at::Tensor y = at::empty({m, n}, x.options());
  if (n == 0) return y;
  w4::SkinnyParams p{};
  p.x = x.data_ptr();
  p.qweight = static_cast<const uint32_t*>(qweight.data_ptr());
  p.scales = scales.data_ptr();
  p.zeros = zeros ? static_cast<const uint32_t*>(zeros->data_ptr()) : nullptr;
  p.bias = bias ? bias->data_ptr() : nullptr;
  p.y = y.data_ptr();
  p.stride_xm = x.stride(0);
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.group_size = static_cast<int>(group_size);
  p.variant = w4::settle_variant(w4::resolve_variant(static_cast<int>(variant), p.m, p.n, p.k), p.m,
                                 kind == w4::Engine::kMma, p.k);
  w4::plan_persist(p, prop->multiProcessorCount);
  const w4::DeviceLimits limits{prop->multiProcessorCount, prop->warpSize,
                                static_cast<int>(prop->sharedMemPerBlockOptin),
                                static_cast<int>(prop->sharedMemPerMultiprocessor)};
  TORCH_CHECK(split >= 0, "skinny_matmul: split must be 0 (the plan's) or positive, got ", num(split));
  TORCH_CHECK(split == 0 || (variant >= 0 && variant != w4::kVariantSegPersist),
              "skinny_matmul: split must be 0 (the plan's) unless variant names a kernel other than ",
              num(w4::kVariantSegPersist), " (seg_p, which plans its own grid), got split=", num(split),
              " with variant=", num(variant));
  const int warps = w4::kBlockThreads / prop->warpSize;
  TORCH_CHECK(split == 0 || variant == w4::kVariantStream || (split <= warps && (split & (split - 1)) == 0),
              "skinny_matmul: a forced split of variant ", num(variant), " must be a power of two up to the ",
              num(warps), " warps of a block, got ", num(split));
  // A forced split steers the kernel it was asked for; where another one runs (settle_variant),
  // that one takes its plan's split.
  if (split > 0 && p.variant == variant && p.variant != w4::kVariantStream) {
    p.split = static_cast<int>(split);
  } else if (split > 0 && p.variant == w4::kVariantStream) {
    TORCH_CHECK(split <= k / w4::kStreamPieceK, "skinny_matmul: the stream variant's split must be in [1, K/",
                num(w4::kStreamPieceK), "] = [1, ", num(k / w4::kStreamPieceK), "], got ", num(split));
    const int shared = w4::stream_plan_layout(p.n, p.m, p.k, p.group_size, !zeros.has_value(), static_cast<int>(split),
                                              limits).bytes;
    TORCH_CHECK(shared <= limits.max_shared, "skinny_matmul: the stream variant at split ", num(split), " needs ",
                num(shared), " bytes of shared memory a block, the device allows ", num(limits.max_shared),
                " (use a larger split)");
    p.split = static_cast<int>(split);
  } else {
    p.split = w4::plan_split(p, limits);
  }
  w4::plan_stages(p, limits);
  at::Tensor partials;  // kept alive until the launches are queued; the stream orders its reuse
  if (const int64_t floats = w4::stream_workspace_floats(p); floats > 0) {
    partials = at::empty({floats}, x.options().dtype(at::kFloat));
    p.partials = partials.data_ptr<float>();
  }
  // Programmatic dependent launch exists on CUDA sm_90+ only.
#if W4_HIP
  p.overlap = w4::kOverlapNone;
#else
  p.overlap = prop->major >= 9 ? overlap_mode : w4::kOverlapNone;
#endif

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  w4::launch(p, kind, x.scalar_type() == at::kBFloat16, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(w4a16, CUDA, m) { m.impl("skinny_matmul", &skinny_matmul_cuda); }

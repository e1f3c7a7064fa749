// Torch binding of the skinny kernel: the implementations of the ops w4a16::skinny_matmul (CUDA,
// and hipified ROCm) and w4a16::skinny_plan (no tensors), whose schemas and the matmul's fake
// implementation live in optimized/skinny.py. Every contract violation is a TORCH_CHECK here too,
// for callers that reach the ops directly; what a call runs is skinny_plan.h's plan_call alone.
// A .cpp unit, built by the host C++ compiler like PyTorch itself: only the kernels go through
// nvcc (skinny_launch.cu and the family units).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <vector>

#include "skinny_plan.h"

namespace {

// Numbers enter messages as text from std::to_string, never streamed: on the device image an
// integer streamed into a std::ostream from extension code crashed the process instead of raising,
// and c10::str streams its arguments, as does printing sizes().
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

// The current device's limits, as the plan reads them.
w4::DeviceLimits current_device_limits() {
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
#if W4_HIP
  const int compute_capability = 0;  // no mma.sync and no programmatic dependent launch on ROCm
#else
  const int compute_capability = 10 * prop->major + prop->minor;
#endif
  return w4::DeviceLimits{prop->multiProcessorCount, prop->warpSize, static_cast<int>(prop->sharedMemPerBlockOptin),
                          static_cast<int>(prop->sharedMemPerMultiprocessor), compute_capability};
}

w4::SkinnyPolicy checked_policy(const char* op, c10::ArrayRef<double> values) {
  w4::SkinnyPolicy policy{};
  const std::string error = w4::parse_policy(values.data(), values.size(), policy);
  TORCH_CHECK(error.empty(), op, ": ", error);
  return policy;
}

at::Tensor skinny_matmul_cuda(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                              const std::optional<at::Tensor>& zeros, int64_t group_size,
                              const std::optional<at::Tensor>& bias, c10::string_view engine,
                              c10::ArrayRef<double> policy_values, c10::string_view kernel, c10::string_view overlap,
                              int64_t split) {
  // What the plan needs to know first: the shape, and where the call runs.
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16),
              "skinny_matmul: x must be float16 or bfloat16 [M, K], got ", x.scalar_type(), " ", dims(x.sizes()));
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(qweight.dim() == 2, "skinny_matmul: qweight must be 2-D: int32 [N, K/8] or int8 [N, K/2], got ",
              dims(qweight.sizes()));
  const int64_t n = qweight.size(0);
  if (zeros.has_value()) {
    TORCH_CHECK(is_packed_dtype(zeros->scalar_type()),
                "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0), got ", zeros->scalar_type(), " ",
                dims(zeros->sizes()));
  }
  TORCH_CHECK(x.is_cuda(), "skinny_matmul: tensors must be on a CUDA/ROCm device, got ", x.device());
  for (const at::Tensor* t : {&qweight, &scales, zeros ? &*zeros : nullptr, bias ? &*bias : nullptr}) {
    TORCH_CHECK(t == nullptr || t->device() == x.device(), "skinny_matmul: all tensors must be on ", x.device(),
                ", got one on ", t->device());
  }
  TORCH_CHECK(n <= INT32_MAX && k <= INT32_MAX, "skinny_matmul: N and K must fit in int32");
  for (const int64_t v : {group_size, split}) {
    TORCH_CHECK(v >= INT32_MIN && v <= INT32_MAX, "skinny_matmul: group_size and split must fit in int32, got ", num(v));
  }

  // The plan: M, group size, K, engine, kernel, overlap and split are checked there.
  const c10::cuda::CUDAGuard guard(x.device());
  w4::PlanRequest request;
  request.m = static_cast<int>(std::min<int64_t>(m, INT32_MAX));
  request.n = static_cast<int>(n);
  request.k = static_cast<int>(k);
  request.group_size = static_cast<int>(group_size);
  request.symmetric = !zeros.has_value();
  request.engine = std::string(engine);
  request.kernel = std::string(kernel);
  request.split = static_cast<int>(split);
  request.overlap = std::string(overlap);
  const w4::SkinnyPlan plan =
      w4::plan_call(request, checked_policy("skinny_matmul", policy_values), current_device_limits());
  TORCH_CHECK(plan.error.empty(), "skinny_matmul: ", plan.error);

  // The tensors' layouts (optimized/contract.py).
  TORCH_CHECK(x.stride(1) == 1, "skinny_matmul: x must be contiguous along K (stride(1) == 1), got strides ",
              dims(x.strides()));
  TORCH_CHECK(rows_aligned(x.data_ptr(), x.stride(0), m, 2),
              "skinny_matmul: x rows must start on 16-byte boundaries (data pointer and stride(0) * 2 bytes "
              "multiples of 16), got stride(0)=", num(x.stride(0)));
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
    TORCH_CHECK(z.dim() == 2 && z.size(0) * 8 == n && z.size(1) == groups,
                "skinny_matmul: packed zero points must be [N/8, K/G] = [", num(n / 8), ", ", num(groups), "], got ",
                dims(z.sizes()), " for N=", num(n));
    TORCH_CHECK(z.is_contiguous(), "skinny_matmul: zero points must be contiguous");
  }
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->dim() == 1 && bias->size(0) == n,
                "skinny_matmul: bias must be ", x.scalar_type(), " [N] = [", num(n), "], got ", bias->scalar_type(),
                " ", dims(bias->sizes()));
    TORCH_CHECK(bias->is_contiguous(), "skinny_matmul: bias must be contiguous");
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
  at::Tensor partials;  // kept alive until the launches are queued; the stream orders its reuse
  if (plan.workspace_floats > 0) {
    partials = at::empty({plan.workspace_floats}, x.options().dtype(at::kFloat));
    p.partials = partials.data_ptr<float>();
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  w4::launch(p, plan, x.scalar_type() == at::kBFloat16, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

// The plan of a call of skinny_matmul with these arguments on the device `device_limits` describes
// (empty: the current device), as the kernel, engine, split, ... values of skinny_plan.h plan_values.
std::vector<int64_t> skinny_plan(int64_t m, int64_t n, int64_t k, int64_t group_size, bool symmetric,
                                 c10::string_view engine, c10::ArrayRef<double> policy_values,
                                 c10::ArrayRef<int64_t> device_limits, c10::string_view kernel, int64_t split) {
  for (const int64_t v : {m, n, k, group_size, split}) {
    TORCH_CHECK(v >= INT32_MIN && v <= INT32_MAX, "skinny_plan: M, N, K, group_size and split must fit in int32, got ",
                num(v));
  }
  w4::DeviceLimits limits{};
  if (device_limits.empty()) {
    limits = current_device_limits();
  } else {
    const std::string error = w4::parse_device_limits(device_limits.data(), device_limits.size(), limits);
    TORCH_CHECK(error.empty(), "skinny_plan: ", error);
  }
  w4::PlanRequest request;
  request.m = static_cast<int>(m);
  request.n = static_cast<int>(n);
  request.k = static_cast<int>(k);
  request.group_size = static_cast<int>(group_size);
  request.symmetric = symmetric;
  request.engine = std::string(engine);
  request.kernel = std::string(kernel);
  request.split = static_cast<int>(split);
  const w4::SkinnyPlan plan = w4::plan_call(request, checked_policy("skinny_plan", policy_values), limits);
  TORCH_CHECK(plan.error.empty(), "skinny_plan: ", plan.error);
  int64_t values[w4::kPlanFields];
  w4::plan_values(plan, values);
  return std::vector<int64_t>(values, values + w4::kPlanFields);
}

}  // namespace

TORCH_LIBRARY_IMPL(w4a16, CUDA, m) { m.impl("skinny_matmul", &skinny_matmul_cuda); }
// No tensor argument: the dispatcher runs this kernel for every backend.
TORCH_LIBRARY_IMPL(w4a16, CompositeExplicitAutograd, m) { m.impl("skinny_plan", &skinny_plan); }

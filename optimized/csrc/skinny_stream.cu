// The stream kernel's instances (with its reduce kernel): both element types, mma engine (CUDA only).
#include "skinny_stream.cuh"

#if !W4_HIP
namespace w4::detail {

template void launch_stream<half_t>(const SkinnyParams&, const SkinnyPlan&, stream_t);
template void launch_stream<bf16_t>(const SkinnyParams&, const SkinnyPlan&, stream_t);

}  // namespace w4::detail
#endif

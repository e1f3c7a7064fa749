// The segmented kernels' instances: both element types, mma engine (CUDA only).
#include "skinny_segment.cuh"

#if !W4_HIP
namespace w4::detail {

template void launch_segment<half_t>(const SkinnyParams&, const SkinnyPlan&, stream_t);
template void launch_segment<bf16_t>(const SkinnyParams&, const SkinnyPlan&, stream_t);

}  // namespace w4::detail
#endif

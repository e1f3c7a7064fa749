// The warpgroup kernel's instances (with the reduction of its K split): both element types (CUDA
// only; the kernel body exists in the sm_90a build).
#include "skinny_wgmma.cuh"

#if !W4_HIP
namespace w4::detail {

template void launch_wgmma<half_t>(const SkinnyParams&, const SkinnyPlan&, stream_t);
template void launch_wgmma<bf16_t>(const SkinnyParams&, const SkinnyPlan&, stream_t);

}  // namespace w4::detail
#endif

// The tile kernel's instances (with the reduction of its K split): both element types, mma engine
// (CUDA only).
#include "skinny_tile.cuh"

#if !W4_HIP
namespace w4::detail {

template void launch_tile<half_t>(const SkinnyParams&, const SkinnyPlan&, stream_t);
template void launch_tile<bf16_t>(const SkinnyParams&, const SkinnyPlan&, stream_t);

}  // namespace w4::detail
#endif

// The ring kernel's instances: both element types, every engine the platform has.
#include "skinny_ring.cuh"

namespace w4::detail {

template void launch_ring<half_t, Engine::kSimt>(const SkinnyParams&, const SkinnyPlan&, stream_t);
template void launch_ring<bf16_t, Engine::kSimt>(const SkinnyParams&, const SkinnyPlan&, stream_t);
#if !W4_HIP
template void launch_ring<half_t, Engine::kMma>(const SkinnyParams&, const SkinnyPlan&, stream_t);
template void launch_ring<bf16_t, Engine::kMma>(const SkinnyParams&, const SkinnyPlan&, stream_t);
#endif

}  // namespace w4::detail

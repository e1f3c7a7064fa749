// w4::launch (skinny_plan.h): runs a plan, calling the kernel family it names. The families'
// instances are compiled in their own translation units (skinny_batch.cu, skinny_ring.cu,
// skinny_segment.cu, skinny_stream.cu, skinny_tile.cu, skinny_wgmma.cu). Torch-free: the CPU compile check builds
// and links it with those units as the extension does, and the emulator runs it.
#include "skinny_common.cuh"

namespace {

template <typename T, w4::Engine E>
void launch_engine(const w4::SkinnyParams& p, const w4::SkinnyPlan& plan, w4::stream_t stream) {
  switch (plan.kernel) {
    case w4::kRing: return w4::detail::launch_ring<T, E>(p, plan, stream);
#if !W4_HIP
    case w4::kSegment:
    case w4::kSegmentSmem:
    case w4::kSegmentPersistent: return w4::detail::launch_segment<T>(p, plan, stream);
    case w4::kStream: return w4::detail::launch_stream<T>(p, plan, stream);
    case w4::kTile: return w4::detail::launch_tile<T>(p, plan, stream);
    case w4::kWgmma: return w4::detail::launch_wgmma<T>(p, plan, stream);
#endif
    default: return w4::detail::launch_batch<T, E>(p, plan, stream);
  }
}

template <typename T>
void launch_type(const w4::SkinnyParams& p, const w4::SkinnyPlan& plan, w4::stream_t stream) {
#if !W4_HIP
  if (plan.engine == w4::Engine::kMma) return launch_engine<T, w4::Engine::kMma>(p, plan, stream);
#endif
  launch_engine<T, w4::Engine::kSimt>(p, plan, stream);
}

}  // namespace

void w4::launch(const SkinnyParams& args, const SkinnyPlan& plan, bool bf16, void* stream) {
  SkinnyParams p = args;
  p.split = plan.split;
  p.overlap = plan.overlap;
  const auto s = static_cast<stream_t>(stream);
  if (bf16) return launch_type<bf16_t>(p, plan, s);
  launch_type<half_t>(p, plan, s);
}

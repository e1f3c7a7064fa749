// w4::launch (skinny_host.h): the dispatch to every kernel, which the variant units
// (skinny_inst_v*.cu) compile; declared extern here (skinny_instances.h). Torch-free: the CI
// compile check builds and links it with those units as the extension does.
#include "skinny_instances.h"

void w4::launch(const SkinnyParams& p, Engine engine, bool bf16, void* stream) {
  const auto s = static_cast<stream_t>(stream);
  if (bf16) return launch_skinny<bf16_t>(p, engine, s);
  launch_skinny<half_t>(p, engine, s);
}

// Compile check without torch or a GPU (tests/test_skinny_compile.py): instantiates every kernel
// the extension can launch, through the same dispatch the binding calls.
#include "skinny_core.cuh"

template void w4::launch_skinny<w4::half_t>(const w4::SkinnyParams&, w4::Engine, w4::stream_t);
template void w4::launch_skinny<w4::bf16_t>(const w4::SkinnyParams&, w4::Engine, w4::stream_t);

// Compile check without torch or a GPU (tests/test_skinny_compile.py): the dispatch the binding
// calls, with every kernel declared extern as in the binding; the test compiles it together with
// skinny_inst_v*.cu (each variant's kernels, as the extension does) and links them.
#include "skinny_instances.h"

template void w4::launch_skinny<w4::half_t>(const w4::SkinnyParams&, w4::Engine, w4::stream_t);
template void w4::launch_skinny<w4::bf16_t>(const w4::SkinnyParams&, w4::Engine, w4::stream_t);

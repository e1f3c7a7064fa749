// Variant 5's kernels (see skinny_instances.h).
#include "skinny_instances.h"

W4_VARIANT_INSTANCES(W4_DEFINE_INSTANCE, 5)

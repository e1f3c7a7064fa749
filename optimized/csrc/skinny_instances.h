// The extension's kernels, one translation unit per variant (skinny_inst_v<V>.cu) so that a
// parallel build compiles them side by side. X(T, E, V) names one launch_variant instance.
#pragma once

#include "skinny_core.cuh"

#if W4_HIP
#define W4_VARIANT_INSTANCES(X, V) X(::w4::half_t, ::w4::Engine::kSimt, V) X(::w4::bf16_t, ::w4::Engine::kSimt, V)
#else
#define W4_VARIANT_INSTANCES(X, V)                                                             \
  X(::w4::half_t, ::w4::Engine::kSimt, V) X(::w4::bf16_t, ::w4::Engine::kSimt, V)              \
  X(::w4::half_t, ::w4::Engine::kMma, V) X(::w4::bf16_t, ::w4::Engine::kMma, V)
#endif

#define W4_ALL_INSTANCES(X)                                                                \
  W4_VARIANT_INSTANCES(X, 0) W4_VARIANT_INSTANCES(X, 1) W4_VARIANT_INSTANCES(X, 2) W4_VARIANT_INSTANCES(X, 3) \
  W4_VARIANT_INSTANCES(X, 4) W4_VARIANT_INSTANCES(X, 5)
static_assert(::w4::kNumVariants == 6, "W4_ALL_INSTANCES and skinny_inst_v*.cu list every variant");

#define W4_EXTERN_INSTANCE(T, E, V) \
  extern template void ::w4::detail::launch_variant<T, E, V>(const ::w4::SkinnyParams&, ::w4::stream_t);
#define W4_DEFINE_INSTANCE(T, E, V) \
  template void ::w4::detail::launch_variant<T, E, V>(const ::w4::SkinnyParams&, ::w4::stream_t);

// Every instance is compiled elsewhere, except those this file defines after it.
W4_ALL_INSTANCES(W4_EXTERN_INSTANCE)

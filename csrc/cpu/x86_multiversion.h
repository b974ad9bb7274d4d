// Compiling a CPU kernel twice: for the build's baseline ISA (SSE2 on x86-64, since torch's
// extension flags give no -march) and for AVX2+FMA through the target attribute, picked at run time
// with cpu_has_avx2(). The build stays portable and its cache key needs no CPU model.
#pragma once

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define FGPLUGIN_X86_MULTIVERSION 1
#define FGPLUGIN_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define FGPLUGIN_X86_MULTIVERSION 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define FGPLUGIN_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define FGPLUGIN_ALWAYS_INLINE inline
#endif

namespace fgplugin {

inline bool cpu_has_avx2() {
#if FGPLUGIN_X86_MULTIVERSION
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

}  // namespace fgplugin

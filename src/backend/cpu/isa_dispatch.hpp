#pragma once
// One kernel body, compiled for every x86 tier (core/cpu_isa.hpp), run at the process's tier.
//
// A vector kernel is written once as an always-inlined body (MPT_KERNEL) and called through
// isa_call<body>(args...): the body is inlined into three wrappers, one per tier, each compiled
// with its tier's instructions (baseline SSE2; AVX2 with FMA and F16C; AVX-512), and the call
// picks the wrapper of detail::cpu_isa(), which MPT_CPU_ISA can cap. The wrappers differ in the
// instructions the compiler may use, never in the arithmetic: the files whose bits must not
// depend on the tier compile without contraction (CMakeLists.txt), so an FMA never fuses there.
// isa_call16 is for kernels on 16-bit integer lanes, whose AVX-512 wrapper also has AVX-512BW.
#include <utility>

#include "core/cpu_isa.hpp"

/// A kernel body: always inlined, so it compiles with the instructions of the wrapper it is in.
#define MPT_KERNEL [[gnu::always_inline]] inline
/// A lambda inside a kernel body, likewise always inlined (`[&](...) MPT_INLINE_LAMBDA { ... }`):
/// one that is not compiles for the baseline, its vectors through the stack (measured 20x slower
/// in attention).
#define MPT_INLINE_LAMBDA __attribute__((always_inline))

// MPT_NO_ISA_TIERS (CMake: MPT_ISA_TIERS=OFF, the sanitizer build) compiles the baseline only.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(MPT_NO_ISA_TIERS)
#define MPT_ISA_DISPATCH 1
#define MPT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c,bmi,bmi2,popcnt")))
#define MPT_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma,f16c,bmi,bmi2,popcnt")))
#define MPT_TARGET_AVX512_16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512cd,avx2,fma,f16c,bmi,bmi2,popcnt")))
#endif

namespace mpt::cpu {

#ifdef MPT_ISA_DISPATCH
namespace isa_detail {
template <auto F, class... A>
MPT_TARGET_AVX2 decltype(auto) on_avx2(A&&... a) {
  return F(std::forward<A>(a)...);
}
template <auto F, class... A>
MPT_TARGET_AVX512 decltype(auto) on_avx512(A&&... a) {
  return F(std::forward<A>(a)...);
}
template <auto F, class... A>
MPT_TARGET_AVX512_16 decltype(auto) on_avx512_16(A&&... a) {
  return F(std::forward<A>(a)...);
}
template <auto F, class... A>
decltype(auto) on_baseline(A&&... a) {
  return F(std::forward<A>(a)...);
}

/// Runs kernel body F at the process's tier; k16: its AVX-512 wrapper has AVX-512BW too.
template <bool k16, auto F, class... A>
decltype(auto) run_at_tier(A&&... a) {
  switch (detail::cpu_isa()) {
    case detail::CpuIsa::avx512:
      if constexpr (k16) return on_avx512_16<F>(std::forward<A>(a)...);
      else return on_avx512<F>(std::forward<A>(a)...);
    case detail::CpuIsa::avx2: return on_avx2<F>(std::forward<A>(a)...);
    case detail::CpuIsa::baseline: break;
  }
  return on_baseline<F>(std::forward<A>(a)...);
}
}  // namespace isa_detail

/// Runs kernel body F (an MPT_KERNEL function) compiled for the process's tier.
template <auto F, class... A>
decltype(auto) isa_call(A&&... a) {
  return isa_detail::run_at_tier<false, F>(std::forward<A>(a)...);
}

/// isa_call for bodies on 16-bit integer lanes (AVX-512F has those only in 256-bit vectors).
template <auto F, class... A>
decltype(auto) isa_call16(A&&... a) {
  return isa_detail::run_at_tier<true, F>(std::forward<A>(a)...);
}

/// The vector width, in bytes, of the process's tier: 64 (avx512), 32 (avx2), 16 (baseline).
inline int isa_native_bytes() {
  switch (detail::cpu_isa()) {
    case detail::CpuIsa::avx512: return 64;
    case detail::CpuIsa::avx2: return 32;
    case detail::CpuIsa::baseline: break;
  }
  return 16;
}

/// For bodies written on explicit vectors of a width (GNU vector_size): F64, F32 and F16 are the
/// body at 64, 32 and 16 bytes, and each is compiled for, and run at, the one tier whose registers
/// have that width. (A 64-byte body at the avx2 tier is lowered through the stack, lane by lane
/// wherever it broadcasts: measured 30x slower in attention.)
template <auto F64, auto F32, auto F16, class... A>
decltype(auto) isa_call_native(A&&... a) {
  switch (detail::cpu_isa()) {
    case detail::CpuIsa::avx512: return isa_detail::on_avx512<F64>(std::forward<A>(a)...);
    case detail::CpuIsa::avx2: return isa_detail::on_avx2<F32>(std::forward<A>(a)...);
    case detail::CpuIsa::baseline: break;
  }
  return isa_detail::on_baseline<F16>(std::forward<A>(a)...);
}
#else
template <auto F, class... A>
decltype(auto) isa_call(A&&... a) {
  return F(std::forward<A>(a)...);
}
template <auto F, class... A>
decltype(auto) isa_call16(A&&... a) {
  return F(std::forward<A>(a)...);
}
inline int isa_native_bytes() { return 16; }
template <auto F64, auto F32, auto F16, class... A>
decltype(auto) isa_call_native(A&&... a) {
  return F16(std::forward<A>(a)...);
}
#endif

}  // namespace mpt::cpu

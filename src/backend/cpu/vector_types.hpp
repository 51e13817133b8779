#pragma once
// Element access for the vectorized CPU kernels: float32/float64 as they are, bfloat16 widened to
// float32 in registers (and rounded back to nearest even); kernels written on these run at the
// process's ISA tier through isa_call (isa_dispatch.hpp).
#include <bit>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/isa_dispatch.hpp"
#include "mpt/dtype.hpp"


// Vector arguments and returns: always inlined into their caller's tier wrapper, so the warning that a
// baseline call would pass them differently from an AVX-512 one never applies.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace mpt::cpu {

/// A vector V of lanes read from p (unaligned), and written back: always inlined into the
/// caller's tier wrapper, so a memcpy of one register's bytes, never a call.
template <class V, class T>
[[gnu::always_inline]] inline V load_lanes(const T* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class V, class T>
[[gnu::always_inline]] inline void store_lanes(T* p, const V& v) {
  __builtin_memcpy(p, &v, sizeof v);
}

/// float32 lanes (and int32 masks of their width) as common/float_math.hpp's operations policy: that file's formulas
/// (exp, GELU) on lanes give the scalar formulas' bits, lane by lane, in files compiled without
/// contraction. Bodies written on them run through isa_call_native, each width at its own tier
/// (isa_native_bytes).
template <class Lanes, class Mask>
struct LaneOpsOf {
  using T = Lanes;
  using M = Mask;
  [[gnu::always_inline]] static T splat(float v) { return T{} + v; }
  [[gnu::always_inline]] static T select(M m, T a, T b) {
    M ai, bi;
    __builtin_memcpy(&ai, &a, sizeof ai);
    __builtin_memcpy(&bi, &b, sizeof bi);
    const M r = (ai & m) | (bi & ~m);
    T out;
    __builtin_memcpy(&out, &r, sizeof out);
    return out;
  }
  /// a·b + c rounded once, lane by lane: one vfmadd where the tier's registers hold T (this file's
  /// bodies run at the tier of their width: isa_call_native), fmaf per lane otherwise (the baseline
  /// tier, and builds without the tiers). Written as an instruction, not left to contraction: the
  /// files of these bodies compile without it, and an intrinsic cannot be inlined through the
  /// target-less policy into its tier's wrapper. The register of a is overwritten (Horner's p:
  /// dead after the step); c may come from memory (the polynomial's constants).
  [[gnu::always_inline]] static T fma(T a, T b, T c) {
#ifdef MPT_ISA_DISPATCH
    if constexpr (sizeof(T) == 64) {
      asm("vfmadd213ps %[c], %[b], %[a]" : [a] "+v"(a) : [b] "v"(b), [c] "vm"(c));
      return a;
    } else if constexpr (sizeof(T) == 32) {
      asm("vfmadd213ps %[c], %[b], %[a]" : [a] "+x"(a) : [b] "x"(b), [c] "xm"(c));
      return a;
    }
#endif
    T r;
    for (std::size_t i = 0; i < sizeof(T) / sizeof(float); ++i) r[i] = std::fma(a[i], b[i], c[i]);
    return r;
  }
  [[gnu::always_inline]] static T from_bits_shifted(T t) {
    M bits;
    __builtin_memcpy(&bits, &t, sizeof bits);
    bits = (bits - 0x4B400000 + 127) << 23;
    T r;
    __builtin_memcpy(&r, &bits, sizeof r);
    return r;
  }
};

/// B bytes of lanes of C (one register of the tier whose width B is: isa_call_native), with W
/// lanes, and the integer mask of the same width. (Each width spelled out: GCC 12 drops
/// vector_size with a dependent size in a class template.)
template <class C, int B> struct Lanes;
#define MPT_LANES(C, I, B)                                                   \
  template <> struct Lanes<C, B> {                                           \
    using V = C __attribute__((vector_size(B)));                             \
    using M = I __attribute__((vector_size(B)));                             \
    static constexpr std::int64_t W = B / static_cast<std::int64_t>(sizeof(C)); \
  };
MPT_LANES(float, std::int32_t, 16)
MPT_LANES(float, std::int32_t, 32)
MPT_LANES(float, std::int32_t, 64)
MPT_LANES(double, std::int64_t, 16)
MPT_LANES(double, std::int64_t, 32)
MPT_LANES(double, std::int64_t, 64)
#undef MPT_LANES

/// float_math's operations policy on B bytes of float32 lanes.
template <int B> using LaneOpsN = LaneOpsOf<typename Lanes<float, B>::V, typename Lanes<float, B>::M>;

/// The bits of a bfloat16 value.
using bf16_bits = std::uint16_t;

inline float widen(float v) { return v; }
inline double widen(double v) { return v; }
inline float widen(bf16_bits v) { return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16); }

template <class T, class C>
inline T narrow(C v) {
  if constexpr (std::is_same_v<T, bf16_bits>) {  // round to nearest even; NaN stays a (quiet) NaN
    const std::uint32_t u = std::bit_cast<std::uint32_t>(static_cast<float>(v));
    const std::uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return static_cast<bf16_bits>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
  } else {
    return static_cast<T>(v);
  }
}

/// B bytes of float32 lanes loaded from bfloat16 (widened) and stored to it (rounded by narrow's
/// rule: nearest even, a NaN kept quiet), for kernels that read 16-bit storage directly.
template <int B> struct Bf16Bits;  // (each width spelled out, as Lanes: GCC 12 and dependent vector_size)
#define MPT_BF16_BITS(B)                                              \
  template <> struct Bf16Bits<B> {                                    \
    using U32 = std::uint32_t __attribute__((vector_size(B)));        \
    using U16 = std::uint16_t __attribute__((vector_size(B / 2)));    \
  };
MPT_BF16_BITS(16)
MPT_BF16_BITS(32)
MPT_BF16_BITS(64)
#undef MPT_BF16_BITS

template <int B>
struct Bf16Lanes {
  using F = typename Lanes<float, B>::V;
  using U32 = typename Bf16Bits<B>::U32;
  using U16 = typename Bf16Bits<B>::U16;
  [[gnu::always_inline]] static F load(const bf16_bits* p) {
    U16 h;
    std::memcpy(&h, p, sizeof h);
    const U32 bits = __builtin_convertvector(h, U32) << 16;  // bfloat16 is float32's high half
    F v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  [[gnu::always_inline]] static void store(bf16_bits* p, F v) {
    U32 u;
    std::memcpy(&u, &v, sizeof u);
    const U32 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const U32 nan = (u >> 16) | 0x40u;  // a NaN stays a quiet NaN
    const U32 out = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    const U16 h = __builtin_convertvector(out, U16);
    std::memcpy(p, &h, sizeof h);
  }
};

/// The dtype whose storage a kernel reads as T.
template <class T>
constexpr DType storage_dtype() {
  if constexpr (std::is_same_v<T, float>) return float32;
  else if constexpr (std::is_same_v<T, double>) return float64;
  else return bfloat16;
}

/// Calls f(T{}, C{}) with the storage type T and compute type C of float32, float64 or bfloat16
/// (float16 maps to float32: callers stage it through float32 copies).
template <class F>
void with_vector_types(DType d, F&& f) {
  if (d == float64) return f(double{}, double{});
  if (d == bfloat16) return f(bf16_bits{}, float{});
  return f(float{}, float{});
}

}  // namespace mpt::cpu

#pragma GCC diagnostic pop

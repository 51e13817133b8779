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
#include "mpt/half.hpp"


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

/// The storage a kernel widens to float32 lanes: float32 (read as it lies), bfloat16 (float32's
/// high half) or float16 (VCVTPH2PS at the avx2 and avx512 tiers: the bulk conversion's
/// instruction, so the same bits, without a call per row; half_bits_to_float lane by lane at the
/// baseline, which has no F16C).
enum class Widen { f32, bf16, f16 };

/// The Widen of a floating dtype with float32 compute (float32, bfloat16, float16).
inline Widen widen_of(DType d) { return d == bfloat16 ? Widen::bf16 : d == float16 ? Widen::f16 : Widen::f32; }

/// Bytes of one stored value.
template <Widen S> inline constexpr std::int64_t widen_bytes = S == Widen::f32 ? 4 : 2;

/// One stored value at p as float32.
template <Widen S>
[[gnu::always_inline]] inline float widen_one(const void* p) {
  if constexpr (S == Widen::f32) {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
  } else {
    std::uint16_t h;
    std::memcpy(&h, p, sizeof h);
    if constexpr (S == Widen::bf16) return widen(h);
    else return half_bits_to_float(h);
  }
}

/// B bytes of float32 lanes from the stored values at p.
template <Widen S, int B>
[[gnu::always_inline]] inline typename Lanes<float, B>::V load_widened(const void* p) {
  using F = typename Lanes<float, B>::V;
  if constexpr (S == Widen::f32) {
    return load_lanes<F>(static_cast<const float*>(p));
  } else if constexpr (S == Widen::bf16) {
    return Bf16Lanes<B>::load(static_cast<const bf16_bits*>(p));
  } else {
    using U16 = typename Bf16Bits<B>::U16;
    F f;
#ifdef MPT_ISA_DISPATCH
    // Written as an instruction, as LaneOpsOf::fma: an intrinsic cannot be inlined through this
    // target-less function into its tier's wrapper.
    if constexpr (B == 64) {
      asm("vcvtph2ps %[h], %[f]" : [f] "=v"(f) : [h] "vm"(load_lanes<U16>(p)));
      return f;
    } else if constexpr (B == 32) {
      asm("vcvtph2ps %[h], %[f]" : [f] "=x"(f) : [h] "xm"(load_lanes<U16>(p)));
      return f;
    }
#endif
    const U16 h = load_lanes<U16>(p);
    for (std::size_t i = 0; i < sizeof(F) / sizeof(float); ++i) f[i] = half_bits_to_float(h[i]);
    return f;
  }
}

/// v stored at p as S, rounded as the bulk conversion rounds (bfloat16 by its rule on the lanes;
/// float16 by VCVTPS2PH at the avx2 and avx512 tiers, written as an instruction as in
/// load_widened, float_to_half_bits lane by lane at the baseline).
template <Widen S, int B>
[[gnu::always_inline]] inline void store_narrowed(void* p, typename Lanes<float, B>::V v) {
  if constexpr (S == Widen::f32) {
    store_lanes(static_cast<float*>(p), v);
  } else if constexpr (S == Widen::bf16) {
    Bf16Lanes<B>::store(static_cast<bf16_bits*>(p), v);
  } else {
    using U16 = typename Bf16Bits<B>::U16;
    U16 h;
#ifdef MPT_ISA_DISPATCH
    if constexpr (B == 64) {
      asm("vcvtps2ph $8, %[f], %[h]" : [h] "=v"(h) : [f] "v"(v));  // 8: nearest even, no exceptions
      std::memcpy(p, &h, sizeof h);
      return;
    } else if constexpr (B == 32) {
      asm("vcvtps2ph $8, %[f], %[h]" : [h] "=x"(h) : [f] "x"(v));
      std::memcpy(p, &h, sizeof h);
      return;
    }
#endif
    for (std::size_t i = 0; i < sizeof(h) / sizeof(std::uint16_t); ++i) h[i] = float_to_half_bits(v[i]);
    std::memcpy(p, &h, sizeof h);
  }
}

/// One float32 value stored at p as S (the bulk conversion's bits).
template <Widen S>
[[gnu::always_inline]] inline void narrow_one(float v, void* p) {
  if constexpr (S == Widen::f32) {
    std::memcpy(p, &v, sizeof v);
  } else {
    const std::uint16_t h = S == Widen::bf16 ? float_to_bfloat16_bits(v) : float_to_half_bits(v);
    std::memcpy(p, &h, sizeof h);
  }
}

/// n float32 values at src stored at dst as S (the bulk conversion's bits): whole vectors of the
/// tier, then one value at a time.
template <Widen S, int B>
[[gnu::always_inline]] inline void narrow_n(const float* src, void* dst, std::int64_t n) {
  constexpr std::int64_t W = Lanes<float, B>::W, osz = widen_bytes<S>;
  auto* d = static_cast<char*>(dst);
  std::int64_t i = 0;
  for (; i + W <= n; i += W) store_narrowed<S, B>(d + i * osz, load_lanes<typename Lanes<float, B>::V>(src + i));
  for (; i < n; ++i) narrow_one<S>(src[i], d + i * osz);
}

/// The N stored values at src as float32 at dst: whole vectors of the tier, then the rest from
/// one more vector when `whole_vector` says a vector's worth at that point may be read, else one
/// value at a time. (Not through a zero-padded copy: a vector load of a few smaller stores is not
/// forwarded from them, and that stall had doubled aᵀ's packing.)
template <Widen S, int B, int N>
[[gnu::always_inline]] inline void widen_n(const char* src, float* dst, bool whole_vector) {
  using F = typename Lanes<float, B>::V;
  constexpr int W = static_cast<int>(Lanes<float, B>::W);
  constexpr std::int64_t isz = widen_bytes<S>;
  constexpr int whole = N / W * W, rest = N - whole;
  for (int i = 0; i < whole; i += W) store_lanes(dst + i, load_widened<S, B>(src + i * isz));
  if constexpr (rest > 0) {
    if (whole_vector) {
      const F v = load_widened<S, B>(src + whole * isz);
      std::memcpy(dst + whole, &v, rest * sizeof(float));
    } else {
      for (int i = whole; i < N; ++i) dst[i] = widen_one<S>(src + i * isz);
    }
  }
}

/// r[i][j] <- r[j][i] for the W registers r[0..W) of W float32 lanes: transposed in registers. Two
/// stages of shuffles within 128-bit blocks (4 x 4 transposes of each group of 4 rows), then one
/// (avx2) or two (avx512) stages moving whole blocks between rows: 0.25-0.4 shuffles a value,
/// against a load and a store each for a transpose through memory.
template <int B>
[[gnu::always_inline]] inline void transpose_lanes(typename Lanes<float, B>::V* r) {
  using F = typename Lanes<float, B>::V;
  constexpr int W = static_cast<int>(Lanes<float, B>::W);
  F t[W], u[W];
  for (int i = 0; i < W; i += 2) {  // t: rows i and i+1 interleaved within each block
    if constexpr (W == 4) {
      t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 4, 1, 5);
      t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 6, 3, 7);
    } else if constexpr (W == 8) {
      t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
      t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    } else {
      t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
      t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    }
  }
  // u[4g + j]: in block L, column 4L + j of rows 4g..4g+3.
  for (int g = 0; g < W; g += 4)
    for (int h = 0; h < 2; ++h) {
      const F a = t[g + h], b = t[g + h + 2];
      if constexpr (W == 4) {
        u[g + 2 * h] = __builtin_shufflevector(a, b, 0, 1, 4, 5);
        u[g + 2 * h + 1] = __builtin_shufflevector(a, b, 2, 3, 6, 7);
      } else if constexpr (W == 8) {
        u[g + 2 * h] = __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13);
        u[g + 2 * h + 1] = __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15);
      } else {
        u[g + 2 * h] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
        u[g + 2 * h + 1] = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
      }
    }
  if constexpr (W == 4) {
    for (int j = 0; j < 4; ++j) r[j] = u[j];
  } else if constexpr (W == 8) {
    for (int j = 0; j < 4; ++j) {
      r[j] = __builtin_shufflevector(u[j], u[4 + j], 0, 1, 2, 3, 8, 9, 10, 11);
      r[4 + j] = __builtin_shufflevector(u[j], u[4 + j], 4, 5, 6, 7, 12, 13, 14, 15);
    }
  } else {
    for (int j = 0; j < 4; ++j) {  // a 4 x 4 transpose of the blocks of u[j], u[4+j], u[8+j], u[12+j]
      const F x0 = __builtin_shufflevector(u[j], u[4 + j], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
      const F x1 = __builtin_shufflevector(u[j], u[4 + j], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
      const F y0 = __builtin_shufflevector(u[8 + j], u[12 + j], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
      const F y1 = __builtin_shufflevector(u[8 + j], u[12 + j], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
      r[j] = __builtin_shufflevector(x0, y0, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
      r[8 + j] = __builtin_shufflevector(x0, y0, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
      r[4 + j] = __builtin_shufflevector(x1, y1, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
      r[12 + j] = __builtin_shufflevector(x1, y1, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    }
  }
}

/// dst[j · ldd + i] = src[i · lds + j] for i, j < W: one W x W square of float32 through
/// registers (transpose_lanes), W the lanes of B bytes.
template <int B>
[[gnu::always_inline]] inline void transpose_square(const float* src, std::int64_t lds, float* dst, std::int64_t ldd) {
  using F = typename Lanes<float, B>::V;
  constexpr std::int64_t W = Lanes<float, B>::W;
  F sq[W];
  for (std::int64_t i = 0; i < W; ++i) sq[i] = load_lanes<F>(src + i * lds);
  transpose_lanes<B>(sq);
  for (std::int64_t j = 0; j < W; ++j) store_lanes(dst + j * ldd, sq[j]);
}

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

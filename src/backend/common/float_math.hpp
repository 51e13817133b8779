#pragma once
// float32 exp and the normal CDF (GELU's erf) from +, -, ×, ÷, fused multiply-add, comparisons and
// bit moves only, written once over an operations policy O, so that one definition runs as a
// scalar on the host, as a scalar on the device (O = ScalarOps: exact:: arithmetic, never
// contracted) and on vector lanes on the CPU (O = cpu's lane policy, in files compiled without
// contraction), giving the same bits everywhere: no libm function but fmaf (IEEE's fused
// multiply-add, one rounding: the same bits from every correct implementation), no table. Every
// polynomial step is one O::fma, never a contraction left to the compiler.
//
//   exp_f32     Cephes's expf: x = n ln 2 + r (n rounded to nearest, ln 2 in two parts), a
//               degree-5 polynomial in r, times 2^n built in the exponent bits; within 2 ulp of
//               e^x for -87.3 <= x <= 88; 0 below (e^-inf = 0), e^88 above; NaN stays NaN.
//   normal_cdf  Φ(x) = ½ erfc(-x/√2) with Numerical Recipes' erfc (Chebyshev fit, relative error
//               below 1.2e-7 for every z >= 0): no cancellation in the left tail, where
//               ½ (1 + erf(x/√2)) loses every digit.
//
// A policy O has: using T (float or a vector of floats), using M (what a comparison of T gives);
// static T splat(float); static T select(M, T, T); static T fma(T a, T b, T c) (a·b + c rounded
// once); static T from_bits_shifted(T t) (2^n for t the float t = 1.5·2^23 + n, -126 <= n <= 127).
//
// Included by unary_ops.hpp (after exact::, before the formulas that use it): include that.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/common/host_device.hpp"

// Always inlined: a CPU caller compiled for AVX-512 (a target_clones clone) must get these in its
// own instruction set, not as calls to baseline copies.
#define MPT_FLOAT_MATH MPT_HOST_DEVICE inline __attribute__((always_inline))

namespace mpt::common {

/// Scalar float32 policy, host and device.
struct ScalarOps {
  using T = float;
  using M = bool;
  MPT_HOST_DEVICE static T splat(float v) { return v; }
  MPT_HOST_DEVICE static T select(M m, T a, T b) { return m ? a : b; }
  MPT_HOST_DEVICE static T fma(T a, T b, T c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
  }
  MPT_HOST_DEVICE static T from_bits_shifted(T t) {
#if defined(__CUDA_ARCH__)
    const std::int32_t n = __float_as_int(t) - 0x4B400000;
    return __int_as_float((n + 127) << 23);
#else
    std::int32_t bits;
    std::memcpy(&bits, &t, sizeof bits);
    bits = (bits - 0x4B400000 + 127) << 23;
    float r;
    std::memcpy(&r, &bits, sizeof r);
    return r;
#endif
  }
};

template <class O>
MPT_FLOAT_MATH typename O::T exp_f32(typename O::T x0) {
  using T = typename O::T;
  using exact::add, exact::mul, exact::sub;
  const auto under = x0 < O::splat(-87.336544f);
  T x = O::select(x0 > O::splat(88.0f), O::splat(88.0f), x0);
  x = O::select(under, O::splat(-87.0f), x);
  const T magic = O::splat(12582912.0f);  // 1.5 · 2^23: adding it rounds to an integer
  const T t = O::fma(O::splat(1.44269504088896341f), x, magic);
  const T n = sub(t, magic);
  // r = x - n ln 2, ln 2 in two parts (Cody and Waite), each product fused into its subtraction.
  const T r = O::fma(O::splat(2.12194440e-4f), n, O::fma(O::splat(-0.693359375f), n, x));
  T p = O::splat(1.9875691500e-4f);
  p = O::fma(p, r, O::splat(1.3981999507e-3f));
  p = O::fma(p, r, O::splat(8.3334519073e-3f));
  p = O::fma(p, r, O::splat(4.1665795894e-2f));
  p = O::fma(p, r, O::splat(1.6666665459e-1f));
  p = O::fma(p, r, O::splat(5.0000001201e-1f));
  p = add(O::fma(p, mul(r, r), r), O::splat(1.0f));
  return O::select(under, O::splat(0.0f), mul(p, O::from_bits_shifted(t)));
}

/// erfc(z) for z >= 0 (Numerical Recipes' erfcc).
template <class O>
MPT_FLOAT_MATH typename O::T erfc_nonneg_f32(typename O::T z) {
  using T = typename O::T;
  using exact::div, exact::mul, exact::sub;
  const T t = div(O::splat(1.0f), O::fma(O::splat(0.5f), z, O::splat(1.0f)));
  T p = O::splat(0.17087277f);
  p = O::fma(p, t, O::splat(-0.82215223f));
  p = O::fma(p, t, O::splat(1.48851587f));
  p = O::fma(p, t, O::splat(-1.13520398f));
  p = O::fma(p, t, O::splat(0.27886807f));
  p = O::fma(p, t, O::splat(-0.18628806f));
  p = O::fma(p, t, O::splat(0.09678418f));
  p = O::fma(p, t, O::splat(0.37409196f));
  p = O::fma(p, t, O::splat(1.00002368f));
  p = O::fma(p, t, O::splat(-1.26551223f));
  return mul(t, exp_f32<O>(O::fma(sub(O::splat(0.0f), z), z, p)));  // t e^(p - z²)
}

/// Φ(x), the standard normal CDF.
template <class O>
MPT_FLOAT_MATH typename O::T normal_cdf_f32(typename O::T x) {
  using T = typename O::T;
  const auto negative = x < O::splat(0.0f);
  const T z = exact::mul(O::select(negative, O::splat(0.0f) - x, x), O::splat(0.70710678118654752f));
  const T half_tail = exact::mul(O::splat(0.5f), erfc_nonneg_f32<O>(z));  // Φ(-|x|)
  return O::select(negative, half_tail, exact::sub(O::splat(1.0f), half_tail));
}

/// GELU (the erf form): x Φ(x).
template <class O>
MPT_FLOAT_MATH typename O::T gelu_f32(typename O::T x) {
  return exact::mul(x, normal_cdf_f32<O>(x));
}

/// d GELU / dx: Φ(x) + x φ(x).
template <class O>
MPT_FLOAT_MATH typename O::T gelu_grad_f32(typename O::T x) {
  using exact::mul;
  const auto pdf = mul(exp_f32<O>(mul(mul(O::splat(-0.5f), x), x)), O::splat(0.3989422804014327f));
  return O::fma(pdf, x, normal_cdf_f32<O>(x));
}

}  // namespace mpt::common

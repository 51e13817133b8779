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
//   sigmoid     1 / (1 + e^-x) on exp_f32; exactly 0 below -87.34 (where e^-x leaves float32),
//               1 from 17 on.
//   tanh        Cephes's tanhf: x + x³ P(x²) (degree 4) for |x| <= 0.625, 1 - 2 / (e^2|x| + 1)
//               with the sign of x above; within a few ulp (tests/ops/test_op_table.cpp); ±0
//               kept, ±1 at ±inf, NaN stays NaN.
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

/// The logistic sigmoid 1 / (1 + e^-x).
template <class O>
MPT_FLOAT_MATH typename O::T sigmoid_f32(typename O::T x) {
  using T = typename O::T;
  const T one = O::splat(1.0f);
  const T s = exact::div(one, exact::add(one, exp_f32<O>(exact::sub(O::splat(0.0f), x))));
  return O::select(x < O::splat(-87.336544f), O::splat(0.0f), s);  // e^-x past float32: the limit 0
}

/// tanh (Cephes's tanhf).
template <class O>
MPT_FLOAT_MATH typename O::T tanh_f32(typename O::T x) {
  using T = typename O::T;
  using exact::add, exact::div, exact::mul, exact::sub;
  const T zero = O::splat(0.0f);
  const auto negative = x < zero;
  const T a = O::select(negative, sub(zero, x), x);  // |x|; NaN stays NaN
  const T big = sub(O::splat(1.0f), div(O::splat(2.0f), add(exp_f32<O>(add(a, a)), O::splat(1.0f))));
  const T z = mul(x, x);
  T p = O::splat(-5.70498872745e-3f);
  p = O::fma(p, z, O::splat(2.06390887954e-2f));
  p = O::fma(p, z, O::splat(-5.37397155531e-2f));
  p = O::fma(p, z, O::splat(1.33314422036e-1f));
  p = O::fma(p, z, O::splat(-3.33332819422e-1f));
  const T small = O::select(x == zero, x, O::fma(mul(p, z), x, x));  // x + x·z·P(z); -0 stays -0
  return O::select(a > O::splat(0.625f), O::select(negative, sub(zero, big), big), small);
}

/// SiLU (swish): x · sigmoid(x).
template <class O>
MPT_FLOAT_MATH typename O::T silu_f32(typename O::T x) {
  return exact::mul(x, sigmoid_f32<O>(x));
}

/// d SiLU / dx: s + x s (1 - s), s = sigmoid(x).
template <class O>
MPT_FLOAT_MATH typename O::T silu_grad_f32(typename O::T x) {
  using exact::add, exact::mul, exact::sub;
  const auto s = sigmoid_f32<O>(x);
  return add(s, mul(mul(x, s), sub(O::splat(1.0f), s)));
}

/// GELU's tanh approximation's inner argument u = √(2/π)(x + 0.044715 x³).
template <class O>
MPT_FLOAT_MATH typename O::T gelu_tanh_inner_f32(typename O::T x) {
  using exact::add, exact::mul;
  const auto x3 = mul(mul(x, x), x);
  return mul(O::splat(0.7978845608028654f), add(x, mul(O::splat(0.044715f), x3)));
}

/// GELU, the tanh approximation: ½ x (1 + tanh u).
template <class O>
MPT_FLOAT_MATH typename O::T gelu_tanh_f32(typename O::T x) {
  using exact::add, exact::mul;
  return mul(mul(O::splat(0.5f), x), add(O::splat(1.0f), tanh_f32<O>(gelu_tanh_inner_f32<O>(x))));
}

/// Its derivative: ½ (1 + t) + ½ x (1 - t²) √(2/π)(1 + 3 · 0.044715 x²), t = tanh u.
template <class O>
MPT_FLOAT_MATH typename O::T gelu_tanh_grad_f32(typename O::T x) {
  using exact::add, exact::mul, exact::sub;
  const auto t = tanh_f32<O>(gelu_tanh_inner_f32<O>(x));
  const auto du = mul(O::splat(0.7978845608028654f), add(O::splat(1.0f), mul(O::splat(3 * 0.044715f), mul(x, x))));
  return add(mul(O::splat(0.5f), add(O::splat(1.0f), t)),
             mul(mul(mul(O::splat(0.5f), x), sub(O::splat(1.0f), mul(t, t))), du));
}

}  // namespace mpt::common

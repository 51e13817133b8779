#pragma once
// Counter-based random numbers as host-and-device functions: the CPU backend runs these bodies,
// the CUDA backend runs them in its kernels, so every device draws the same stream bit for bit.
// Element i of stream (seed, offset) is one Philox block of its own, so the values do not depend
// on how the work is split over threads. The floating-point steps use only +, -, *, /, sqrt and
// explicit fma (no library log/cos, which differ between glibc and CUDA in the last bits), and no
// product ever feeds an addition directly, so FMA contraction (nvcc's default) cannot change a bit.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/common/host_device.hpp"

namespace mpt::kernels {

struct Philox4 {
  std::uint32_t v[4];
};

/// Random123's Philox-4x32 with 10 rounds: counter (c0, c1, c2, c3), key (k0, k1).
MPT_HOST_DEVICE inline Philox4 philox4x32_10(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                                             std::uint32_t c3, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // bump the key (Weyl sequence) between rounds
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
    const std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const std::uint32_t n1 = static_cast<std::uint32_t>(p1);
    const std::uint32_t n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const std::uint32_t n3 = static_cast<std::uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  return Philox4{{c0, c1, c2, c3}};
}

/// The block of element i of stream (seed, offset): counter (i, offset), key seed (low word first).
MPT_HOST_DEVICE inline Philox4 philox_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  return philox4x32_10(static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32),
                       static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(offset >> 32),
                       static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

/// 53 random bits from two words, (bits + 1/2) * 2^-53 rounded toward zero: always in (0, 1).
/// Below 1/2 that is exact; above, the half is dropped (there (bits + 1/2) * 2^-53 is not a
/// double, and rounding it to nearest would turn the largest value into exactly 1).
MPT_HOST_DEVICE inline double uniform_from_words(std::uint32_t w0, std::uint32_t w1) {
  const std::uint64_t bits = (static_cast<std::uint64_t>(w0) << 21) ^ (w1 >> 11);
  const double half = bits < (std::uint64_t{1} << 52) ? 0x1p-54 : 0.0;
  return fma(static_cast<double>(bits), 0x1p-53, half);  // exact either way
}

/// Uniform in (0, 1) from words v[0], v[1] of element i's block.
MPT_HOST_DEVICE inline double uniform_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  const Philox4 r = philox_at(seed, offset, i);
  return uniform_from_words(r.v[0], r.v[1]);
}

/// c[0] z^(N-1) + c[1] z^(N-2) + ... + c[N-1] by Horner's rule, one explicit fma a step (the
/// same rounding on every compiler).
template <int N>
MPT_HOST_DEVICE inline double horner(const double (&c)[N], double z) {
  double p = c[0];
  for (int i = 1; i < N; ++i) p = fma(p, z, c[i]);
  return p;
}

/// Natural log of a positive normal finite x (meant for x in (0, 1]), within about 1 ulp.
/// fdlibm's scheme with Taylor coefficients: x = 2^k * m, m in [sqrt(1/2), sqrt(2)), f = m - 1,
/// s = f / (2 + f), log m = f - (f^2/2 - s * (f^2/2 + R(s^2))), R(z) = sum 2 z^j / (2j + 1).
MPT_HOST_DEVICE inline double det_log(double x) {
  std::uint64_t b;
  memcpy(&b, &x, sizeof b);
  int k = static_cast<int>((b >> 52) & 0x7ff) - 1023;
  b = (b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
  double m;
  memcpy(&m, &b, sizeof m);  // m in [1, 2)
  if (m >= 1.4142135623730951) {
    m = m * 0.5;  // exact
    ++k;
  }
  const double f = m - 1.0;  // exact (Sterbenz)
  const double s = f / (2.0 + f);  // |s| <= 0.1716, s^2 <= 0.0295: 11 terms leave < 1e-19
  const double z = s * s;
  const double log_c[] = {0.08695652173913043 /* 2/23 */, 0.09523809523809523, 0.10526315789473684,
                          0.11764705882352941, 0.13333333333333333, 0.15384615384615385,
                          0.18181818181818182, 0.2222222222222222,  0.2857142857142857,
                          0.4,                 0.6666666666666666};
  const double p = horner(log_c, z);  // R = p * z
  const double hf = 0.5 * f;  // exact
  const double dk = static_cast<double>(k);
  constexpr double ln2_hi = 0x1.62e42feep-1;  // k * ln2_hi is exact for |k| < 2000
  constexpr double ln2_lo = 0x1.a39ef35793c76p-33;
  const double hfsq = hf * f;  // only ever an fma addend, never contracted
  const double t = fma(s, fma(p, z, hfsq), dk * ln2_lo);  // s * (f^2/2 + R) + k * ln2_lo
  const double u = fma(hf, f, -t);  // f^2/2 - t
  return fma(dk, ln2_hi, f - u);  // k * ln2_hi + (f - u)
}

/// cos(2 pi u) for u in [0, 1), absolute error about 1e-16. u * 4 and its integer part are exact,
/// so the quadrant reduction is exact; what is left is cos or sin of (pi/2) r, |r| <= 1/2.
MPT_HOST_DEVICE inline double det_cos_2pi(double u) {
  const double t = u * 4.0;  // exact
  int q = static_cast<int>(t);
  double r = t - static_cast<double>(q);  // exact, in [0, 1)
  if (r > 0.5) {
    r = r - 1.0;  // exact
    ++q;
  }
  const double z = r * r;
  double c;
  if ((q & 1) == 0) {  // cos((pi/2) r) = sum (-1)^j (pi/2)^(2j) r^(2j) / (2j)!
    const double cos_c[] = {-5.294400200734623e-13, 6.565963114979473e-11, -6.386603083791852e-09,
                            4.710874778818172e-07,  -2.5202042373060607e-05, 0.0009192602748394266,
                            -0.02086348076335296,   0.25366950790104803,    -1.2337005501361697,
                            1.0};
    c = horner(cos_c, z);
  } else {  // sin((pi/2) r) = sum (-1)^j (pi/2)^(2j+1) r^(2j+1) / (2j+1)!
    const double sin_c[] = {-4.377065467313742e-14, 6.0669357311061955e-12, -6.688035109811468e-10,
                            5.692172921967927e-08,  -3.598843235212085e-06, 0.00016044118478735983,
                            -0.004681754135318688,  0.07969262624616705,    -0.6459640975062463,
                            6.123233995736766e-17 /* pi/2 = 1.5707963267948966 + 6.12e-17 */};
    const double tail = horner(sin_c, z);
    c = fma(r, 1.5707963267948966, r * tail);
  }
  // cos(q pi/2 + x): q = 0: cos x, 1: -sin x, 2: -cos x, 3: sin x.
  const int quadrant = q & 3;
  return quadrant == 1 || quadrant == 2 ? -c : c;
}

/// Standard normal by Box-Muller: u1 from words (v0, v1), u2 from words (v2, v3) of element i's
/// block, sqrt(-2 log u1) * cos(2 pi u2).
MPT_HOST_DEVICE inline double normal_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  const Philox4 r = philox_at(seed, offset, i);
  const double u1 = uniform_from_words(r.v[0], r.v[1]);
  const double u2 = uniform_from_words(r.v[2], r.v[3]);
  return sqrt(-2.0 * det_log(u1)) * det_cos_2pi(u2);
}

}  // namespace mpt::kernels

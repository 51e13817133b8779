#pragma once
// Backend::random's kernel: element i of the Philox stream (seed, offset) computed from
// (seed, offset, i) alone by backend/common/random.hpp, the CPU's very function, then stored
// the way the CPU's convert stores a double, so GPU and CPU give the same bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/common/random.hpp"
#include "backend/cuda/kernels/launch.hpp"
#include "backend/cuda/kernels/element_types.hpp"

namespace mpt::kernels {

/// double -> float rounded to odd (the sticky last bit), so that rounding it on to a 16-bit
/// type equals rounding v directly (core/convert.cpp's to_float_round_odd).
MPT_HOST_DEVICE inline float float_round_odd(double v) {
  float f = static_cast<float>(v);
  std::uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if (!nonfinite(v) && static_cast<double>(f) != v && (bits & 1u) == 0)
    f = nextafterf(f, v > static_cast<double>(f) ? HUGE_VALF : -HUGE_VALF);
  return f;
}

/// A double stored in T as core/convert.cpp does: 16-bit through round-to-odd float32,
/// (v != 0) for bool, a plain conversion otherwise.
template <class T>
MPT_HOST_DEVICE inline T store_double(double v) {
  if constexpr (is_half_v<T>) return store<T>(float_round_odd(v));
  else if constexpr (std::is_same_v<T, bool>) return v != 0.0;
  else return static_cast<T>(v);
}

/// out[i] = uniform in (a, b) or normal(mean a, stddev b) of element i, grid-stride.
template <class T>
MPT_HOST_DEVICE void random_body(const Thread& t, T* out, std::int64_t n, bool normal, double a, double b,
                                 std::uint64_t seed, std::uint64_t offset) {
  for (std::int64_t i = t.global(); i < n; i += t.stride()) {
    const auto k = static_cast<std::uint64_t>(i);
    out[i] = store_double<T>(normal ? normal_value(seed, offset, k, a, b) : uniform_value(seed, offset, k, a, b));
  }
}

}  // namespace mpt::kernels

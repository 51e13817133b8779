#include "core/convert.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/common/binary_ops.hpp"  // trunc_to_int: the casts to integers both backends give
#include "mpt/half.hpp"

namespace mpt::detail {
namespace {

template <class F>
void visit(DType d, F&& f) {
  switch (d) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Float16: return f(half{});
    case DType::BFloat16: return f(bfloat16_t{});
    case DType::Int32: return f(std::int32_t{});
    case DType::Int64: return f(std::int64_t{});
    case DType::UInt8: return f(std::uint8_t{});
    case DType::Bool: return f(bool{});
  }
}

template <class T> double to_double(T v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t>)
    return static_cast<double>(static_cast<float>(v));
  else
    return static_cast<double>(v);
}
// double -> float rounding to odd (23 fraction bits keep a sticky last bit), so that the
// following rounding to float16/bfloat16 equals rounding v directly, not twice.
float to_float_round_odd(double v) {
  float f = static_cast<float>(v);
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isfinite(v) && static_cast<double>(f) != v && (bits & 1u) == 0)
    f = std::nextafter(f, v > static_cast<double>(f) ? INFINITY : -INFINITY);
  return f;
}

template <class T> T from_double(double v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t>)
    return T(to_float_round_odd(v));
  else if constexpr (std::is_same_v<T, bool>)
    return v != 0.0;
  else if constexpr (std::is_integral_v<T>)
    return common::trunc_to_int<T>(v);  // NaN and out-of-range values defined (as x86 and the CUDA cast give)
  else
    return static_cast<T>(v);
}

}  // namespace

void convert(const void* src, DType sd, void* dst, DType dd, std::size_t n) {
  if (n == 0) return;
  if (sd == dd) {
    std::memcpy(dst, src, n * itemsize(sd));
    return;
  }
  auto* s16 = static_cast<const std::uint16_t*>(src);
  auto* d16 = static_cast<std::uint16_t*>(dst);
  if (sd == float32 && dd == float16) return float_to_half(static_cast<const float*>(src), d16, n);
  if (sd == float16 && dd == float32) return half_to_float(s16, static_cast<float*>(dst), n);
  if (sd == float32 && dd == bfloat16)
    return float_to_bfloat16(static_cast<const float*>(src), d16, n);
  if (sd == bfloat16 && dd == float32) return bfloat16_to_float(s16, static_cast<float*>(dst), n);
  if (is_half(sd) && is_half(dd)) {  // through float32, in blocks
    float buf[1024];
    for (std::size_t i = 0; i < n; i += 1024) {
      std::size_t m = std::min<std::size_t>(1024, n - i);
      convert(s16 + i, sd, buf, float32, m);
      convert(buf, float32, d16 + i, dd, m);
    }
    return;
  }
  visit(sd, [&](auto s) {
    using S = decltype(s);
    visit(dd, [&](auto d) {
      using D = decltype(d);
      auto* sp = static_cast<const S*>(src);
      auto* dp = static_cast<D*>(dst);
      if constexpr (std::is_same_v<S, float> && std::is_same_v<D, double>) {
        for (std::size_t i = 0; i < n; ++i) dp[i] = sp[i];
      } else if constexpr (std::is_same_v<S, double> && std::is_same_v<D, float>) {
        for (std::size_t i = 0; i < n; ++i) dp[i] = static_cast<float>(sp[i]);
      } else if constexpr (std::is_integral_v<S> && std::is_integral_v<D> && !std::is_same_v<D, bool>) {
        // Integer to integer directly: modulo 2^bits (NumPy's astype), never through a double
        // that cannot hold every int64.
        for (std::size_t i = 0; i < n; ++i) dp[i] = static_cast<D>(sp[i]);
      } else {
        for (std::size_t i = 0; i < n; ++i) dp[i] = from_double<D>(to_double(sp[i]));
      }
    });
  });
}

}  // namespace mpt::detail

#pragma once
// Element types of the CUDA kernels and their "load 16-bit, compute float32, store 16-bit"
// conversions, usable in device code and in plain host code (the tests run kernel bodies on the
// CPU with these very types: cuda_fp16.h and cuda_bf16.h compile under g++).
//
//   dispatch(x.dtype(), [&](auto tag) { using T = typename decltype(tag)::type; ... });
//
// Storage types: float, double, __half, __nv_bfloat16, int32_t, int64_t, uint8_t, bool.
// Compute types (compute_t<T>): double for double, int64_t for integers and bool, float else.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/common/host_device.hpp"
#include "backend/common/unary_ops.hpp"
#include "mpt/dtype.hpp"
#include "mpt/error.hpp"

namespace mpt::kernels {

template <class T> struct Type { using type = T; };

/// Calls f(Type<T>{}) with the storage type of dtype d.
template <class F>
decltype(auto) dispatch(DType d, F&& f) {
  switch (d) {
    case DType::Float32: return f(Type<float>{});
    case DType::Float64: return f(Type<double>{});
    case DType::Float16: return f(Type<__half>{});
    case DType::BFloat16: return f(Type<__nv_bfloat16>{});
    case DType::Int32: return f(Type<std::int32_t>{});
    case DType::Int64: return f(Type<std::int64_t>{});
    case DType::UInt8: return f(Type<std::uint8_t>{});
    case DType::Bool: return f(Type<bool>{});
  }
  fail("cuda: unknown dtype ", static_cast<int>(d));
}

/// Calls f(Type<T>{}) for a floating dtype only (float32, float64, float16, bfloat16).
template <class F>
decltype(auto) dispatch_float(DType d, const char* op, F&& f) {
  switch (d) {
    case DType::Float32: return f(Type<float>{});
    case DType::Float64: return f(Type<double>{});
    case DType::Float16: return f(Type<__half>{});
    case DType::BFloat16: return f(Type<__nv_bfloat16>{});
    default: break;
  }
  fail(op, ": expected a floating dtype, got ", to_string(d));
}

template <class T> inline constexpr bool is_half_v =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double,
                                     std::conditional_t<std::is_integral_v<T>, std::int64_t, float>>;

/// The bits of v as U (same size).
template <class U, class T>
MPT_HOST_DEVICE inline U bits_as(T v) {
  static_assert(sizeof(U) == sizeof(T));
  U u;
  std::memcpy(static_cast<void*>(&u), static_cast<const void*>(&v), sizeof u);  // __half has no public bits
  return u;
}

/// An element as its compute type. A 16-bit NaN comes out as a quiet float32 NaN with its sign
/// and payload, as mpt/half.hpp converts on the CPU (the intrinsics give a canonical NaN).
template <class T>
MPT_HOST_DEVICE inline compute_t<T> load(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    const auto h = bits_as<std::uint16_t>(v);
    if ((h & 0x7fffu) > 0x7c00u)
      return bits_as<float>((static_cast<std::uint32_t>(h & 0x8000u) << 16) | 0x7fc00000u |
                            (static_cast<std::uint32_t>(h & 0x3ffu) << 13));
    return __half2float(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const auto h = bits_as<std::uint16_t>(v);
    if ((h & 0x7fffu) > 0x7f80u) return bits_as<float>(static_cast<std::uint32_t>(h | 0x40u) << 16);
    return __bfloat162float(v);
  } else {
    return static_cast<compute_t<T>>(v);
  }
}

/// A compute value stored as T: round to nearest even for 16-bit types (overflow to inf; a NaN
/// stays a quiet NaN with its sign and top payload bits, as mpt/half.hpp), (v != 0) for bool, a
/// plain conversion otherwise.
template <class T, class C>
MPT_HOST_DEVICE inline T store(C v) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    const float f = static_cast<float>(v);
    const std::uint32_t x = bits_as<std::uint32_t>(f), a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {
      if constexpr (std::is_same_v<T, __half>)
        return bits_as<__half>(static_cast<std::uint16_t>(((x >> 16) & 0x8000u) | 0x7e00u | ((a >> 13) & 0x3ffu)));
      else
        return bits_as<__nv_bfloat16>(static_cast<std::uint16_t>((x >> 16) | 0x40u));
    }
    if constexpr (std::is_same_v<T, __half>) return __float2half_rn(f);
    else return __float2bfloat16_rn(f);
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != C(0);
  } else {
    return static_cast<T>(v);
  }
}

/// True when a float is inf or NaN, by its exponent bits (robust under fast-math).
MPT_HOST_DEVICE inline bool nonfinite(float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & 0x7f800000u) == 0x7f800000u;
}
MPT_HOST_DEVICE inline bool nonfinite(double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}

/// Arithmetic that nvcc may not contract into an fma the CPU does not do: the round-to-nearest
/// intrinsics on the device, plain operators on the host (float and double; others plain).
// Arithmetic nvcc does not contract into fma (the CPU rounds a * b + c twice): defined once in
// backend/common/unary_ops.hpp for both backends.
namespace exact = ::mpt::common::exact;

}  // namespace mpt::kernels

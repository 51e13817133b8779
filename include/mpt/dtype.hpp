#pragma once
/// Element types, named exactly like Keras's dtype strings.
///
///   mpt::DType d = mpt::dtype_from_string("bfloat16");
///   assert(mpt::to_string(d) == "bfloat16" && mpt::itemsize(d) == 2);
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mpt {

enum class DType : std::uint8_t { Float32, Float64, Float16, BFloat16, Int32, Int64, UInt8, Bool };

inline constexpr DType float32 = DType::Float32;
inline constexpr DType float64 = DType::Float64;
inline constexpr DType float16 = DType::Float16;
inline constexpr DType bfloat16 = DType::BFloat16;
inline constexpr DType int32 = DType::Int32;
inline constexpr DType int64 = DType::Int64;
inline constexpr DType uint8 = DType::UInt8;
inline constexpr DType bool_ = DType::Bool;

/// "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "bool".
std::string to_string(DType dtype);
/// Inverse of to_string; an unknown name is an mpt::Error listing the valid ones.
DType dtype_from_string(std::string_view name);
std::size_t itemsize(DType dtype);
bool is_floating(DType dtype);
/// float16 or bfloat16.
bool is_half(DType dtype);
bool is_integer(DType dtype);  // int32, int64, uint8, bool

}  // namespace mpt

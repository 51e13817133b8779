#include "mpt/dtype.hpp"

#include <array>

#include "mpt/error.hpp"

namespace mpt {
namespace {
constexpr std::array<std::string_view, 8> kNames = {"float32", "float64", "float16", "bfloat16",
                                                    "int32",   "int64",   "uint8",   "bool"};
}

std::string to_string(DType dtype) { return std::string(kNames.at(static_cast<int>(dtype))); }

DType dtype_from_string(std::string_view name) {
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return static_cast<DType>(i);
  std::string valid;
  for (auto n : kNames) valid += (valid.empty() ? "" : ", ") + std::string(n);
  fail("dtype: unknown dtype '", name, "'; valid names: ", valid);
}

std::size_t itemsize(DType dtype) {
  switch (dtype) {
    case DType::Float64:
    case DType::Int64: return 8;
    case DType::Float32:
    case DType::Int32: return 4;
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::UInt8:
    case DType::Bool: return 1;
  }
  return 0;
}

bool is_floating(DType d) {
  return d == float32 || d == float64 || d == float16 || d == bfloat16;
}
bool is_half(DType d) { return d == float16 || d == bfloat16; }
bool is_integer(DType d) { return !is_floating(d); }

}  // namespace mpt

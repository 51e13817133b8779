#pragma once
// Helpers shared by the host tests of the CUDA kernels (tests/cuda/test_cuda_*.cpp): host arrays
// of the storage types (__half, __nv_bfloat16, float, ...), their dtypes, and CPU tensors made
// from them and read back into them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/backend.hpp"
#include "test_util.hpp"

namespace mpt::test {

/// The CPU backend, whose ops the kernels are compared with.
inline Backend& cpu() { return mpt::detail::backend(Device::cpu()); }

/// A host array of storage type T (std::vector<bool> has no data()).
template <class T> struct Vec : std::vector<T> {
  using std::vector<T>::vector;
};
template <> struct Vec<bool> : std::vector<std::uint8_t> {
  using Base = std::vector<std::uint8_t>;
  using Base::vector;
  bool* data() { return reinterpret_cast<bool*>(Base::data()); }
  const bool* data() const { return reinterpret_cast<const bool*>(Base::data()); }
  bool& operator[](std::size_t i) { return data()[i]; }
  const bool& operator[](std::size_t i) const { return data()[i]; }
  bool operator==(const Vec&) const = default;
};

/// The dtype whose elements are stored as T.
template <class T> DType dtype_of_storage() {
  if constexpr (std::is_same_v<T, float>) return float32;
  else if constexpr (std::is_same_v<T, double>) return float64;
  else if constexpr (std::is_same_v<T, __half>) return float16;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return bfloat16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return int32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return int64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return uint8;
  else return bool_;
}

/// A CPU tensor of shape s holding a copy of v.
template <class T>
Tensor host_tensor(const Vec<T>& v, const Shape& s) {
  return Tensor::from_host(v.data(), v.size(), dtype_of_storage<T>(), s, Device::cpu());
}

/// A CPU tensor's elements as its storage type T.
template <class T>
Vec<T> tensor_values(const Tensor& t) {
  Vec<T> v(static_cast<std::size_t>(t.numel()));
  if (!v.empty()) std::memcpy(static_cast<void*>(v.data()), t.data_ptr(), v.size() * sizeof(T));
  return v;
}

}  // namespace mpt::test

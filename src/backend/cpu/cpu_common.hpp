#pragma once
// Helpers shared by the CPU kernels: threading and the "load 16-bit, compute float32, store
// 16-bit" block scheme. A kernel is written once per compute type C (float, double, int64_t);
// blocks of up to kBlock elements are converted into C on load and back on store.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/common/shape.hpp"
#include "core/convert.hpp"
#include "mpt/tensor.hpp"

namespace mpt::cpu {

constexpr std::int64_t kBlock = 1024;

/// Runs f(begin, end) over [0, n) in chunks of at least `grain`, on all threads when worth it.
template <class F>
void parallel_for(std::int64_t n, std::int64_t grain, F&& f) {
  if (n <= 0) return;
  int threads = omp_get_max_threads();
  if (threads <= 1 || n <= grain || omp_in_parallel()) {
    f(std::int64_t{0}, n);
    return;
  }
  std::int64_t chunks = std::min<std::int64_t>(threads, (n + grain - 1) / grain);
#pragma omp parallel for num_threads(static_cast<int>(chunks)) schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    f(b, e);
  }
}

/// Calls f(C{}) with the compute type of a dtype: double for float64, int64 for integers,
/// float otherwise.
template <class F>
decltype(auto) with_compute_type(DType d, F&& f) {
  if (d == float64) return f(double{});
  if (is_integer(d)) return f(std::int64_t{});
  return f(float{});
}

template <class C> constexpr DType compute_dtype_of() {
  if constexpr (std::is_same_v<C, double>) return float64;
  else if constexpr (std::is_same_v<C, float>) return float32;
  else return int64;
}

/// Pointer to elements [begin, begin+n) of t as C: direct when t already holds C, else
/// converted into `scratch` (n <= kBlock).
template <class C>
const C* load(const Tensor& t, std::int64_t begin, std::int64_t n, C* scratch) {
  const char* base = static_cast<const char*>(t.data_ptr()) + begin * itemsize(t.dtype());
  if (t.dtype() == compute_dtype_of<C>()) return reinterpret_cast<const C*>(base);
  detail::convert(base, t.dtype(), scratch, compute_dtype_of<C>(), static_cast<std::size_t>(n));
  return scratch;
}

/// Where a kernel writes elements [begin, begin+n) of t as C (t's memory or `scratch`).
template <class C>
C* store_target(Tensor& t, std::int64_t begin, C* scratch) {
  char* base = static_cast<char*>(t.data_ptr()) + begin * itemsize(t.dtype());
  return t.dtype() == compute_dtype_of<C>() ? reinterpret_cast<C*>(base) : scratch;
}

/// Completes a store: converts scratch into t when store_target returned scratch.
template <class C>
void store(Tensor& t, std::int64_t begin, std::int64_t n, const C* values) {
  char* base = static_cast<char*>(t.data_ptr()) + begin * itemsize(t.dtype());
  if (reinterpret_cast<const char*>(values) == base) return;
  detail::convert(values, compute_dtype_of<C>(), base, t.dtype(), static_cast<std::size_t>(n));
}

/// Converts n elements from src (dtype sd) to dst (dtype dd) on all threads.
inline void convert_n(const void* src, DType sd, void* dst, DType dd, std::int64_t n) {
  const std::size_t si = itemsize(sd), di = itemsize(dd);
  parallel_for(n, 1 << 14, [&](std::int64_t b, std::int64_t e) {
    detail::convert(static_cast<const char*>(src) + b * si, sd, static_cast<char*>(dst) + b * di, dd,
                    static_cast<std::size_t>(e - b));
  });
}

/// t itself when float32 or undefined, else a float32 copy (float16 and bfloat16 staging).
inline Tensor to_float32(const Tensor& t) {
  if (!t.defined() || t.dtype() == float32) return t;
  Tensor f = Tensor::empty(t.shape(), float32, t.device());
  convert_n(t.data_ptr(), t.dtype(), f.data_ptr(), float32, t.numel());
  return f;
}

using detail::split_axis;  // shape [outer, n, inner] around an axis

}  // namespace mpt::cpu

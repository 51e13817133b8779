#pragma once
// Row-chunked loops for the normalization kernels: x viewed as [rows, cols], split into one
// contiguous chunk of rows per thread so that per-column partial sums can be kept per chunk.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_common.hpp"

namespace mpt::cpu {

/// How many chunks f will be called with (1 for small problems or inside a parallel region).
inline int row_chunks(std::int64_t rows, std::int64_t cols) {
  if (omp_in_parallel() || rows <= 1) return 1;
  const std::int64_t by_size = std::max<std::int64_t>(1, rows * cols / 16384);
  return static_cast<int>(std::min<std::int64_t>({omp_get_max_threads(), by_size, rows}));
}

/// Calls f(chunk, row_begin, row_end) for `chunks` contiguous chunks of [0, rows), in parallel.
template <class F>
void for_row_chunks(int chunks, std::int64_t rows, F&& f) {
  if (chunks <= 1) return f(0, std::int64_t{0}, rows);
#pragma omp parallel for num_threads(chunks) schedule(static)
  for (int c = 0; c < chunks; ++c) f(c, rows * c / chunks, rows * (c + 1) / chunks);
}

/// Rows per block so that a block of cols-wide rows holds about 4096 elements.
inline std::int64_t block_rows(std::int64_t cols) { return std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(cols, 1)); }

/// A small [n] tensor (float32/float64 parameters, or undefined) as C values, `fallback` when undefined.
template <class C>
std::vector<C> values_of(const Tensor& t, std::int64_t n, C fallback) {
  std::vector<C> v(static_cast<std::size_t>(n), fallback);
  if (t.defined() && n > 0) detail::convert(t.data_ptr(), t.dtype(), v.data(), compute_dtype_of<C>(), v.size());
  return v;
}

/// Writes n doubles into t (any float dtype).
inline void write_values(const std::vector<double>& v, Tensor& t) {
  if (t.defined() && !v.empty()) detail::convert(v.data(), float64, t.data_ptr(), t.dtype(), v.size());
}

}  // namespace mpt::cpu

#pragma once
// Launch code shared by batch_norm.cu and layer_norm.cu: per-column float64 sums over the rows of
// a [rows, cols] view (kernels/batch_norm.hpp's column_sums_* phases, tiled as batch norm's
// channels) and the pointers of optional tensors. Included by .cu files only (a __global__
// wrapper); everything has internal linkage, like each file's own kernels.
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels/batch_norm.hpp"

namespace mpt::cuda {
namespace {
using namespace mpt::kernels;

template <class C, class Term>
__global__ void column_sums_kernel(Term term, std::int64_t rows, std::int64_t cols, std::int64_t cw, double* part) {
  __shared__ double sh[2 * kNormThreads];
  const Thread t = this_thread();
  column_sums_phase<C>(t, sh, term, rows, cols, cw);
  for (int step = 0; step < kTreeSteps; ++step) {
    __syncthreads();
    column_sums_step(t, sh, cols, cw, step);
  }
  __syncthreads();
  column_sums_store(t, sh, part, cols, cw);
}

/// The [rows, cols] tiling: grid (column tiles of cw columns, row blocks) of kNormThreads threads.
struct Tiling {
  std::int64_t rows, cols, cw;
  dim3 grid;
};

inline Tiling tiling(std::int64_t rows, std::int64_t cols, const char* op) {
  const std::int64_t cw = channel_tile(cols), tiles = (cols + cw - 1) / cw;
  MPT_CHECK(tiles <= 0x7fffffff, op, ": too many columns (", cols, ")");
  return {rows, cols, cw, dim3(static_cast<unsigned>(tiles), row_blocks(rows, kNormThreads / cw, tiles))};
}

/// Per-column float64 partial sums of term (computed in C), [grid.y][2][cols], in a new
/// workspace tensor on `device`.
template <class C, class Term>
Tensor column_sums(const Term& term, const Tiling& tl, Device device, cudaStream_t s, const char* op) {
  Tensor part = Tensor::empty({static_cast<std::int64_t>(tl.grid.y) * 2 * tl.cols}, float64, device);
  column_sums_kernel<C><<<tl.grid, kNormThreads, 0, s>>>(term, tl.rows, tl.cols, tl.cw, part.data<double>());
  check_launch(op);
  return part;
}

/// t's elements, or nullptr for an undefined (absent) tensor.
template <class P>
const P* optional(const Tensor& t) {
  return t.defined() ? t.data<P>() : nullptr;
}
template <class P>
P* optional_out(Tensor& t) {
  return t.defined() ? t.data<P>() : nullptr;
}

}  // namespace
}  // namespace mpt::cuda

#pragma once
// Row gathers and zero padding / cropping: pure data movement, so the bits equal the CPU's.
// Both are grid-stride loops over the output in words W (gather: the widest word dividing the
// row and both pointers; pad: the element's own size).
#include <cstdint>

#include "backend/cuda/kernels/elementwise.hpp"  // convert_value
#include "backend/cuda/kernels/launch.hpp"

namespace mpt::kernels {

/// out row k = x row indices[k] of x's `rows` rows of row_words words; an index outside
/// [0, rows) gives a row of zeros, never a read outside x (the CPU refuses such an index; ops
/// checks the ids it gathers by, as Embedding does).
template <class W>
MPT_HOST_DEVICE void gather_rows_body(const Thread& t, const W* x, const std::int64_t* indices, W* out,
                                      std::int64_t count, std::int64_t row_words, std::int64_t rows) {
  const std::int64_t total = count * row_words;
  for (std::int64_t u = t.global(); u < total; u += t.stride()) {
    const std::int64_t k = u / row_words, w = u - k * row_words, i = indices[k];
    out[u] = i >= 0 && i < rows ? x[i * row_words + w] : W{};
  }
}

/// out[indices[k]] += src[k] (rows of `width` elements) in out's type C (float, double): one
/// thread per column adding its rows in k order, the CPU's order, so the sums are the CPU's bits
/// and do not depend on the launch (no atomics). Indices are in range (ops checks them).
template <class S, class C>
MPT_HOST_DEVICE void scatter_add_rows_body(const Thread& t, const S* src, const std::int64_t* indices, C* out,
                                           std::int64_t count, std::int64_t width) {
  for (std::int64_t j = t.global(); j < width; j += t.stride())
    for (std::int64_t k = 0; k < count; ++k) {
      C& o = out[indices[k] * width + j];
      o = exact::add(o, convert_value<C>(src[k * width + j]));
    }
}

constexpr int kMaxPadDims = 12;

/// Shapes and per-axis offsets of a pad (out[i + offset] = x[i]), passed by value.
struct PadGeom {
  int nd = 0;
  std::int64_t out_shape[kMaxPadDims], in_shape[kMaxPadDims], offset[kMaxPadDims];
};

/// Every out element: the source element it lands on, or zero.
template <class W>
MPT_HOST_DEVICE void pad_body(const Thread& t, const W* x, W* out, std::int64_t total, PadGeom g) {
  for (std::int64_t u = t.global(); u < total; u += t.stride()) {
    std::int64_t rest = u, src = 0, stride = 1;
    bool inside = true;
    for (int d = g.nd - 1; d >= 0; --d) {
      const std::int64_t i = rest % g.out_shape[d] - g.offset[d];
      rest /= g.out_shape[d];
      inside = inside && i >= 0 && i < g.in_shape[d];
      src += i * stride;
      stride *= g.in_shape[d];
    }
    out[u] = inside ? x[src] : W(0);
  }
}

}  // namespace mpt::kernels

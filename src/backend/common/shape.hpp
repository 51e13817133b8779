#pragma once
// Shape arithmetic shared by the CPU and CUDA backends (host code).
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt::detail {

/// Splits a shape at `axis` into [outer, n, inner].
inline void split_axis(const Shape& s, std::int64_t axis, std::int64_t& outer, std::int64_t& n,
                       std::int64_t& inner) {
  outer = 1, inner = 1;
  for (std::int64_t i = 0; i < axis; ++i) outer *= s[i];
  n = s[axis];
  for (std::size_t i = axis + 1; i < s.size(); ++i) inner *= s[i];
}

/// K operands broadcast to `out`, walked as collapsed axes: size-1 output axes dropped and
/// adjacent axes merged where every operand allows; per operand a stride per axis, 0 where it is
/// broadcast. At least one axis (a scalar output is one axis of 1, strides 0). Shapes already
/// validated by src/ops.
template <int K>
struct CollapsedBroadcast {
  std::vector<std::int64_t> dims;
  std::array<std::vector<std::int64_t>, K> strides;
};

template <int K>
CollapsedBroadcast<K> collapse_broadcast(const Shape& out, const std::array<const Shape*, K>& in) {
  const std::size_t n = out.size();
  std::array<std::vector<std::int64_t>, K> full;  // per operand, its stride on every output axis
  for (int k = 0; k < K; ++k) {
    full[k].assign(n, 0);
    const Shape& s = *in[k];
    std::int64_t stride = 1;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const std::size_t d = s.size() - 1 - i, o = n - 1 - i;
      full[k][o] = s[d] == 1 ? 0 : stride;
      stride *= s[d];
    }
  }
  CollapsedBroadcast<K> c;
  for (std::size_t i = 0; i < n; ++i) {
    if (out[i] == 1) continue;  // size-1 dims carry no iteration
    bool merge = !c.dims.empty();
    for (int k = 0; k < K && merge; ++k) merge = c.strides[k].back() == full[k][i] * out[i];
    if (merge) {
      c.dims.back() *= out[i];
      for (int k = 0; k < K; ++k) c.strides[k].back() = full[k][i];
    } else {
      c.dims.push_back(out[i]);
      for (int k = 0; k < K; ++k) c.strides[k].push_back(full[k][i]);
    }
  }
  if (c.dims.empty()) {
    c.dims.push_back(1);
    for (int k = 0; k < K; ++k) c.strides[k].push_back(0);
  }
  return c;
}

}  // namespace mpt::detail

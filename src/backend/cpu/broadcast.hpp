#pragma once
// Broadcast iteration: the output is walked as rows of a collapsed shape; each operand has a
// per-row offset and an inner stride of 0 (broadcast) or 1 (contiguous).
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/common/shape.hpp"
#include "mpt/tensor.hpp"

namespace mpt::cpu {

template <int K>
struct BroadcastPlan {
  std::vector<std::int64_t> dims;                       // collapsed output dims
  std::array<std::vector<std::int64_t>, K> strides;     // per operand, per dim
  std::int64_t rows = 1, inner = 1;
  std::array<std::int64_t, K> inner_stride{};

  BroadcastPlan(const Shape& out, const std::array<const Shape*, K>& in) {
    detail::CollapsedBroadcast<K> c = detail::collapse_broadcast<K>(out, in);
    dims = std::move(c.dims);
    strides = std::move(c.strides);
    inner = dims.back();
    for (std::size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
    for (int k = 0; k < K; ++k) inner_stride[k] = strides[k].back();
  }

  /// Element offset of operand k at the start of row r.
  std::int64_t row_offset(int k, std::int64_t r) const {
    std::int64_t off = 0;
    for (std::int64_t i = static_cast<std::int64_t>(dims.size()) - 2; i >= 0; --i) {
      std::int64_t idx = r % dims[i];
      r /= dims[i];
      off += idx * strides[k][i];
    }
    return off;
  }
};

}  // namespace mpt::cpu

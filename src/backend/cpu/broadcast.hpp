#pragma once
// Broadcast iteration: the output is walked as rows of a collapsed shape; each operand has a
// per-row offset and an inner stride of 0 (broadcast) or 1 (contiguous).
#include <array>
#include <cstdint>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt::cpu {

template <int K>
struct BroadcastPlan {
  std::vector<std::int64_t> dims;                       // collapsed output dims
  std::array<std::vector<std::int64_t>, K> strides;     // per operand, per dim
  std::int64_t rows = 1, inner = 1;
  std::array<std::int64_t, K> inner_stride{};

  BroadcastPlan(const Shape& out, const std::array<const Shape*, K>& in) {
    const std::size_t n = out.size();
    std::array<std::vector<std::int64_t>, K> full;
    for (int k = 0; k < K; ++k) {
      full[k].assign(n, 0);
      const Shape& s = *in[k];
      std::int64_t stride = 1;
      for (std::size_t i = 0; i < s.size(); ++i) {
        std::size_t d = s.size() - 1 - i, o = n - 1 - i;
        full[k][o] = s[d] == 1 ? 0 : stride;
        stride *= s[d];
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (out[i] == 1) continue;  // size-1 dims carry no iteration
      bool merge = !dims.empty();
      for (int k = 0; k < K && merge; ++k)
        merge = strides[k].back() == full[k][i] * out[i];
      if (merge) {
        dims.back() *= out[i];
        for (int k = 0; k < K; ++k) strides[k].back() = full[k][i];
      } else {
        dims.push_back(out[i]);
        for (int k = 0; k < K; ++k) strides[k].push_back(full[k][i]);
      }
    }
    if (dims.empty()) {
      dims.push_back(1);
      for (int k = 0; k < K; ++k) strides[k].push_back(0);
    }
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

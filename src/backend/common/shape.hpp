#pragma once
// Shape arithmetic shared by the CPU and CUDA backends (host code).
#include <cstddef>
#include <cstdint>

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

}  // namespace mpt::detail

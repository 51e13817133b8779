#pragma once
// Output size and Keras padding of one spatial axis, shared by the convolution and pooling ops.
#include <cstdint>
#include <string>

#include "mpt/error.hpp"

namespace mpt::ops::detail {

struct SpatialAxis {
  std::int64_t out = 0, pad_lo = 0, pad_hi = 0;
};

/// "valid": no padding, out = (in - window) / stride + 1 (window <= in required by the caller);
/// "same": out = ceil(in / stride), padded so the windows cover it, the odd extra at the end.
inline SpatialAxis spatial_axis(std::int64_t in, std::int64_t window, std::int64_t stride, bool same) {
  SpatialAxis a;
  if (!same) {
    a.out = in >= window ? (in - window) / stride + 1 : 0;
    return a;
  }
  a.out = in / stride + (in % stride != 0);  // ceil; (in + stride - 1) / stride overflows
  const std::int64_t total = std::max<std::int64_t>((a.out - 1) * stride + window - in, 0);
  a.pad_lo = total / 2;
  a.pad_hi = total - a.pad_lo;
  return a;
}

/// true for "same", false for "valid"; anything else is an mpt::Error naming the op.
inline bool parse_padding(const char* op, const std::string& padding) {
  if (padding == "same") return true;
  MPT_CHECK(padding == "valid", op, ": padding must be \"valid\" or \"same\", got \"", padding, "\"");
  return false;
}

}  // namespace mpt::ops::detail

#pragma once
// Element conversion between any two dtypes on the host (the cast kernel's core).
#include <cstddef>

#include "mpt/dtype.hpp"

namespace mpt::detail {
/// dst[i] = src[i] converted; float->16-bit rounds to nearest even, float->int truncates,
/// anything->bool is (x != 0).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n);
}  // namespace mpt::detail

#pragma once
// Views core makes for the ops that define Tensor's differentiable methods (ops/tensor_methods.cpp).
#include "mpt/tensor.hpp"

namespace mpt::detail {

/// Rows [begin, end) of x's first axis as a view (no copy, no tape record); mpt::Error naming
/// Tensor::slice for a bad range.
Tensor row_view(const Tensor& x, std::int64_t begin, std::int64_t end);

}  // namespace mpt::detail

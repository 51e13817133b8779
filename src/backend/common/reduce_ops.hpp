#pragma once
// A reduction's start value and its combine step, one definition for the CPU's loops
// (cpu/reduce.cpp) and the CUDA kernels (cuda/kernels/reduce.hpp): max and min keep a NaN once
// seen, start from ±inf for floating types (the maximum of -inf values is -inf), and sums add
// (integers wrap).
#include <limits>

#include "backend/backend.hpp"
#include "backend/common/unary_ops.hpp"  // exact::add

namespace mpt::common {

template <class C>
MPT_HOST_DEVICE inline C reduce_init(ReduceOp op) {
  using L = std::numeric_limits<C>;
  return op == ReduceOp::Max   ? (L::has_infinity ? -L::infinity() : L::lowest())
         : op == ReduceOp::Min ? (L::has_infinity ? L::infinity() : L::max())
                               : C(0);
}

template <class C>
struct ReduceCombine {
  ReduceOp op;
  MPT_HOST_DEVICE C operator()(C acc, C v) const {
    switch (op) {
      case ReduceOp::Max: return (v > acc || v != v) ? v : acc;
      case ReduceOp::Min: return (v < acc || v != v) ? v : acc;
      default: return exact::add(acc, v);
    }
  }
};

}  // namespace mpt::common

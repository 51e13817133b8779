#pragma once
// Helpers shared by the losses and the metrics (internal).
#include <string>
#include <utility>

#include "mpt/ops.hpp"
#include "mpt/tensor.hpp"

namespace mpt::losses::detail {

/// float64 stays float64; everything else computes in float32.
inline DType compute_dtype(const Tensor& y_pred) { return y_pred.dtype() == float64 ? float64 : float32; }

/// Casts with ops::cast (so gradients flow back in x's dtype) unless x already has `dtype`.
inline Tensor cast_to(const Tensor& x, DType dtype) { return x.dtype() == dtype ? x : ops::cast(x, dtype); }

/// Keras's squeeze_or_expand_to_same_rank: when the ranks differ by one and the longer one
/// ends in 1, a rank-1 partner gains a trailing axis, otherwise the longer one loses it.
inline std::pair<Tensor, Tensor> squeeze_or_expand_to_same_rank(Tensor a, Tensor b) {
  auto fix = [](Tensor& longer, Tensor& shorter) {
    if (longer.dim() != shorter.dim() + 1 || longer.shape().back() != 1) return;
    if (shorter.dim() == 1) {
      Shape s = shorter.shape();
      s.push_back(1);
      shorter = shorter.reshape(s);
    } else {
      Shape s = longer.shape();
      s.pop_back();
      longer = longer.reshape(s);
    }
  };
  fix(a, b);
  fix(b, a);
  return {a, b};
}

/// Runs f; an mpt::Error it throws comes back prefixed with `who` (unless it already starts so).
template <class F>
auto named_errors(const std::string& who, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.rfind(who, 0) == 0) throw;
    throw Error(who + ": " + what);
  }
}

}  // namespace mpt::losses::detail

#pragma once
/// Host views of tensors as xtensor expressions (no copy).
///
///   auto t = mpt::Tensor::zeros({2, 3});
///   auto v = mpt::as_xtensor<float>(t);     // xt::adapt over t's memory
///   v(1, 2) = 5.f;                          // writes into t
#include <xtensor/xadapt.hpp>

#include "mpt/tensor.hpp"

namespace mpt {

/// A view over a CPU tensor's memory; T must be the tensor's element type.
template <class T>
auto as_xtensor(const Tensor& t) {
  MPT_CHECK(t.device().is_cpu(), "as_xtensor: tensor is on ", t.device().str(), "; copy it with .to(Device::cpu())");
  std::vector<std::size_t> shape(t.shape().begin(), t.shape().end());
  return xt::adapt(t.data<T>(), static_cast<std::size_t>(t.numel()), xt::no_ownership(), shape);
}

}  // namespace mpt

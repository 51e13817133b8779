#pragma once
/// mpt::Tensors: Keras's x or y argument, one tensor or a list of them (one per model input or
/// output, in the model's order). Converts from a Tensor, a std::vector<Tensor> and a braced list:
///
///   model.fit({x_image, x_meta}, y);                // two inputs, one output
///   model.fit(x, {y_class, y_box});                 // one input, two outputs
///   model.fit({x_image, x_meta}, {y_class, y_box}); // two and two
#include <cstddef>
#include <initializer_list>
#include <utility>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt {

class Tensors {
 public:
  Tensors() = default;
  /// One tensor; an undefined one is no tensor (an empty list).
  Tensors(const Tensor& t) {  // NOLINT(google-explicit-constructor)
    if (t.defined()) list_.push_back(t);
  }
  Tensors(std::vector<Tensor> ts) : list_(std::move(ts)) {}  // NOLINT(google-explicit-constructor)
  Tensors(std::initializer_list<Tensor> ts) : list_(ts) {}
  const std::vector<Tensor>& list() const { return list_; }
  std::size_t size() const { return list_.size(); }
  bool empty() const { return list_.empty(); }
  const Tensor& operator[](std::size_t i) const { return list_[i]; }
  auto begin() const { return list_.begin(); }
  auto end() const { return list_.end(); }

 private:
  std::vector<Tensor> list_;
};

}  // namespace mpt

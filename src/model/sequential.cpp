#include "mpt/autograd.hpp"
#include "mpt/layers/core.hpp"
#include "mpt/model.hpp"

namespace mpt {

Sequential::Sequential(std::initializer_list<LayerRef> layers) : Sequential(std::vector<LayerRef>(layers)) {}

Sequential::Sequential(const std::vector<LayerRef>& layers) {
  name_ = "sequential";
  for (const auto& l : layers) add(l);
}

void Sequential::add(LayerRef layer) {
  MPT_CHECK(static_cast<bool>(layer), "Sequential.add: null layer");
  Shape in = layers::input_layer_shape(*layer);
  if (!in.empty()) {
    MPT_CHECK(layers_.empty() && input_shape_.empty(), "Sequential.add: an Input layer must come first");
    input_shape_ = in;
    return;
  }
  for (const auto& l : layers_)
    MPT_CHECK(l.ptr() != layer.ptr(), "Sequential.add: layer '", layer->name(), "' is already in the model");
  MPT_CHECK(detail::nested_model(*layer).get() != this, "Sequential.add: model '", name_, "' cannot be a layer of itself");
  layers_.push_back(layer);
  try {
    assign_layer_names();  // a duplicate user name: the model stays as it was
  } catch (...) {
    layers_.pop_back();
    throw;
  }
  // With a known input shape, build the new layer now (as Keras does) on a one-example batch.
  if (!input_shape_.empty() && !layer->built()) {
    Shape in = layers_.size() > 1 ? layers_[layers_.size() - 2]->output_shape() : Shape{};
    if (layers_.size() == 1) {
      in = input_shape_;
      in.insert(in.begin(), 1);
    }
    if (!in.empty()) {
      NoGradGuard no_grad;
      layer(Tensor::zeros(in));
    }
  }
}

void Sequential::pop() {
  MPT_CHECK(!layers_.empty(), "Sequential.pop: the model has no layers");
  layers_.pop_back();
}

void Sequential::check_input(const Tensor& x) const {
  MPT_CHECK(x.defined(), "Sequential '", name_, "': undefined input");
  if (input_shape_.empty()) return;
  Shape per(x.shape().begin() + (x.dim() > 0 ? 1 : 0), x.shape().end());
  MPT_CHECK(x.dim() > 0 && per == input_shape_, "Sequential '", name_, "': expected inputs of shape ",
            batch_shape_string(input_shape_), ", got ", to_string(x.shape()));
}

Tensor Sequential::call(const Tensor& x, bool training) {
  check_input(x);
  MPT_CHECK(!layers_.empty(), "Sequential '", name_, "': the model has no layers");
  clear_activity_losses();
  Tensor h = x;
  for (const auto& l : layers_) h = l(h, {.training = training});
  return h;
}

void Sequential::build(const Shape& shape) {
  Shape s = shape;
  if (!input_shape_.empty() && s.size() == input_shape_.size()) s.insert(s.begin(), 1);  // no batch given
  MPT_CHECK(!s.empty(), "Sequential.build: empty input shape");
  if (s[0] <= 0) s[0] = 1;  // None
  if (input_shape_.empty()) input_shape_ = Shape(s.begin() + 1, s.end());
  NoGradGuard no_grad;
  call(Tensor::zeros(s), false);
}

}  // namespace mpt

#include "mpt/layers/core.hpp"

namespace mpt::layers {
namespace {

class InputLayer : public Layer {
 public:
  InputLayer(Shape shape, std::string name) : Layer("InputLayer", std::nullopt, std::move(name)), shape_(std::move(shape)) {}
  Tensor call(const Tensor& x, bool) override {
    Shape per_example(x.shape().begin() + (x.dim() > 0 ? 1 : 0), x.shape().end());
    if (x.dim() == 0 || per_example != shape_)
      error("expected inputs of shape ", batch_shape_string(shape_), ", got ", to_string(x.shape()));
    return x;
  }
  nlohmann::json config() const override {
    nlohmann::json s = nlohmann::json::array({nullptr});
    for (auto d : shape_) s.push_back(d);
    return {{"batch_shape", s}};
  }
  const Shape& shape() const { return shape_; }

 private:
  Shape shape_;
};

}  // namespace

LayerRef Input(const Shape& shape, InputOptions options) {
  for (auto d : shape) MPT_CHECK(d > 0, "Input: dimensions must be positive, got ", to_string(shape));
  return std::make_shared<InputLayer>(shape, options.name);
}

Shape input_layer_shape(const Layer& layer) {
  auto* in = dynamic_cast<const InputLayer*>(&layer);
  return in ? in->shape() : Shape{};
}

}  // namespace mpt::layers

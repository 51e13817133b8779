#include "mpt/layers/core.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

class ActivationLayer : public Layer {
 public:
  ActivationLayer(std::string activation, LayerOptions o, const char* class_name = "Activation")
      : Layer(class_name, o.dtype, o.name), activation_(std::move(activation)) {
    ops::check_activation(activation_);
  }
  Tensor call(const Tensor& x, bool) override { return ops::activation(x, activation_); }
  bool ends_in_softmax() const override { return activation_ == "softmax"; }
  nlohmann::json config() const override {
    if (class_name() == "ReLU") return {{"max_value", nullptr}, {"negative_slope", 0.0}, {"threshold", 0.0}};  // Keras's
    return {{"activation", activation_}};
  }

 private:
  std::string activation_;
};

class SoftmaxLayer : public Layer {
 public:
  explicit SoftmaxLayer(SoftmaxOptions o) : Layer("Softmax", o.dtype, o.name), axis_(o.axis) {}
  Tensor call(const Tensor& x, bool) override {
    if (x.dim() < 1 || axis_ < -x.dim() || axis_ >= x.dim()) error("axis ", axis_, " out of range for input ", to_string(x.shape()));
    return ops::softmax(x, axis_);
  }
  bool ends_in_softmax() const override { return true; }
  nlohmann::json config() const override { return {{"axis", axis_}}; }

 private:
  std::int64_t axis_;
};

}  // namespace

LayerRef Activation(const std::string& activation, LayerOptions o) {
  return std::make_shared<ActivationLayer>(activation, std::move(o));
}
LayerRef Softmax(SoftmaxOptions o) { return std::make_shared<SoftmaxLayer>(std::move(o)); }
LayerRef ReLU(LayerOptions o) { return std::make_shared<ActivationLayer>("relu", std::move(o), "ReLU"); }

}  // namespace mpt::layers

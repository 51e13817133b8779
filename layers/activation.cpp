#include <cmath>

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

class LeakyReluLayer : public Layer {
 public:
  explicit LeakyReluLayer(LeakyReLUOptions o) : Layer("LeakyReLU", o.dtype, o.name), slope_(o.negative_slope) {
    if (!(slope_ >= 0) || !std::isfinite(slope_)) error("negative_slope must be a finite number >= 0, got ", slope_);
  }
  Tensor call(const Tensor& x, bool) override { return ops::leaky_relu(x, slope_); }
  nlohmann::json config() const override { return {{"negative_slope", slope_}}; }

 private:
  double slope_;
};

const bool registered = [] {
  register_layer("LeakyReLU", [](const LayerConfig& c) {
    // Keras 3 writes negative_slope; Keras 2 wrote alpha.
    const double slope = c.has("negative_slope") ? c.get_double("negative_slope")
                         : c.has("alpha")        ? c.get_double("alpha")
                                                 : 0.3;
    return LeakyReLU({.negative_slope = slope, .dtype = c.dtype, .name = c.name});
  });
  return true;
}();

}  // namespace

LayerRef Activation(const std::string& activation, LayerOptions o) {
  return std::make_shared<ActivationLayer>(activation, std::move(o));
}
LayerRef Softmax(SoftmaxOptions o) { return std::make_shared<SoftmaxLayer>(std::move(o)); }
LayerRef ReLU(LayerOptions o) { return std::make_shared<ActivationLayer>("relu", std::move(o), "ReLU"); }
LayerRef LeakyReLU(LeakyReLUOptions o) { return std::make_shared<LeakyReluLayer>(std::move(o)); }

}  // namespace mpt::layers

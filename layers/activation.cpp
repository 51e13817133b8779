#include <cmath>

#include "mpt/layers/core.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

class ActivationLayer : public Layer {
 public:
  ActivationLayer(std::string activation, LayerOptions o)
      : Layer("Activation", o.dtype, o.name), activation_(std::move(activation)) {
    ops::check_activation(activation_);
  }
  Tensor call(const Tensor& x, bool) override { return ops::activation(x, activation_); }
  bool ends_in_softmax() const override { return activation_ == "softmax"; }
  nlohmann::json config() const override { return {{"activation", activation_}}; }

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

class ReluLayer : public Layer {
 public:
  explicit ReluLayer(ReLUOptions o) : Layer("ReLU", o.dtype, o.name), o_(o) {
    if (o_.max_value && !(*o_.max_value >= 0 && std::isfinite(*o_.max_value)))
      error("max_value must be a finite number >= 0 (or none), got ", *o_.max_value);
    if (!(o_.negative_slope >= 0) || !std::isfinite(o_.negative_slope))
      error("negative_slope must be a finite number >= 0, got ", o_.negative_slope);
    if (!(o_.threshold >= 0) || !std::isfinite(o_.threshold))
      error("threshold must be a finite number >= 0, got ", o_.threshold);
  }
  // keras.activations.relu's formula, op for op.
  Tensor call(const Tensor& x, bool) override {
    const bool slope = o_.negative_slope != 0.0;
    if (slope && !o_.max_value && o_.threshold == 0.0) return ops::leaky_relu(x, o_.negative_slope);
    auto scalar = [&](double v) { return Tensor::scalar(v, x.dtype(), x.device()); };
    Tensor negative_part;
    if (slope) negative_part = ops::relu(o_.threshold != 0.0 ? ops::sub(scalar(o_.threshold), x) : ops::neg(x));
    Tensor y;
    bool clip = o_.max_value.has_value();
    if (o_.threshold != 0.0) {
      y = ops::mul(x, ops::cast(ops::greater(x, scalar(o_.threshold)), x.dtype()));
    } else if (o_.max_value && *o_.max_value == 6.0) {
      y = ops::relu6(x);
      clip = false;
    } else {
      y = ops::relu(x);
    }
    if (clip) y = ops::minimum(ops::maximum(y, scalar(0.0)), scalar(*o_.max_value));
    if (slope) y = ops::sub(y, ops::mul(scalar(o_.negative_slope), negative_part));
    return y;
  }
  nlohmann::json config() const override {
    return {{"max_value", o_.max_value ? nlohmann::json(*o_.max_value) : nlohmann::json(nullptr)},
            {"negative_slope", o_.negative_slope},
            {"threshold", o_.threshold}};
  }

 private:
  ReLUOptions o_;
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

class EluLayer : public Layer {
 public:
  explicit EluLayer(ELUOptions o) : Layer("ELU", o.dtype, o.name), alpha_(o.alpha) {
    if (!std::isfinite(alpha_)) error("alpha must be a finite number, got ", alpha_);
  }
  // keras.ops.elu: exp of the negative part only (the positive branch never overflows).
  Tensor call(const Tensor& x, bool) override {
    auto scalar = [&](double v) { return Tensor::scalar(v, x.dtype(), x.device()); };
    const Tensor negative = ops::mul(scalar(alpha_), ops::sub(ops::exp(ops::minimum(x, scalar(0.0))), scalar(1.0)));
    return ops::where(ops::greater(x, scalar(0.0)), x, negative);
  }
  nlohmann::json config() const override { return {{"alpha", alpha_}}; }

 private:
  double alpha_;
};

const bool registered = [] {
  register_layer("ReLU", [](const LayerConfig& c) {
    return ReLU({.max_value = c.has("max_value") ? std::optional<double>(c.get_double("max_value")) : std::nullopt,
                 .negative_slope = c.has("negative_slope") ? c.get_double("negative_slope") : 0.0,
                 .threshold = c.has("threshold") ? c.get_double("threshold") : 0.0,
                 .dtype = c.dtype,
                 .name = c.name});
  });
  register_layer("LeakyReLU", [](const LayerConfig& c) {
    // Keras 3 writes negative_slope; Keras 2 wrote alpha.
    const double slope = c.has("negative_slope") ? c.get_double("negative_slope")
                         : c.has("alpha")        ? c.get_double("alpha")
                                                 : 0.3;
    return LeakyReLU({.negative_slope = slope, .dtype = c.dtype, .name = c.name});
  });
  register_layer("ELU", [](const LayerConfig& c) {
    return ELU({.alpha = c.has("alpha") ? c.get_double("alpha") : 1.0, .dtype = c.dtype, .name = c.name});
  });
  return true;
}();

}  // namespace

LayerRef Activation(const std::string& activation, LayerOptions o) {
  return std::make_shared<ActivationLayer>(activation, std::move(o));
}
LayerRef Softmax(SoftmaxOptions o) { return std::make_shared<SoftmaxLayer>(std::move(o)); }
LayerRef ReLU(ReLUOptions o) { return std::make_shared<ReluLayer>(std::move(o)); }
LayerRef LeakyReLU(LeakyReLUOptions o) { return std::make_shared<LeakyReluLayer>(std::move(o)); }
LayerRef ELU(ELUOptions o) { return std::make_shared<EluLayer>(std::move(o)); }

}  // namespace mpt::layers

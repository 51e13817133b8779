// RMSNormalization (Keras 3's keras.layers.RMSNormalization): x / sqrt(mean(x², last axis) + ε)
// times a learned "scale", built from mpt::ops with float32 statistics under every policy.
#include "config_values.hpp"
#include "mpt/layers/normalization.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

class RMSNormalizationLayer : public Layer {
 public:
  explicit RMSNormalizationLayer(RMSNormalizationOptions o)
      : Layer("RMSNormalization", o.dtype, o.name), o_(std::move(o)) {
    if (!(o_.epsilon > 0.0)) error("epsilon must be positive, got ", o_.epsilon);
  }

  void build(const Shape& s) override {
    if (s.empty()) error("expected an input of rank >= 1, got a scalar");
    const auto rank = static_cast<std::int64_t>(s.size());
    if (o_.axis != -1 && o_.axis != rank - 1)
      error("axis ", o_.axis, " is not supported: mpt normalizes the last axis, axis -1, of input shape ", to_string(s));
    scale_ = add_weight("scale", {s.back()}, "ones");
  }

  Tensor call(const Tensor& x, bool) override {
    check_input(x, 1, scale_.shape()[0]);
    const DType pd = x.dtype() == float64 ? float64 : float32;  // the statistics' dtype
    const Tensor xs = x.dtype() == pd ? x : ops::cast(x, pd);
    const Tensor mean_square = ops::mean(ops::square(xs), {-1}, /*keepdims=*/true);
    const Tensor inv_rms = ops::pow(ops::add(mean_square, Tensor::scalar(o_.epsilon, pd, x.device())), -0.5);
    const Tensor y = ops::mul(ops::mul(xs, inv_rms), scale_.read(pd));
    return y.dtype() == x.dtype() ? y : ops::cast(y, x.dtype());
  }

  nlohmann::json config() const override { return {{"axis", o_.axis}, {"epsilon", o_.epsilon}}; }

 private:
  RMSNormalizationOptions o_;
  Variable scale_;
};

const bool registered = [] {
  register_layer("RMSNormalization", [](const LayerConfig& c) {
    RMSNormalizationOptions o{.dtype = c.dtype, .name = c.name};
    if (c.has("axis")) o.axis = detail::one_axis(c, "axis");
    if (c.has("epsilon")) o.epsilon = c.get_double("epsilon");
    return RMSNormalization(std::move(o));
  });
  return true;
}();

}  // namespace

LayerRef RMSNormalization(RMSNormalizationOptions options) {
  return std::make_shared<RMSNormalizationLayer>(std::move(options));
}

}  // namespace mpt::layers

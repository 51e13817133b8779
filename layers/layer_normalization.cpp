#include "config_values.hpp"
#include "mpt/layers/normalization.hpp"
#include "mpt/nn_ops.hpp"

namespace mpt::layers {
namespace {


class LayerNormalizationLayer : public Layer {
 public:
  explicit LayerNormalizationLayer(LayerNormalizationOptions o) : Layer("LayerNormalization", o.dtype, o.name), o_(std::move(o)) {
    if (!(o_.epsilon > 0.0)) error("epsilon must be positive, got ", o_.epsilon);
    set_rules("beta", o_.beta_regularizer, o_.beta_constraint);
    set_rules("gamma", o_.gamma_regularizer, o_.gamma_constraint);
  }

  void build(const Shape& s) override {
    if (s.empty()) error("expected an input of rank >= 1, got a scalar");
    const auto rank = static_cast<std::int64_t>(s.size());
    if (o_.axis != -1 && o_.axis != rank - 1)
      error("axis ", o_.axis, " is not supported: mpt normalizes the last axis, axis -1, of input shape ", to_string(s));
    if (o_.scale) gamma_ = add_weight("gamma", {s.back()}, o_.gamma_initializer);
    if (o_.center) beta_ = add_weight("beta", {s.back()}, o_.beta_initializer);
  }

  Tensor call(const Tensor& x, bool) override {
    if (x.dim() < 1) error("expected an input of rank >= 1, got a scalar");
    const std::int64_t d = o_.scale ? gamma_.shape()[0] : o_.center ? beta_.shape()[0] : x.shape().back();
    check_input(x, 1, d);
    const DType pd = x.dtype() == float64 ? float64 : float32;  // float32 statistics under every policy
    return ops::layer_norm(x, o_.scale ? gamma_.read(pd) : Tensor(), o_.center ? beta_.read(pd) : Tensor(), o_.epsilon);
  }

  nlohmann::json config() const override {
    nlohmann::json c = {{"axis", o_.axis},
            {"epsilon", o_.epsilon},
            {"center", o_.center},
            {"scale", o_.scale},
            {"beta_initializer", o_.beta_initializer},
            {"gamma_initializer", o_.gamma_initializer}};
    c.update(rules_config());
    return c;
  }

 private:
  LayerNormalizationOptions o_;
  Variable gamma_, beta_;
};

const bool registered = [] {
  register_layer("LayerNormalization", [](const LayerConfig& c) {
    LayerNormalizationOptions o{.dtype = c.dtype, .name = c.name};
    if (c.has("axis")) o.axis = detail::one_axis(c, "axis");
    c.expect("rms_scaling", false);
    if (c.has("epsilon")) o.epsilon = c.get_double("epsilon");
    if (c.has("center")) o.center = c.get_bool("center");
    if (c.has("scale")) o.scale = c.get_bool("scale");
    o.beta_initializer = c.get_initializer("beta_initializer", o.beta_initializer);
    o.gamma_initializer = c.get_initializer("gamma_initializer", o.gamma_initializer);
    return LayerNormalization(std::move(o));
  });
  return true;
}();

}  // namespace

LayerRef LayerNormalization(LayerNormalizationOptions o) { return std::make_shared<LayerNormalizationLayer>(std::move(o)); }

}  // namespace mpt::layers

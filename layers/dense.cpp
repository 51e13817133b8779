#include "config_values.hpp"
#include "mpt/layers/core.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

class DenseLayer : public Layer {
 public:
  DenseLayer(std::int64_t units, DenseOptions o) : Layer("Dense", o.dtype, o.name), units_(units), o_(std::move(o)) {
    if (units <= 0) error("units must be positive, got ", units);
    ops::check_activation(o_.activation);
    set_activity_regularizer(o_.activity_regularizer);
    set_rules("kernel", o_.kernel_regularizer, o_.kernel_constraint);
    set_rules("bias", o_.bias_regularizer, o_.bias_constraint);
  }
  void build(const Shape& s) override {
    if (s.size() < 2) error("expected an input of rank >= 2 (batch, features), got shape ", to_string(s));
    kernel_ = add_weight("kernel", {s.back(), units_}, o_.kernel_initializer);
    if (o_.use_bias) bias_ = add_weight("bias", {units_}, o_.bias_initializer);
  }
  Tensor call(const Tensor& x, bool) override {
    check_input(x, 2, kernel_.shape()[0]);
    const bool softmax = o_.activation == "softmax";
    Tensor y = ops::dense(x, read(kernel_), o_.use_bias ? read(bias_) : Tensor(), softmax ? "linear" : o_.activation);
    return softmax ? ops::softmax(y) : y;
  }
  bool ends_in_softmax() const override { return o_.activation == "softmax"; }
  nlohmann::json config() const override {
    nlohmann::json c = {{"units", units_},
                        {"activation", o_.activation},
                        {"use_bias", o_.use_bias},
                        {"kernel_initializer", o_.kernel_initializer},
                        {"bias_initializer", o_.bias_initializer}};
    c.update(rules_config());
    return c;
  }

 private:
  std::int64_t units_;
  DenseOptions o_;
  Variable kernel_, bias_;
};

}  // namespace

LayerRef Dense(std::int64_t units, DenseOptions options) { return std::make_shared<DenseLayer>(units, std::move(options)); }

}  // namespace mpt::layers

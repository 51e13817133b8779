#include "config_values.hpp"
#include "mpt/layers/conv.hpp"
#include "mpt/nn_ops.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

using detail::json;
using detail::text;

class Conv2DLayer : public Layer {
 public:
  Conv2DLayer(std::int64_t filters, IntPair kernel_size, Conv2DOptions o)
      : Layer("Conv2D", o.dtype, o.name), filters_(filters), kernel_size_(kernel_size), o_(std::move(o)) {
    if (filters <= 0) error("filters must be positive, got ", filters);
    if (kernel_size.h <= 0 || kernel_size.w <= 0) error("kernel_size must be positive, got ", text(kernel_size));
    if (o_.strides.h <= 0 || o_.strides.w <= 0) error("strides must be positive, got ", text(o_.strides));
    if (o_.dilation_rate.h <= 0 || o_.dilation_rate.w <= 0)
      error("dilation_rate must be positive, got ", text(o_.dilation_rate));
    if (o_.padding != "valid" && o_.padding != "same") error("padding must be \"valid\" or \"same\", got \"", o_.padding, "\"");
    ops::check_activation(o_.activation);
    set_activity_regularizer(o_.activity_regularizer);
    set_rules("kernel", o_.kernel_regularizer, o_.kernel_constraint);
    set_rules("bias", o_.bias_regularizer, o_.bias_constraint);
  }

  void build(const Shape& s) override {
    check_shape(s);
    kernel_ = add_weight("kernel", {kernel_size_.h, kernel_size_.w, s[3], filters_}, o_.kernel_initializer);
    if (o_.use_bias) bias_ = add_weight("bias", {filters_}, o_.bias_initializer);
  }

  Tensor call(const Tensor& x, bool) override {
    check_shape(x.shape());
    if (x.shape()[3] != kernel_.shape()[2])
      error("expected ", kernel_.shape()[2], " input channels (the last axis), got input shape ", to_string(x.shape()));
    const bool softmax = o_.activation == "softmax";
    Tensor y = ops::conv2d(x, read(kernel_), o_.use_bias ? read(bias_) : Tensor(),
                           {.strides = o_.strides,
                            .padding = o_.padding,
                            .dilation = o_.dilation_rate,
                            .activation = softmax ? "linear" : o_.activation});
    return softmax ? ops::softmax(y) : y;
  }

  bool ends_in_softmax() const override { return o_.activation == "softmax"; }

  nlohmann::json config() const override {
    nlohmann::json c = {{"filters", filters_},
            {"kernel_size", json(kernel_size_)},
            {"strides", json(o_.strides)},
            {"padding", o_.padding},
            {"data_format", "channels_last"},
            {"dilation_rate", json(o_.dilation_rate)},
            {"groups", 1},
            {"activation", o_.activation},
            {"use_bias", o_.use_bias},
            {"kernel_initializer", o_.kernel_initializer},
            {"bias_initializer", o_.bias_initializer}};
    c.update(rules_config());
    return c;
  }

 private:
  /// Rank 4 and, with 'valid' padding, an image at least as large as the (dilated) kernel.
  void check_shape(const Shape& s) const {
    if (s.size() != 4)
      error("expected an input of rank 4 (batch, height, width, channels), got shape ", to_string(s));
    const std::int64_t eh = (kernel_size_.h - 1) * o_.dilation_rate.h + 1, ew = (kernel_size_.w - 1) * o_.dilation_rate.w + 1;
    if (o_.padding == "valid" && (eh > s[1] || ew > s[2]))
      error("kernel_size ", text(kernel_size_), (eh != kernel_size_.h || ew != kernel_size_.w ? " (dilated to [" +
                std::to_string(eh) + ", " + std::to_string(ew) + "])" : std::string()),
            " is larger than the input image ", s[1], "x", s[2], " with padding 'valid' (input shape ", to_string(s), ")");
  }

  std::int64_t filters_;
  IntPair kernel_size_;
  Conv2DOptions o_;
  Variable kernel_, bias_;
};

const bool registered = [] {
  register_layer("Conv2D", [](const LayerConfig& c) {
    c.expect("data_format", "channels_last");
    c.expect("groups", 1);
    return Conv2D(c.get_int("filters"), detail::pair_of(c, "kernel_size"),
                  {.strides = c.has("strides") ? detail::pair_of(c, "strides") : IntPair(1),
                   .padding = c.get("padding", "valid"),
                   .dilation_rate = c.has("dilation_rate") ? detail::pair_of(c, "dilation_rate") : IntPair(1),
                   .activation = c.get("activation", "linear"),
                   .use_bias = c.has("use_bias") ? c.get_bool("use_bias") : true,
                   .kernel_initializer = c.get("kernel_initializer", "glorot_uniform"),
                   .bias_initializer = c.get("bias_initializer", "zeros"),
                   .dtype = c.dtype,
                   .name = c.name});
  });
  return true;
}();

}  // namespace

LayerRef Conv2D(std::int64_t filters, IntPair kernel_size, Conv2DOptions o) {
  return std::make_shared<Conv2DLayer>(filters, kernel_size, std::move(o));
}

}  // namespace mpt::layers

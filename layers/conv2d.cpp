#include "config_values.hpp"
#include "mpt/layers/conv.hpp"
#include "mpt/nn_ops.hpp"
#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

using detail::json;
using detail::text;

/// What Conv2D and DepthwiseConv2D share: the geometry's checks, the input's shape checks and
/// the convolution with its activation (softmax after it, unfused).
class ConvBase : public Layer {
 public:
  ConvBase(const char* class_name, const PolicyArg& dtype, const std::string& name, IntPair kernel_size,
           IntPair strides, std::string padding, IntPair dilation_rate, std::string activation)
      : Layer(class_name, dtype, name),
        kernel_size_(kernel_size),
        strides_(strides),
        dilation_rate_(dilation_rate),
        padding_(std::move(padding)),
        activation_(std::move(activation)) {
    if (kernel_size.h <= 0 || kernel_size.w <= 0) error("kernel_size must be positive, got ", text(kernel_size));
    if (strides_.h <= 0 || strides_.w <= 0) error("strides must be positive, got ", text(strides_));
    if (dilation_rate_.h <= 0 || dilation_rate_.w <= 0)
      error("dilation_rate must be positive, got ", text(dilation_rate_));
    if (padding_ != "valid" && padding_ != "same") error("padding must be \"valid\" or \"same\", got \"", padding_, "\"");
    ops::check_activation(activation_);
  }

  bool ends_in_softmax() const override { return activation_ == "softmax"; }

 protected:
  /// Rank 4 and, with 'valid' padding, an image at least as large as the (dilated) kernel.
  void check_shape(const Shape& s) const {
    if (s.size() != 4)
      error("expected an input of rank 4 (batch, height, width, channels), got shape ", to_string(s));
    const std::int64_t eh = (kernel_size_.h - 1) * dilation_rate_.h + 1, ew = (kernel_size_.w - 1) * dilation_rate_.w + 1;
    if (padding_ == "valid" && (eh > s[1] || ew > s[2]))
      error("kernel_size ", text(kernel_size_), (eh != kernel_size_.h || ew != kernel_size_.w ? " (dilated to [" +
                std::to_string(eh) + ", " + std::to_string(ew) + "])" : std::string()),
            " is larger than the input image ", s[1], "x", s[2], " with padding 'valid' (input shape ", to_string(s), ")");
  }

  /// The input's channels must be those the layer was built for.
  void check_channels(const Tensor& x, std::int64_t channels) const {
    if (x.shape()[3] != channels)
      error("expected ", channels, " input channels (the last axis), got input shape ", to_string(x.shape()));
  }

  /// act(conv(x, kernel [kh, kw, Cin / groups, Cout]) + bias).
  Tensor convolve(const Tensor& x, const Tensor& kernel, const Tensor& bias, std::int64_t groups) const {
    const bool softmax = activation_ == "softmax";
    Tensor y = ops::conv2d(x, kernel, bias,
                           {.strides = strides_,
                            .padding = padding_,
                            .dilation = dilation_rate_,
                            .activation = softmax ? "linear" : activation_,
                            .groups = groups});
    return softmax ? ops::softmax(y) : y;
  }

  /// Keras's geometry entries, in its order.
  nlohmann::json geometry_config() const {
    return {{"kernel_size", json(kernel_size_)},
            {"strides", json(strides_)},
            {"padding", padding_},
            {"data_format", "channels_last"},
            {"dilation_rate", json(dilation_rate_)}};
  }

  IntPair kernel_size_, strides_, dilation_rate_;
  std::string padding_, activation_;
};

class Conv2DLayer : public ConvBase {
 public:
  Conv2DLayer(std::int64_t filters, IntPair kernel_size, Conv2DOptions o)
      : ConvBase("Conv2D", o.dtype, o.name, kernel_size, o.strides, o.padding, o.dilation_rate, o.activation),
        filters_(filters),
        o_(std::move(o)) {
    if (filters <= 0) error("filters must be positive, got ", filters);
    if (o_.groups <= 0) error("groups must be a positive integer, got ", o_.groups);
    if (filters % o_.groups != 0)
      error("filters = ", filters, " must be divisible by groups = ", o_.groups, " (each group has filters / groups outputs)");
    set_activity_regularizer(o_.activity_regularizer);
    set_rules("kernel", o_.kernel_regularizer, o_.kernel_constraint);
    set_rules("bias", o_.bias_regularizer, o_.bias_constraint);
  }

  void build(const Shape& s) override {
    check_shape(s);
    if (s[3] % o_.groups != 0)
      error("the input's ", s[3], " channels must be divisible by groups = ", o_.groups, " (input shape ",
            to_string(s), ")");
    kernel_ = add_weight("kernel", {kernel_size_.h, kernel_size_.w, s[3] / o_.groups, filters_}, o_.kernel_initializer);
    if (o_.use_bias) bias_ = add_weight("bias", {filters_}, o_.bias_initializer);
  }

  Tensor call(const Tensor& x, bool) override {
    check_shape(x.shape());
    check_channels(x, kernel_.shape()[2] * o_.groups);
    return convolve(x, read(kernel_), o_.use_bias ? read(bias_) : Tensor(), o_.groups);
  }

  nlohmann::json config() const override {
    nlohmann::json c = {{"filters", filters_}};
    c.update(geometry_config());
    c.update(nlohmann::json{{"groups", o_.groups},
                            {"activation", o_.activation},
                            {"use_bias", o_.use_bias},
                            {"kernel_initializer", o_.kernel_initializer},
                            {"bias_initializer", o_.bias_initializer}});
    c.update(rules_config());
    return c;
  }

 private:
  std::int64_t filters_;
  Conv2DOptions o_;
  Variable kernel_, bias_;
};

class DepthwiseConv2DLayer : public ConvBase {
 public:
  DepthwiseConv2DLayer(IntPair kernel_size, DepthwiseConv2DOptions o)
      : ConvBase("DepthwiseConv2D", o.dtype, o.name, kernel_size, o.strides, o.padding, o.dilation_rate, o.activation),
        o_(std::move(o)) {
    if (o_.depth_multiplier <= 0) error("depth_multiplier must be positive, got ", o_.depth_multiplier);
    set_activity_regularizer(o_.activity_regularizer);
    // Keras names the kernel "kernel" and its rules depthwise_regularizer / depthwise_constraint.
    set_rules("kernel", o_.depthwise_regularizer, o_.depthwise_constraint, "depthwise");
    set_rules("bias", o_.bias_regularizer, o_.bias_constraint);
  }

  void build(const Shape& s) override {
    check_shape(s);
    // Keras's shape (its initializer's fans follow it): [kh, kw, C, depth_multiplier].
    kernel_ = add_weight("kernel", {kernel_size_.h, kernel_size_.w, s[3], o_.depth_multiplier}, o_.depthwise_initializer);
    if (o_.use_bias) bias_ = add_weight("bias", {s[3] * o_.depth_multiplier}, o_.bias_initializer);
  }

  Tensor call(const Tensor& x, bool) override {
    check_shape(x.shape());
    const std::int64_t c = kernel_.shape()[2], m = o_.depth_multiplier;
    check_channels(x, c);
    // [kh, kw, C, M] holds the grouped kernel [kh, kw, 1, C * M] (output c * M + m from input c)
    // in the same order: a reshape, no copy of values.
    Tensor k = ops::reshape(read(kernel_), {kernel_size_.h, kernel_size_.w, 1, c * m});
    return convolve(x, k, o_.use_bias ? read(bias_) : Tensor(), c);
  }

  nlohmann::json config() const override {
    nlohmann::json c = {{"depth_multiplier", o_.depth_multiplier}};
    c.update(geometry_config());
    c.update(nlohmann::json{{"activation", o_.activation},
                            {"use_bias", o_.use_bias},
                            {"depthwise_initializer", o_.depthwise_initializer},
                            {"bias_initializer", o_.bias_initializer}});
    c.update(rules_config());
    return c;
  }

 private:
  DepthwiseConv2DOptions o_;
  Variable kernel_, bias_;
};

const bool registered = [] {
  register_layer("Conv2D", [](const LayerConfig& c) {
    c.expect("data_format", "channels_last");
    return Conv2D(c.get_int("filters"), detail::pair_of(c, "kernel_size"),
                  {.strides = c.has("strides") ? detail::pair_of(c, "strides") : IntPair(1),
                   .padding = c.get("padding", "valid"),
                   .dilation_rate = c.has("dilation_rate") ? detail::pair_of(c, "dilation_rate") : IntPair(1),
                   .groups = c.has("groups") ? c.get_int("groups") : 1,
                   .activation = c.get("activation", "linear"),
                   .use_bias = c.has("use_bias") ? c.get_bool("use_bias") : true,
                   .kernel_initializer = c.get_initializer("kernel_initializer", "glorot_uniform"),
                   .bias_initializer = c.get_initializer("bias_initializer", "zeros"),
                   .dtype = c.dtype,
                   .name = c.name});
  });
  register_layer("DepthwiseConv2D", [](const LayerConfig& c) {
    c.expect("data_format", "channels_last");
    return DepthwiseConv2D(
        detail::pair_of(c, "kernel_size"),
        {.strides = c.has("strides") ? detail::pair_of(c, "strides") : IntPair(1),
         .padding = c.get("padding", "valid"),
         .depth_multiplier = c.has("depth_multiplier") ? c.get_int("depth_multiplier") : 1,
         .dilation_rate = c.has("dilation_rate") ? detail::pair_of(c, "dilation_rate") : IntPair(1),
         .activation = c.get("activation", "linear"),
         .use_bias = c.has("use_bias") ? c.get_bool("use_bias") : true,
         .depthwise_initializer = c.get_initializer("depthwise_initializer", "glorot_uniform"),
         .bias_initializer = c.get_initializer("bias_initializer", "zeros"),
         .dtype = c.dtype,
         .name = c.name});
  });
  return true;
}();

}  // namespace

LayerRef Conv2D(std::int64_t filters, IntPair kernel_size, Conv2DOptions o) {
  return std::make_shared<Conv2DLayer>(filters, kernel_size, std::move(o));
}

LayerRef DepthwiseConv2D(IntPair kernel_size, DepthwiseConv2DOptions o) {
  return std::make_shared<DepthwiseConv2DLayer>(kernel_size, std::move(o));
}

}  // namespace mpt::layers

#include "config_values.hpp"
#include "mpt/layers/pooling.hpp"
#include "mpt/nn_ops.hpp"

namespace mpt::layers {
namespace {

using detail::json;
using detail::text;

class Pooling2DLayer : public Layer {
 public:
  Pooling2DLayer(const char* class_name, bool max, IntPair pool_size, Pooling2DOptions o)
      : Layer(class_name, o.dtype, o.name), max_(max), pool_(pool_size), strides_(o.strides.value_or(pool_size)),
        padding_(o.padding) {
    if (pool_.h <= 0 || pool_.w <= 0) error("pool_size must be positive, got ", text(pool_));
    if (strides_.h <= 0 || strides_.w <= 0) error("strides must be positive, got ", text(strides_));
    if (padding_ != "valid" && padding_ != "same") error("padding must be \"valid\" or \"same\", got \"", padding_, "\"");
  }

  Tensor call(const Tensor& x, bool) override {
    const Shape& s = x.shape();
    if (s.size() != 4) error("expected an input of rank 4 (batch, height, width, channels), got shape ", to_string(s));
    if (padding_ == "valid" && (pool_.h > s[1] || pool_.w > s[2]))
      error("pool_size ", text(pool_), " is larger than the input image ", s[1], "x", s[2],
            " with padding 'valid' (input shape ", to_string(s), ")");
    ops::Pool2dOptions o{.strides = strides_, .padding = padding_};
    return max_ ? ops::max_pool2d(x, pool_, o) : ops::avg_pool2d(x, pool_, o);
  }

  nlohmann::json config() const override {
    return {{"pool_size", json(pool_)}, {"padding", padding_}, {"strides", json(strides_)}, {"data_format", "channels_last"}};
  }

 private:
  bool max_;
  IntPair pool_, strides_;
  std::string padding_;
};

class GlobalAveragePooling2DLayer : public Layer {
 public:
  explicit GlobalAveragePooling2DLayer(GlobalPooling2DOptions o)
      : Layer("GlobalAveragePooling2D", o.dtype, o.name), keepdims_(o.keepdims) {}
  Tensor call(const Tensor& x, bool) override {
    if (x.dim() != 4) error("expected an input of rank 4 (batch, height, width, channels), got shape ", to_string(x.shape()));
    if (x.shape()[1] == 0 || x.shape()[2] == 0) error("empty image in input of shape ", to_string(x.shape()));
    return ops::global_avg_pool2d(x, keepdims_);
  }
  nlohmann::json config() const override {
    return {{"data_format", "channels_last"}, {"keepdims", keepdims_}};
  }

 private:
  bool keepdims_;
};

Pooling2DOptions pooling_options(const LayerConfig& c) {
  c.expect("data_format", "channels_last");
  return {.strides = c.has("strides") ? std::optional<IntPair>(detail::pair_of(c, "strides"))
                                                                    : std::nullopt,
          .padding = c.get("padding", "valid"),
          .dtype = c.dtype,
          .name = c.name};
}

const bool registered = [] {
  register_layer("MaxPooling2D", [](const LayerConfig& c) {
    return MaxPooling2D(c.has("pool_size") ? detail::pair_of(c, "pool_size") : IntPair(2), pooling_options(c));
  });
  register_layer("AveragePooling2D", [](const LayerConfig& c) {
    return AveragePooling2D(c.has("pool_size") ? detail::pair_of(c, "pool_size") : IntPair(2), pooling_options(c));
  });
  register_layer("GlobalAveragePooling2D", [](const LayerConfig& c) {
    c.expect("data_format", "channels_last");
    return GlobalAveragePooling2D(
        {.keepdims = c.has("keepdims") ? c.get_bool("keepdims") : false, .dtype = c.dtype, .name = c.name});
  });
  return true;
}();

}  // namespace

LayerRef MaxPooling2D(IntPair pool_size, Pooling2DOptions o) {
  return std::make_shared<Pooling2DLayer>("MaxPooling2D", true, pool_size, std::move(o));
}
LayerRef AveragePooling2D(IntPair pool_size, Pooling2DOptions o) {
  return std::make_shared<Pooling2DLayer>("AveragePooling2D", false, pool_size, std::move(o));
}
LayerRef GlobalAveragePooling2D(GlobalPooling2DOptions o) {
  return std::make_shared<GlobalAveragePooling2DLayer>(std::move(o));
}

}  // namespace mpt::layers

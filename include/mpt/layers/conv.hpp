#pragma once
/// Convolution and zero padding layers, as Keras's (channels-last images [batch, h, w, c]);
/// pooling in pooling.hpp, normalization in normalization.hpp:
///
///   namespace layers = mpt::layers;
///   mpt::Sequential model({layers::Input({28, 28, 1}),
///                          layers::Conv2D(32, {3, 3}, {.activation = "relu"}),
///                          layers::MaxPooling2D({2, 2}),
///                          layers::Conv2D(64, 3, {.strides = 2, .padding = "same", .use_bias = false}),
///                          layers::DepthwiseConv2D(3, {.padding = "same"}),   // per channel
///                          layers::Conv2D(64, 1, {.groups = 4}),               // 4 channel groups
///                          layers::BatchNormalization(),
///                          layers::ReLU(),
///                          layers::GlobalAveragePooling2D(),
///                          layers::Dense(10, {.activation = "softmax"})});
///
#include <array>
#include <optional>
#include <string>

#include "mpt/layers/core.hpp"
#include "mpt/nn_ops.hpp"

namespace mpt::layers {

using mpt::IntPair;  // mpt/nn_ops.hpp: one (height, width) type for layers and ops

struct Conv2DOptions {
  IntPair strides = 1;
  std::string padding = "valid";  ///< "valid" or "same"
  IntPair dilation_rate = 1;
  /// Channel groups: output block g (filters / groups channels) sees input block g only;
  /// filters and the input channels divisible by it (Keras's groups).
  std::int64_t groups = 1;
  std::string activation = "linear";
  bool use_bias = true;
  initializers::Initializer kernel_initializer = "glorot_uniform";
  initializers::Initializer bias_initializer = "zeros";
  std::optional<regularizers::Regularizer> kernel_regularizer = std::nullopt;
  std::optional<regularizers::Regularizer> bias_regularizer = std::nullopt;
  std::optional<regularizers::Regularizer> activity_regularizer = std::nullopt;
  std::optional<constraints::Constraint> kernel_constraint = std::nullopt;
  std::optional<constraints::Constraint> bias_constraint = std::nullopt;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// 2-D convolution with `filters` output channels; kernel [kh, kw, in_channels / groups, filters].
LayerRef Conv2D(std::int64_t filters, IntPair kernel_size, Conv2DOptions options = {});

struct DepthwiseConv2DOptions {
  IntPair strides = 1;
  std::string padding = "valid";  ///< "valid" or "same"
  std::int64_t depth_multiplier = 1;
  IntPair dilation_rate = 1;
  std::string activation = "linear";
  bool use_bias = true;
  initializers::Initializer depthwise_initializer = "glorot_uniform";
  initializers::Initializer bias_initializer = "zeros";
  std::optional<regularizers::Regularizer> depthwise_regularizer = std::nullopt;
  std::optional<regularizers::Regularizer> bias_regularizer = std::nullopt;
  std::optional<regularizers::Regularizer> activity_regularizer = std::nullopt;
  std::optional<constraints::Constraint> depthwise_constraint = std::nullopt;
  std::optional<constraints::Constraint> bias_constraint = std::nullopt;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Keras's DepthwiseConv2D: each input channel convolved on its own with depth_multiplier
/// filters, output channel c * depth_multiplier + m from input channel c; kernel (Keras's
/// "kernel" variable, config "depthwise_*") [kh, kw, in_channels, depth_multiplier], bias
/// [in_channels * depth_multiplier]. A grouped convolution with groups = in_channels.
LayerRef DepthwiseConv2D(IntPair kernel_size, DepthwiseConv2DOptions options = {});

/// Zero padding of ZeroPadding2D: one number for all sides, {h, w} (symmetric), or
/// {{top, bottom}, {left, right}}.
struct Padding2D {
  std::int64_t top = 1, bottom = 1, left = 1, right = 1;
  Padding2D(std::int64_t all = 1) : top(all), bottom(all), left(all), right(all) {}  // NOLINT
  Padding2D(std::int64_t h, std::int64_t w) : top(h), bottom(h), left(w), right(w) {}
  Padding2D(std::pair<std::int64_t, std::int64_t> h, std::pair<std::int64_t, std::int64_t> w)
      : top(h.first), bottom(h.second), left(w.first), right(w.second) {}
};
LayerRef ZeroPadding2D(Padding2D padding = {}, LayerOptions options = {});

}  // namespace mpt::layers

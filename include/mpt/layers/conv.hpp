#pragma once
/// Convolutional and normalization layers, as Keras's (channels-last images [batch, h, w, c]):
///
///   namespace layers = mpt::layers;
///   mpt::Sequential model({layers::Input({28, 28, 1}),
///                          layers::Conv2D(32, {3, 3}, {.activation = "relu"}),
///                          layers::MaxPooling2D({2, 2}),
///                          layers::Conv2D(64, 3, {.strides = 2, .padding = "same", .use_bias = false}),
///                          layers::BatchNormalization(),
///                          layers::ReLU(),
///                          layers::GlobalAveragePooling2D(),
///                          layers::Dense(10, {.activation = "softmax"})});
///
/// BatchNormalization's moving statistics follow the applied optimizer steps only: a training
/// call computes them, Model::train_step commits them after the optimizer step and drops them
/// when a loss-scale overflow skipped it (custom loops call model.finish_step(applied)).
#include <array>
#include <optional>
#include <string>

#include "mpt/layers/core.hpp"

namespace mpt::layers {

/// A (height, width) pair, given as {h, w} or as one number for both (Keras's int-or-tuple).
struct IntPair {
  std::int64_t h = 1, w = 1;
  IntPair(std::int64_t both) : h(both), w(both) {}  // NOLINT: Conv2D(32, 3) as in Keras
  IntPair(std::int64_t height, std::int64_t width) : h(height), w(width) {}
  std::array<std::int64_t, 2> array() const { return {h, w}; }
  bool operator==(const IntPair&) const = default;
};

struct Conv2DOptions {
  IntPair strides = 1;
  std::string padding = "valid";  ///< "valid" or "same"
  IntPair dilation_rate = 1;
  std::string activation = "linear";
  bool use_bias = true;
  std::string kernel_initializer = "glorot_uniform";
  std::string bias_initializer = "zeros";
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// 2-D convolution with `filters` output channels; kernel [kh, kw, in_channels, filters].
LayerRef Conv2D(std::int64_t filters, IntPair kernel_size, Conv2DOptions options = {});

struct Pooling2DOptions {
  std::optional<IntPair> strides = std::nullopt;  ///< default: pool_size
  std::string padding = "valid";
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
LayerRef MaxPooling2D(IntPair pool_size = {2, 2}, Pooling2DOptions options = {});
/// With "same" padding the padded positions are left out of each average (as Keras).
LayerRef AveragePooling2D(IntPair pool_size = {2, 2}, Pooling2DOptions options = {});

struct GlobalPooling2DOptions {
  bool keepdims = false;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Mean over height and width: [batch, h, w, c] -> [batch, c].
LayerRef GlobalAveragePooling2D(GlobalPooling2DOptions options = {});

struct BatchNormalizationOptions {
  std::int64_t axis = -1;  ///< the channel axis; mpt supports the last one
  double momentum = 0.99;
  double epsilon = 1e-3;
  bool center = true;  ///< learn beta
  bool scale = true;   ///< learn gamma
  std::string beta_initializer = "zeros";
  std::string gamma_initializer = "ones";
  std::string moving_mean_initializer = "zeros";
  std::string moving_variance_initializer = "ones";
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Training (and trainable): normalizes with the batch's mean and biased variance and moves
/// moving_mean / moving_variance toward them by (1 - momentum) once the step is applied.
/// Otherwise normalizes with the moving statistics. Statistics and normalization run in float32
/// under every policy; the output is in the compute dtype.
LayerRef BatchNormalization(BatchNormalizationOptions options = {});

struct LayerNormalizationOptions {
  std::int64_t axis = -1;  ///< mpt supports the last axis
  double epsilon = 1e-3;
  bool center = true;
  bool scale = true;
  std::string beta_initializer = "zeros";
  std::string gamma_initializer = "ones";
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
LayerRef LayerNormalization(LayerNormalizationOptions options = {});

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

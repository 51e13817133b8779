#pragma once
/// Convolution, pooling and normalization ops over channels-last (NHWC) images, as Keras lays
/// them out: x [batch, height, width, channels], kernels [kh, kw, in_channels, filters]. Like
/// every op in mpt::ops they validate their inputs, record their backward on an active tape and
/// accumulate in float32 for 16-bit inputs; normalization statistics are float32.
///
///   using namespace mpt;
///   Tensor h = ops::conv2d(x, kernel, bias, {.strides = {2, 2}, .padding = "same", .activation = "relu"});
///   Tensor p = ops::max_pool2d(h, {2, 2});                        // strides default to the pool size
///   auto bn = ops::batch_norm(p, gamma, beta, {}, {}, {.training = true});
///   // bn.y: normalized p; bn.mean / bn.variance: the batch statistics (float32)
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "mpt/tensor.hpp"

namespace mpt {

/// A (height, width) pair: kernel and pool sizes, strides, dilation rates, given as {h, w} or
/// as one number for both (Keras's int-or-tuple). The one such type of the ops and the layers.
struct IntPair {
  std::int64_t h = 1, w = 1;
  IntPair() = default;
  IntPair(std::int64_t both) : h(both), w(both) {}  // NOLINT: Conv2D(32, 3) as in Keras
  IntPair(std::int64_t height, std::int64_t width) : h(height), w(width) {}
  std::int64_t& operator[](int i) { return i == 0 ? h : w; }
  std::int64_t operator[](int i) const { return i == 0 ? h : w; }
  bool operator==(const IntPair&) const = default;
};

}  // namespace mpt

namespace mpt::ops {

struct Conv2dOptions {
  IntPair strides = {1, 1};
  /// "valid" (no padding) or "same" (output = ceil(input / stride); Keras/TensorFlow padding,
  /// the odd extra row/column at the bottom/right).
  std::string padding = "valid";
  IntPair dilation = {1, 1};
  /// Fused activation: linear, relu, sigmoid, tanh, gelu, silu (as ops::dense).
  std::string activation = "linear";
  /// Grouped convolution (Keras's Conv2D `groups`): the channels split into `groups` blocks,
  /// output block g computed from input block g only; Cin and Cout divisible by it. groups ==
  /// Cin is a depthwise convolution (DepthwiseConv2D).
  std::int64_t groups = 1;
};
/// act(conv(x, kernel) + bias): x [N, H, W, Cin], kernel [kh, kw, Cin / groups, Cout], bias
/// [Cout] or undefined; one fused op with its own backward (data, weights, bias).
Tensor conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias = {}, Conv2dOptions options = {});

struct Pool2dOptions {
  std::optional<IntPair> strides = std::nullopt;  ///< default: the pool size (as Keras)
  std::string padding = "valid";                ///< "valid" or "same"
};
/// Max over each window (padding never wins).
Tensor max_pool2d(const Tensor& x, IntPair pool_size = {2, 2}, Pool2dOptions options = {});
/// Mean over each window; with "same" padding the padded positions are left out of the mean.
Tensor avg_pool2d(const Tensor& x, IntPair pool_size = {2, 2}, Pool2dOptions options = {});
/// Mean over height and width: [N, H, W, C] -> [N, C] ([N, 1, 1, C] with keepdims).
Tensor global_avg_pool2d(const Tensor& x, bool keepdims = false);
/// Zeros around the image: [N, H, W, C] -> [N, top + H + bottom, left + W + right, C].
Tensor zero_pad2d(const Tensor& x, std::int64_t top, std::int64_t bottom, std::int64_t left, std::int64_t right);

struct AffineTransformOptions {
  std::string interpolation = "bilinear";  ///< "bilinear" or "nearest" (round half to even)
  /// Where a sample falls outside the image: "constant" (fill_value), "nearest" (the edge
  /// pixel), "wrap" (the image tiled), "mirror" (reflected about the edge pixel: c b | a b c) or
  /// "reflect" (about the edge: b a | a b c).
  std::string fill_mode = "constant";
  double fill_value = 0.0;
};
/// keras.ops.image.affine_transform on images [B, H, W, C] (or one image [H, W, C]): output
/// pixel (y, x) of image b is the input sampled at x' = (a0·x + a1·y + a2) / k,
/// y' = (b0·x + b1·y + b2) / k, k = c0·x + c1·y + 1, from transform row b = [a0, a1, a2, b0, b1,
/// b2, c0, c1] ([B, 8], or [8] / [1, 8] for every image; it maps output coordinates to input
/// ones, pixel centres at integers). Same shape and dtype out; floating images, computed in
/// float32 (float64 for float64). Carries no gradient (augmentation of inputs): the output is
/// a constant to autograd.
Tensor affine_transform(const Tensor& images, const Tensor& transform, AffineTransformOptions options = {});

struct ResizeOptions {
  std::string interpolation = "bilinear";  ///< bilinear only (Keras's default)
  /// Resize the largest centred window of the target's aspect ratio instead of the whole image.
  bool crop_to_aspect_ratio = false;
};
/// keras.ops.image.resize to size {height, width}: bilinear with half-pixel centres and no
/// antialiasing (tf.image.resize's and torch's interpolate(align_corners=False)), edges
/// clamped. Floating images [B, H, W, C] or [H, W, C]; no gradient, as affine_transform.
Tensor resize(const Tensor& images, IntPair size, ResizeOptions options = {});

struct BatchNormOptions {
  /// true: normalize with the batch's statistics (and return them); false: with the given ones.
  bool training = false;
  double epsilon = 1e-3;
  /// "linear" or "relu" (fused).
  std::string activation = "linear";
};
struct BatchNormResult {
  Tensor y;         ///< x's shape and dtype
  Tensor mean;      ///< [C] batch mean (training) or the given mean; float32 (float64 for float64 x)
  Tensor variance;  ///< [C] biased batch variance (training) or the given variance
};
/// Per-channel normalization over every axis but the last: y = (x - mean) / sqrt(var + eps) *
/// gamma + beta. gamma/beta [C] may be undefined (scale 1, offset 0); mean/var [C] are used in
/// inference and may be undefined in training. Parameters of any float dtype are cast to float32
/// (float64 for float64 x), the dtype statistics are computed in. Differentiable in x, gamma, beta.
BatchNormResult batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                           const Tensor& variance, BatchNormOptions options = {});

/// Normalization of each row over the last axis (statistics in float32), then * gamma + beta
/// ([D] or undefined). Differentiable in x, gamma, beta.
Tensor layer_norm(const Tensor& x, const Tensor& gamma = {}, const Tensor& beta = {}, double epsilon = 1e-3);

struct AttentionOptions {
  /// Bool (true attends), broadcastable to [batch, heads, Tq, Tk]: [Tq, Tk], [B, Tq, Tk] or
  /// [B, 1 or H, Tq, Tk] (a padding mask, a custom pattern). Undefined: none.
  Tensor mask = {};
  /// Query i attends to keys j <= i (top-left aligned, as Keras and PyTorch).
  bool is_causal = false;
  /// Multiplies q·k; default 1 / sqrt(head dim).
  std::optional<double> scale = std::nullopt;
};
/// softmax(scale · q kᵀ, masked) v per batch and head, Keras's ops.dot_product_attention and
/// PyTorch's scaled_dot_product_attention, in Keras's layout: query [B, Tq, H, D], key
/// [B, Tk, H, D], value [B, Tk, H, Dv] -> [B, Tq, H, Dv] in the query's dtype. Computed in
/// float32 (float64 for float64), softmax statistics included, with an online softmax: memory
/// linear in T (each row keeps its log-sum-exp for the backward pass, which recomputes the
/// probabilities). Masked positions get probability exactly 0; a query that attends to nothing
/// gives zeros. Differentiable in query, key and value.
Tensor dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                             AttentionOptions options = {});

}  // namespace mpt::ops

#pragma once
/// Core layers, created like Keras's: layers::Dense(128, {.activation = "relu"}).
///
///   namespace layers = mpt::layers;
///   mpt::Sequential model({layers::Input({28, 28, 1}), layers::Flatten(),
///                          layers::Dense(128, {.activation = "relu"}), layers::Dropout(0.2),
///                          layers::Dense(10), layers::Activation("softmax")});
#include <optional>
#include <string>

#include "mpt/layers/layer.hpp"

namespace mpt::layers {

using PolicyArg = std::optional<mixed_precision::Policy>;

/// The input of a Sequential model: per-example shape (no batch dimension).
struct InputOptions {
  std::string name = "";
};
LayerRef Input(const Shape& shape, InputOptions options = {});
/// The per-example shape of an Input layer; empty for any other layer.
Shape input_layer_shape(const Layer& layer);

struct DenseOptions {
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
LayerRef Dense(std::int64_t units, DenseOptions options = {});

struct LayerOptions {
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// By Keras name: linear, exponential, relu, relu6, leaky_relu, sigmoid, tanh, gelu, silu
/// (swish), softmax.
LayerRef Activation(const std::string& activation, LayerOptions options = {});

struct SoftmaxOptions {
  std::int64_t axis = -1;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
LayerRef Softmax(SoftmaxOptions options = {});

/// Keras's ReLU layer: x for threshold <= x < max_value, max_value from max_value on, and
/// negative_slope * (x - threshold) below the threshold (ReLU6: {.max_value = 6}).
struct ReLUOptions {
  std::optional<double> max_value = std::nullopt;  ///< no cap (Keras's None); else >= 0
  double negative_slope = 0.0;                      ///< >= 0
  double threshold = 0.0;                           ///< >= 0
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
LayerRef ReLU(ReLUOptions options = {});

struct EmbeddingOptions {
  initializers::Initializer embeddings_initializer = "uniform";  ///< Keras's default: RandomUniform(-0.05, 0.05)
  bool mask_zero = false;  ///< true is refused: mpt propagates no masks
  std::optional<regularizers::Regularizer> embeddings_regularizer = std::nullopt;
  std::optional<regularizers::Regularizer> activity_regularizer = std::nullopt;
  std::optional<constraints::Constraint> embeddings_constraint = std::nullopt;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Integer ids [batch, ...] (integers or integral floats) -> rows of a learned table
/// "embeddings" [input_dim, output_dim]: [batch, ..., output_dim] in the compute dtype. The
/// table is a float32 variable under mixed policies and its gradient a float32 scatter-add.
LayerRef Embedding(std::int64_t input_dim, std::int64_t output_dim, EmbeddingOptions options = {});

struct PositionEmbeddingOptions {
  initializers::Initializer initializer = "glorot_uniform";  ///< Keras-Hub's default
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// A learned position table "embeddings" [sequence_length, features]: for an input [batch, ...,
/// T, features] (T <= sequence_length) its first T rows, broadcast to the input's shape (added
/// to token embeddings by the model). Keras-Hub's PositionEmbedding.
LayerRef PositionEmbedding(std::int64_t sequence_length, PositionEmbeddingOptions options = {});

struct LeakyReLUOptions {
  double negative_slope = 0.3;  ///< Keras's default (the leaky_relu activation's is 0.2); >= 0
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// x where x >= 0, else negative_slope * x.
LayerRef LeakyReLU(LeakyReLUOptions options = {});

struct ELUOptions {
  double alpha = 1.0;  ///< Keras's default
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Keras's ELU: x where x > 0, else alpha * (exp(x) - 1).
LayerRef ELU(ELUOptions options = {});
LayerRef Flatten(LayerOptions options = {});
/// target_shape: per-example (no batch dimension); one entry may be -1.
LayerRef Reshape(const Shape& target_shape, LayerOptions options = {});

struct DropoutOptions {
  std::optional<std::uint64_t> seed = std::nullopt;  ///< default: drawn from set_random_seed's stream
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Drops `rate` of the inputs in training (scaling the rest by 1/(1-rate)); identity in inference.
LayerRef Dropout(double rate, DropoutOptions options = {});

}  // namespace mpt::layers

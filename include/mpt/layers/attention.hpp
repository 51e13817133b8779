#pragma once
/// Attention layers, as Keras's: MultiHeadAttention.
///
///   auto x = mpt::Input({256, 128});
///   auto h = layers::MultiHeadAttention(4, 32, {.use_causal_mask = true})({x, x});   // self-attention
///   auto mask = mpt::Input({256, 256}, {.dtype = mpt::bool_});
///   auto y = layers::MultiHeadAttention(4, 32)({x, x, mask});                        // with a mask
#include <cstdint>
#include <optional>
#include <string>

#include "mpt/layers/core.hpp"

namespace mpt::layers {

struct MultiHeadAttentionOptions {
  std::optional<std::int64_t> value_dim = std::nullopt;  ///< default: key_dim
  double dropout = 0.0;  ///< on the attention probabilities, in training only
  bool use_bias = true;
  /// The output's last dimension; default: the query's.
  std::optional<std::int64_t> output_shape = std::nullopt;
  /// Query i attends to keys j <= i (Keras passes this per call; in mpt it is the layer's, and a
  /// .keras file carries it in the call's kwargs both ways).
  bool use_causal_mask = false;
  initializers::Initializer kernel_initializer = "glorot_uniform";
  initializers::Initializer bias_initializer = "zeros";
  /// On every projection's kernel / bias, as Keras's.
  std::optional<regularizers::Regularizer> kernel_regularizer = std::nullopt;
  std::optional<regularizers::Regularizer> bias_regularizer = std::nullopt;
  /// On each of the four projections' outputs (query, key, value and the output: Keras's
  /// EinsumDense sublayers), each penalty divided by the batch size; not on the scores.
  std::optional<regularizers::Regularizer> activity_regularizer = std::nullopt;
  std::optional<constraints::Constraint> kernel_constraint = std::nullopt;
  std::optional<constraints::Constraint> bias_constraint = std::nullopt;
  std::optional<std::uint64_t> seed = std::nullopt;  ///< the dropout stream; default: the global seed
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Keras's MultiHeadAttention on [batch, T, features] inputs, called on {query, value},
/// {query, value, key}, or either followed by an attention mask [batch, Tq, Tk] of a
/// non-floating dtype (bool: true attends; integers: nonzero attends); one input x is {x, x}.
/// Weights as Keras's EinsumDense kernels: query/kernel [dq, heads, key_dim], query/bias
/// [heads, key_dim], key/... [dk, heads, key_dim], value/... [dv, heads, value_dim],
/// attention_output/kernel [heads, value_dim, out] and attention_output/bias [out]. Attention
/// through ops::dot_product_attention (softmax in float32, memory linear in T); with dropout in
/// training, through explicit probabilities [batch, heads, Tq, Tk] in float32. A query that
/// attends to nothing gives zeros (Keras: the mean of the values).
LayerRef MultiHeadAttention(std::int64_t num_heads, std::int64_t key_dim, MultiHeadAttentionOptions options = {});

}  // namespace mpt::layers

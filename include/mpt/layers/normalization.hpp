#pragma once
/// Normalization layers, as Keras's: BatchNormalization, LayerNormalization, RMSNormalization.
///
/// BatchNormalization's moving statistics follow the applied optimizer steps only: a training
/// call computes them, Model::train_step commits them after the optimizer step and drops them
/// when a loss-scale overflow skipped it (custom loops call model.finish_step(applied)).
#include <cstdint>
#include <string>

#include "mpt/layers/core.hpp"

namespace mpt::layers {

struct BatchNormalizationOptions {
  std::int64_t axis = -1;  ///< the channel axis; mpt supports the last one
  double momentum = 0.99;
  double epsilon = 1e-3;
  bool center = true;  ///< learn beta
  bool scale = true;   ///< learn gamma
  initializers::Initializer beta_initializer = "zeros";
  initializers::Initializer gamma_initializer = "ones";
  initializers::Initializer moving_mean_initializer = "zeros";
  initializers::Initializer moving_variance_initializer = "ones";
  std::optional<regularizers::Regularizer> beta_regularizer = std::nullopt;
  std::optional<regularizers::Regularizer> gamma_regularizer = std::nullopt;
  std::optional<constraints::Constraint> beta_constraint = std::nullopt;
  std::optional<constraints::Constraint> gamma_constraint = std::nullopt;
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
  initializers::Initializer beta_initializer = "zeros";
  initializers::Initializer gamma_initializer = "ones";
  std::optional<regularizers::Regularizer> beta_regularizer = std::nullopt;
  std::optional<regularizers::Regularizer> gamma_regularizer = std::nullopt;
  std::optional<constraints::Constraint> beta_constraint = std::nullopt;
  std::optional<constraints::Constraint> gamma_constraint = std::nullopt;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
LayerRef LayerNormalization(LayerNormalizationOptions options = {});

struct RMSNormalizationOptions {
  std::int64_t axis = -1;  ///< mpt supports the last axis
  double epsilon = 1e-6;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// x / sqrt(mean(x², last axis) + epsilon) * scale, with the weight "scale" [features] (ones):
/// Keras 3's RMSNormalization. Statistics and scaling in float32 under every policy; the
/// output in the compute dtype.
LayerRef RMSNormalization(RMSNormalizationOptions options = {});

}  // namespace mpt::layers

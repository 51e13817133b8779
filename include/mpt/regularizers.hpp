#pragma once
/// Keras's weight regularizers and constraints, set on a layer's variables:
///
///   layers::Dense(64, {.kernel_regularizer = regularizers::L2(1e-4),
///                      .activity_regularizer = regularizers::L1(1e-5),
///                      .kernel_constraint = constraints::MaxNorm(3.0)});
///
/// A regularized variable's penalty, and a layer's activity penalty (of its outputs, divided by
/// the batch size as Keras 3 does), join Model::losses() and the training loss, in float32
/// whatever the policy. Constraints run on the float32 master after each applied optimizer step.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mpt/tensor.hpp"

namespace mpt::regularizers {

/// l1·Σ|x| + l2·Σx² (Keras's L1, L2 and L1L2 compute the same, and differ in the class name and
/// defaults they are saved with). The gradient of |x| at 0 is 0, as TensorFlow's and PyTorch's
/// (Keras on JAX takes 1 there).
struct Regularizer {
  std::string class_name = "L1L2";  ///< as Keras saves it: "L1", "L2" or "L1L2"
  double l1 = 0.0, l2 = 0.0;
  /// The penalty of x as a float32 scalar (x widened first), differentiable in x.
  Tensor operator()(const Tensor& x) const;
};
Regularizer L1(double l1 = 0.01);
Regularizer L2(double l2 = 0.01);
Regularizer L1L2(double l1 = 0.0, double l2 = 0.0);

/// Keras's serialized form ({"module": "keras.regularizers", "class_name": "L2", "config":
/// {"l2": 0.01}, ...}); null for none.
nlohmann::json serialize(const std::optional<Regularizer>& r);
/// The inverse of serialize; mpt::Error naming `where` for another class or a bad factor.
std::optional<Regularizer> deserialize(const nlohmann::json& v, const std::string& where);

}  // namespace mpt::regularizers

namespace mpt::constraints {

/// Keras's MaxNorm (norms along `axis` clipped to max_value), NonNeg (negatives to 0) and
/// UnitNorm (norms along `axis` scaled to 1); norms get Keras's epsilon 1e-7.
struct Constraint {
  std::string class_name;  ///< "MaxNorm", "NonNeg" or "UnitNorm"
  double max_value = 2.0;
  std::vector<std::int64_t> axis = {0};
  /// The constrained value of w, in w's dtype.
  Tensor operator()(const Tensor& w) const;
};
Constraint MaxNorm(double max_value = 2.0, std::vector<std::int64_t> axis = {0});
Constraint NonNeg();
Constraint UnitNorm(std::vector<std::int64_t> axis = {0});

nlohmann::json serialize(const std::optional<Constraint>& c);
std::optional<Constraint> deserialize(const nlohmann::json& v, const std::string& where);

}  // namespace mpt::constraints

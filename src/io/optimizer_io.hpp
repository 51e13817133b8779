#pragma once
// Optimizers in checkpoints: Keras's variable order (which slot of which variable is
// optimizer/vars/<i>) and Keras-style configs to rebuild the built-in optimizers.
#include <memory>
#include <string>
#include <vector>

#include "core/json_util.hpp"
#include "mpt/optimizers/optimizer.hpp"

namespace mpt::io {

/// mpt slot names in Keras's order after iteration and learning_rate: each inner list is
/// created for every trainable variable in turn, interleaved (Adam: {{"m", "v"}, {"vhat"}}).
/// Optimizers mpt does not know list the slots they hold, sorted, as one group.
std::vector<std::vector<std::string>> slot_layout(const optimizers::Optimizer& opt);
/// The shape Keras gives slot `name` of v, and whether mpt derives it rather than keeping it
/// (Adafactor's full velocity of a factored variable and its placeholder scalars of the others).
struct KerasSlot {
  Shape shape;
  bool derived = false;
};
KerasSlot keras_slot(const optimizers::Optimizer& opt, const Variable& v, const std::string& name);
/// Variables Keras lists after the slots (Nadam: "u_product").
std::vector<std::string> trailing_variables(const optimizers::Optimizer& opt);
/// The value of a derived entry, as Keras holds it (Nadam's u_product; zeros of `shape` for the others).
Tensor derived_value(const optimizers::Optimizer& opt, const std::string& name, const Shape& shape);
/// Whether Keras keeps a learning_rate variable (a constant rate, not a schedule).
bool has_learning_rate_variable(const optimizers::Optimizer& opt);

/// {"class_name": "Adam", "config": {...}} of a built-in optimizer (LossScaleOptimizer with its
/// inner one); mpt::Error for optimizers and schedules it cannot rebuild.
/// `keras_only` leaves out mpt's own LossScaleOptimizer options (for Keras's config.json).
Json optimizer_to_json(const optimizers::Optimizer& opt, bool keras_only = false);
/// The optimizer a config describes; mpt::Error naming `where` and the key on a bad config.
std::shared_ptr<optimizers::Optimizer> optimizer_from_json(const Json& v, const std::string& where);

}  // namespace mpt::io

#pragma once
// The two weight layouts, shared by save_weights/load_weights and full checkpoints. Loading
// first reads and checks everything into a PendingState; commit() then applies it in one go,
// so a failed load never leaves a model half-loaded.
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "io/hdf5_file.hpp"
#include "mpt/model.hpp"

namespace mpt::io {

/// Keras 3's model.weights.h5: /layers/<name>/vars/<i>, /optimizer/vars/<i>, /vars.
/// Keras 3's object path of each layer under /layers: its class in snake_case, with _1, _2, ...
/// for the second, third, ... layer of that class in model.layers() order (saving_lib's
/// _save_container_state), whatever the layers' names.
std::vector<std::string> object_paths(const std::vector<LayerRef>& layers);
void write_keras3(const h5::Group& root, const Model& model, const SaveWeightsOptions& options);
/// Keras 2's legacy layout: root attributes layer_names, backend, keras_version; one group per
/// layer with a weight_names attribute and datasets <layer>/<layer>/<var>:0.
void write_legacy(const h5::Group& root, const Model& model, std::optional<DType> dtype);

struct PendingState {
  std::vector<std::pair<Variable, Tensor>> weights;  ///< already in each variable's dtype/device
  bool has_optimizer = false;
  std::int64_t iterations = 0;
  std::vector<std::tuple<std::string, std::string, Tensor>> slots;  ///< variable path, slot, value
  bool has_loss_scale = false;
  double loss_scale = 1;
  std::int64_t step_counter = 0;
  int overflow_count = 0;
  /// Applies everything; cannot fail on validated input.
  void commit(Model& model) const;
};

/// What to do with the optimizer state Keras 3's layout holds.
enum class OptimizerState {
  Ignore,
  IfMatching,  ///< load_weights: load it when the model is compiled with a matching optimizer (else warn, as Keras)
  Required,    ///< load_model: it must be there and match
};

/// Reads the weights (and the optimizer state, per `optimizer`) and checks them against the
/// model; mpt::Error names the first mismatch. The layout is told apart by content.
PendingState read_weights(const h5::File& file, const Model& model, OptimizerState optimizer);

}  // namespace mpt::io

#pragma once
// Model architecture and compile settings as Keras-style JSON (see model_config.cpp).
#include <memory>
#include <string>

#include "core/json_util.hpp"
#include "mpt/model.hpp"

namespace mpt::io {

/// {"class_name": "Sequential" | "Functional", "config": {...}} in Keras 3's layout (functional
/// models: layers with inbound_nodes, input_layers, output_layers). `keras_view` writes what
/// Keras's config.json needs (build_config, Keras's compile_config, 31-bit seeds).
Json model_config_json(const Model& m, bool keras_view = false);
/// Rebuilds the layers (through the layer registry) and the model, uncompiled; mpt::Error
/// naming `where` and the key on a config it cannot rebuild.
std::unique_ptr<Model> model_from_config(const Json& v, const std::string& where);
/// mpt's compile settings: the optimizer's full config, the loss with its options, metrics.
Json compile_config_json(const Model& m);
/// Compiles `m` from mpt's compile_config or Keras's.
void compile_from_config(Model& m, const Json& config, const std::string& where, bool auto_scale_loss);

}  // namespace mpt::io

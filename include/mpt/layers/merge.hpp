#pragma once
/// Merge layers: several inputs of one shape in, one tensor out (functional models and custom
/// blocks call them with a list).
///
///   auto y = layers::Add()({x, shortcut});                  // residual connection
///   auto z = layers::Concatenate({.axis = -1})({a, b});     // channels stacked
#include "mpt/layers/core.hpp"

namespace mpt::layers {

/// The elementwise sum of two or more inputs of the same shape (size-1 axes broadcast).
LayerRef Add(LayerOptions options = {});

struct ConcatenateOptions {
  std::int64_t axis = -1;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Inputs joined along `axis`; all other axes must agree.
LayerRef Concatenate(ConcatenateOptions options = {});

}  // namespace mpt::layers

#pragma once
/// The functional API's symbolic tensors: mpt::Input creates one, calling a layer on one
/// records a node, and mpt::Model(inputs, outputs) runs the recorded graph.
///
///   auto in = mpt::Input({32, 32, 3});
///   auto x = layers::Conv2D(16, {3, 3}, {.padding = "same"})(in);
///   auto y = layers::Add()({x, layers::Conv2D(16, {3, 3}, {.padding = "same"})(x)});   // residual
///   mpt::Model model(in, layers::Dense(10, {.activation = "softmax"})(layers::Flatten()(y)));
#include <memory>
#include <string>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt {

class LayerRef;
struct FunctionalNode;

/// A symbolic tensor: where a value comes from in a functional model. Its shape has no batch
/// dimension.
class KerasTensor {
 public:
  KerasTensor() = default;
  KerasTensor(std::shared_ptr<FunctionalNode> node, Tensor example) : node_(std::move(node)), example_(std::move(example)) {}
  /// Per-example shape (no batch dimension).
  Shape shape() const;
  DType dtype() const { return example_.dtype(); }
  const std::shared_ptr<FunctionalNode>& node() const { return node_; }
  /// A one-example value computed when the graph was recorded (shapes and dtypes).
  const Tensor& example() const { return example_; }
  bool defined() const { return node_ != nullptr; }

 private:
  std::shared_ptr<FunctionalNode> node_;
  Tensor example_;
};

/// One layer call in a functional graph (or an input when layer is null).
struct FunctionalNode {
  std::shared_ptr<class Layer> layer;  ///< null for an Input
  std::vector<KerasTensor> inputs;
  Shape input_shape;  ///< per-example shape of an Input
  std::string input_name;
};

struct FunctionalInputOptions {
  DType dtype = float32;
  std::string name = "";
};
/// A functional model input of per-example `shape`.
KerasTensor Input(const Shape& shape, FunctionalInputOptions options = {});

}  // namespace mpt

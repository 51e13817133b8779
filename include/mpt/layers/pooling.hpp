#pragma once
/// Pooling layers, as Keras's (channels-last images [batch, h, w, c]): MaxPooling2D,
/// AveragePooling2D, GlobalAveragePooling2D.
#include <optional>
#include <string>

#include "mpt/layers/conv.hpp"  // IntPair

namespace mpt::layers {

struct Pooling2DOptions {
  std::optional<IntPair> strides = std::nullopt;  ///< default: pool_size
  std::string padding = "valid";
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
LayerRef MaxPooling2D(IntPair pool_size = {2, 2}, Pooling2DOptions options = {});
/// With "same" padding the padded positions are left out of each average (as Keras).
LayerRef AveragePooling2D(IntPair pool_size = {2, 2}, Pooling2DOptions options = {});

struct GlobalPooling2DOptions {
  bool keepdims = false;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Mean over height and width: [batch, h, w, c] -> [batch, c].
LayerRef GlobalAveragePooling2D(GlobalPooling2DOptions options = {});

}  // namespace mpt::layers

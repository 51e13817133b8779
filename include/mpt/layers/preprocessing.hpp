#pragma once
/// Keras's image preprocessing layers, on the model's device: Rescaling, and the augmentation
/// layers, which act in training only (identity in inference) and draw from the Philox streams
/// by their seed, so a seed gives the same augmentation on every device.
///
///   mpt::Sequential m({layers::Input({28, 28, 1}), layers::Rescaling(1.0 / 255),
///                      layers::RandomFlip("horizontal"), ...});
#include <cstdint>
#include <optional>
#include <string>

#include "mpt/layers/layer.hpp"

namespace mpt::layers {

struct RescalingOptions {
  double offset = 0.0;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Keras's Rescaling: x · scale + offset in the compute dtype (integer inputs, such as uint8
/// images, are cast to it first).
LayerRef Rescaling(double scale, RescalingOptions options = {});

struct RandomFlipOptions {
  std::optional<std::uint64_t> seed = std::nullopt;  ///< default: drawn from set_random_seed's stream
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Keras's RandomFlip on NHWC images [B, H, W, C]: in training each image is flipped left-right
/// ("horizontal"), upside down ("vertical"), or each of the two independently
/// ("horizontal_and_vertical"), each with probability 1/2; in inference the identity. For inputs
/// (as Keras's augmentation layers are used): the flipped images carry no gradient.
LayerRef RandomFlip(const std::string& mode = "horizontal_and_vertical", RandomFlipOptions options = {});

}  // namespace mpt::layers

#pragma once
/// Keras's image preprocessing layers, on the model's device: Rescaling, and the augmentation
/// layers, which act in training only (identity in inference) and draw from the Philox streams
/// by their seed, so a seed gives the same augmentation on every device.
///
///   mpt::Sequential m({layers::Input({28, 28, 1}), layers::Rescaling(1.0 / 255),
///                      layers::RandomFlip("horizontal"), ...});
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "mpt/layers/layer.hpp"
#include "mpt/nn_ops.hpp"  // IntPair

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

/// A range of factors (Keras's float-or-tuple): one number f stands for [-|f|, |f|], a pair
/// {lower, upper} for itself (sorted).
struct FactorRange {
  double lower = 0.0, upper = 0.0;
  bool pair = false;  ///< given as a pair (saved back as a list, as Keras)
  FactorRange(double f) : lower(-std::abs(f)), upper(std::abs(f)), given{f, f} {}  // NOLINT: 0.1 as in Keras
  FactorRange(double a, double b) : lower(std::min(a, b)), upper(std::max(a, b)), pair(true), given{a, b} {}
  double given[2];  ///< as given (the config)
};

struct RandomTranslationOptions {
  std::string fill_mode = "reflect";       ///< "reflect", "wrap", "constant" or "nearest"
  std::string interpolation = "bilinear";  ///< "bilinear" or "nearest"
  std::optional<std::uint64_t> seed = std::nullopt;
  double fill_value = 0.0;  ///< the value outside the image with fill_mode "constant"
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Keras's RandomTranslation on NHWC images: in training each image is shifted by
/// height_factor · H rows and width_factor · W columns, drawn uniformly per image from the
/// factor ranges (each within [-1, 1]); the pixels uncovered are filled by fill_mode
/// (ops::affine_transform). The identity in inference; no gradient through the shift.
LayerRef RandomTranslation(FactorRange height_factor, FactorRange width_factor, RandomTranslationOptions options = {});

struct RandomZoomOptions {
  /// Default: the height's zoom for both axes (aspect ratio kept).
  std::optional<FactorRange> width_factor = std::nullopt;
  std::string fill_mode = "reflect";
  std::string interpolation = "bilinear";
  std::optional<std::uint64_t> seed = std::nullopt;
  double fill_value = 0.0;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Keras's RandomZoom: in training each image is scaled about its centre by 1 + a factor drawn
/// per image from height_factor (and width_factor), factors within (-1, 1]; as Keras, a
/// positive factor zooms out (the image shrinks, fill_mode fills the border), a negative one
/// zooms in. The identity in inference; no gradient.
LayerRef RandomZoom(FactorRange height_factor, RandomZoomOptions options = {});

struct RandomCropOptions {
  std::optional<std::uint64_t> seed = std::nullopt;
  /// mpt's addition, PyTorch's RandomCrop(size, padding): zeros added around each image (rows,
  /// columns per side) before the crop, in training only; with height and width the image's own
  /// size this is the usual "pad and crop" augmentation, the identity in inference. Saved in the
  /// config only when not 0 (Keras has no such argument).
  IntPair padding = 0;
  PolicyArg dtype = std::nullopt;
  std::string name = "";
};
/// Keras's RandomCrop to height × width: in training, when the (padded) images are larger than
/// that in both dimensions, one window at a random offset, the same for the whole batch (as
/// Keras); otherwise, and in inference, the largest centred window of the target's aspect
/// ratio resized (bilinear) to height × width, which is the identity when the images already
/// have that size. (Keras 3.15's code returns the input unchanged in inference, against its own
/// documentation and output shape; mpt follows the documentation.) No gradient.
LayerRef RandomCrop(std::int64_t height, std::int64_t width, RandomCropOptions options = {});

}  // namespace mpt::layers

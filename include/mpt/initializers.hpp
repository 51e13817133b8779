#pragma once
/// Keras's initializers (keras.initializers) with their arguments, for a layer's variables:
///
///   namespace init = mpt::initializers;
///   layers::Dense(16, {.kernel_initializer = init::RandomNormal({.stddev = 0.5}),
///                      .bias_initializer = init::Constant(0.1)});
///   layers::Conv2D(32, 3, {.kernel_initializer = init::HeNormal({.seed = 7})});
///   layers::Dense(16, {.kernel_initializer = "he_uniform"});   // by name, at Keras's defaults
///
/// Names are Keras's (snake_case or the class name): zeros (zero), ones (one), constant,
/// random_normal (normal), random_uniform (uniform), truncated_normal, variance_scaling,
/// glorot_normal, glorot_uniform, he_normal, he_uniform, lecun_normal, lecun_uniform,
/// orthogonal, identity (IdentityInitializer).
///
/// The arithmetic is Keras's (keras/src/initializers): compute_fans below; VarianceScaling's
/// truncated normal has stddev sqrt(scale) / 0.87962566103423978 and, like TruncatedNormal,
/// redraws values beyond 2 stddev from the mean; Orthogonal is the Q of a QR factorization of a
/// normal matrix [max(rows, cols), min(rows, cols)] (rows: the product of all dimensions but the
/// last) with the signs of diag(R) applied, transposed when rows < cols, times gain (the QR runs
/// on the host in float64); Identity is gain · eye(rows, cols) (2-d shapes only).
///
/// Seeds: a seeded initializer gives the same values for the same shape and dtype wherever and
/// whenever it runs (mpt's Philox-4x32-10 stream (seed, offset 0); the truncated normal's
/// redraws come from offsets 1..8), on every device. An unseeded one draws from the global
/// stream (set_random_seed). The values are NOT those Keras draws for the same seed (JAX's
/// threefry, TensorFlow's and PyTorch's generators all differ from each other and from mpt's):
/// a seed reproduces mpt's run, not Keras's. A seed is saved as is; in a .keras file it is cut to
/// the 31 bits Keras's backends take.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mpt/tensor.hpp"

namespace mpt::initializers {

using Seed = std::optional<std::uint64_t>;
using Axes = std::optional<std::vector<std::int64_t>>;

/// Keras's compute_fans: with input_axes and output_axes, the products of those dimensions;
/// else rank 0: (1, 1); rank 1: (n, n); rank 2: (in, out); higher ranks (convolution kernels
/// [..., in, out]): (in, out) times the product of the leading (receptive field) dimensions.
std::pair<double, double> compute_fans(const Shape& shape, const Axes& input_axes = std::nullopt,
                                       const Axes& output_axes = std::nullopt);

/// One of Keras's initializer classes with its arguments: made by the functions below or from a
/// name (implicitly, so an options field takes "he_uniform"), read back from Keras's saved form
/// by deserialize. A class uses only its own arguments; the named VarianceScaling forms
/// (GlorotUniform, ...) hold their scale, mode and distribution, and save as VarianceScaling
/// when those were changed.
struct Initializer {
  std::string class_name = "GlorotUniform";  ///< Keras's: "RandomNormal", "HeUniform", "Identity", ...
  double mean = 0.0, stddev = 0.05;          ///< RandomNormal, TruncatedNormal
  double minval = -0.05, maxval = 0.05;      ///< RandomUniform
  double value = 0.0;                        ///< Constant
  double scale = 1.0;                        ///< the VarianceScaling family
  std::string mode = "fan_avg";              ///< fan_in, fan_out, fan_avg
  std::string distribution = "uniform";      ///< truncated_normal, untruncated_normal, uniform
  Axes input_axes = std::nullopt, output_axes = std::nullopt;  ///< the fans' axes (both or neither)
  double gain = 1.0;                         ///< Orthogonal, Identity
  Seed seed = std::nullopt;                  ///< the random classes

  /// GlorotUniform(), Keras's default kernel initializer.
  Initializer() = default;
  /// By Keras name (see above), at Keras's default arguments; mpt::Error listing the names for
  /// an unknown one.
  Initializer(const std::string& name);  // NOLINT: implicit, as Keras takes names
  Initializer(const char* name);         // NOLINT

  /// Initial values of `shape` in `dtype` on the default device. Unseeded: stream
  /// `unseeded_seed`, or (without it) the next seed of the global stream.
  Tensor operator()(const Shape& shape, DType dtype = float32,
                    std::optional<std::uint64_t> unseeded_seed = std::nullopt) const;
  /// Keras's get_config of the class (the same keys, e.g. {"seed": null, "mean": 0.0,
  /// "stddev": 0.05}; Identity adds "gain" when it is not 1, which Keras 3.15's leaves out and
  /// its from_config takes).
  nlohmann::json get_config() const;
  /// mpt::Error naming the class and the argument when an argument is out of Keras's range.
  void check() const;

  bool operator==(const Initializer&) const = default;
};

struct RandomNormalOptions {
  double mean = 0.0;
  double stddev = 0.05;
  Seed seed = std::nullopt;
};
/// Normal values of `mean` and `stddev`.
Initializer RandomNormal(RandomNormalOptions options = {});
/// Normal values beyond 2 stddev from the mean redrawn (their stddev is 0.88 · stddev).
Initializer TruncatedNormal(RandomNormalOptions options = {});

struct RandomUniformOptions {
  double minval = -0.05;
  double maxval = 0.05;
  Seed seed = std::nullopt;
};
Initializer RandomUniform(RandomUniformOptions options = {});

Initializer Zeros();
Initializer Ones();
/// Every value `value`.
Initializer Constant(double value = 0.0);

struct VarianceScalingOptions {
  double scale = 1.0;                           ///< > 0
  std::string mode = "fan_in";                  ///< fan_in, fan_out or fan_avg
  std::string distribution = "truncated_normal";  ///< also untruncated_normal, uniform ("normal": truncated)
  Seed seed = std::nullopt;
  Axes input_axes = std::nullopt;   ///< with output_axes: the fans' axes (Keras's EinsumDense)
  Axes output_axes = std::nullopt;
};
/// Values of variance scale / fan: a truncated normal of stddev sqrt(scale / fan) / 0.8796, a
/// normal of stddev sqrt(scale / fan), or uniform in ±sqrt(3 · scale / fan).
Initializer VarianceScaling(VarianceScalingOptions options = {});

struct SeedOptions {
  Seed seed = std::nullopt;
  Axes input_axes = std::nullopt;
  Axes output_axes = std::nullopt;
};
/// VarianceScaling(1, fan_avg, truncated_normal / uniform).
Initializer GlorotNormal(SeedOptions options = {});
Initializer GlorotUniform(SeedOptions options = {});
/// VarianceScaling(2, fan_in, truncated_normal / uniform).
Initializer HeNormal(SeedOptions options = {});
Initializer HeUniform(SeedOptions options = {});
/// VarianceScaling(1, fan_in, truncated_normal / uniform).
Initializer LecunNormal(SeedOptions options = {});
Initializer LecunUniform(SeedOptions options = {});

struct OrthogonalOptions {
  double gain = 1.0;
  Seed seed = std::nullopt;
};
/// An orthogonal matrix (rows or columns orthonormal, times gain) for shapes of rank >= 2.
Initializer Orthogonal(OrthogonalOptions options = {});
/// gain · the identity matrix, for 2-d shapes (Keras 3's Identity, alias IdentityInitializer).
Initializer Identity(double gain = 1.0);
inline Initializer IdentityInitializer(double gain = 1.0) { return Identity(gain); }

/// Keras's serialized form: {"module": "keras.initializers", "class_name": ..., "config": {...},
/// "registered_name": null}.
nlohmann::json serialize(const Initializer& i);
/// A name or a serialized initializer (Keras 3's, or Keras 2's {"class_name", "config"}) back;
/// mpt::Error naming `where`, the class and the field for anything mpt cannot honour.
Initializer deserialize(const nlohmann::json& v, const std::string& where);

/// nlohmann::json conversion (serialize), so a layer's config() writes an Initializer as Keras does.
inline void to_json(nlohmann::json& j, const Initializer& i) { j = serialize(i); }

}  // namespace mpt::initializers

// Rescaling and RandomFlip (include/mpt/layers/preprocessing.hpp), in mpt::ops only.
#include "mpt/layers/preprocessing.hpp"

#include <cmath>
#include <numeric>
#include <vector>

#include "mpt/ops.hpp"

namespace mpt::layers {
namespace {

class RescalingLayer : public Layer {
 public:
  RescalingLayer(double scale, RescalingOptions o) : Layer("Rescaling", o.dtype, o.name), scale_(scale), offset_(o.offset) {
    if (!std::isfinite(scale) || !std::isfinite(offset_)) error("scale and offset must be finite, got ", scale, " and ", offset_);
  }
  Tensor call(const Tensor& x, bool) override {
    const DType d = compute_dtype();
    const Tensor xc = x.dtype() == d ? x : ops::cast(x, d);
    Tensor y = ops::mul(xc, Tensor::scalar(scale_, d, x.device()));
    return offset_ == 0.0 ? y : ops::add(y, Tensor::scalar(offset_, d, x.device()));
  }
  nlohmann::json config() const override { return {{"scale", scale_}, {"offset", offset_}}; }

 private:
  double scale_, offset_;
};

class RandomFlipLayer : public Layer {
 public:
  RandomFlipLayer(std::string mode, RandomFlipOptions o)
      : Layer("RandomFlip", o.dtype, o.name), mode_(std::move(mode)), seed_(o.seed ? *o.seed : detail::next_seed()) {
    if (mode_ != "horizontal" && mode_ != "vertical" && mode_ != "horizontal_and_vertical")
      error("mode must be 'horizontal', 'vertical' or 'horizontal_and_vertical', got '", mode_, "'");
  }
  Tensor call(const Tensor& x, bool training) override {
    if (x.dim() != 4) error("expects images [batch, height, width, channels], got shape ", to_string(x.shape()));
    if (!training) return x;
    Tensor y = x;
    // One uniform draw per image and axis, from the layer's seed and call count (Keras: flip
    // where the draw is <= 0.5).
    if (mode_ != "vertical") y = maybe_flip(y, 2, calls_++);
    if (mode_ != "horizontal") y = maybe_flip(y, 1, calls_++);
    return y;
  }
  nlohmann::json config() const override { return {{"mode", mode_}, {"seed", seed_}, {"data_format", "channels_last"}}; }
  std::vector<std::uint64_t> rng_state() const override { return {calls_}; }
  void set_rng_state(const std::vector<std::uint64_t>& s) override {
    if (s.size() != 1) error("expected 1 random-state value, got ", s.size());
    calls_ = s[0];
  }

 private:
  /// x with axis `axis` (1: rows, 2: columns) reversed in the images whose draw is <= 0.5.
  Tensor maybe_flip(const Tensor& x, std::int64_t axis, std::uint64_t offset) const {
    const Shape& s = x.shape();
    const std::int64_t n = s[static_cast<std::size_t>(axis)];
    // The axis first, its rows gathered in reverse, then back: [B, H, W, C] throughout.
    std::vector<std::int64_t> perm{axis, 0, axis == 1 ? 2 : 1, 3}, back(4);
    for (std::int64_t i = 0; i < 4; ++i) back[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = i;
    std::vector<std::int64_t> rev(static_cast<std::size_t>(n));
    std::iota(rev.rbegin(), rev.rend(), std::int64_t{0});
    const Tensor idx = Tensor::from_vector(rev, {n}, Device::cpu()).to(x.device());
    const Tensor flipped = ops::transpose(ops::gather_rows(ops::transpose(x, perm), idx), back);
    const Tensor u = Tensor::random_uniform({s[0], 1, 1, 1}, 0.0, 1.0, seed_, float32, x.device(), offset);
    return ops::where(ops::less_equal(u, Tensor::scalar(0.5, float32, x.device())), flipped, x);
  }

  std::string mode_;
  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
};

const bool registered = [] {
  register_layer("Rescaling", [](const LayerConfig& c) {
    return Rescaling(c.get_double("scale"),
                     {.offset = c.has("offset") ? c.get_double("offset") : 0.0, .dtype = c.dtype, .name = c.name});
  });
  register_layer("RandomFlip", [](const LayerConfig& c) {
    if (c.has("data_format")) c.expect("data_format", "channels_last");
    std::optional<std::uint64_t> seed;
    if (c.has("seed")) seed = c.get_uint("seed");
    return RandomFlip(c.has("mode") ? c.get("mode") : "horizontal_and_vertical",
                      {.seed = seed, .dtype = c.dtype, .name = c.name});
  });
  return true;
}();

}  // namespace

LayerRef Rescaling(double scale, RescalingOptions o) { return std::make_shared<RescalingLayer>(scale, std::move(o)); }
LayerRef RandomFlip(const std::string& mode, RandomFlipOptions o) {
  return std::make_shared<RandomFlipLayer>(mode, std::move(o));
}

}  // namespace mpt::layers

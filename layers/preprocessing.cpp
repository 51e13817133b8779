// Rescaling and the augmentation layers (include/mpt/layers/preprocessing.hpp), in mpt::ops only.
#include "mpt/layers/preprocessing.hpp"

#include <cmath>
#include <numeric>
#include <vector>

#include "mpt/nn_ops.hpp"
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

/// The augmentation layers' common part: the seed, and the count of draws so far (the Philox
/// offset of the next, saved with the checkpoint so a resumed fit draws what it would have).
class RandomImageLayer : public Layer {
 public:
  RandomImageLayer(const std::string& class_name, const PolicyArg& dtype, const std::string& name,
                   const std::optional<std::uint64_t>& seed)
      : Layer(class_name, dtype, name), seed_(seed ? *seed : detail::next_seed()) {}
  std::vector<std::uint64_t> rng_state() const override { return {calls_}; }
  void set_rng_state(const std::vector<std::uint64_t>& s) override {
    if (s.size() != 1) error("expected 1 random-state value, got ", s.size());
    calls_ = s[0];
  }

 protected:
  /// The next draw: uniform in [lo, hi), float32, of `shape`, on `device`.
  Tensor draw(const Shape& shape, double lo, double hi, Device device) {
    return Tensor::random_uniform(shape, lo, hi, seed_, float32, device, calls_++);
  }
  /// Images [B, H, W, C] checked, integer ones (uint8 pixels) cast to the compute dtype.
  Tensor images(const Tensor& x) const {
    if (x.dim() != 4) error("expects images [batch, height, width, channels], got shape ", to_string(x.shape()));
    return is_floating(x.dtype()) ? x : ops::cast(x, compute_dtype());
  }

  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
};

class RandomFlipLayer : public RandomImageLayer {
 public:
  RandomFlipLayer(std::string mode, RandomFlipOptions o)
      : RandomImageLayer("RandomFlip", o.dtype, o.name, o.seed), mode_(std::move(mode)) {
    if (mode_ != "horizontal" && mode_ != "vertical" && mode_ != "horizontal_and_vertical")
      error("mode must be 'horizontal', 'vertical' or 'horizontal_and_vertical', got '", mode_, "'");
  }
  Tensor call(const Tensor& x, bool training) override {
    if (x.dim() != 4) error("expects images [batch, height, width, channels], got shape ", to_string(x.shape()));
    if (!training) return x;
    Tensor y = x;
    // One uniform draw per image and axis, from the layer's seed and call count (Keras: flip
    // where the draw is <= 0.5).
    if (mode_ != "vertical") y = maybe_flip(y, 2);
    if (mode_ != "horizontal") y = maybe_flip(y, 1);
    return y;
  }
  nlohmann::json config() const override { return {{"mode", mode_}, {"seed", seed_}, {"data_format", "channels_last"}}; }

 private:
  /// x with axis `axis` (1: rows, 2: columns) reversed in the images whose draw is <= 0.5.
  Tensor maybe_flip(const Tensor& x, std::int64_t axis) {
    const Shape& s = x.shape();
    const std::int64_t n = s[static_cast<std::size_t>(axis)];
    // The axis first, its rows gathered in reverse, then back: [B, H, W, C] throughout.
    std::vector<std::int64_t> perm{axis, 0, axis == 1 ? 2 : 1, 3}, back(4);
    for (std::int64_t i = 0; i < 4; ++i) back[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = i;
    std::vector<std::int64_t> rev(static_cast<std::size_t>(n));
    std::iota(rev.rbegin(), rev.rend(), std::int64_t{0});
    const Tensor idx = Tensor::from_vector(rev, {n}, Device::cpu()).to(x.device());
    const Tensor flipped = ops::transpose(ops::gather_rows(ops::transpose(x, perm), idx), back);
    const Tensor u = draw({s[0], 1, 1, 1}, 0.0, 1.0, x.device());
    return ops::where(ops::less_equal(u, Tensor::scalar(0.5, float32, x.device())), flipped, x);
  }

  std::string mode_;
};

nlohmann::json factor_json(const FactorRange& f) {
  return f.pair ? nlohmann::json::array({f.given[0], f.given[1]}) : nlohmann::json(f.given[0]);
}

FactorRange factor_from(const LayerConfig& c, const std::string& key) {
  const nlohmann::json& j = c.at(key);
  if (j.is_array() && j.size() == 2 && j[0].is_number() && j[1].is_number())
    return {j[0].get<double>(), j[1].get<double>()};
  if (j.is_number()) return j.get<double>();
  fail(c.class_name, " '", c.name, "': ", key, " must be a number or a pair of numbers, got ", j.dump());
}

/// The layers resampling each image by an affine transform drawn per image (Keras's
/// RandomTranslation and RandomZoom): fill mode, interpolation and fill value checked and kept.
class RandomAffineLayer : public RandomImageLayer {
 public:
  RandomAffineLayer(const std::string& class_name, const PolicyArg& dtype, const std::string& name,
                    const std::optional<std::uint64_t>& seed, std::string fill_mode, std::string interpolation,
                    double fill_value)
      : RandomImageLayer(class_name, dtype, name, seed),
        fill_mode_(std::move(fill_mode)),
        interpolation_(std::move(interpolation)),
        fill_value_(fill_value) {
    if (fill_mode_ != "reflect" && fill_mode_ != "wrap" && fill_mode_ != "constant" && fill_mode_ != "nearest")
      error("fill_mode must be 'reflect', 'wrap', 'constant' or 'nearest', got '", fill_mode_, "'");
    if (interpolation_ != "bilinear" && interpolation_ != "nearest")
      error("interpolation must be 'bilinear' or 'nearest', got '", interpolation_, "'");
    if (!std::isfinite(fill_value_)) error("fill_value must be finite, got ", fill_value_);
  }
  Tensor call(const Tensor& x, bool training) override {
    const Tensor im = images(x);
    if (!training) return im;
    const Shape& s = im.shape();
    return ops::affine_transform(im, transforms(s[0], s[1], s[2], im.device()),
                                 {.interpolation = interpolation_, .fill_mode = fill_mode_, .fill_value = fill_value_});
  }
  nlohmann::json config() const override {
    nlohmann::json j = own_config();
    j["fill_mode"] = fill_mode_;
    j["interpolation"] = interpolation_;
    j["seed"] = seed_;
    j["fill_value"] = fill_value_;
    j["data_format"] = "channels_last";
    return j;
  }

 protected:
  /// The transform rows [B, 8] (float32) of one call, drawn on `device`.
  virtual Tensor transforms(std::int64_t batch, std::int64_t h, std::int64_t w, Device device) = 0;
  virtual nlohmann::json own_config() const = 0;

  void check_range(const char* what, const FactorRange& f, bool zoom) const {
    for (double v : {f.lower, f.upper})
      if (!(v <= 1.0 && (zoom ? v > -1.0 : v >= -1.0)))
        error(what, " must be within ", zoom ? "(-1, 1]" : "[-1, 1]", ", got ", v);
  }

  std::string fill_mode_, interpolation_;
  double fill_value_;
};

/// Columns [B, 1] into transform rows [B, 8] (undefined columns are zeros).
Tensor rows_of(const std::vector<Tensor>& cols, std::int64_t batch, Device device) {
  const Tensor zero = Tensor::zeros({batch, 1}, float32, device);
  std::vector<Tensor> parts;
  parts.reserve(cols.size());
  for (const Tensor& c : cols) parts.push_back(c.defined() ? c : zero);
  return ops::concat(parts, 1);
}

class RandomTranslationLayer : public RandomAffineLayer {
 public:
  RandomTranslationLayer(FactorRange h, FactorRange w, RandomTranslationOptions o)
      : RandomAffineLayer("RandomTranslation", o.dtype, o.name, o.seed, o.fill_mode, o.interpolation, o.fill_value),
        height_(h),
        width_(w) {
    check_range("height_factor", height_, false);
    check_range("width_factor", width_, false);
  }

 protected:
  // Keras: shifts drawn per image (height first), as fractions of the size; the source of
  // output (y, x) is (y - dy, x - dx).
  Tensor transforms(std::int64_t batch, std::int64_t h, std::int64_t w, Device device) override {
    const Tensor dy = ops::mul(draw({batch, 1}, height_.lower, height_.upper, device),
                               Tensor::scalar(static_cast<double>(h), float32, device));
    const Tensor dx = ops::mul(draw({batch, 1}, width_.lower, width_.upper, device),
                               Tensor::scalar(static_cast<double>(w), float32, device));
    const Tensor one = Tensor::ones({batch, 1}, float32, device);
    return rows_of({one, {}, ops::neg(dx), {}, one, ops::neg(dy), {}, {}}, batch, device);
  }
  nlohmann::json own_config() const override {
    return {{"height_factor", factor_json(height_)}, {"width_factor", factor_json(width_)}};
  }

 private:
  FactorRange height_, width_;
};

class RandomZoomLayer : public RandomAffineLayer {
 public:
  RandomZoomLayer(FactorRange h, RandomZoomOptions o)
      : RandomAffineLayer("RandomZoom", o.dtype, o.name, o.seed, o.fill_mode, o.interpolation, o.fill_value),
        height_(h),
        width_(o.width_factor) {
    check_range("height_factor", height_, true);
    if (width_) check_range("width_factor", *width_, true);
  }

 protected:
  // Keras: zooms 1 + factor per image (height first; the width's own draw, or the height's),
  // about the image centre ((size - 1) / 2 stays in place).
  Tensor transforms(std::int64_t batch, std::int64_t h, std::int64_t w, Device device) override {
    const Tensor zh = draw({batch, 1}, 1.0 + height_.lower, 1.0 + height_.upper, device);
    const Tensor zw = width_ ? draw({batch, 1}, 1.0 + width_->lower, 1.0 + width_->upper, device) : zh;
    auto offset = [&](const Tensor& z, std::int64_t n) {  // (n - 1) / 2 · (1 - z)
      return ops::mul(ops::sub(Tensor::scalar(1.0, float32, device), z),
                      Tensor::scalar((static_cast<double>(n) - 1.0) / 2.0, float32, device));
    };
    return rows_of({zw, {}, offset(zw, w), {}, zh, offset(zh, h), {}, {}}, batch, device);
  }
  nlohmann::json own_config() const override {
    return {{"height_factor", factor_json(height_)},
            {"width_factor", width_ ? factor_json(*width_) : nlohmann::json(nullptr)}};
  }

 private:
  FactorRange height_;
  std::optional<FactorRange> width_;
};

class RandomCropLayer : public RandomImageLayer {
 public:
  RandomCropLayer(std::int64_t height, std::int64_t width, RandomCropOptions o)
      : RandomImageLayer("RandomCrop", o.dtype, o.name, o.seed), height_(height), width_(width), padding_(o.padding) {
    if (height_ <= 0 || width_ <= 0) error("height and width must be positive, got ", height_, " and ", width_);
    if (padding_.h < 0 || padding_.w < 0) error("padding must be >= 0, got (", padding_.h, ", ", padding_.w, ")");
  }
  Tensor call(const Tensor& x, bool training) override {
    Tensor im = images(x);
    if (training && (padding_.h > 0 || padding_.w > 0))
      im = ops::zero_pad2d(im, padding_.h, padding_.h, padding_.w, padding_.w);
    const std::int64_t h = im.shape()[1], w = im.shape()[2];
    if (training && h > height_ && w > width_) {
      // One offset for the batch (Keras), drawn on the host (no device read): int(U[0, n+1)).
      const Tensor u = draw({2}, 0.0, 1.0, Device::cpu());
      const float* p = u.data<float>();
      const auto h0 = std::min(h - height_, static_cast<std::int64_t>(static_cast<double>(p[0]) * static_cast<double>(h - height_ + 1)));
      const auto w0 = std::min(w - width_, static_cast<std::int64_t>(static_cast<double>(p[1]) * static_cast<double>(w - width_ + 1)));
      return ops::slice(ops::slice(im, 1, h0, h0 + height_), 2, w0, w0 + width_).detach();
    }
    if (h == height_ && w == width_) return im;
    // Smaller images (or inference): the centred window of the target's aspect ratio, resized.
    return ops::resize(im, {height_, width_}, {.crop_to_aspect_ratio = true});
  }
  nlohmann::json config() const override {
    nlohmann::json j{{"height", height_}, {"width", width_}, {"seed", seed_}, {"data_format", "channels_last"}};
    if (padding_.h != 0 || padding_.w != 0) j["padding"] = {padding_.h, padding_.w};
    return j;
  }

 private:
  std::int64_t height_, width_;
  IntPair padding_;
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
  auto affine_common = [](const LayerConfig& c, auto& o) {
    if (c.has("data_format")) c.expect("data_format", "channels_last");
    if (c.has("fill_mode")) o.fill_mode = c.get("fill_mode");
    if (c.has("interpolation")) o.interpolation = c.get("interpolation");
    if (c.has("seed")) o.seed = c.get_uint("seed");
    if (c.has("fill_value")) o.fill_value = c.get_double("fill_value");
    o.dtype = c.dtype;
    o.name = c.name;
  };
  register_layer("RandomTranslation", [affine_common](const LayerConfig& c) {
    RandomTranslationOptions o;
    affine_common(c, o);
    return RandomTranslation(factor_from(c, "height_factor"), factor_from(c, "width_factor"), o);
  });
  register_layer("RandomZoom", [affine_common](const LayerConfig& c) {
    RandomZoomOptions o;
    affine_common(c, o);
    if (c.has("width_factor")) o.width_factor = factor_from(c, "width_factor");
    return RandomZoom(factor_from(c, "height_factor"), o);
  });
  register_layer("RandomCrop", [](const LayerConfig& c) {
    if (c.has("data_format")) c.expect("data_format", "channels_last");
    RandomCropOptions o{.dtype = c.dtype, .name = c.name};
    if (c.has("seed")) o.seed = c.get_uint("seed");
    if (c.has("padding")) {
      const std::vector<std::int64_t> p = c.get_ints("padding");
      o.padding = p.size() == 1 ? IntPair(p[0]) : IntPair(p.at(0), p.at(1));
    }
    return RandomCrop(c.get_int("height"), c.get_int("width"), o);
  });
  return true;
}();

}  // namespace

LayerRef Rescaling(double scale, RescalingOptions o) { return std::make_shared<RescalingLayer>(scale, std::move(o)); }
LayerRef RandomFlip(const std::string& mode, RandomFlipOptions o) {
  return std::make_shared<RandomFlipLayer>(mode, std::move(o));
}
LayerRef RandomTranslation(FactorRange height_factor, FactorRange width_factor, RandomTranslationOptions o) {
  return std::make_shared<RandomTranslationLayer>(height_factor, width_factor, std::move(o));
}
LayerRef RandomZoom(FactorRange height_factor, RandomZoomOptions o) {
  return std::make_shared<RandomZoomLayer>(height_factor, std::move(o));
}
LayerRef RandomCrop(std::int64_t height, std::int64_t width, RandomCropOptions o) {
  return std::make_shared<RandomCropLayer>(height, width, std::move(o));
}

}  // namespace mpt::layers

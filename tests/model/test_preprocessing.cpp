// Keras's preprocessing layers: Rescaling's values; the augmentation layers' identity in
// inference; flips that are exactly the reversed images, one per image and axis with
// probability 1/2; translations and zooms that are exact at whole-pixel factors, drawn per
// image within their ranges; crops that are windows of the (padded) images, one offset per
// batch as Keras; the same draws for a seed on every device; and .keras configs that load back.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;

namespace {
/// Image b of x [B, H, W, C] (host values), flipped left-right and/or upside down.
std::vector<float> image(const std::vector<float>& v, const Shape& s, std::int64_t b, bool lr, bool ud) {
  const std::int64_t H = s[1], W = s[2], C = s[3];
  std::vector<float> out;
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t w = 0; w < W; ++w)
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t hh = ud ? H - 1 - h : h, ww = lr ? W - 1 - w : w;
        out.push_back(v[static_cast<std::size_t>(((b * H + hh) * W + ww) * C + c)]);
      }
  return out;
}
}  // namespace

TEST_CASE("Rescaling: x * scale + offset in the compute dtype, integer images cast first") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    auto r = layers::Rescaling(1.0 / 255, {.offset = -0.5});
    Tensor x = Tensor::from_vector(std::vector<std::uint8_t>{0, 51, 255, 128}, {1, 2, 2, 1}, dev);
    Tensor y = r(x);
    CHECK(y.dtype() == float32);
    const auto v = y.to_vector<float>();
    CHECK(v[0] == doctest::Approx(-0.5));
    CHECK(v[1] == doctest::Approx(51.0 / 255 - 0.5));
    CHECK(v[2] == doctest::Approx(0.5));
    CHECK(r(x, {.training = true}).to_vector<float>() == v);  // the same in training
  });
  mixed_precision::set_global_policy("mixed_bfloat16");
  CHECK(layers::Rescaling(2.0)(Tensor::ones({1, 3})).dtype() == bfloat16);
  mixed_precision::set_global_policy("float32");
  CHECK_THROWS_AS(layers::Rescaling(std::nan("")), Error);
}

TEST_CASE("RandomFlip: the identity in inference; in training each image flipped or not, each way with probability 1/2") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const Shape s{64, 3, 5, 2};
    Tensor x = Tensor::random_uniform(s, 0, 1, 3, float32, dev);
    const auto xv = x.to_vector<float>();
    for (const char* mode : {"horizontal", "vertical", "horizontal_and_vertical"}) {
      CAPTURE(mode);
      auto flip = layers::RandomFlip(mode, {.seed = 7});
      CHECK(flip(x).to_vector<float>() == xv);  // inference
      Tensor y = flip(x, {.training = true});
      CHECK(y.shape() == s);
      const auto yv = y.to_vector<float>();
      const bool lr_allowed = std::string(mode) != "vertical", ud_allowed = std::string(mode) != "horizontal";
      int kinds[4] = {0, 0, 0, 0};
      for (std::int64_t b = 0; b < s[0]; ++b) {
        const std::vector<float> got(yv.begin() + b * 30, yv.begin() + (b + 1) * 30);
        int which = -1;
        for (int k = 0; k < 4 && which < 0; ++k) {
          const bool lr = k & 1, ud = k & 2;
          if ((lr && !lr_allowed) || (ud && !ud_allowed)) continue;
          if (got == image(xv, s, b, lr, ud)) which = k;
        }
        REQUIRE(which >= 0);  // exactly one of the allowed flips of its own image
        ++kinds[which];
      }
      // Each allowed kind appears (64 images: a kind of probability 1/4 is missing with
      // probability 1e-8), the others never.
      for (int k = 0; k < 4; ++k) {
        const bool allowed = (lr_allowed || !(k & 1)) && (ud_allowed || !(k & 2));
        CHECK((kinds[k] > 0) == allowed);
      }
      // The next call draws anew; a layer with the same seed repeats the first call.
      CHECK(flip(x, {.training = true}).to_vector<float>() != yv);
      CHECK(layers::RandomFlip(mode, {.seed = 7})(x, {.training = true}).to_vector<float>() == yv);
    }
  });
  CHECK_THROWS_AS(layers::RandomFlip("diagonal"), Error);
  CHECK_THROWS_AS(layers::RandomFlip()(Tensor::ones({2, 3})), Error);
}

namespace {
/// Image x [B, H, W, C] (host values) shifted by (dy, dx) whole pixels, zeros where uncovered:
/// out(y, x) = in(y - dy, x - dx).
std::vector<float> shifted(const std::vector<float>& v, const Shape& s, std::int64_t dy, std::int64_t dx) {
  const std::int64_t B = s[0], H = s[1], W = s[2], C = s[3];
  std::vector<float> out;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t y = 0; y < H; ++y)
      for (std::int64_t x = 0; x < W; ++x)
        for (std::int64_t c = 0; c < C; ++c) {
          const std::int64_t sy = y - dy, sx = x - dx;
          out.push_back(sy >= 0 && sy < H && sx >= 0 && sx < W ? v[static_cast<std::size_t>(((b * H + sy) * W + sx) * C + c)]
                                                              : 0.0f);
        }
  return out;
}

/// The window [h0, h0 + h) x [w0, w0 + w) of image b.
std::vector<float> window(const std::vector<float>& v, const Shape& s, std::int64_t b, std::int64_t h0,
                          std::int64_t w0, std::int64_t h, std::int64_t w) {
  std::vector<float> out;
  for (std::int64_t y = h0; y < h0 + h; ++y)
    for (std::int64_t x = w0; x < w0 + w; ++x)
      for (std::int64_t c = 0; c < s[3]; ++c) out.push_back(v[static_cast<std::size_t>(((b * s[1] + y) * s[2] + x) * s[3] + c)]);
  return out;
}

std::pair<float, float> min_max(const std::vector<float>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return {*lo, *hi};
}
}  // namespace

TEST_CASE("RandomTranslation: whole-pixel shifts exact, draws per image within the factors, identity in inference") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const Shape s{3, 8, 6, 2};
    const Tensor x = Tensor::random_uniform(s, 0, 1, 4, float32, dev);
    const auto xv = x.to_vector<float>();
    // Fixed factors: down 0.25 · 8 = 2 rows, left 0.5 · 6 = 3 columns, zeros uncovered.
    for (const char* interp : {"bilinear", "nearest"}) {
      auto fixed = layers::RandomTranslation({0.25, 0.25}, {-0.5, -0.5}, {.fill_mode = "constant", .interpolation = interp});
      CHECK(fixed(x).to_vector<float>() == xv);  // inference
      CHECK(fixed(x, {.training = true}).to_vector<float>() == shifted(xv, s, 2, -3));
    }
    // Random factors: every image shifted by its own draw, values within the input's range
    // (bilinear blends of reflected pixels), the same draws for the same seed on every device.
    auto t = layers::RandomTranslation(0.3, {-0.2, 0.4}, {.seed = 5});
    const auto y = t(x, {.training = true}).to_vector<float>();
    const auto [lo, hi] = min_max(xv);
    const auto [ylo, yhi] = min_max(y);
    CHECK(ylo >= lo);
    CHECK(yhi <= hi);
    CHECK(y != xv);
    const std::size_t per = static_cast<std::size_t>(8 * 6 * 2);
    CHECK(std::vector<float>(y.begin(), y.begin() + per) != std::vector<float>(y.begin() + per, y.begin() + 2 * per));
    test::PolicyDeviceScope cpu_scope("float32", Device::cpu());
    CHECK(layers::RandomTranslation(0.3, {-0.2, 0.4}, {.seed = 5})(x.to(Device::cpu()), {.training = true})
              .to_vector<float>() == y);
  });
  CHECK_THROWS_AS(layers::RandomTranslation(1.5, 0.1), Error);
  CHECK_THROWS_AS(layers::RandomTranslation(0.1, 0.1, {.fill_mode = "mirror"}), Error);  // not a layer fill mode in Keras
  CHECK_THROWS_AS(layers::RandomTranslation(0.1, 0.1, {.interpolation = "bicubic"}), Error);
  CHECK_THROWS_AS(layers::RandomTranslation(0.1, 0.1)(Tensor::ones({2, 3})), Error);
}

TEST_CASE("RandomZoom: 1 + factor about the centre, exact at zoom 2, width following height by default") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const Shape s{2, 5, 5, 1};
    const Tensor x = Tensor::random_uniform(s, 0, 1, 6, float32, dev);
    const auto xv = x.to_vector<float>();
    // Factor 1: zoom 2 (out): output (y, x) samples (2y - 2, 2x - 2), zeros outside.
    auto out = layers::RandomZoom({1.0, 1.0}, {.fill_mode = "constant"});
    CHECK(out(x).to_vector<float>() == xv);
    const auto y = out(x, {.training = true}).to_vector<float>();
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t i = 0; i < 5; ++i)
        for (std::int64_t j = 0; j < 5; ++j) {
          const std::int64_t si = 2 * i - 2, sj = 2 * j - 2;
          const float want = si >= 0 && si < 5 && sj >= 0 && sj < 5 ? xv[static_cast<std::size_t>((b * 5 + si) * 5 + sj)] : 0.0f;
          CHECK(y[static_cast<std::size_t>((b * 5 + i) * 5 + j)] == want);
        }
    // Height 0 with a width of its own: rows untouched, columns zoomed.
    auto wide = layers::RandomZoom({0.0, 0.0}, {.width_factor = layers::FactorRange(1.0, 1.0), .fill_mode = "constant"});
    const auto yw = wide(x, {.training = true}).to_vector<float>();
    CHECK(yw[1] == xv[0]);  // (0, 1) <- (0, 0)
    CHECK(yw[5 + 3] == xv[5 + 2 * 3 - 2]);
    // Random zooms stay within the input's range; the same seed repeats on every device.
    auto r = layers::RandomZoom({-0.5, 0.3}, {.seed = 9});
    const auto yr = r(x, {.training = true}).to_vector<float>();
    CHECK(min_max(yr).first >= min_max(xv).first);
    CHECK(min_max(yr).second <= min_max(xv).second);
    test::PolicyDeviceScope cpu_scope("float32", Device::cpu());
    CHECK(layers::RandomZoom({-0.5, 0.3}, {.seed = 9})(x.to(Device::cpu()), {.training = true}).to_vector<float>() == yr);
  });
  CHECK_THROWS_AS(layers::RandomZoom(-1.0), Error);  // zoom 0
  CHECK_THROWS_AS(layers::RandomZoom(0.2, {.width_factor = 2.0}), Error);
}

TEST_CASE("RandomCrop: one window per batch in training, Keras's resize otherwise; padding crops around the image") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const Shape s{3, 7, 9, 2};
    const Tensor x = Tensor::random_uniform(s, 0, 1, 8, float32, dev);
    const auto xv = x.to_vector<float>();
    auto crop = layers::RandomCrop(4, 5, {.seed = 2});
    std::set<std::pair<std::int64_t, std::int64_t>> offsets;
    for (int call = 0; call < 40; ++call) {
      const Tensor y = crop(x, {.training = true});
      REQUIRE(y.shape() == Shape{3, 4, 5, 2});
      const auto yv = y.to_vector<float>();
      const std::size_t per = 4 * 5 * 2;
      std::optional<std::pair<std::int64_t, std::int64_t>> at;
      for (std::int64_t h0 = 0; h0 <= 3 && !at; ++h0)
        for (std::int64_t w0 = 0; w0 <= 4 && !at; ++w0)
          if (std::vector<float>(yv.begin(), yv.begin() + per) == window(xv, s, 0, h0, w0, 4, 5)) at = {{h0, w0}};
      REQUIRE(at);  // a window of the first image...
      for (std::int64_t b = 1; b < 3; ++b)  // ...at the same place in every image (Keras)
        CHECK(std::vector<float>(yv.begin() + b * per, yv.begin() + (b + 1) * per) ==
              window(xv, s, b, at->first, at->second, 4, 5));
      offsets.insert(*at);
    }
    CHECK(offsets.size() >= 12);  // of the 20 offsets, drawn uniformly
    // Inference: Keras's documented centred crop to the aspect ratio, resized.
    CHECK(crop(x).to_vector<float>() == ops::resize(x, {4, 5}, {.crop_to_aspect_ratio = true}).to_vector<float>());
    CHECK(layers::RandomCrop(7, 9)(x).to_vector<float>() == xv);  // the same size: the identity
    // Padding: a window of the zero-padded image in training, the image itself in inference.
    auto padded = layers::RandomCrop(7, 9, {.seed = 4, .padding = {2, 3}});
    CHECK(padded(x).to_vector<float>() == xv);
    const auto pv = ops::zero_pad2d(x, 2, 2, 3, 3).to_vector<float>();
    const Shape ps{3, 11, 15, 2};
    bool found = false;
    const auto yp = padded(x, {.training = true}).to_vector<float>();
    for (std::int64_t h0 = 0; h0 <= 4 && !found; ++h0)
      for (std::int64_t w0 = 0; w0 <= 6 && !found; ++w0)
        found = std::vector<float>(yp.begin(), yp.begin() + 7 * 9 * 2) == window(pv, ps, 0, h0, w0, 7, 9);
    CHECK(found);
  });
  // Keras 3.15's values: RandomCrop(4, 4) in training on the 3 x 3 image 0..8 (smaller: resized).
  const Tensor small = Tensor::arange(0, 9).reshape({1, 3, 3, 1}).to(float32);
  test::check_close(layers::RandomCrop(4, 4, {.seed = 1})(small, {.training = true}),
                    {0, 0.625, 1.375, 2, 1.875, 2.5, 3.25, 3.875, 4.125, 4.75, 5.5, 6.125, 6, 6.625, 7.375, 8},
                    {1e-6, 1e-6}, "RandomCrop resize");
  CHECK_THROWS_AS(layers::RandomCrop(0, 4), Error);
  CHECK_THROWS_AS(layers::RandomCrop(4, 4, {.padding = -1}), Error);
}

TEST_CASE("Rescaling and RandomFlip save in .keras configs and load back") {
  const auto path = std::filesystem::temp_directory_path() / ("mpt_preproc_" + std::to_string(::getpid()) + ".keras");
  Sequential m({layers::Input({4, 4, 1}), layers::Rescaling(0.5, {.offset = 1.0}),
                layers::RandomFlip("horizontal", {.seed = 3}), layers::Flatten(), layers::Dense(2)});
  m.compile({.optimizer = "sgd", .loss = "mse"});
  m.save(path.string());
  auto back = load_model(path.string());
  Tensor x = Tensor::random_uniform({3, 4, 4, 1}, 0, 1, 2);
  CHECK(back->predict(x).to_vector<float>() == m.predict(x).to_vector<float>());
  const auto cfg = back->get_layer(1)->config();
  CHECK(cfg.at("mode") == "horizontal");
  CHECK(cfg.at("seed") == 3);
  CHECK(back->get_layer(0)->config().at("offset") == 1.0);
  std::filesystem::remove(path);
}

TEST_CASE("RandomTranslation, RandomZoom and RandomCrop save Keras's configs and load back, Keras's own too") {
  const auto path = std::filesystem::temp_directory_path() / ("mpt_augment_" + std::to_string(::getpid()) + ".keras");
  Sequential m({layers::Input({8, 8, 1}), layers::RandomTranslation({-0.1, 0.2}, 0.1, {.seed = 3}),
                layers::RandomZoom(0.2, {.width_factor = layers::FactorRange(-0.1, 0.3), .fill_mode = "nearest", .seed = 4}),
                layers::RandomCrop(8, 8, {.seed = 5, .padding = 2}), layers::RandomCrop(6, 6, {.seed = 6}),
                layers::Flatten(), layers::Dense(2)});
  m.compile({.optimizer = "sgd", .loss = "mse"});
  m.save(path.string());
  auto back = load_model(path.string());
  const Tensor x = Tensor::random_uniform({3, 8, 8, 1}, 0, 1, 2);
  CHECK(back->predict(x).to_vector<float>() == m.predict(x).to_vector<float>());
  // The same draws after loading: the seeds travel in the config.
  CHECK(back->call(x, true).to_vector<float>() == m.call(x, true).to_vector<float>());
  const auto t = back->get_layer(0)->config();
  CHECK(t.at("height_factor") == nlohmann::json::array({-0.1, 0.2}));
  CHECK(t.at("width_factor") == 0.1);
  CHECK(t.at("fill_mode") == "reflect");
  CHECK(t.at("interpolation") == "bilinear");
  const auto z = back->get_layer(1)->config();
  CHECK(z.at("width_factor") == nlohmann::json::array({-0.1, 0.3}));
  CHECK(z.at("fill_mode") == "nearest");
  CHECK(back->get_layer(2)->config().at("padding") == nlohmann::json::array({2, 2}));
  CHECK_FALSE(back->get_layer(3)->config().contains("padding"));  // Keras has no such key
  std::filesystem::remove(path);
  // Configs as Keras 3.15 writes them (seed None, width_factor None, factors as lists).
  const auto from_keras = [](const std::string& cls, const nlohmann::json& cfg) {
    return layer_from_config(LayerConfig(cls, "aug", mixed_precision::Policy("float32"), true, cfg));
  };
  auto kz = from_keras("RandomZoom", {{"height_factor", {-0.2, 0.1}}, {"width_factor", nullptr}, {"fill_mode", "reflect"},
                                      {"interpolation", "bilinear"}, {"seed", nullptr}, {"fill_value", 0.0},
                                      {"data_format", "channels_last"}});
  CHECK(kz->config().at("height_factor") == nlohmann::json::array({-0.2, 0.1}));
  CHECK(kz->config().at("width_factor").is_null());
  auto kc = from_keras("RandomCrop", {{"height", 2}, {"width", 3}, {"seed", 7}, {"data_format", "channels_last"}});
  CHECK(kc(Tensor::ones({1, 4, 4, 1}), {.training = true}).shape() == Shape{1, 2, 3, 1});
  CHECK_THROWS_AS(from_keras("RandomTranslation", {{"height_factor", "a"}, {"width_factor", 0.1}}), Error);
  CHECK_THROWS_AS(from_keras("RandomCrop", {{"height", 2}, {"width", 3}, {"data_format", "channels_first"}}), Error);
}

// Rescaling and RandomFlip (Keras's preprocessing layers): values, the identity in inference,
// flips that are exactly the reversed images, one per image and axis with probability 1/2, the
// same for a seed on every device, and .keras configs that load back.
#include <unistd.h>

#include <filesystem>

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

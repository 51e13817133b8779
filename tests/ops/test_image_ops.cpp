// Image resampling ops (keras.ops.image.affine_transform and resize): against Keras 3.15's
// values on the same inputs (tests/interop/record_keras_image.py), against a float64 reference
// written here from the definition (projective transforms, every dtype), the fill modes on
// hand-worked rows, on every device; no gradient; bad arguments refused by name.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.hpp"

using namespace mpt;

namespace {

const nlohmann::json& keras_image() {
  static const nlohmann::json j = [] {
    std::ifstream in(test::test_data("keras_image.json"));
    REQUIRE_MESSAGE(in.good(), "missing ", test::test_data("keras_image.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

std::vector<double> doubles(const nlohmann::json& j) { return j.get<std::vector<double>>(); }

/// Keras's index fixers, written from keras/src/backend/torch/image.py.
std::int64_t fixed(std::int64_t i, std::int64_t n, const std::string& mode) {
  auto pymod = [](std::int64_t a, std::int64_t m) { return ((a % m) + m) % m; };
  auto mirror = [&](std::int64_t k, std::int64_t size) -> std::int64_t {
    if (size == 1) return 0;
    const std::int64_t s = size - 1;
    return std::abs(pymod(k + s, 2 * s) - s);
  };
  if (mode == "wrap") return pymod(i, n);
  if (mode == "mirror") return mirror(i, n);
  if (mode == "reflect") return (mirror(2 * i + 1, 2 * n + 1) - 1) / 2;
  return std::clamp<std::int64_t>(i, 0, n - 1);
}

/// The float64 reference of affine_transform: map_coordinates of order 0 or 1 at the
/// (projectively divided) coordinates of every output pixel.
std::vector<double> reference(const std::vector<double>& img, const Shape& s, const std::vector<double>& t,
                              const std::string& interp, const std::string& mode, double fill) {
  const std::int64_t B = s[0], H = s[1], W = s[2], C = s[3];
  std::vector<double> out;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t y = 0; y < H; ++y)
      for (std::int64_t x = 0; x < W; ++x)
        for (std::int64_t c = 0; c < C; ++c) {
          const double* r = &t[static_cast<std::size_t>(b * 8)];
          const double k = r[6] * x + r[7] * y + 1;
          const double sx = (r[0] * x + r[1] * y + r[2]) / k, sy = (r[3] * x + r[4] * y + r[5]) / k;
          std::vector<std::pair<std::int64_t, double>> ny, nx;
          if (interp == "nearest") {
            ny = {{static_cast<std::int64_t>(std::nearbyint(sy)), 1.0}};
            nx = {{static_cast<std::int64_t>(std::nearbyint(sx)), 1.0}};
          } else {
            const double fy = std::floor(sy), fx = std::floor(sx);
            ny = {{static_cast<std::int64_t>(fy), 1 - (sy - fy)}, {static_cast<std::int64_t>(fy) + 1, sy - fy}};
            nx = {{static_cast<std::int64_t>(fx), 1 - (sx - fx)}, {static_cast<std::int64_t>(fx) + 1, sx - fx}};
          }
          double v = 0;
          for (auto [iy, wy] : ny)
            for (auto [ix, wx] : nx) {
              const bool inside = mode != "constant" || (iy >= 0 && iy < H && ix >= 0 && ix < W);
              const double px = inside ? img[static_cast<std::size_t>(
                                             ((b * H + fixed(iy, H, mode)) * W + fixed(ix, W, mode)) * C + c)]
                                       : fill;
              v += wy * wx * px;
            }
          out.push_back(v);
        }
  return out;
}

}  // namespace

TEST_CASE("affine_transform matches Keras 3.15 in both interpolations and every fill mode") {
  const auto& j = keras_image();
  const Shape s = j.at("images_shape").get<Shape>();
  const std::vector<double> img = doubles(j.at("images"));
  test::for_each_device([&](Device dev) {
    const Tensor x = Tensor::from_vector(img, s, dev).to(float32);
    for (const auto& c : j.at("affine")) {
      const std::string what = c.at("name").get<std::string>() + " " + c.at("interpolation").get<std::string>() +
                               " " + c.at("fill_mode").get<std::string>();
      const Tensor t = Tensor::from_vector(doubles(c.at("transform")), {s[0], 8}, dev).to(float32);
      const Tensor y = ops::affine_transform(x, t,
                                             {.interpolation = c.at("interpolation"),
                                              .fill_mode = c.at("fill_mode"),
                                              .fill_value = c.at("fill_value").get<double>()});
      CHECK(y.shape() == s);
      CHECK(y.dtype() == float32);
      test::check_close(y, doubles(c.at("output")), {1e-5, 1e-5}, what);
    }
  });
}

TEST_CASE("resize matches Keras 3.15: bilinear, half-pixel centres, with and without crop_to_aspect_ratio") {
  const auto& j = keras_image();
  const Shape s = j.at("images_shape").get<Shape>();
  test::for_each_device([&](Device dev) {
    const Tensor x = Tensor::from_vector(doubles(j.at("images")), s, dev).to(float32);
    for (const auto& c : j.at("resize")) {
      const auto size = c.at("size").get<std::vector<std::int64_t>>();
      const bool crop = c.at("crop_to_aspect_ratio").get<bool>();
      const Tensor y = ops::resize(x, {size[0], size[1]}, {.crop_to_aspect_ratio = crop});
      CHECK(y.shape() == Shape{s[0], size[0], size[1], s[3]});
      test::check_close(y, doubles(c.at("output")), {1e-5, 1e-5},
                        "resize to " + std::to_string(size[0]) + "x" + std::to_string(size[1]) + (crop ? " cropped" : ""));
    }
    // The same size is the identity, bit for bit; one image [H, W, C] works unbatched.
    CHECK(ops::resize(x, {s[1], s[2]}).to_vector<float>() == x.to_vector<float>());
    const Tensor one = ops::slice(x, 0, 1, 2).reshape({s[1], s[2], s[3]});
    CHECK(ops::resize(one, {3, 4}).shape() == Shape{3, 4, s[3]});
    CHECK(ops::resize(one, {3, 4}).to_vector<float>() ==
          ops::slice(ops::resize(x, {3, 4}), 0, 1, 2).to_vector<float>());
  });
}

TEST_CASE("affine_transform: projective transforms and every dtype against the float64 reference") {
  const Shape s{2, 6, 5, 3};
  const std::vector<double> t{0.9, -0.3, 1.2, 0.25, 1.1, -0.8, 0.03, -0.02,  // projective
                              1.3, 0.0, -1.65, 0.0, 0.7, 0.9, 0.0, 0.0};     // scale + translation (no .5 ties)
  test::for_each_device([&](Device dev) {
    for (DType d : test::float_dtypes()) {
      const Tensor x = test::random(s, d, dev, 11);
      const std::vector<double> xv = x.to_vector<double>();  // the values as rounded to d
      const Tensor tt = Tensor::from_vector(t, {2, 8}, dev);
      for (const char* interp : {"bilinear", "nearest"})
        for (const char* mode : {"constant", "nearest", "wrap", "mirror", "reflect"}) {
          const Tensor y = ops::affine_transform(x, tt, {.interpolation = interp, .fill_mode = mode, .fill_value = -0.25});
          CHECK(y.dtype() == d);
          test::check_close(y, reference(xv, s, t, interp, mode, -0.25), test::tolerance(d),
                            to_string(d) + " " + interp + " " + mode);
        }
    }
  });
}

TEST_CASE("affine_transform fill modes on a row, worked by hand: a b c d shifted three pixels") {
  // Output x samples the input at x - 3 (a2 = -3): sources -3, -2, -1, 0, then 1, 2, 3 past the
  // row's end at a2 = +3.
  test::for_each_device([](Device dev) {
    const Tensor row = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {1, 1, 4, 1}, dev);
    auto shifted = [&](double a2, const char* mode) {
      const Tensor t = Tensor::from_vector(std::vector<float>{1, 0, static_cast<float>(a2), 0, 1, 0, 0, 0}, {8}, dev);
      return ops::affine_transform(row, t, {.fill_mode = mode, .fill_value = 9}).to_vector<float>();
    };
    CHECK(shifted(-3, "constant") == std::vector<float>{9, 9, 9, 1});
    CHECK(shifted(-3, "nearest") == std::vector<float>{1, 1, 1, 1});
    CHECK(shifted(-3, "wrap") == std::vector<float>{2, 3, 4, 1});
    CHECK(shifted(-3, "mirror") == std::vector<float>{4, 3, 2, 1});   // d c b | a b c d
    CHECK(shifted(-3, "reflect") == std::vector<float>{3, 2, 1, 1});  // c b a | a b c d
    CHECK(shifted(3, "reflect") == std::vector<float>{4, 4, 3, 2});   // a b c d | d c b
    CHECK(shifted(3, "mirror") == std::vector<float>{4, 3, 2, 1});    // a b c d | c b a
    CHECK(shifted(0, "reflect") == std::vector<float>{1, 2, 3, 4});   // the identity, exactly
    // Half a pixel: the mean of neighbours; with constant fill the outside neighbour is the fill.
    CHECK(shifted(-0.5, "constant") == std::vector<float>{5, 1.5, 2.5, 3.5});
  });
}

TEST_CASE("affine_transform and resize carry no gradient and refuse bad arguments by name") {
  Tensor x = Tensor::random_uniform({2, 4, 4, 1}, 0, 1, 1);
  Tensor t = Tensor::from_vector(std::vector<float>{1, 0, 0.5, 0, 1, 0, 0, 0}, {8});
  {
    GradientTape tape;
    tape.watch(x);
    CHECK_FALSE(ops::affine_transform(x, t).requires_grad());
    CHECK_FALSE(ops::resize(x, {2, 2}).requires_grad());
  }
  auto msg = [](const std::function<void()>& f) { return test::error_of(f); };
  CHECK(test::contains(msg([&] { ops::affine_transform(x, t, {.interpolation = "bicubic"}); }), "interpolation"));
  CHECK(test::contains(msg([&] { ops::affine_transform(x, t, {.fill_mode = "edge"}); }), "fill_mode"));
  CHECK(test::contains(msg([&] { ops::affine_transform(x, Tensor::ones({3, 8})); }), "[8], [1, 8] or [batch, 8]"));
  CHECK(test::contains(msg([&] { ops::affine_transform(x, Tensor::ones({2, 6})); }), "transform"));
  CHECK(test::contains(msg([&] { ops::affine_transform(Tensor::ones({4, 4}), t); }), "affine_transform: images"));
  CHECK(test::contains(msg([&] { ops::affine_transform(x.to(int32), t); }), "affine_transform"));
  CHECK(test::contains(msg([&] { ops::resize(x, {0, 3}); }), "resize: size must be positive"));
  CHECK(test::contains(msg([&] { ops::resize(x, {2, 2}, {.interpolation = "nearest"}); }), "resize: interpolation"));
  // Non-finite coordinates give NaN or the fill, never a read outside the image.
  const Tensor bad = Tensor::from_vector(std::vector<float>{std::nanf(""), 0, 0, 0, 1e30f, 0, 0, 0}, {8});
  for (const char* mode : {"constant", "nearest", "wrap", "mirror", "reflect"})
    CHECK(ops::affine_transform(x, bad, {.fill_mode = mode}).shape() == x.shape());
}

// Losses against host references computed in double with std::log, by object and by name,
// under 16-bit predictions, their gradients, and their error messages. Huber, KLDivergence,
// LogCosh and CosineSimilarity against Keras 3's own values, recorded by
// tests/interop/record_keras_losses.py into tests/data/keras_losses.json.
#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;  // check_close, for_each_device, random, tolerance, ...

namespace {

// The clip bounds as Keras has them in float32: 1 - 1e-7 rounds to 1 - 2^-23.
const double kLo = static_cast<double>(1e-7f), kHi = static_cast<double>(1.0f - 1e-7f);
constexpr std::int64_t kRows = 4, kClasses = 3;

// Hand-made logits and probabilities (rows of 3 classes) and their sparse labels.
const std::vector<double> kLogits = {2.0, 1.0, 0.1, 0.5, 2.5, -1.0, -0.3, 0.2, 0.8, 1.5, -0.5, 0.0};
// Row 3 does not sum to 1 (normalised first); row 4 gives the true class probability 0 (clipped).
const std::vector<double> kProbs = {0.7, 0.2, 0.1, 0.1, 0.8, 0.1, 0.4, 0.6, 1.0, 0.5, 0.0, 0.5};
const std::vector<std::int32_t> kLabels = {0, 1, 2, 1};

std::vector<double> one_hot(const std::vector<std::int32_t>& labels, std::int64_t classes) {
  std::vector<double> y(labels.size() * classes, 0.0);
  for (std::size_t i = 0; i < labels.size(); ++i) y[i * classes + labels[i]] = 1.0;
  return y;
}

/// -sum(y * log q) per row, q = softmax(x) or the normalised, clipped probabilities.
std::vector<double> ref_crossentropy(const std::vector<double>& x, const std::vector<double>& y,
                                     std::int64_t classes, bool from_logits) {
  const std::size_t rows = x.size() / classes;
  std::vector<double> out(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const double* xr = &x[r * classes];
    const double* yr = &y[r * classes];
    std::vector<double> logq(classes);
    if (from_logits) {
      double m = *std::max_element(xr, xr + classes), s = 0;
      for (std::int64_t i = 0; i < classes; ++i) s += std::exp(xr[i] - m);
      for (std::int64_t i = 0; i < classes; ++i) logq[i] = xr[i] - m - std::log(s);
    } else {
      double s = 0;
      for (std::int64_t i = 0; i < classes; ++i) s += xr[i];
      for (std::int64_t i = 0; i < classes; ++i) logq[i] = std::log(std::clamp(xr[i] / s, kLo, kHi));
    }
    double l = 0;
    for (std::int64_t i = 0; i < classes; ++i) l -= yr[i] * logq[i];
    out[r] = l;
  }
  return out;
}

/// Binary crossentropy averaged over the last axis of `width` elements.
std::vector<double> ref_binary(const std::vector<double>& x, std::vector<double> z, std::int64_t width,
                               bool from_logits, double smoothing = 0.0) {
  for (auto& v : z) v = v * (1 - smoothing) + 0.5 * smoothing;
  std::vector<double> out(x.size() / width, 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    double l;
    if (from_logits) {
      l = std::max(x[i], 0.0) - x[i] * z[i] + std::log1p(std::exp(-std::abs(x[i])));
    } else {
      double p = std::clamp(x[i], kLo, kHi);
      l = -(z[i] * std::log(p) + (1 - z[i]) * std::log(1 - p));
    }
    out[i / width] += l / static_cast<double>(width);
  }
  return out;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

Tensor f32(const std::vector<double>& v, const Shape& s, Device d) {
  return Tensor::from_vector(v, s, d).to(float32);
}

/// The per-example values and the scalar mean of `loss`, both checked against `expected`.
void check_loss(const losses::Loss& loss, const Tensor& y_true, const Tensor& y_pred,
                const std::vector<double>& expected, const std::string& what) {
  Tensor per = loss.call(y_true, y_pred);
  CHECK(per.dtype() == float32);
  check_close(per, expected, tolerance(float32), what + " per example");
  Tensor l = loss(y_true, y_pred);
  CHECK(l.dtype() == float32);
  CHECK(l.dim() == 0);
  check_close(l, {mean_of(expected)}, tolerance(float32), what + " mean");
}

}  // namespace

TEST_CASE("sparse_categorical_crossentropy from logits and probabilities") {
  for_each_device([](Device dev) {
    const auto y = one_hot(kLabels, kClasses);
    for (bool logits : {true, false}) {
      CAPTURE(logits);
      const auto& x = logits ? kLogits : kProbs;
      Tensor y_pred = f32(x, {kRows, kClasses}, dev);
      const auto expected = ref_crossentropy(x, y, kClasses, logits);
      losses::SparseCategoricalCrossentropy loss({.from_logits = logits});
      CHECK(loss.name() == "sparse_categorical_crossentropy");
      CHECK(loss.from_logits() == logits);
      Tensor labels = Tensor::from_vector(kLabels, {kRows}, dev);
      check_loss(loss, labels, y_pred, expected, "int32 [N]");
      check_loss(loss, labels.to(int64).reshape({kRows, 1}), y_pred, expected, "int64 [N,1]");
      // Float labels holding class ids are cast to int, as Keras does.
      check_loss(loss, labels.to(float32), y_pred, expected, "float32 [N]");
      check_loss(loss, labels.to(float32).reshape({kRows, 1}), y_pred, expected, "float32 [N,1]");
    }
    // By name: from_logits = false, Keras's default.
    auto by_name = losses::get("sparse_categorical_crossentropy");
    REQUIRE(by_name);
    check_close(by_name->operator()(Tensor::from_vector(kLabels, {kRows}, dev), f32(kProbs, {kRows, kClasses}, dev)),
                {mean_of(ref_crossentropy(kProbs, y, kClasses, false))}, tolerance(float32), "by name");
    // The clipped row: -log(1e-7).
    CHECK(ref_crossentropy(kProbs, y, kClasses, false)[3] == doctest::Approx(-std::log(kLo)));
  });
}

TEST_CASE("categorical_crossentropy from logits, probabilities and with label smoothing") {
  for_each_device([](Device dev) {
    const auto y = one_hot(kLabels, kClasses);
    Tensor y_true = f32(y, {kRows, kClasses}, dev);
    for (bool logits : {true, false}) {
      for (double ls : {0.0, 0.1, 0.3}) {
        CAPTURE(logits);
        CAPTURE(ls);
        const auto& x = logits ? kLogits : kProbs;
        std::vector<double> smoothed = y;
        for (auto& v : smoothed) v = v * (1 - ls) + ls / kClasses;
        losses::CategoricalCrossentropy loss({.from_logits = logits, .label_smoothing = ls});
        CHECK(loss.name() == "categorical_crossentropy");
        check_loss(loss, y_true, f32(x, {kRows, kClasses}, dev), ref_crossentropy(x, smoothed, kClasses, logits),
                   "categorical");
      }
    }
    // Integer one-hot labels are distributions too, not class ids.
    check_loss(losses::CategoricalCrossentropy({.from_logits = true}), y_true.to(int32),
               f32(kLogits, {kRows, kClasses}, dev), ref_crossentropy(kLogits, y, kClasses, true), "int one-hot");
    // A soft target distribution.
    const std::vector<double> soft = {0.5, 0.5, 0, 0.2, 0.3, 0.5, 0, 0, 1, 0.1, 0.8, 0.1};
    check_loss(losses::CategoricalCrossentropy({.from_logits = true}), f32(soft, {kRows, kClasses}, dev),
               f32(kLogits, {kRows, kClasses}, dev), ref_crossentropy(kLogits, soft, kClasses, true), "soft");
    auto by_name = losses::get("categorical_crossentropy");
    check_close(by_name->operator()(y_true, f32(kProbs, {kRows, kClasses}, dev)),
                {mean_of(ref_crossentropy(kProbs, y, kClasses, false))}, tolerance(float32), "by name");
  });
}

TEST_CASE("binary_crossentropy from logits, probabilities and with label smoothing") {
  for_each_device([](Device dev) {
    // Two outputs per example; logits include 0 and large magnitudes (the stable form).
    const std::vector<double> logits = {0.0, 2.0, -1.5, 30.0, -30.0, 0.7, 3.0, -0.2};
    const std::vector<double> probs = {0.9, 0.2, 0.0, 1.0, 0.5, 0.3, 0.999, 0.01};
    const std::vector<double> z = {1, 0, 1, 1, 1, 0, 0, 1};
    Tensor y_true = f32(z, {4, 2}, dev);
    for (bool from_logits : {true, false}) {
      for (double ls : {0.0, 0.2}) {
        CAPTURE(from_logits);
        CAPTURE(ls);
        const auto& x = from_logits ? logits : probs;
        losses::BinaryCrossentropy loss({.from_logits = from_logits, .label_smoothing = ls});
        CHECK(loss.name() == "binary_crossentropy");
        check_loss(loss, y_true, f32(x, {4, 2}, dev), ref_binary(x, z, 2, from_logits, ls), "binary");
      }
    }
    // The clip: p = 0 with z = 1 costs -log(1e-7).
    CHECK(ref_binary({0.0}, {1.0}, 1, false)[0] == doctest::Approx(-std::log(kLo)));
    // Labels [N] against a single-unit output [N, 1] (Keras expands the labels), int labels.
    const std::vector<double> x1 = {0.8, 0.3, 0.6, 0.1};
    const std::vector<double> z1 = {1, 0, 0, 1};
    Tensor labels = Tensor::from_vector<std::int32_t>({1, 0, 0, 1}, {4}, dev);
    for (const char* name : {"binary_crossentropy", "bce", "BinaryCrossentropy"}) {
      CAPTURE(name);
      auto loss = losses::get(name);
      check_loss(*loss, labels, f32(x1, {4, 1}, dev), ref_binary(x1, z1, 1, false), name);
    }
  });
}

TEST_CASE("mean_squared_error and mean_absolute_error average the last axis") {
  for_each_device([](Device dev) {
    const std::vector<double> t = {1.0, 2.0, 3.0, -1.0, 0.5, 0.0};
    const std::vector<double> p = {1.5, 1.0, 3.0, 1.0, -0.5, 0.25};
    std::vector<double> mse(2, 0.0), mae(2, 0.0);
    for (std::size_t i = 0; i < t.size(); ++i) {
      mse[i / 3] += (t[i] - p[i]) * (t[i] - p[i]) / 3;
      mae[i / 3] += std::abs(t[i] - p[i]) / 3;
    }
    CHECK(mse[0] == doctest::Approx((0.25 + 1.0 + 0.0) / 3));
    Tensor yt = f32(t, {2, 3}, dev), yp = f32(p, {2, 3}, dev);
    check_loss(losses::MeanSquaredError(), yt, yp, mse, "mse object");
    check_loss(losses::MeanAbsoluteError(), yt, yp, mae, "mae object");
    for (const char* name : {"mean_squared_error", "mse", "MSE", "MeanSquaredError"})
      check_loss(*losses::get(name), yt, yp, mse, name);
    for (const char* name : {"mean_absolute_error", "mae", "MAE", "MeanAbsoluteError"})
      check_loss(*losses::get(name), yt, yp, mae, name);
    CHECK(losses::get("mse")->name() == "mean_squared_error");
    // Labels [N] against [N, 1]: one value per example, no broadcasting to [N, N].
    Tensor per = losses::MeanSquaredError().call(f32({1, 2, 3}, {3}, dev), f32({1.5, 2, 1}, {3, 1}, dev));
    CHECK(per.shape() == Shape{3});
    check_close(per, {0.25, 0.0, 4.0}, tolerance(float32), "mse [N] vs [N,1]");
  });
}

TEST_CASE("16-bit predictions give float32 losses close to the float32 ones") {
  const auto y = one_hot(kLabels, kClasses);
  struct Case {
    std::string what;
    std::shared_ptr<losses::Loss> loss;
    Tensor y_true;
    std::vector<double> x;
    Shape shape;
  };
  const std::vector<double> bin_x = {0.9, 0.2, 0.1, 0.7, 0.5, 0.3, 0.95, 0.05};
  const std::vector<Case> cases = {
      {"scce logits", std::make_shared<losses::SparseCategoricalCrossentropy>(losses::CrossentropyOptions{true}),
       Tensor::from_vector(kLabels, {kRows}), kLogits, {kRows, kClasses}},
      {"scce probs", std::make_shared<losses::SparseCategoricalCrossentropy>(), Tensor::from_vector(kLabels, {kRows}),
       {0.7, 0.2, 0.1, 0.1, 0.8, 0.1, 0.2, 0.3, 0.5, 0.3, 0.4, 0.3}, {kRows, kClasses}},
      {"cce logits smoothed",
       std::make_shared<losses::CategoricalCrossentropy>(losses::CrossentropyOptions{true, 0.1}),
       f32(y, {kRows, kClasses}, default_device()), kLogits, {kRows, kClasses}},
      {"cce probs", std::make_shared<losses::CategoricalCrossentropy>(), f32(y, {kRows, kClasses}, default_device()),
       {0.7, 0.2, 0.1, 0.1, 0.8, 0.1, 0.2, 0.3, 0.5, 0.3, 0.4, 0.3}, {kRows, kClasses}},
      {"bce logits", std::make_shared<losses::BinaryCrossentropy>(losses::CrossentropyOptions{true}),
       f32({1, 0, 1, 1, 1, 0, 0, 1}, {4, 2}, default_device()), {0.0, 2.0, -1.5, 3.0, -3.0, 0.7, 3.0, -0.2}, {4, 2}},
      {"bce probs", std::make_shared<losses::BinaryCrossentropy>(),
       f32({1, 0, 1, 1, 1, 0, 0, 1}, {4, 2}, default_device()), bin_x, {4, 2}},
      {"mse", std::make_shared<losses::MeanSquaredError>(), f32({1, 2, 3, -1, 0.5, 0}, {2, 3}, default_device()),
       {1.5, 1.0, 3.0, 1.0, -0.5, 0.25}, {2, 3}},
      {"mae", std::make_shared<losses::MeanAbsoluteError>(), f32({1, 2, 3, -1, 0.5, 0}, {2, 3}, default_device()),
       {1.5, 1.0, 3.0, 1.0, -0.5, 0.25}, {2, 3}},
  };
  for (const auto& c : cases) {
    const double reference = (*c.loss)(c.y_true, f32(c.x, c.shape, default_device())).item();
    for (DType d : {float16, bfloat16}) {
      CAPTURE(c.what);
      CAPTURE(to_string(d));
      Tensor y_pred = Tensor::from_vector(c.x, c.shape).to(d);
      Tensor per = c.loss->call(c.y_true, y_pred);
      CHECK(per.dtype() == float32);
      Tensor l = (*c.loss)(c.y_true, y_pred);
      CHECK(l.dtype() == float32);
      check_close(l, {reference}, tolerance(d), c.what + " in " + to_string(d));
    }
  }
}

TEST_CASE("loss gradients w.r.t. y_pred match finite differences in float64") {
  for_each_device([](Device dev) {
    Tensor labels = Tensor::from_vector(kLabels, {kRows}, dev);
    Tensor onehot = Tensor::from_vector(one_hot(kLabels, kClasses), {kRows, kClasses}, dev);
    Tensor logits = Tensor::from_vector(kLogits, {kRows, kClasses}, dev);
    // Positive and not normalised, away from the clip bounds.
    Tensor probs = Tensor::random_uniform({kRows, kClasses}, 0.1, 1.0, 7, float64, dev);
    Tensor bin_t = Tensor::from_vector<double>({1, 0, 1, 1, 1, 0, 0, 1}, {4, 2}, dev);
    Tensor bin_logits = Tensor::from_vector<double>({0.0, 2.0, -1.5, 3.0, -3.0, 0.7, 3.0, -0.2}, {4, 2}, dev);
    Tensor bin_probs = Tensor::random_uniform({4, 2}, 0.05, 0.95, 8, float64, dev);
    struct Case {
      std::string what;
      std::shared_ptr<losses::Loss> loss;
      Tensor y_true, y_pred;
    };
    using losses::CrossentropyOptions;
    const std::vector<Case> cases = {
        {"scce logits", std::make_shared<losses::SparseCategoricalCrossentropy>(CrossentropyOptions{true}), labels,
         logits},
        {"scce probs", std::make_shared<losses::SparseCategoricalCrossentropy>(), labels, probs},
        {"cce logits", std::make_shared<losses::CategoricalCrossentropy>(CrossentropyOptions{true, 0.1}), onehot,
         logits},
        {"cce probs", std::make_shared<losses::CategoricalCrossentropy>(CrossentropyOptions{false, 0.1}), onehot,
         probs},
        {"bce logits", std::make_shared<losses::BinaryCrossentropy>(CrossentropyOptions{true, 0.2}), bin_t,
         bin_logits},
        {"bce probs", std::make_shared<losses::BinaryCrossentropy>(CrossentropyOptions{false, 0.2}), bin_t,
         bin_probs},
        {"mse", std::make_shared<losses::MeanSquaredError>(), bin_t, bin_logits},
        {"mae", std::make_shared<losses::MeanAbsoluteError>(), bin_t, bin_logits + 0.1},
    };
    for (const auto& c : cases) {
      CHECK(c.loss->operator()(c.y_true, c.y_pred).dtype() == float64);
      check_gradients(c.what, [&](const std::vector<Tensor>& in) { return (*c.loss)(c.y_true, in[0]); },
                      {c.y_pred});
    }
    // The stable binary form has the right slope at logit 0: (sigmoid(0) - z) / n.
    GradientTape tape;
    Tensor x = Tensor::from_vector<double>({0.0, 0.0}, {2, 1}, dev);
    tape.watch(x);
    Tensor l = losses::BinaryCrossentropy({.from_logits = true})(
        Tensor::from_vector<double>({1.0, 0.0}, {2, 1}, dev), x);
    check_close(tape.gradient(l, {x})[0], {-0.25, 0.25}, tolerance(float64), "bce slope at 0");
  });
}

TEST_CASE("gradients of 16-bit predictions come back in their dtype") {
  const auto y = one_hot(kLabels, kClasses);
  for (DType d : {float16, bfloat16}) {
    CAPTURE(to_string(d));
    std::vector<std::pair<std::string, std::shared_ptr<losses::Loss>>> cases = {
        {"scce", std::make_shared<losses::SparseCategoricalCrossentropy>(losses::CrossentropyOptions{true})},
        {"cce", std::make_shared<losses::CategoricalCrossentropy>(losses::CrossentropyOptions{true})},
        {"bce", std::make_shared<losses::BinaryCrossentropy>(losses::CrossentropyOptions{true})},
        {"mse", std::make_shared<losses::MeanSquaredError>()},
        {"mae", std::make_shared<losses::MeanAbsoluteError>()}};
    for (auto& c : cases) {  // no structured binding: clang 14 cannot capture one
      const auto& what = c.first;
      auto& loss = c.second;
      CAPTURE(what);
      Tensor y_true = what == "scce" ? Tensor::from_vector(kLabels, {kRows}) : f32(y, {kRows, kClasses}, default_device());
      auto grad_in = [&](DType dt) {
        Tensor x = Tensor::from_vector(kLogits, {kRows, kClasses}).to(dt);
        GradientTape tape;
        tape.watch(x);
        Tensor l = (*loss)(y_true, x);
        CHECK(l.dtype() == float32);
        return tape.gradient(l, {x})[0];
      };
      Tensor g16 = grad_in(d);
      REQUIRE(g16.defined());
      CHECK(g16.dtype() == d);
      // Against the float32 gradient at the same (rounded) points.
      Tensor x32 = Tensor::from_vector(kLogits, {kRows, kClasses}).to(d).to(float32);
      GradientTape tape;
      tape.watch(x32);
      Tensor g32 = tape.gradient((*loss)(y_true, x32), {x32})[0];
      check_close(g16, g32.to_vector<double>(), tolerance(d), what + " gradient");
    }
  }
}

TEST_CASE("loss errors name the loss") {
  Tensor logits = Tensor::from_vector(kLogits, {kRows, kClasses}).to(float32);
  // Unknown names list the valid ones.
  std::string msg = error_of([] { losses::get("sparse_crossentropy"); });
  CHECK(msg.find("sparse_crossentropy") != std::string::npos);
  CHECK(msg.find("valid names") != std::string::npos);
  CHECK(msg.find("sparse_categorical_crossentropy") != std::string::npos);
  CHECK(msg.find("mean_absolute_error") != std::string::npos);
  CHECK_THROWS_AS(losses::LossArg("nope").get(), Error);

  // Batch sizes differ: the loss and both shapes are named.
  msg = error_of([&] { losses::SparseCategoricalCrossentropy()(Tensor::from_vector<std::int32_t>({0, 1, 2}), logits); });
  CHECK(msg.find("sparse_categorical_crossentropy") != std::string::npos);
  CHECK(msg.find("(3,)") != std::string::npos);
  CHECK(msg.find("(4, 3)") != std::string::npos);
  msg = error_of([&] { losses::MeanSquaredError()(Tensor::zeros({5, 3}), logits); });
  CHECK(msg.find("mean_squared_error") != std::string::npos);
  CHECK(msg.find("(5, 3)") != std::string::npos);

  // Labels out of range, above and below.
  for (std::int32_t bad : {3, -1}) {
    CAPTURE(bad);
    Tensor labels = Tensor::from_vector<std::int32_t>({0, 1, bad, 1}, {kRows});
    msg = error_of([&] { losses::SparseCategoricalCrossentropy({.from_logits = true})(labels, logits); });
    CHECK(msg.find("sparse_categorical_crossentropy") != std::string::npos);
    CHECK(msg.find("out of range") != std::string::npos);
    msg = error_of([&] { losses::SparseCategoricalCrossentropy({.from_logits = true}).call(labels, logits); });
    CHECK(msg.find("sparse_categorical_crossentropy") != std::string::npos);
    msg = error_of([&] { losses::SparseCategoricalCrossentropy()(labels.to(float32), logits); });
    CHECK(msg.find("out of range") != std::string::npos);
  }

  // Shapes that do not fit.
  msg = error_of([&] { losses::CategoricalCrossentropy()(Tensor::zeros({kRows, 4}), logits); });
  CHECK(msg.find("categorical_crossentropy") != std::string::npos);
  CHECK(msg.find("(4, 4)") != std::string::npos);
  msg = error_of([&] { losses::SparseCategoricalCrossentropy()(Tensor::zeros({kRows, 2}, int32), logits); });
  CHECK(msg.find("sparse_categorical_crossentropy") != std::string::npos);
  msg = error_of([&] { losses::BinaryCrossentropy()(Tensor::zeros({kRows, 2}), logits); });
  CHECK(msg.find("binary_crossentropy") != std::string::npos);

  // Options out of range.
  CHECK_THROWS_AS(losses::CategoricalCrossentropy({.label_smoothing = 1.5}), Error);
  CHECK_THROWS_AS(losses::BinaryCrossentropy({.label_smoothing = -0.1}), Error);
  CHECK_THROWS_AS(losses::SparseCategoricalCrossentropy({.label_smoothing = 0.1}), Error);

  // NaN inputs are fit's business, not the loss's.
  Tensor nan_pred = Tensor::full({2, 3}, std::nan(""));
  Tensor nan_loss;
  CHECK_NOTHROW(nan_loss = losses::MeanSquaredError()(Tensor::zeros({2, 3}), nan_pred));
  CHECK(std::isnan(nan_loss.item()));
}

TEST_CASE("LossArg resolves names and objects") {
  CHECK(losses::LossArg().empty());
  CHECK(losses::LossArg().get() == nullptr);
  losses::LossArg by_name("categorical_crossentropy");
  CHECK_FALSE(by_name.empty());
  CHECK(dynamic_cast<losses::CategoricalCrossentropy*>(by_name.get().get()) != nullptr);
  losses::LossArg by_object(losses::SparseCategoricalCrossentropy({.from_logits = true}));
  auto scce = std::dynamic_pointer_cast<losses::SparseCategoricalCrossentropy>(by_object.get());
  REQUIRE(scce);
  CHECK(scce->from_logits());
  auto shared = std::make_shared<losses::MeanAbsoluteError>();
  CHECK(losses::LossArg(shared).get() == shared);
  CHECK(losses::LossArg(std::string("mse")).get()->name() == "mean_squared_error");
}

TEST_CASE("sparse categorical crossentropy with ignore_class: the mean over the other positions, no gradient there") {
  for_each_device([](Device dev) {
    // [B, T, V] logits and [B, T] labels with padding -1, as a sequence model has them.
    Tensor logits = test::random({2, 3, 4}, float32, dev, 3, -2, 2);
    const std::vector<double> lab = {2, -1, 0, 3, 1, -1};
    for (DType label_dtype : {int64, float32}) {
      Tensor labels = Tensor::from_vector<double>(lab, {2, 3}).to(label_dtype).to(dev);
      losses::SparseCategoricalCrossentropy loss({.from_logits = true, .ignore_class = -1});
      GradientTape tape;
      tape.watch(logits);
      Tensor l = loss(labels, logits);
      Tensor g = tape.gradient(l, {logits})[0];
      const auto x = logits.to_vector<double>();
      double sum = 0;
      int valid = 0;
      for (std::size_t p = 0; p < 6; ++p) {
        if (lab[p] < 0) continue;
        double m = -1e300, z = 0;
        for (std::size_t c = 0; c < 4; ++c) m = std::max(m, x[p * 4 + c]);
        for (std::size_t c = 0; c < 4; ++c) z += std::exp(x[p * 4 + c] - m);
        sum += m + std::log(z) - x[p * 4 + static_cast<std::size_t>(lab[p])];
        ++valid;
      }
      CHECK(l.item() == doctest::Approx(sum / valid).epsilon(1e-5));
      const auto gv = g.to_vector<double>();
      for (std::size_t c = 0; c < 4; ++c) {
        CHECK(gv[1 * 4 + c] == 0.0);  // ignored positions
        CHECK(gv[5 * 4 + c] == 0.0);
      }
      double row = 0;
      for (std::size_t c = 0; c < 4; ++c) row += gv[c];
      CHECK(row == doctest::Approx(0).scale(1));  // softmax - one_hot sums to 0, scaled by 1/valid
    }
    // A label neither ignored nor a class is still an error (on the CPU, where labels are read).
    if (dev.is_cpu()) {
      losses::SparseCategoricalCrossentropy loss({.from_logits = true, .ignore_class = 0});
      CHECK_THROWS_AS(loss(Tensor::from_vector<std::int64_t>({1, 7, 0, 2, 0, 0}, {2, 3}, dev), logits), Error);
    }
  });
  CHECK_THROWS_WITH_AS(losses::CategoricalCrossentropy({.ignore_class = 0}), doctest::Contains("ignore_class"), Error);
}

// ---- Huber, KLDivergence, LogCosh, CosineSimilarity --------------------------------------------

namespace {

const nlohmann::json& keras_losses() {
  static const nlohmann::json j = [] {
    std::ifstream in(test::test_data("keras_losses.json"));
    REQUIRE_MESSAGE(in.good(), "missing ", test::test_data("keras_losses.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

/// The mpt loss of a recorded case: Keras's class name and its options.
std::shared_ptr<losses::Loss> loss_of(const std::string& cls, const nlohmann::json& options) {
  if (cls == "Huber") return std::make_shared<losses::Huber>(options.value("delta", 1.0));
  if (cls == "KLDivergence") return std::make_shared<losses::KLDivergence>();
  if (cls == "LogCosh") return std::make_shared<losses::LogCosh>();
  if (cls == "CosineSimilarity") return std::make_shared<losses::CosineSimilarity>(options.value("axis", -1));
  if (cls == "SparseCategoricalCrossentropy")
    return std::make_shared<losses::SparseCategoricalCrossentropy>(
        losses::CrossentropyOptions{.from_logits = true, .ignore_class = options.value("ignore_class", -1)});
  if (cls == "Hinge" || cls == "SquaredHinge" || cls == "CategoricalHinge" || cls == "Poisson" ||
      cls == "MeanAbsolutePercentageError" || cls == "MeanSquaredLogarithmicError" || cls == "MeanSquaredError")
    return losses::get(cls);
  FAIL("no loss class ", cls);
  return nullptr;
}

template <class T>
bool is_a(const std::shared_ptr<losses::Loss>& l) {
  return dynamic_cast<const T*>(l.get()) != nullptr;
}

Tensor recorded_tensor(const nlohmann::json& j, DType dtype, Device dev) {
  return Tensor::from_vector(j["values"].get<std::vector<double>>(), j["shape"].get<Shape>()).to(dtype).to(dev);
}

/// A y_true / y_pred pair per new loss for the gradient and 16-bit checks (float64 here), away from
/// Huber's delta and KLDivergence's clip bounds.
struct NewLossCase {
  std::string what;
  std::shared_ptr<losses::Loss> loss;
  Tensor y_true, y_pred;
};

std::vector<NewLossCase> new_loss_cases(Device dev) {
  Tensor t = Tensor::from_vector<double>({0.3, -1.2, 2.0, 0.0, 0.5, -0.4, 1.1, -2.5, 0.9, 0.2, -0.7, 1.6}, {4, 3}, dev);
  Tensor p = Tensor::from_vector<double>({0.1, 0.4, -1.9, 0.6, 0.45, 1.8, 1.3, -0.5, 4.0, -0.3, -0.65, 1.0}, {4, 3}, dev);
  Tensor pt = Tensor::random_uniform({4, 3}, 0.05, 0.95, 11, float64, dev);
  Tensor pp = Tensor::random_uniform({4, 3}, 0.05, 0.95, 12, float64, dev);
  Tensor t3 = Tensor::random_uniform({2, 3, 4}, -2, 2, 13, float64, dev);
  Tensor p3 = Tensor::random_uniform({2, 3, 4}, -2, 2, 14, float64, dev);
  return {
      {"huber", std::make_shared<losses::Huber>(), t, p},
      {"huber delta 0.7 rank 3", std::make_shared<losses::Huber>(0.7), t3, p3 * 1.7},
      {"kl_divergence", std::make_shared<losses::KLDivergence>(), pt, pp},
      {"kl_divergence rank 3", std::make_shared<losses::KLDivergence>(), (t3 + 2.1) / 4.3, (p3 + 2.2) / 4.5},
      {"log_cosh", std::make_shared<losses::LogCosh>(), t, p * 3.0},
      {"log_cosh rank 3", std::make_shared<losses::LogCosh>(), t3, p3},
      {"cosine_similarity", std::make_shared<losses::CosineSimilarity>(), t, p},
      {"cosine_similarity axis 1", std::make_shared<losses::CosineSimilarity>(1), t3, p3},
      {"cosine_similarity axis 0", std::make_shared<losses::CosineSimilarity>(0), t, p},
      // (p · 1.3: no margin 1 - t·p exactly at the hinge's kink.)
      {"hinge -1/1 labels", std::make_shared<losses::Hinge>(),
       Tensor::from_vector<double>({1, -1, 1, -1, 1, -1, 1, -1, 1, 1, -1, 1}, {4, 3}, dev), p * 1.3},
      {"hinge 0/1 labels", std::make_shared<losses::Hinge>(), ops::cast(ops::greater(t, t * 0.0), float64), p * 1.3},
      {"squared_hinge rank 3", std::make_shared<losses::SquaredHinge>(), ops::sign(t3), p3},
      {"categorical_hinge", std::make_shared<losses::CategoricalHinge>(),
       Tensor::from_vector<double>({1, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0}, {4, 3}, dev), p},
      {"poisson", std::make_shared<losses::Poisson>(), pt * 3.0, pp * 2.0},
      {"mean_absolute_percentage_error", std::make_shared<losses::MeanAbsolutePercentageError>(), t3, p3},
      {"mean_squared_logarithmic_error", std::make_shared<losses::MeanSquaredLogarithmicError>(), pt * 4.0, pp * 3.0},
  };
}

}  // namespace

TEST_CASE("Huber, KLDivergence, LogCosh, CosineSimilarity, the hinges, Poisson, MAPE and MSLE give Keras 3's recorded values") {
  const auto& rec = keras_losses();
  REQUIRE(rec["cases"].size() >= 35);
  // float32 against Keras's float32 (JAX): 1e-6 relative, with a 1e-7 floor for values near 0
  // (cosine of orthogonal vectors, LogCosh's x + softplus(-2x) - log 2 cancelling to a small value).
  const Tolerance tol{1e-6, 1e-7};
  for_each_device([&](Device dev) {
    for (const auto& c : rec["cases"]) {
      const std::string what = c["what"];
      CAPTURE(what);
      auto loss = loss_of(c["class"], c["options"]);
      Tensor y_true = recorded_tensor(c["y_true"], float32, dev);
      Tensor y_pred = recorded_tensor(c["y_pred"], float32, dev);
      Tensor per = loss->call(y_true, y_pred);
      CHECK(per.dtype() == float32);
      CHECK(per.shape() == c["per_example"]["shape"].get<Shape>());
      check_close(per, c["per_example"]["values"].get<std::vector<double>>(), tol, what + " per example");
      Tensor l = (*loss)(y_true, y_pred);
      CHECK(l.dtype() == float32);
      CHECK(l.dim() == 0);
      check_close(l, {c["value"].get<double>()}, tol, what + " sum_over_batch_size");
      // The metric of the same name (Keras's metrics of the losses): the mean of the values.
      const std::string cls = c["class"];
      if (cls != "Huber" && cls != "KLDivergence" && cls != "LogCosh" && cls != "CosineSimilarity") {
        auto metric = metrics::get(cls);
        metric->update_state(y_true, y_pred);
        CHECK(metric->result() == doctest::Approx(c["value"].get<double>()).epsilon(1e-6).scale(1e-1));
        CHECK(metric->name() == cls);
        CHECK(metrics::get(loss->name())->clone()->name() == loss->name());  // by the function name too
      }
    }
  });
}

TEST_CASE("Keras's reductions, with sample weights and ignore_class's mask, give Keras 3's recorded values") {
  const auto& rec = keras_losses();
  REQUIRE(rec["reductions"].size() == 20);
  for_each_device([&](Device dev) {
    for (const auto& c : rec["reductions"]) {
      const std::string what = c["class"].get<std::string>() + " " + c["reduction"].get<std::string>() +
                               (c["sample_weight"].is_null() ? "" : " weighted");
      CAPTURE(what);
      auto loss = loss_of(c["class"], c["options"]);
      loss->set_reduction(c["reduction"].get<std::string>());
      const bool sparse = c["class"] == "SparseCategoricalCrossentropy";
      const Tensor y_true = recorded_tensor(c["y_true"], sparse ? int64 : float32, dev);
      const Tensor y_pred = recorded_tensor(c["y_pred"], float32, dev);
      const Tensor w = c["sample_weight"].is_null() ? Tensor() : recorded_tensor(c["sample_weight"], float32, dev);
      const Tensor l = (*loss)(y_true, y_pred, w);
      CHECK(l.shape() == c["value"]["shape"].get<Shape>());
      check_close(l, c["value"]["values"].get<std::vector<double>>(), {1e-6, 1e-7}, what);
    }
  });
}

TEST_CASE("the new losses by Keras's names, with Keras's defaults") {
  for (const char* n : {"huber", "Huber"}) {
    CAPTURE(n);
    CHECK(is_a<losses::Huber>(losses::get(n)));
    CHECK(std::dynamic_pointer_cast<losses::Huber>(losses::get(n))->delta() == 1.0);
  }
  for (const char* n : {"kl_divergence", "KLDivergence", "kld", "KLD", "kullback_leibler_divergence"}) {
    CAPTURE(n);
    CHECK(is_a<losses::KLDivergence>(losses::get(n)));
  }
  for (const char* n : {"log_cosh", "LogCosh", "logcosh"}) {
    CAPTURE(n);
    CHECK(is_a<losses::LogCosh>(losses::get(n)));
  }
  for (const char* n : {"cosine_similarity", "CosineSimilarity"}) {
    CAPTURE(n);
    CHECK(is_a<losses::CosineSimilarity>(losses::get(n)));
    CHECK(std::dynamic_pointer_cast<losses::CosineSimilarity>(losses::get(n))->axis() == -1);
  }
  // Keras's default names.
  CHECK(losses::Huber().name() == "huber_loss");
  CHECK(losses::KLDivergence().name() == "kl_divergence");
  CHECK(losses::LogCosh().name() == "log_cosh");
  CHECK(losses::CosineSimilarity().name() == "cosine_similarity");
  CHECK(losses::Huber(2.5).delta() == 2.5);
  CHECK(losses::CosineSimilarity(1).axis() == 1);
  const std::string msg = error_of([] { losses::get("huber_los"); });
  for (const char* n : {"huber", "kl_divergence", "log_cosh", "cosine_similarity", "KLDivergence"}) {
    CAPTURE(n);
    CHECK(contains(msg, n));
  }
  for (const char* n : {"hinge", "Hinge"}) CHECK(is_a<losses::Hinge>(losses::get(n)));
  for (const char* n : {"squared_hinge", "SquaredHinge"}) CHECK(is_a<losses::SquaredHinge>(losses::get(n)));
  for (const char* n : {"categorical_hinge", "CategoricalHinge"}) CHECK(is_a<losses::CategoricalHinge>(losses::get(n)));
  for (const char* n : {"poisson", "Poisson"}) CHECK(is_a<losses::Poisson>(losses::get(n)));
  for (const char* n : {"mean_absolute_percentage_error", "MeanAbsolutePercentageError", "mape", "MAPE"})
    CHECK(is_a<losses::MeanAbsolutePercentageError>(losses::get(n)));
  for (const char* n : {"mean_squared_logarithmic_error", "MeanSquaredLogarithmicError", "msle", "MSLE"})
    CHECK(is_a<losses::MeanSquaredLogarithmicError>(losses::get(n)));
  for (const char* n : {"hinge", "squared_hinge", "categorical_hinge", "poisson", "mean_absolute_percentage_error",
                        "mean_squared_logarithmic_error"})
    CHECK(losses::get(n)->name() == n);  // Keras's default names
  CHECK(dynamic_cast<losses::LogCosh*>(losses::LossArg("log_cosh").get().get()) != nullptr);
  CHECK(dynamic_cast<losses::Huber*>(losses::LossArg(losses::Huber(0.5)).get().get())->delta() == 0.5);
}

TEST_CASE("new loss gradients w.r.t. y_pred match finite differences in float64") {
  for_each_device([](Device dev) {
    for (const auto& c : new_loss_cases(dev)) {
      CAPTURE(c.what);
      CHECK(c.loss->call(c.y_true, c.y_pred).dtype() == float64);
      CHECK((*c.loss)(c.y_true, c.y_pred).dtype() == float64);
      check_gradients(c.what, [&](const std::vector<Tensor>& in) { return (*c.loss)(c.y_true, in[0]); },
                      {c.y_pred});
    }
    // Huber's slope: x inside delta, delta * sign(x) outside (per element, over 3 elements, 2 rows).
    {
      GradientTape tape;
      Tensor x = Tensor::from_vector<double>({0.5, -0.25, 3.0, -4.0, 1.0, -1.0}, {2, 3}, dev);
      tape.watch(x);
      Tensor l = losses::Huber(1.0)(Tensor::zeros({2, 3}, float64, dev), x);
      check_close(tape.gradient(l, {x})[0], {0.5 / 6, -0.25 / 6, 1.0 / 6, -1.0 / 6, 1.0 / 6, -1.0 / 6},
                  tolerance(float64), "huber slope");
    }
    // LogCosh's slope is tanh(x), also where exp(-2|x|) no longer changes 1 + e (|x| = 30).
    {
      GradientTape tape;
      Tensor x = Tensor::from_vector<double>({0.0, 0.5, -2.0, 30.0, -30.0, 1e-3}, {1, 6}, dev);
      tape.watch(x);
      Tensor l = losses::LogCosh()(Tensor::zeros({1, 6}, float64, dev), x);
      std::vector<double> want;
      for (double v : x.to_vector<double>()) want.push_back(std::tanh(v) / 6);
      check_close(tape.gradient(l, {x})[0], want, tolerance(float64), "log_cosh slope");
      check_close(l, {(std::log(std::cosh(0.5)) + std::log(std::cosh(2.0)) + 2 * (30 - std::log(2.0)) +
                       std::log(std::cosh(1e-3))) / 6},
                  tolerance(float64), "log_cosh value");
    }
    // A zero vector: cosine 0 and a finite gradient (Keras's rsqrt(0) = inf never forms here).
    {
      GradientTape tape;
      Tensor x = Tensor::from_vector<double>({0, 0, 0, 1, 2, 2}, {2, 3}, dev);
      tape.watch(x);
      Tensor t = Tensor::from_vector<double>({1, 0, 0, 2, 4, 4}, {2, 3}, dev);
      Tensor per = losses::CosineSimilarity().call(t, x);
      check_close(per, {0.0, -1.0}, tolerance(float64), "cosine with a zero vector");
      Tensor g = tape.gradient(ops::mean(per), {x})[0];
      for (double v : g.to_vector<double>()) CHECK(std::isfinite(v));
    }
  });
}

TEST_CASE("the new losses under 16-bit predictions: float32 losses, gradients in the prediction dtype") {
  for (const auto& c : new_loss_cases(default_device())) {
    for (DType d : {float16, bfloat16}) {
      CAPTURE(c.what);
      CAPTURE(to_string(d));
      // Against float32 at the same (rounded) points.
      Tensor x16 = c.y_pred.to(d);
      Tensor x32 = x16.to(float32);
      Tensor t32 = c.y_true.to(float32);
      Tensor per = c.loss->call(t32, x16);
      CHECK(per.dtype() == float32);
      check_close(per, c.loss->call(t32, x32).to_vector<double>(), tolerance(float32), c.what + " per example");
      GradientTape tape;
      tape.watch(x16);
      Tensor l = (*c.loss)(t32, x16);
      CHECK(l.dtype() == float32);
      Tensor g16 = tape.gradient(l, {x16})[0];
      REQUIRE(g16.defined());
      CHECK(g16.dtype() == d);
      GradientTape tape32;
      tape32.watch(x32);
      Tensor g32 = tape32.gradient((*c.loss)(t32, x32), {x32})[0];
      check_close(g16, g32.to_vector<double>(), tolerance(d), c.what + " gradient");
    }
  }
}

TEST_CASE("new loss errors name the loss") {
  Tensor p = Tensor::zeros({4, 3});
  const std::vector<std::pair<std::string, std::shared_ptr<losses::Loss>>> all = {
      {"huber_loss", std::make_shared<losses::Huber>()},
      {"kl_divergence", std::make_shared<losses::KLDivergence>()},
      {"log_cosh", std::make_shared<losses::LogCosh>()},
      {"cosine_similarity", std::make_shared<losses::CosineSimilarity>()},
      {"hinge", std::make_shared<losses::Hinge>()},
      {"squared_hinge", std::make_shared<losses::SquaredHinge>()},
      {"poisson", std::make_shared<losses::Poisson>()},
      {"mean_absolute_percentage_error", std::make_shared<losses::MeanAbsolutePercentageError>()},
      {"mean_squared_logarithmic_error", std::make_shared<losses::MeanSquaredLogarithmicError>()}};
  for (const auto& entry : all) {  // no structured binding: clang 14 cannot capture one
    const std::string& name = entry.first;
    const auto& loss = entry.second;
    CAPTURE(name);
    // Last axes that do not broadcast.
    std::string msg = error_of([&] { (*loss)(Tensor::zeros({4, 2}), p); });
    CHECK(contains(msg, "loss " + name));
    CHECK(contains(msg, "(4, 2)"));
    msg = error_of([&] { loss->call(Tensor::zeros({4, 2}), p); });
    CHECK(contains(msg, "loss " + name));
    // Batch sizes that differ.
    msg = error_of([&] { (*loss)(Tensor::zeros({5, 3}), p); });
    CHECK(contains(msg, "loss " + name));
    CHECK(contains(msg, "(5, 3)"));
  }
  std::string msg = error_of([] { losses::Huber(0.0); });
  CHECK(contains(msg, "huber_loss"));
  CHECK(contains(msg, "delta"));
  CHECK_THROWS_AS(losses::Huber(-1.0), Error);
  CHECK_THROWS_AS(losses::Huber(std::nan("")), Error);
  msg = error_of([&] { losses::CosineSimilarity(2)(p, p); });
  CHECK(contains(msg, "cosine_similarity"));
  CHECK(contains(msg, "axis 2"));
  msg = error_of([&] { losses::CosineSimilarity(-3).call(p, p); });
  CHECK(contains(msg, "axis -3"));
}

TEST_CASE("loss reductions (Keras's): sum, mean, mean_with_sample_weight, none, with sample weights and the ignore_class mask") {
  using R = losses::Reduction;
  for_each_device([](Device dev) {
    for (DType dt : {float32, float64}) {
      CAPTURE(dt);
      // Mean squared error: one value per example of [5, 3].
      const Tensor t = test::random({5, 3}, dt, dev, 31, -1, 1);
      Tensor p = test::random({5, 3}, dt, dev, 32, -1, 1);
      const std::vector<double> tv = t.to_vector<double>(), pv = p.to_vector<double>();
      std::vector<double> per(5, 0.0);
      for (std::size_t i = 0; i < 15; ++i) per[i / 3] += (pv[i] - tv[i]) * (pv[i] - tv[i]) / 3.0;
      const std::vector<double> w = {0.5, 0.0, 2.0, 1.0, 0.25};
      const Tensor sw = Tensor::from_vector<double>(w, {5}).to(dt).to(dev);
      double sum = 0, wsum = 0, weights = 0;
      for (std::size_t i = 0; i < 5; ++i) sum += per[i], wsum += per[i] * w[i], weights += w[i];
      const double tol = dt == float64 ? 1e-12 : 1e-5;
      losses::MeanSquaredError mse;
      auto with = [&](R r, const Tensor& weight) {
        mse.set_reduction(r);
        return mse(t, p, weight);
      };
      check_close(with(R::sum_over_batch_size, Tensor()), {sum / 5}, {tol, 0}, "sum_over_batch_size");
      check_close(with(R::mean, sw), {wsum / 5}, {tol, 0}, "mean, weighted");
      check_close(with(R::sum, Tensor()), {sum}, {tol, 0}, "sum");
      check_close(with(R::sum, sw), {wsum}, {tol, 0}, "sum, weighted");
      check_close(with(R::mean_with_sample_weight, sw), {wsum / weights}, {tol, 0}, "mean_with_sample_weight");
      check_close(with(R::mean_with_sample_weight, Tensor()), {sum / 5}, {tol, 0}, "mean_with_sample_weight, no weights");
      check_close(with(R::mean_with_sample_weight, ops::mul(sw, Tensor::scalar(0.0, dt, dev))), {0.0}, {0, 0},
                  "mean_with_sample_weight, weights summing to 0");
      const Tensor none = with(R::none, sw);
      REQUIRE(none.shape() == Shape{5});
      std::vector<double> want(5);
      for (std::size_t i = 0; i < 5; ++i) want[i] = per[i] * w[i];
      check_close(none, want, {tol, 0}, "none");
      // The sum's gradient is the mean's times the batch size.
      GradientTape tape;
      tape.watch(p);
      mse.set_reduction(R::sum);
      const Tensor gs = tape.gradient(mse(t, p), {p})[0];
      GradientTape tape2;
      tape2.watch(p);
      mse.set_reduction(R::sum_over_batch_size);
      const Tensor gm = tape2.gradient(mse(t, p), {p})[0];
      check_close(gs, ops::mul(gm, Tensor::scalar(5.0, dt, dev)).to_vector<double>(), {tol, 0}, "sum's gradient");
    }
    // ignore_class over [2, 3] positions: the mask weighs numel / count under the means, 1 under
    // the others (Keras's apply_mask), times the per-example weights.
    Tensor logits = test::random({2, 3, 4}, float32, dev, 33, -2, 2);
    const std::vector<double> lab = {2, -1, 0, 3, 1, -1};
    const Tensor labels = Tensor::from_vector<double>(lab, {2, 3}).to(int64).to(dev);
    const std::vector<double> x = logits.to_vector<double>();
    std::vector<double> ce(6, 0.0);
    for (std::size_t q = 0; q < 6; ++q) {
      if (lab[q] < 0) continue;
      double m = -1e300, z = 0;
      for (std::size_t c = 0; c < 4; ++c) m = std::max(m, x[q * 4 + c]);
      for (std::size_t c = 0; c < 4; ++c) z += std::exp(x[q * 4 + c] - m);
      ce[q] = m + std::log(z) - x[q * 4 + static_cast<std::size_t>(lab[q])];
    }
    const std::vector<double> w = {3.0, 0.5};  // per example: over its 3 positions
    const Tensor sw = Tensor::from_vector<double>(w, {2}).to(dev);
    double sum = 0, wsum = 0, wcount = 0;
    for (std::size_t q = 0; q < 6; ++q)
      if (lab[q] >= 0) sum += ce[q], wsum += ce[q] * w[q / 3], wcount += w[q / 3];
    losses::SparseCategoricalCrossentropy scce({.from_logits = true, .ignore_class = -1});
    auto with = [&](R r, const Tensor& weight) {
      scce.set_reduction(r);
      return scce(labels, logits, weight);
    };
    check_close(with(R::sum_over_batch_size, Tensor()), {sum / 4}, {1e-5, 0}, "masked mean");
    check_close(with(R::mean, sw), {wsum / 4}, {1e-5, 0}, "masked mean, weighted");
    check_close(with(R::sum, Tensor()), {sum}, {1e-5, 0}, "masked sum");
    check_close(with(R::sum, sw), {wsum}, {1e-5, 0}, "masked sum, weighted");
    check_close(with(R::mean_with_sample_weight, Tensor()), {sum / 4}, {1e-5, 0}, "masked mean_with_sample_weight");
    check_close(with(R::mean_with_sample_weight, sw), {wsum / wcount}, {1e-5, 0}, "masked, weighted mean_with_sample_weight");
    const Tensor none = with(R::none, Tensor());
    REQUIRE(none.shape() == Shape{2, 3});
    check_close(none, ce, {1e-5, 0}, "masked none: 0 at ignored positions");
    check_close(scce.call(labels, logits), ce, {1e-5, 0}, "call()");
    // Every position ignored: 0 under every reduction, and a finite (zero) gradient.
    const Tensor all_ignored = Tensor::full({2, 3}, -1.0, int64, dev);
    for (R r : {R::sum_over_batch_size, R::sum, R::mean_with_sample_weight}) {
      scce.set_reduction(r);
      GradientTape tape;
      tape.watch(logits);
      const Tensor l = scce(all_ignored, logits);
      CHECK(l.item() == 0.0);
      for (double g : tape.gradient(l, {logits})[0].to_vector<double>()) CHECK(g == 0.0);
    }
  });
  // Names, as Keras's.
  CHECK(losses::reduction_from_string("mean_with_sample_weight") == losses::Reduction::mean_with_sample_weight);
  CHECK(losses::to_string(losses::Reduction::sum) == "sum");
  CHECK(contains(error_of([] { losses::MeanSquaredError().set_reduction("auto"); }),
                 "loss reduction 'auto' is not one of sum_over_batch_size, mean, sum, mean_with_sample_weight, none"));
}

TEST_CASE("fit with a summed loss: SGD steps of the mean's at batch-size times the rate; \"none\" is refused by name") {
  for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const Tensor x = test::random({64, 6}, float32, dev, 41, -1, 1);
    const Tensor y = test::random({64, 2}, float32, dev, 42, -1, 1);
    std::vector<std::vector<double>> weights;
    std::vector<double> logged;
    for (int summed = 0; summed < 2; ++summed) {
      set_random_seed(9);
      Sequential m({layers::Input({6}), layers::Dense(5, {.activation = "tanh"}), layers::Dense(2)});
      losses::MeanSquaredError loss;
      if (summed) loss.set_reduction("sum");
      m.compile({.optimizer = optimizers::SGD({.learning_rate = summed ? 0.05 / 16 : 0.05}), .loss = loss});
      const History h = m.fit(x, y, {.batch_size = 16, .epochs = 2, .verbose = 0, .shuffle = false});
      logged.push_back(h.history.at("loss").back());
      std::vector<double> w;
      for (const auto& v : m.get_weights())
        for (double e : v.to_vector<double>()) w.push_back(e);
      weights.push_back(w);
      if (summed) {  // evaluate reports the batches' sums, averaged by rows
        const double e = m.evaluate(x, y, {.batch_size = 16}).at("loss");
        m.compile({.optimizer = "sgd", .loss = "mse"});
        CHECK(e == doctest::Approx(16 * m.evaluate(x, y, {.batch_size = 16}).at("loss")).epsilon(1e-5));
      }
    }
    check_close(weights[1], weights[0], {1e-5, 1e-6}, "summed loss at rate / 16 against the mean's");
    CHECK(logged[1] == doctest::Approx(16 * logged[0]).epsilon(1e-3));  // the same steps: sums of 16
    Sequential m({layers::Input({6}), layers::Dense(2)});
    losses::MeanSquaredError none;
    none.set_reduction(losses::Reduction::none);
    m.compile({.optimizer = "sgd", .loss = none});
    const std::string e = error_of([&] { m.fit(x, y, {.batch_size = 16, .epochs = 1, .verbose = 0}); });
    CHECK(contains(e, "mean_squared_error has reduction \"none\""));
    CHECK(m.predict(x).shape() == Shape{64, 2});  // compiled, and usable
  });
}

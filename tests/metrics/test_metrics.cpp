// Metric functions on hand-made inputs, running means across batches, Keras's "accuracy"
// resolution, error messages, and every metric (sample_weight included) against results Keras 3
// recorded (tests/interop/record_keras_metrics.py, tests/data/keras_metrics.json).
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;  // check_close, for_each_device, random, tolerance, ...

namespace {

// Four examples, three classes: argmax = {0, 1, 2, 0}.
const std::vector<double> kProbs = {0.7, 0.2, 0.1, 0.1, 0.8, 0.1, 0.2, 0.3, 0.5, 0.4, 0.35, 0.25};
const std::vector<std::int32_t> kLabels = {0, 1, 1, 0};  // matches {1, 1, 0, 1}

Tensor f32(const std::vector<double>& v, const Shape& s, Device d) {
  return Tensor::from_vector(v, s, d).to(float32);
}

template <class M>
bool is_a(const std::shared_ptr<metrics::Metric>& m) {
  return dynamic_cast<M*>(m.get()) != nullptr;
}

}  // namespace

TEST_CASE("sparse_categorical_accuracy with int and float labels of shape [N] and [N,1]") {
  for_each_device([](Device dev) {
    Tensor y_pred = f32(kProbs, {4, 3}, dev);
    Tensor labels = Tensor::from_vector(kLabels, {4}, dev);
    const std::vector<double> expected = {1, 1, 0, 1};
    for (const Tensor& y_true : {labels, labels.to(int64).reshape({4, 1}), labels.to(float32),
                                 labels.to(float32).reshape({4, 1})}) {
      CAPTURE(y_true.str());
      Tensor acc = metrics::sparse_categorical_accuracy(y_true, y_pred);
      CHECK(acc.dtype() == float32);
      CHECK(acc.shape() == Shape{4});
      check_close(acc, expected, tolerance(float32), "sparse accuracy");
    }
    // 16-bit predictions give the same float32 values.
    for (DType d : {float16, bfloat16}) {
      Tensor acc = metrics::sparse_categorical_accuracy(labels, y_pred.to(d));
      CHECK(acc.dtype() == float32);
      check_close(acc, expected, tolerance(float32), "sparse accuracy " + to_string(d));
    }
    // A float label that is not a class id never matches (Keras compares values).
    check_close(metrics::sparse_categorical_accuracy(f32({0.5, 1, 1, 0}, {4}, dev), y_pred), {0, 1, 0, 1},
                tolerance(float32), "fractional label");
  });
}

TEST_CASE("categorical_accuracy and binary_accuracy") {
  for_each_device([](Device dev) {
    Tensor y_pred = f32(kProbs, {4, 3}, dev);
    Tensor one_hot = f32({1, 0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0}, {4, 3}, dev);
    Tensor acc = metrics::categorical_accuracy(one_hot, y_pred);
    CHECK(acc.dtype() == float32);
    check_close(acc, {1, 1, 0, 1}, tolerance(float32), "categorical accuracy");
    check_close(metrics::categorical_accuracy(one_hot, y_pred.to(bfloat16)), {1, 1, 0, 1}, tolerance(float32),
                "categorical accuracy bfloat16");

    // Two outputs per example: the mean over the last axis; 0.5 itself counts as 0.
    Tensor bt = f32({1, 0, 1, 1, 0, 0, 1, 0}, {4, 2}, dev);
    Tensor bp = f32({0.9, 0.2, 0.6, 0.4, 0.7, 0.8, 0.5, 0.1}, {4, 2}, dev);
    Tensor bacc = metrics::binary_accuracy(bt, bp);
    CHECK(bacc.dtype() == float32);
    CHECK(bacc.shape() == Shape{4});
    check_close(bacc, {1, 0.5, 0, 0.5}, tolerance(float32), "binary accuracy");
    check_close(metrics::binary_accuracy(bt, bp.to(float16)), {1, 0.5, 0, 0.5}, tolerance(float32),
                "binary accuracy float16");
    // Labels [N] (int) against a single unit [N, 1]: one value per example.
    Tensor b1 = metrics::binary_accuracy(Tensor::from_vector<std::int32_t>({1, 0, 1}, {3}, dev),
                                         f32({0.8, 0.6, 0.3}, {3, 1}, dev));
    CHECK(b1.shape() == Shape{3});
    check_close(b1, {1, 0, 0}, tolerance(float32), "binary accuracy [N] vs [N,1]");
  });
}

TEST_CASE("mean_absolute_error and mean_squared_error metric functions") {
  for_each_device([](Device dev) {
    Tensor t = f32({1, 2, 3, -1, 0.5, 0}, {2, 3}, dev);
    Tensor p = f32({1.5, 1, 3, 1, -0.5, 0.25}, {2, 3}, dev);
    check_close(metrics::mean_absolute_error(t, p), {1.5 / 3, 3.25 / 3}, tolerance(float32), "mae");
    check_close(metrics::mean_squared_error(t, p), {1.25 / 3, 5.0625 / 3}, tolerance(float32), "mse");
    metrics::MeanSquaredError mse;
    CHECK(mse.name() == "mean_squared_error");
    mse.update_state(t, p);
    CHECK(mse.result() == doctest::Approx((1.25 / 3 + 5.0625 / 3) / 2));
    metrics::MeanAbsoluteError mae("my_mae");
    CHECK(mae.name() == "my_mae");
    mae.update_state(t, p);
    CHECK(mae.result() == doctest::Approx((1.5 / 3 + 3.25 / 3) / 2));
  });
}

TEST_CASE("Mean and the accuracy metrics keep running means until reset_state") {
  metrics::Mean mean("loss");
  CHECK(mean.name() == "loss");
  CHECK(mean.result() == 0.0);
  mean.update(Tensor::from_vector<float>({1, 2, 3}));
  mean.update(Tensor::from_vector<float>({4}).to(bfloat16));
  CHECK(mean.result() == doctest::Approx(2.5));
  mean.update(10.0, 2.0);  // weight 2
  CHECK(mean.result() == doctest::Approx((1 + 2 + 3 + 4 + 20) / 6.0));
  mean.update(Tensor::scalar(0.5));  // a scalar counts once
  CHECK(mean.result() == doctest::Approx((30 + 0.5) / 7.0));
  // A rank-2 value is one sample per row (its mean), as Keras's reduce_to_samplewise_values.
  metrics::Mean rows;
  rows.update(Tensor::from_vector<double>({1, 3, 5, 7}, {2, 2}));
  CHECK(rows.result() == doctest::Approx(4.0));
  mean.reset_state();
  CHECK(mean.result() == 0.0);
  mean.update(Tensor::from_vector<double>({7.0}));
  CHECK(mean.result() == doctest::Approx(7.0));
  auto fresh = mean.clone();
  CHECK(fresh->name() == "loss");
  CHECK(fresh->result() == 0.0);

  // Batches of different sizes: 3 of 4 right, then 1 of 2.
  metrics::SparseCategoricalAccuracy acc;
  CHECK(acc.name() == "sparse_categorical_accuracy");
  Tensor y_pred = Tensor::from_vector(kProbs, {4, 3}).to(float32);
  acc.update_state(Tensor::from_vector(kLabels, {4}), y_pred);
  CHECK(acc.result() == doctest::Approx(0.75));
  acc.update_state(Tensor::from_vector<std::int32_t>({2, 2}, {2}), y_pred.slice(0, 2));
  CHECK(acc.result() == doctest::Approx(3.0 / 6.0));
  auto copy = acc.clone();
  CHECK(copy->name() == "sparse_categorical_accuracy");
  CHECK(copy->result() == 0.0);
  acc.reset_state();
  CHECK(acc.result() == 0.0);
  acc.update_state(Tensor::from_vector<std::int32_t>({0}, {1}), y_pred.slice(0, 1));
  CHECK(acc.result() == doctest::Approx(1.0));

  metrics::BinaryAccuracy bin;
  bin.update_state(Tensor::from_vector<float>({1, 0, 1, 1}, {4, 1}), Tensor::from_vector<float>({0.9, 0.1, 0.2, 0.7}, {4, 1}));
  bin.update_state(Tensor::from_vector<float>({0, 0}, {2, 1}), Tensor::from_vector<float>({0.6, 0.4}, {2, 1}));
  CHECK(bin.result() == doctest::Approx(4.0 / 6.0));
}

TEST_CASE("metrics::get resolves accuracy as Keras does and keeps the user's name") {
  // Sparse labels [N] against a softmax output [N, 10].
  auto m = metrics::get("accuracy", "sparse_categorical_crossentropy", {32}, {32, 10});
  CHECK(is_a<metrics::SparseCategoricalAccuracy>(m));
  CHECK(m->name() == "accuracy");
  CHECK(is_a<metrics::SparseCategoricalAccuracy>(metrics::get("accuracy", "", {32, 1}, {32, 10})));
  CHECK(is_a<metrics::SparseCategoricalAccuracy>(metrics::get("acc", "", {32}, {32, 10})));
  CHECK(metrics::get("acc", "", {32}, {32, 10})->name() == "acc");
  CHECK(is_a<metrics::SparseCategoricalAccuracy>(metrics::get("Accuracy", "", {32}, {32, 10})));
  // One-hot labels.
  CHECK(is_a<metrics::CategoricalAccuracy>(metrics::get("accuracy", "categorical_crossentropy", {32, 10}, {32, 10})));
  // A single unit output, or the binary crossentropy loss.
  CHECK(is_a<metrics::BinaryAccuracy>(metrics::get("accuracy", "", {32, 1}, {32, 1})));
  CHECK(is_a<metrics::BinaryAccuracy>(metrics::get("accuracy", "", {32}, {32, 1})));
  CHECK(is_a<metrics::BinaryAccuracy>(metrics::get("accuracy", "binary_crossentropy", {32, 5}, {32, 5})));
  CHECK(is_a<metrics::BinaryAccuracy>(metrics::get("accuracy", "bce", {32, 5}, {32, 5})));
  // Shapes unknown: the loss decides.
  CHECK(is_a<metrics::SparseCategoricalAccuracy>(metrics::get("accuracy", "sparse_categorical_crossentropy")));
  CHECK(is_a<metrics::BinaryAccuracy>(metrics::get("accuracy", "binary_crossentropy")));
  CHECK(is_a<metrics::CategoricalAccuracy>(metrics::get("accuracy", "categorical_crossentropy")));

  // The resolved metric computes the right thing.
  m = metrics::get("accuracy", "sparse_categorical_crossentropy", {4}, {4, 3});
  m->update_state(Tensor::from_vector(kLabels, {4}), Tensor::from_vector(kProbs, {4, 3}).to(float32));
  CHECK(m->result() == doctest::Approx(0.75));

  // Other names.
  CHECK(is_a<metrics::SparseCategoricalAccuracy>(metrics::get("sparse_categorical_accuracy")));
  CHECK(is_a<metrics::CategoricalAccuracy>(metrics::get("categorical_accuracy")));
  CHECK(is_a<metrics::BinaryAccuracy>(metrics::get("binary_accuracy")));
  for (const char* name : {"mae", "mean_absolute_error", "MeanAbsoluteError"}) {
    auto mm = metrics::get(name);
    CHECK(is_a<metrics::MeanAbsoluteError>(mm));
    CHECK(mm->name() == name);
  }
  for (const char* name : {"mse", "mean_squared_error", "MSE"}) {
    auto mm = metrics::get(name);
    CHECK(is_a<metrics::MeanSquaredError>(mm));
    CHECK(mm->name() == name);
  }

  // MetricArg carries names and objects.
  metrics::MetricArg by_name("accuracy");
  CHECK(by_name.name() == "accuracy");
  CHECK_FALSE(by_name.object());
  metrics::MetricArg by_object(metrics::BinaryAccuracy("bin"));
  REQUIRE(by_object.object());
  CHECK(by_object.object()->name() == "bin");
}

TEST_CASE("metric errors name the metric") {
  std::string msg = error_of([] { metrics::get("precision_at_k"); });
  CHECK(msg.find("precision_at_k") != std::string::npos);
  CHECK(msg.find("valid names") != std::string::npos);
  CHECK(msg.find("sparse_categorical_accuracy") != std::string::npos);
  CHECK(msg.find("accuracy") != std::string::npos);

  Tensor y_pred = Tensor::from_vector(kProbs, {4, 3}).to(float32);
  msg = error_of([&] { metrics::sparse_categorical_accuracy(Tensor::from_vector<std::int32_t>({0, 1, 2}), y_pred); });
  CHECK(msg.find("sparse_categorical_accuracy") != std::string::npos);
  CHECK(msg.find("(4, 3)") != std::string::npos);
  msg = error_of([&] { metrics::categorical_accuracy(Tensor::zeros({4, 2}), y_pred); });
  CHECK(msg.find("categorical_accuracy") != std::string::npos);
  msg = error_of([&] { metrics::binary_accuracy(Tensor::zeros({5, 3}), y_pred); });
  CHECK(msg.find("binary_accuracy") != std::string::npos);
}

TEST_CASE("SparseCategoricalAccuracy with ignore_class counts only the other positions, on every device") {
  for_each_device([](Device dev) {
    // [2, 3] token labels over 3 classes; -1 is padding. argmax per position: {0, 1, 2, 0, 1, 2}.
    std::vector<double> probs;
    for (int i = 0; i < 6; ++i)
      for (int c = 0; c < 3; ++c) probs.push_back(c == i % 3 ? 0.8 : 0.1);
    Tensor y_pred = f32(probs, {2, 3, 3}, dev);
    Tensor labels = Tensor::from_vector<std::int32_t>({0, 2, -1, 0, -1, -1}, {2, 3}, dev);  // right, wrong, -, right
    metrics::SparseCategoricalAccuracy acc("acc", -1);
    acc.update_state(labels, y_pred);
    CHECK(acc.result() == doctest::Approx(2.0 / 3.0));
    // A second batch with every position padded adds nothing; one more right position does.
    acc.update_state(Tensor::full({2, 3}, -1, int32, dev), y_pred);
    CHECK(acc.result() == doctest::Approx(2.0 / 3.0));
    acc.update_state(Tensor::from_vector<std::int32_t>({0, -1, -1, -1, -1, -1}, {2, 3}, dev), y_pred);
    CHECK(acc.result() == doctest::Approx(3.0 / 4.0));
    CHECK(acc.reduction_state() == std::vector<double>{3.0, 4.0});
    auto copy = acc.clone();
    CHECK(dynamic_cast<metrics::SparseCategoricalAccuracy&>(*copy).ignore_class() == -1);
    acc.reset_state();
    CHECK(acc.result() == 0.0);
    // Weighted: a per-example weight weighs each of its valid positions.
    metrics::SparseCategoricalAccuracy weighted("acc", -1);
    weighted.update_state(labels, y_pred, f32({1, 3}, {2}, dev));
    CHECK(weighted.result() == doctest::Approx((1.0 + 0.0 + 3.0) / 5.0));
    CHECK(weighted.reduction_state() == std::vector<double>{4.0, 5.0});
    // Without ignore_class, -1 is just a wrong label.
    metrics::SparseCategoricalAccuracy plain;
    plain.update_state(labels, y_pred);
    CHECK(plain.result() == doctest::Approx(2.0 / 6.0));
  });
}

// ---- Keras-recorded results (tests/interop/record_keras_metrics.py) ----------------------------

namespace {

const nlohmann::json& keras_cases() {
  static const nlohmann::json j = [] {
    std::ifstream in(test_data("keras_metrics.json"));
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return j.at("cases");
}

Tensor tensor_of(const nlohmann::json& t, Device dev) {
  const Shape shape = t.at("shape").get<Shape>();
  const std::string dtype = t.at("dtype");
  Tensor out;
  if (dtype == "int32" || dtype == "int64") {
    out = Tensor::from_vector(t.at("values").get<std::vector<std::int32_t>>(), shape, dev);
  } else {
    REQUIRE_MESSAGE(dtype == "float32", "dtype ", dtype);
    out = Tensor::from_vector(t.at("values").get<std::vector<float>>(), shape, dev);
  }
  return shape.empty() ? out.reshape({}) : out;  // from_vector's empty shape is 1-d
}

std::optional<std::vector<double>> doubles_or_none(const nlohmann::json& a, const char* key) {
  if (!a.contains(key) || a.at(key).is_null()) return std::nullopt;
  if (a.at(key).is_number()) return std::vector<double>{a.at(key).get<double>()};
  return a.at(key).get<std::vector<double>>();
}

std::optional<std::int64_t> int_or_none(const nlohmann::json& a, const char* key) {
  if (!a.contains(key) || a.at(key).is_null()) return std::nullopt;
  return a.at(key).get<std::int64_t>();
}

/// The case's metric through mpt's C++ API, with the recorded Keras arguments.
std::shared_ptr<metrics::Metric> metric_of(const nlohmann::json& c) {
  const std::string cls = c.at("class");
  const nlohmann::json& a = c.at("args");
  using namespace metrics;
  if (cls == "TopKCategoricalAccuracy") return std::make_shared<TopKCategoricalAccuracy>(a.value("k", 5));
  if (cls == "SparseTopKCategoricalAccuracy")
    return std::make_shared<SparseTopKCategoricalAccuracy>(a.value("k", 5), "sparse_top_k_categorical_accuracy",
                                                           a.value("from_sorted_ids", false));
  if (cls == "Precision" || cls == "Recall") {
    PrecisionRecallOptions o{.thresholds = doubles_or_none(a, "thresholds"), .top_k = int_or_none(a, "top_k"),
                             .class_id = int_or_none(a, "class_id")};
    if (cls == "Precision") return std::make_shared<Precision>(o);
    return std::make_shared<Recall>(o);
  }
  if (cls == "AUC") {
    AUCOptions o;
    o.num_thresholds = a.value("num_thresholds", 200);
    o.curve = a.value("curve", "ROC");
    o.summation_method = a.value("summation_method", "interpolation");
    o.thresholds = doubles_or_none(a, "thresholds");
    o.multi_label = a.value("multi_label", false);
    o.num_labels = int_or_none(a, "num_labels");
    o.label_weights = doubles_or_none(a, "label_weights");
    o.from_logits = a.value("from_logits", false);
    return std::make_shared<AUC>(o);
  }
  if (cls == "F1Score") {
    F1ScoreOptions o;
    if (a.contains("average") && !a.at("average").is_null()) o.average = a.at("average").get<std::string>();
    if (a.contains("threshold") && !a.at("threshold").is_null()) o.threshold = a.at("threshold").get<double>();
    return std::make_shared<F1Score>(o);
  }
  if (cls == "RootMeanSquaredError") return std::make_shared<RootMeanSquaredError>();
  if (cls == "SparseCategoricalAccuracy") return std::make_shared<SparseCategoricalAccuracy>();
  if (cls == "CategoricalAccuracy") return std::make_shared<CategoricalAccuracy>();
  if (cls == "BinaryAccuracy") return std::make_shared<BinaryAccuracy>("binary_accuracy", a.value("threshold", 0.5));
  if (cls == "MeanAbsoluteError") return std::make_shared<MeanAbsoluteError>();
  if (cls == "MeanSquaredError") return std::make_shared<MeanSquaredError>();
  if (cls == "Mean") return std::make_shared<Mean>();
  if (cls == "Hinge" || cls == "SquaredHinge" || cls == "CategoricalHinge" || cls == "Poisson" ||
      cls == "MeanAbsolutePercentageError" || cls == "MeanSquaredLogarithmicError" || cls == "KLDivergence" ||
      cls == "LogCoshError")
    return metrics::get(cls);
  if (cls == "CosineSimilarity") return std::make_shared<metrics::CosineSimilarity>("cosine", a.value("axis", -1));
  const losses::CrossentropyOptions ce{.from_logits = a.value("from_logits", false),
                                       .label_smoothing = a.value("label_smoothing", 0.0)};
  if (cls == "BinaryCrossentropy") return std::make_shared<metrics::BinaryCrossentropy>("bce", ce);
  if (cls == "CategoricalCrossentropy") return std::make_shared<metrics::CategoricalCrossentropy>("cce", ce);
  if (cls == "SparseCategoricalCrossentropy") return std::make_shared<metrics::SparseCategoricalCrossentropy>("scce", ce);
  FAIL("no metric for class ", cls);
  return nullptr;
}

struct Batch {
  Tensor y_true, y_pred, sample_weight;
};

std::vector<Batch> batches_of(const nlohmann::json& c, Device dev, DType pred_dtype) {
  std::vector<Batch> out;
  for (const auto& b : c.at("batches")) {
    Batch x{tensor_of(b.at("y_true"), dev), tensor_of(b.at("y_pred"), dev), Tensor()};
    if (is_floating(x.y_pred.dtype())) x.y_pred = x.y_pred.to(pred_dtype);
    if (!b.at("sample_weight").is_null()) x.sample_weight = tensor_of(b.at("sample_weight"), dev);
    out.push_back(x);
  }
  return out;
}

/// Keras's float32 result against mpt's double: 1e-6 relative, plus 1e-7 absolute for Keras's own
/// float32 rounding near zero (the worst case, an AUC PR-gain of 0.02 computed through
/// cancelling float32 terms, is 1.3e-6 relative; every other case is within 4e-7).
void check_like_keras(const std::vector<double>& got, const nlohmann::json& want, const std::string& what) {
  const auto expected = want.get<std::vector<double>>();
  REQUIRE_MESSAGE(got.size() == expected.size(), what, ": ", got.size(), " values, Keras ", expected.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    CHECK_MESSAGE(std::abs(got[i] - expected[i]) <= 1e-6 * std::abs(expected[i]) + 1e-7, what, " value ", i,
                  ": mpt ", got[i], ", Keras ", expected[i]);
}

std::vector<double> summed(std::vector<double> a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

}  // namespace

TEST_CASE("every metric matches Keras's recorded results batch by batch, weighted and not, on every device") {
  for_each_device([](Device dev) {
    std::size_t replayed = 0;
    for (const auto& c : keras_cases()) {
      const std::string name = c.at("name");
      std::vector<DType> dtypes{float32};
      if (c.at("exact16").get<bool>()) dtypes = {float32, float16, bfloat16};
      for (DType d : dtypes) {
        const std::string what = name + " (" + to_string(d) + " predictions, " + dev.str() + ")";
        auto m = metric_of(c);
        const auto batches = batches_of(c, dev, d);
        reset_transfers();
        for (std::size_t i = 0; i < batches.size(); ++i) {
          const Batch& b = batches[i];
          if (b.sample_weight.defined()) m->update_state(b.y_true, b.y_pred, b.sample_weight);
          else m->update_state(b.y_true, b.y_pred);
          if (dev == Device::test()) CHECK_MESSAGE(transfers().to_host == 0, what, ": update_state read the device");
          check_like_keras(m->results(), c.at("results")[i], what + " batch " + std::to_string(i));
          reset_transfers();
        }
        ++replayed;
        if (d != float32) continue;
        // The reduction states of two halves add up to the whole's.
        if (batches.size() >= 2) {
          auto first = m->clone(), rest = m->clone();
          for (std::size_t i = 0; i < batches.size(); ++i) {
            const Batch& b = batches[i];
            (i == 0 ? first : rest)->update_state(b.y_true, b.y_pred, b.sample_weight);
          }
          check_like_keras(m->results_of_state(summed(first->reduction_state(), rest->reduction_state())),
                           c.at("results").back(), what + " (two ranks)");
        }
        // reset_state: the first batch again gives the first result.
        m->reset_state();
        m->update_state(batches[0].y_true, batches[0].y_pred, batches[0].sample_weight);
        check_like_keras(m->results(), c.at("results")[0], what + " after reset_state");
      }
    }
    CHECK(replayed >= keras_cases().size());
  });
}

TEST_CASE("top-k accuracies: ties with the k-th score count as in, labels outside the classes never") {
  for_each_device([](Device dev) {
    // Row 0's class 2 ties with class 1 for the top score (both rank 1); row 1's class 2 is 3rd.
    Tensor y_pred = f32({0.1, 0.4, 0.4, 0.1, 0.5, 0.3, 0.2, 0.0}, {2, 4}, dev);
    Tensor ids = Tensor::from_vector<std::int32_t>({2, 2}, {2}, dev);
    check_close(metrics::sparse_top_k_categorical_accuracy(ids, y_pred, 1), {1, 0}, tolerance(float32), "k=1");
    check_close(metrics::sparse_top_k_categorical_accuracy(ids, y_pred, 2), {1, 0}, tolerance(float32), "k=2");
    check_close(metrics::sparse_top_k_categorical_accuracy(ids, y_pred, 3), {1, 1}, tolerance(float32), "k=3");
    Tensor one_hot = f32({0, 0, 1, 0, 0, 0, 1, 0}, {2, 4}, dev);
    check_close(metrics::top_k_categorical_accuracy(one_hot, y_pred, 2), {1, 0}, tolerance(float32), "one-hot k=2");
    check_close(metrics::sparse_top_k_categorical_accuracy(Tensor::from_vector<std::int32_t>({7, -1}, {2}, dev),
                                                           y_pred, 3),
                {0, 0}, tolerance(float32), "out of range");
    // [N, 1] labels give [N, 1] values; float ids are truncated.
    Tensor v = metrics::sparse_top_k_categorical_accuracy(f32({2.0, 0.0}, {2, 1}, dev), y_pred, 3);
    CHECK(v.shape() == Shape{2, 1});
    check_close(v, {1, 1}, tolerance(float32), "[N, 1] float labels");
    // Sorted ids: a hit among the first k.
    Tensor sorted = Tensor::from_vector<std::int32_t>({3, 2, 9, 5, 1, 2}, {2, 3}, dev);
    check_close(metrics::sparse_top_k_categorical_accuracy(ids, sorted, 2, true), {1, 0}, tolerance(float32),
                "sorted k=2");
    check_close(metrics::sparse_top_k_categorical_accuracy(ids, sorted, 5, true), {1, 1}, tolerance(float32),
                "sorted k beyond the ids");
    metrics::SparseTopKCategoricalAccuracy m(2);
    m.update_state(ids, y_pred, f32({3, 1}, {2}, dev));
    CHECK(m.result() == doctest::Approx(0.75));
  });
}

TEST_CASE("metrics::get knows Keras's names of the new metrics and keeps the user's name") {
  CHECK(is_a<metrics::TopKCategoricalAccuracy>(metrics::get("top_k_categorical_accuracy")));
  CHECK(is_a<metrics::TopKCategoricalAccuracy>(metrics::get("TopKCategoricalAccuracy")));
  CHECK(is_a<metrics::SparseTopKCategoricalAccuracy>(metrics::get("sparse_top_k_categorical_accuracy")));
  CHECK(is_a<metrics::SparseTopKCategoricalAccuracy>(metrics::get("SparseTopKCategoricalAccuracy")));
  CHECK(is_a<metrics::Precision>(metrics::get("precision")));
  CHECK(is_a<metrics::Precision>(metrics::get("Precision")));
  CHECK(is_a<metrics::Recall>(metrics::get("recall")));
  CHECK(is_a<metrics::AUC>(metrics::get("auc")));
  CHECK(is_a<metrics::AUC>(metrics::get("AUC")));
  CHECK(is_a<metrics::F1Score>(metrics::get("f1_score")));
  CHECK(is_a<metrics::F1Score>(metrics::get("F1Score")));
  CHECK(is_a<metrics::RootMeanSquaredError>(metrics::get("root_mean_squared_error")));
  CHECK(is_a<metrics::RootMeanSquaredError>(metrics::get("RootMeanSquaredError")));
  CHECK(metrics::get("AUC")->name() == "AUC");
  CHECK(metrics::get("precision")->name() == "precision");
  auto k = std::dynamic_pointer_cast<metrics::TopKCategoricalAccuracy>(metrics::get("top_k_categorical_accuracy"));
  REQUIRE(k);
  CHECK(k->k() == 5);
  // Keras's get is exact: neither "Auc" nor "rmse" is a Keras name.
  CHECK(contains(error_of([] { metrics::get("Auc"); }), "valid names"));
  CHECK(contains(error_of([] { metrics::get("rmse"); }), "root_mean_squared_error"));
}

TEST_CASE("Precision, Recall, AUC and F1Score: several values through results(), clone keeps the arguments") {
  for_each_device([](Device dev) {
    Tensor y_true = f32({1, 0, 1, 0, 1, 1, 0, 0}, {4, 2}, dev);
    Tensor y_pred = f32({0.9, 0.6, 0.4, 0.2, 0.7, 0.8, 0.1, 0.3}, {4, 2}, dev);
    metrics::Precision p({.thresholds = std::vector<double>{0.25, 0.5, 0.75}});
    p.update_state(y_true, y_pred);
    // Predicted positive at 0.25: 0.9 0.6 0.4 0.7 0.8 0.3 (4 of them true); at 0.5: 0.9 0.6 0.7 0.8 (3);
    // at 0.75: 0.9 0.8 (2).
    check_close(p.results(), {4.0 / 6.0, 3.0 / 4.0, 1.0}, {1e-12, 1e-12}, "precision per threshold");
    CHECK(contains(error_of([&] { p.result(); }), "use results()"));
    CHECK(p.reduction_state() == std::vector<double>{4, 3, 2, 2, 1, 0});
    auto copy = p.clone();
    CHECK(copy->results() == std::vector<double>{0, 0, 0});
    metrics::Recall r({.class_id = 1});
    r.update_state(y_true, y_pred);  // class 1: labels 0 0 1 0, scores 0.6 0.2 0.8 0.3
    CHECK(r.result() == doctest::Approx(1.0));
    CHECK(r.reduction_state() == std::vector<double>{1, 0});
    metrics::F1Score f1;  // average none: one per class
    f1.update_state(y_true, y_pred);
    CHECK(f1.results().size() == 2);
    CHECK(contains(error_of([&] { f1.result(); }), "use results()"));
    metrics::AUC auc({.multi_label = true});
    CHECK(auc.reduction_state().empty());  // the label count comes with the first batch
    auc.update_state(y_true, y_pred);
    CHECK(auc.reduction_state().size() == 4 * 200 * 2);
    CHECK(auc.result() == doctest::Approx(1.0));  // both labels separate perfectly
    auto auc2 = std::dynamic_pointer_cast<metrics::AUC>(auc.clone());
    REQUIRE(auc2);
    CHECK(auc2->options().multi_label);
    CHECK(auc2->result() == 0.0);
    auc.reset_state();
    CHECK(auc.result() == 0.0);
    metrics::AUC with_thresholds({.thresholds = std::vector<double>{0.7, 0.2}});
    CHECK(with_thresholds.options().num_thresholds == 4);
    CHECK(with_thresholds.thresholds() == std::vector<double>{-1e-7, 0.2, 0.7, 1 + 1e-7});
  });
}

TEST_CASE("new metric errors name the metric and what it got") {
  Tensor y2 = Tensor::from_vector<float>({1, 0, 0, 1}, {2, 2});
  Tensor p2 = Tensor::from_vector<float>({0.8, 0.3, 0.1, 0.6}, {2, 2});
  Tensor p3 = Tensor::from_vector<float>({0.8, 0.3, 0.1, 0.6, 0.2, 0.2}, {2, 3});
  CHECK(contains(error_of([] { metrics::AUC({.curve = "LIFT"}); }), "metric auc: invalid curve 'LIFT'"));
  CHECK(contains(error_of([] { metrics::AUC({.summation_method = "simpson"}); }), "summation_method 'simpson'"));
  CHECK(contains(error_of([] { metrics::AUC({.num_thresholds = 1}); }), "num_thresholds"));
  CHECK(contains(error_of([] { metrics::AUC({.num_labels = 3}); }), "num_labels is needed only when multi_label"));
  CHECK(contains(error_of([] { metrics::Precision({.thresholds = std::vector<double>{0.5, 1.5}}); }),
                 "metric precision: thresholds must be in [0, 1], got 1.5"));
  CHECK(contains(error_of([] { metrics::Recall({.top_k = 0, .name = "r"}); }), "metric r: top_k"));
  CHECK(contains(error_of([] { metrics::F1Score({.average = "samples"}); }), "metric f1_score: invalid average"));
  CHECK(contains(error_of([] { metrics::F1Score({.threshold = 0.0}); }), "threshold"));

  metrics::Precision p({.name = "prec"});
  CHECK(contains(error_of([&] { p.update_state(y2, p3); }), "metric prec: y_true (2, 2) and y_pred (2, 3)"));
  CHECK(contains(error_of([&] { p.update_state(y2, p2, Tensor::ones({3})); }),
                 "metric prec: sample_weight (3,) does not broadcast to y_pred (2, 2)"));
  metrics::Precision top({.top_k = 3});
  CHECK(contains(error_of([&] { top.update_state(y2, p2); }), "top_k 3 exceeds the 2 classes"));
  metrics::Recall cid({.class_id = 2});
  CHECK(contains(error_of([&] { cid.update_state(y2, p2); }), "metric recall: class_id 2 is out of range"));
  metrics::AUC ml({.multi_label = true, .num_labels = 3});
  CHECK(contains(error_of([&] { ml.update_state(y2, p2); }), "metric auc: y_pred (2, 2) has 2 labels, the metric 3"));
  CHECK(contains(error_of([&] { ml.update_state(Tensor::zeros({4}), Tensor::zeros({4})); }), "multi_label"));
  metrics::F1Score f1;
  CHECK(contains(error_of([&] { f1.update_state(Tensor::zeros({4}), Tensor::zeros({4})); }),
                 "metric f1_score: expects y_true and y_pred of one shape (batch_size, output_dim)"));
  CHECK(contains(error_of([&] { f1.update_state(y2, p2, Tensor::ones({2, 2})); }), "sample_weight (2, 2)"));
  f1.update_state(y2, p2);
  CHECK(contains(error_of([&] { f1.update_state(Tensor::zeros({2, 3}), p3); }), "has 3 classes, earlier batches 2"));
  metrics::TopKCategoricalAccuracy top_k(2, "top2");
  CHECK(contains(error_of([&] { top_k.update_state(y2, p3); }), "top_k_categorical_accuracy"));
  CHECK(contains(error_of([&] { top_k.update_state(y2, p2, Tensor::ones({3})); }),
                 "metric top2: sample_weight (3,) does not broadcast"));
  metrics::SparseTopKCategoricalAccuracy sparse;
  CHECK(contains(error_of([&] { sparse.update_state(Tensor::zeros({3}), p2); }), "sparse_top_k_categorical_accuracy"));
  metrics::RootMeanSquaredError rmse;
  CHECK(contains(error_of([&] { rmse.update_state(y2, p3); }), "metric root_mean_squared_error"));
  metrics::Mean mean("m");
  CHECK(contains(error_of([&] { mean.update(p2, Tensor::ones({2, 3})); }), "metric m: sample_weight (2, 3)"));
}

namespace {
/// A user metric overriding only the unweighted update_state.
class SecondColumn : public metrics::Mean {
 public:
  SecondColumn() : Mean("second_column") {}
  void update_state(const Tensor&, const Tensor& y_pred) override { update(ops::slice(y_pred, 1, 1, 2)); }
  std::shared_ptr<metrics::Metric> clone() const override { return std::make_shared<SecondColumn>(); }
};
class Constant : public metrics::Metric {
 public:
  Constant() : Metric("constant") {}
  void update_state(const Tensor&, const Tensor&) override {}
  double result() const override { return 1.0; }
  void reset_state() override {}
  std::shared_ptr<Metric> clone() const override { return std::make_shared<Constant>(); }
};
}  // namespace

TEST_CASE("sample_weight: a user metric without a weighted update refuses weights, and takes none") {
  Tensor y = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  SecondColumn s;
  metrics::Metric& m = s;
  m.update_state(y, y, Tensor());  // no weight: the user's override
  CHECK(s.result() == doctest::Approx(3.0));
  CHECK(contains(error_of([&] { m.update_state(y, y, Tensor::ones({2})); }),
                 "metric 'second_column': its class derives from a built-in metric"));
  Constant c;
  metrics::Metric& cm = c;
  cm.update_state(y, y, Tensor());
  CHECK(contains(error_of([&] { cm.update_state(y, y, Tensor::ones({2})); }), "metric 'constant' takes no sample_weight"));
  // Weights on another device than the predictions are moved to them; integer weights are fine.
  metrics::Mean mean;
  mean.update_state(y, y, Tensor::from_vector<std::int32_t>({1, 3}, {2}));
  CHECK(mean.result() == doctest::Approx((1.5 * 1 + 3.5 * 3) / 4.0));
}

TEST_CASE("a model compiled with the new metrics saves as .keras and .h5 and loads back with their arguments") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("mpt-metrics-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Tensor x = Tensor::random_uniform({32, 8}, -1, 1, 3);
  std::vector<float> onehot(32 * 4, 0.0f);
  std::vector<std::int32_t> ids(32);
  auto xv = x.to_vector<float>();
  for (int i = 0; i < 32; ++i) {
    ids[i] = (xv[i * 8] > 0 ? 1 : 0) + (xv[i * 8 + 1] > 0 ? 2 : 0);
    onehot[i * 4 + ids[i]] = 1.0f;
  }
  auto make = [] {
    return std::make_unique<Sequential>(std::vector<LayerRef>{
        layers::Input({8}), layers::Dense(6, {.activation = "relu"}), layers::Dense(4, {.activation = "softmax"})});
  };
  auto check_round_trip = [&](Model& m, const Tensor& y, const std::string& tag) {
    m.fit(x, y, {.batch_size = 8, .epochs = 1, .verbose = 0});
    const auto want = m.evaluate(x, y, {.batch_size = 32});
    for (const std::string file : {tag + ".keras", tag + ".h5"}) {
      m.save((dir / file).string());
      auto loaded = load_model((dir / file).string());
      const auto got = loaded->evaluate(x, y, {.batch_size = 32});
      REQUIRE(got.size() == want.size());
      for (const auto& kv : want) {
        REQUIRE_MESSAGE(got.count(kv.first), file, ": no ", kv.first);
        CHECK_MESSAGE(got.at(kv.first) == doctest::Approx(kv.second).epsilon(1e-6), file, " ", kv.first);
      }
    }
  };
  auto dense = make();
  dense->compile({.optimizer = "sgd",
                  .loss = "categorical_crossentropy",
                  .metrics = {metrics::TopKCategoricalAccuracy(2, "top2"),
                              metrics::Precision({.thresholds = std::vector<double>{0.3}, .class_id = 1, .name = "p1"}),
                              metrics::Recall({.top_k = 2}),
                              metrics::AUC({.curve = "PR", .summation_method = "majoring", .multi_label = true,
                                            .num_labels = 4, .label_weights = std::vector<double>{1, 2, 0.5, 1}}),
                              metrics::AUC({.name = "auc_t", .thresholds = std::vector<double>{0.2, 0.5}}),
                              metrics::F1Score({.average = "macro", .threshold = 0.3}),
                              metrics::RootMeanSquaredError("rmse"), metrics::BinaryAccuracy("bin", 0.3), "auc",
                              "precision", metrics::Hinge("h"), metrics::SquaredHinge(), "categorical_hinge",
                              metrics::Poisson(), "mape", metrics::MeanSquaredLogarithmicError("log_err"),
                              "kl_divergence", metrics::LogCoshError(), metrics::CosineSimilarity("cos", 0),
                              metrics::BinaryCrossentropy("bce", {.label_smoothing = 0.1}),
                              metrics::CategoricalCrossentropy("cce", {.from_logits = true}),
                              "categorical_crossentropy"}});
  check_round_trip(*dense, Tensor::from_vector(onehot, {32, 4}), "dense");
  auto sparse = make();
  sparse->compile({.optimizer = "sgd",
                   .loss = "sparse_categorical_crossentropy",
                   .metrics = {metrics::SparseTopKCategoricalAccuracy(2, "top2"), "sparse_top_k_categorical_accuracy",
                               metrics::SparseCategoricalCrossentropy("scce", {.from_logits = true}),
                               "sparse_categorical_crossentropy"}});
  check_round_trip(*sparse, Tensor::from_vector(ids, {32}), "sparse");
  // A SparseCategoricalAccuracy with ignore_class has no Keras form: .keras refuses it, .h5 keeps it.
  auto ignoring = make();
  ignoring->compile({.optimizer = "sgd",
                     .loss = "sparse_categorical_crossentropy",
                     .metrics = {metrics::SparseCategoricalAccuracy("acc", 3)}});
  ignoring->fit(x, Tensor::from_vector(ids, {32}), {.batch_size = 8, .epochs = 1, .verbose = 0});
  CHECK(contains(error_of([&] { ignoring->save((dir / "ignoring.keras").string()); }), "ignore_class 3 has no Keras"));
  ignoring->save((dir / "ignoring.h5").string());
  CHECK(load_model((dir / "ignoring.h5").string())->evaluate(x, Tensor::from_vector(ids, {32})).at("acc") ==
        doctest::Approx(ignoring->evaluate(x, Tensor::from_vector(ids, {32})).at("acc")));
  fs::remove_all(dir);
}

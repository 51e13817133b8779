// Metric functions on hand-made inputs, running means across batches, Keras's "accuracy"
// resolution, and error messages.
#include <cmath>

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
    // Without ignore_class, -1 is just a wrong label.
    metrics::SparseCategoricalAccuracy plain;
    plain.update_state(labels, y_pred);
    CHECK(plain.result() == doctest::Approx(2.0 / 6.0));
  });
}

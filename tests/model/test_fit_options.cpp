// fit's weighting and epoch options against Keras 3 fits recorded by
// tests/interop/record_keras_fit.py (tests/data/keras_fit.json): sample_weight, class_weight
// (sparse and one-hot targets), steps_per_epoch (fewer and more batches than a pass holds),
// validation_freq, validation_batch_size, validation data with sample weights, validation_split
// with sample weights, evaluate with sample_weight. Then a resumed steps_per_epoch fit, sample
// weights under shuffling, the weighted loss entry point, predict_on_batch, get_layer, and the
// bad inputs.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;

namespace {

const nlohmann::json& recorded() {
  static const nlohmann::json j = [] {
    std::ifstream in(test::test_data("keras_fit.json"));
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return j;
}

/// The script's model: x[4] -> Dense(3, tanh) "d1" -> Dense(3, softmax) "d2".
std::unique_ptr<Model> classifier(const std::string& loss = "sparse_categorical_crossentropy",
                                  const std::vector<std::string>& metrics = {},
                                  const std::vector<std::string>& weighted_metrics = {}) {
  auto x = mpt::Input({4}, {.name = "x"});
  auto h = layers::Dense(3, {.activation = "tanh", .name = "d1"})(x);
  auto m = std::make_unique<Model>(x, layers::Dense(3, {.activation = "softmax", .name = "d2"})(h), "m");
  m->compile({.optimizer = optimizers::SGD({.learning_rate = 0.5}),
              .loss = loss,
              .metrics = {metrics.begin(), metrics.end()},
              .weighted_metrics = {weighted_metrics.begin(), weighted_metrics.end()}});
  return m;
}

/// Every entry of Keras's results (a history's lists, or evaluate's numbers) in mpt's, to 1e-5.
void check_results(const std::map<std::string, std::vector<double>>& got, const nlohmann::json& keras) {
  for (const auto& item : keras.items()) {
    CAPTURE(item.key());
    REQUIRE(got.count(item.key()) == 1);
    const auto want = item.value().is_array() ? item.value().get<std::vector<double>>()
                                              : std::vector<double>{item.value().get<double>()};
    const auto& values = got.at(item.key());
    REQUIRE(values.size() == want.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      CHECK_MESSAGE(values[i] == doctest::Approx(want[i]).epsilon(1e-5), "entry ", i);
  }
}
std::map<std::string, std::vector<double>> as_lists(const std::map<std::string, double>& results) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& kv : results) out[kv.first] = {kv.second};
  return out;
}

Tensor floats(const nlohmann::json& v, const Shape& shape, Device dev) {
  return Tensor::from_vector(v.get<std::vector<float>>(), shape).to(dev);
}

/// A recorded run's data on `dev`: x [10, 4], y (labels [10] or one-hot [10, 3]), weights [10].
struct RunData {
  Tensor x, y, w;
};
RunData data_of(const nlohmann::json& r, Device dev) {
  const auto y_shape = r["y_shape"].get<Shape>();
  const Tensor y = y_shape.size() == 1 ? Tensor::from_vector(r["y"].get<std::vector<std::int32_t>>(), y_shape).to(dev)
                                       : floats(r["y"], y_shape, dev);
  return {floats(r["x"], {10, 4}, dev), y, floats(r["sample_weight"], {10}, dev)};
}

std::map<std::int64_t, double> class_weight_of(const nlohmann::json& r) {
  std::map<std::int64_t, double> cw;
  if (r.contains("class_weight"))
    for (const auto& item : r["class_weight"].items()) cw[std::stoll(item.key())] = item.value().get<double>();
  return cw;
}

/// The FitOptions the script gave Keras for run `name` (besides batch 4, no shuffle).
FitOptions options_of(const std::string& name, const nlohmann::json& r, const RunData& d, Device dev) {
  FitOptions o{.batch_size = 4, .epochs = 3, .verbose = 0, .shuffle = false};
  o.class_weight = class_weight_of(r);
  for (const char* weighted :
       {"sample_weight", "steps_per_epoch_5", "validation_freq", "validation_split", "weighted_metrics"})
    if (name == weighted) o.sample_weight = d.w;
  if (name == "steps_per_epoch_2") o.epochs = 5, o.steps_per_epoch = 2;
  if (name == "steps_per_epoch_5") o.steps_per_epoch = 5;
  if (name == "validation_freq") o.epochs = 5, o.validation_freq = 2, o.validation_batch_size = 2;
  if (r.contains("val_x")) {
    o.validation_data = std::make_pair(floats(r["val_x"], {5, 4}, dev),
                                       Tensor::from_vector(r["val_y"].get<std::vector<std::int32_t>>(), {5}).to(dev));
    o.validation_sample_weight = floats(r["val_sample_weight"], {5}, dev);
  }
  if (name == "validation_split") o.validation_split = 0.3;
  return o;
}

void check_weights(const Model& m, const nlohmann::json& expected) {
  for (const auto& v : m.variables()) {
    const auto want = expected[v.path()]["values"].get<std::vector<double>>();
    const auto got = v.value().to_vector<double>();
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      CHECK_MESSAGE(got[i] == doctest::Approx(want[i]).epsilon(1e-5), v.path(), "[", i, "]");
  }
}

const char* const kRuns[] = {"plain",           "sample_weight",     "class_weight_sparse", "class_weight_one_hot",
                             "steps_per_epoch_2", "steps_per_epoch_5", "validation_freq",     "validation_split",
                             "weighted_metrics",  "weighted_metrics_class_weight"};

}  // namespace

TEST_CASE("fit's sample_weight, class_weight, steps_per_epoch, validation options and weighted_metrics as Keras 3") {
  REQUIRE(recorded()["keras_version"].get<std::string>().rfind("3.", 0) == 0);
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    for (const std::string name : kRuns) {
      CAPTURE(name);
      const auto& r = recorded()["runs"][name];
      auto m = classifier(r["loss_name"].get<std::string>(), r["metrics"].get<std::vector<std::string>>(),
                          r["weighted_metrics"].get<std::vector<std::string>>());
      for (const auto& v : m->variables()) v.assign(floats(r["initial_weights"][v.path()]["values"],
                                                           r["initial_weights"][v.path()]["shape"].get<Shape>(), dev));
      const RunData d = data_of(r, dev);
      std::vector<bool> validated;
      callbacks::LambdaCallback seen;
      seen.epoch_end = [&](int, const Logs& logs) { validated.push_back(logs.count("val_loss") > 0); };
      FitOptions o = options_of(name, r, d, dev);
      o.callbacks = {seen};
      const History h = m->fit(d.x, d.y, o);
      const auto& loss = h.history.at("loss");
      REQUIRE(loss.size() == r["loss"].size());
      for (std::size_t e = 0; e < loss.size(); ++e)
        CHECK_MESSAGE(loss[e] == doctest::Approx(r["loss"][e].get<double>()).epsilon(1e-5), "epoch ", e);
      // val_loss where Keras validated (validation_freq), and only there.
      REQUIRE(validated.size() == r["val_loss"].size());
      std::vector<double> keras_val;
      for (std::size_t e = 0; e < validated.size(); ++e) {
        CHECK_MESSAGE(validated[e] == !r["val_loss"][e].is_null(), "epoch ", e);
        if (!r["val_loss"][e].is_null()) keras_val.push_back(r["val_loss"][e].get<double>());
      }
      const std::vector<double> no_val;
      const auto& val = h.history.count("val_loss") ? h.history.at("val_loss") : no_val;
      REQUIRE(val.size() == keras_val.size());
      for (std::size_t i = 0; i < val.size(); ++i)
        CHECK_MESSAGE(val[i] == doctest::Approx(keras_val[i]).epsilon(1e-5), "validation ", i);
      check_results(h.history, r["history"]);  // metrics, weighted metrics and their val_ twins
      check_weights(*m, r["final_weights"]);
      check_results(as_lists(m->evaluate(d.x, d.y, {.batch_size = 3})), r["evaluate"]);
      check_results(as_lists(m->evaluate(d.x, d.y, {.batch_size = 3, .sample_weight = d.w})), r["evaluate_weighted"]);
    }
  });
}

TEST_CASE("steps_per_epoch: a fit resumed at initial_epoch takes the batches the uninterrupted one took") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const auto& r = recorded()["runs"]["sample_weight"];
    const RunData d = data_of(r, dev);
    auto weights_after = [&](std::vector<std::pair<int, int>> spans, std::vector<double>& losses) {
      set_random_seed(3);
      auto m = classifier();
      for (const auto& span : spans) {
        const History h = m->fit(d.x, d.y, {.batch_size = 4, .epochs = span.second, .verbose = 0, .sample_weight = d.w,
                                            .initial_epoch = span.first, .steps_per_epoch = 2, .seed = 5});
        losses.insert(losses.end(), h.history.at("loss").begin(), h.history.at("loss").end());
      }
      std::vector<double> out;
      for (const auto& w : m->get_weights()) {
        const auto v = w.to_vector<double>();
        out.insert(out.end(), v.begin(), v.end());
      }
      return out;
    };
    std::vector<double> whole_losses, split_losses;
    const auto whole = weights_after({{0, 7}}, whole_losses);
    const auto split = weights_after({{0, 3}, {3, 7}}, split_losses);
    CHECK(whole == split);  // the same batches, shuffles and weights: bit for bit
    CHECK(whole_losses == split_losses);
    REQUIRE(whole_losses.size() == 7);
  });
}

TEST_CASE("sample weights are shuffled with their rows") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const auto& r = recorded()["runs"]["sample_weight"];
    const RunData d = data_of(r, dev);
    // One batch of all rows: the shuffle changes only the summation order, unless the weights
    // stayed behind while x and y moved.
    std::vector<std::vector<double>> finals;
    for (bool shuffle : {false, true}) {
      set_random_seed(4);
      auto m = classifier();
      m->fit(d.x, d.y,
             {.batch_size = 10, .epochs = 4, .verbose = 0, .shuffle = shuffle, .sample_weight = d.w, .seed = 9});
      std::vector<double> all;
      for (const auto& w : m->get_weights()) {
        const auto v = w.to_vector<double>();
        all.insert(all.end(), v.begin(), v.end());
      }
      finals.push_back(all);
    }
    test::check_close(finals[1], finals[0], {1e-5, 1e-6}, "shuffled vs in order");
  });
}

TEST_CASE("the weighted loss: per example over every position, per position, and [N, 1]") {
  test::for_each_device([](Device dev) {
    losses::SparseCategoricalCrossentropy loss_fn;
    // Two examples of three positions, four classes.
    const std::vector<float> logits{0.1f, 0.5f, -0.3f, 0.2f, 1.0f, 0.0f, 0.3f, -0.5f, 0.4f, 0.4f, 0.1f, 0.0f,
                                    -1.0f, 0.2f, 0.6f, 0.9f, 0.0f, 0.0f, 0.5f, 0.5f, 0.3f, 0.1f, 0.2f, 0.7f};
    const Tensor p = ops::softmax(Tensor::from_vector(logits, {2, 3, 4}).to(dev));
    const Tensor y = Tensor::from_vector(std::vector<std::int32_t>{0, 1, 2, 3, 0, 1}, {2, 3}).to(dev);
    const auto per = loss_fn.call(y, p).to_vector<double>();
    REQUIRE(per.size() == 6);
    const std::vector<double> w{0.5, 2.0};
    double expected = 0;
    for (std::size_t i = 0; i < 6; ++i) expected += per[i] * w[i / 3];
    expected /= 6;  // "sum_over_batch_size": over every value, not over the weights
    const Tensor w1 = Tensor::from_vector(std::vector<float>{0.5f, 2.0f}, {2}).to(dev);
    CHECK(loss_fn(y, p, w1).item() == doctest::Approx(expected).epsilon(1e-6));
    CHECK(loss_fn(y, p, w1.reshape({2, 1})).item() == doctest::Approx(expected).epsilon(1e-6));
    const Tensor wp = Tensor::from_vector(std::vector<float>{0.5f, 0.5f, 0.5f, 2.0f, 2.0f, 2.0f}, {2, 3}).to(dev);
    CHECK(loss_fn(y, p, wp).item() == doctest::Approx(expected).epsilon(1e-6));
    CHECK(loss_fn(y, p, Tensor()).item() == doctest::Approx(loss_fn(y, p).item()).epsilon(1e-7));
    const std::string bad = test::error_of([&] { loss_fn(y, p, Tensor::ones({3}).to(dev)); });
    CHECK(test::contains(bad, "loss sparse_categorical_crossentropy: sample_weight (3,) needs one row per example"));
    const std::string misfit = test::error_of([&] { loss_fn(y, p, Tensor::ones({2, 2}).to(dev)); });
    CHECK(test::contains(misfit, "sample_weight of shape (2, 2) does not fit the per-example losses of shape (2, 3)"));
  });
}

TEST_CASE("predict_on_batch: one inference pass, float32 out, where x came from") {
  test::for_each_device([](Device dev) {
    for (const std::string policy : {"float32", "mixed_bfloat16"}) {
      CAPTURE(policy);
      test::PolicyDeviceScope scope(policy, dev);
      set_random_seed(6);
      Sequential m({layers::Input({4}), layers::Dense(8, {.activation = "relu"}), layers::Dropout(0.5),
                    layers::Dense(3)});
      const Tensor x = Tensor::random_uniform({7, 4}, -1, 1, 2, float32, Device::cpu());
      const Tensor p = m.predict_on_batch(x);
      CHECK(p.shape() == Shape{7, 3});
      CHECK(p.dtype() == float32);
      CHECK(p.device() == Device::cpu());
      // Inference mode (Dropout off): the same as predict, and as another call.
      test::check_close(p.to_vector<double>(), m.predict(x, {.batch_size = 2}).to_vector<double>(),
                        test::tolerance(m.dtype_policy().compute_dtype()), "predict_on_batch vs predict");
      CHECK(p.to_vector<float>() == m.predict_on_batch(x).to_vector<float>());
      CHECK(test::contains(test::error_of([&] { m.predict_on_batch(Tensor::zeros({2, 5})); }),
                           "expected inputs of shape"));
    }
  });
}

TEST_CASE("get_layer by name and by index, with Keras's indices and errors") {
  auto x = mpt::Input({4}, {.name = "x"});
  auto h = layers::Dense(3, {.name = "d1"})(x);
  Model m(x, layers::Dense(2, {.name = "d2"})(h), "m");
  // Keras's model.layers: ['x' (InputLayer), 'd1', 'd2'].
  CHECK(m.get_layer("d1")->name() == "d1");
  CHECK(m.get_layer(1)->name() == "d1");
  CHECK(m.get_layer(2)->name() == "d2");
  CHECK(m.get_layer(-1)->name() == "d2");
  CHECK(m.get_layer(-2).ptr() == m.get_layer("d1").ptr());
  CHECK(test::contains(test::error_of([&] { m.get_layer("nope"); }),
                       "get_layer: model 'm' has no layer named 'nope'; its layers are ['x', 'd1', 'd2']"));
  CHECK(test::contains(test::error_of([&] { m.get_layer(3); }),
                       "get_layer: asked for the layer at index 3 but model 'm' has only 3 layers"));
  CHECK(test::contains(test::error_of([&] { m.get_layer(-4); }), "index -4"));
  CHECK(test::contains(test::error_of([&] { m.get_layer(0); }), "'x' is an Input of model 'm'"));
  CHECK(test::contains(test::error_of([&] { m.get_layer("x"); }), "'x' is an Input of model 'm'"));
  // Sequential: Keras's list leaves the Input out.
  Sequential s({layers::Input({4}), layers::Dense(3), layers::Dense(2)});
  CHECK(s.get_layer(0)->name() == "dense");
  CHECK(s.get_layer("dense_1").ptr() == s.get_layer(1).ptr());
  CHECK(test::contains(test::error_of([&] { s.get_layer("d"); }), "its layers are ['dense', 'dense_1']"));
}

TEST_CASE("fit's weighting and epoch options: bad inputs name fit and what they got") {
  test::PolicyDeviceScope scope("float32", Device::cpu());
  const auto& r = recorded()["runs"]["plain"];
  const RunData d = data_of(r, Device::cpu());
  auto m = classifier();
  auto fit_error = [&](FitOptions o) {
    o.verbose = 0;
    return test::error_of([&] { m->fit(d.x, d.y, std::move(o)); });
  };
  const Tensor w9 = Tensor::ones({9});
  CHECK(test::contains(fit_error({.sample_weight = w9}),
                       "fit: sample_weight needs one weight per sample of x (10, 4), got shape (9,)"));
  CHECK(test::contains(fit_error({.sample_weight = Tensor::from_vector(std::vector<float>(10, NAN), {10})}),
                       "fit: sample_weight contains NaN"));
  CHECK(test::contains(fit_error({.class_weight = {{0, 2.0}}, .sample_weight = d.w}),
                       "fit: class_weight and sample_weight cannot be given together"));
  CHECK(test::contains(fit_error({.class_weight = {{-1, 2.0}}}), "fit: class_weight has the negative class index -1"));
  CHECK(test::contains(fit_error({.class_weight = {{1, NAN}}}), "fit: class_weight of class 1 is nan"));
  CHECK(test::contains(fit_error({.steps_per_epoch = 0}), "fit: steps_per_epoch must be positive, got 0"));
  CHECK(test::contains(fit_error({.steps_per_epoch = -3}), "fit: steps_per_epoch must be positive, got -3"));
  CHECK(test::contains(fit_error({.validation_split = 0.2, .validation_freq = 0}),
                       "fit: validation_freq must be a positive number of epochs, got 0"));
  CHECK(test::contains(fit_error({.validation_split = 0.2, .validation_batch_size = 0}),
                       "fit: validation_batch_size must be positive, got 0"));
  CHECK(test::contains(fit_error({.validation_sample_weight = d.w}),
                       "fit: validation_sample_weight (10,) is given without validation_data"));
  CHECK(test::contains(fit_error({.validation_data = std::make_pair(d.x, d.y), .validation_sample_weight = w9}),
                       "fit: validation_sample_weight needs one weight per sample of x (10, 4), got shape (9,)"));
  CHECK(test::contains(test::error_of([&] { m->evaluate(d.x, d.y, {.sample_weight = w9}); }),
                       "evaluate: sample_weight needs one weight per sample of x (10, 4), got shape (9,)"));
  // class_weight needs class targets: not regression values, not sequences, not several outputs.
  auto reg = classifier("mse");
  const Tensor y_reg = Tensor::from_vector(std::vector<float>{0, 1, 2, 0.25f, 1, 2, 0, 1, 2, 0}, {10, 1});
  CHECK(test::contains(test::error_of([&] { reg->fit(d.x, y_reg, {.verbose = 0, .class_weight = {{1, 2.0}}}); }),
                       "fit: class_weight needs class indices in y, got 0.25 at sample 3"));
  const Tensor y_neg = Tensor::from_vector(std::vector<float>{0, 1, 2, -1, 1, 2, 0, 1, 2, 0}, {10, 1});
  CHECK(test::contains(test::error_of([&] { reg->fit(d.x, y_neg, {.verbose = 0, .class_weight = {{1, 2.0}}}); }),
                       "fit: class_weight needs class indices in y, got -1 at sample 3"));
  // Sequences: sparse labels (N, T), one-hot (N, T, C).
  auto seq_in = mpt::Input({5, 4});
  Model seq(seq_in, layers::Dense(3, {.activation = "softmax"})(seq_in), "seq");
  seq.compile({.optimizer = "sgd", .loss = "sparse_categorical_crossentropy"});
  CHECK(test::contains(test::error_of([&] {
                         seq.fit(Tensor::zeros({10, 5, 4}), Tensor::zeros({10, 5}, int32),
                                 {.verbose = 0, .class_weight = {{1, 2.0}}});
                       }),
                       "fit: class_weight needs one class per example; with sparse labels, y of shape (N,) or (N, 1); "
                       "got y of shape (10, 5)"));
  seq.compile({.optimizer = "sgd", .loss = "categorical_crossentropy"});
  CHECK(test::contains(test::error_of([&] {
                         seq.fit(Tensor::zeros({10, 5, 4}), Tensor::zeros({10, 5, 3}),
                                 {.verbose = 0, .class_weight = {{1, 2.0}}});
                       }),
                       "fit: class_weight needs one class per example, y of shape (N,), (N, 1) or one-hot (N, C); got "
                       "y of shape (10, 5, 3)"));
  auto in = mpt::Input({4});
  Model two(std::vector<KerasTensor>{in}, {layers::Dense(3)(in), layers::Dense(2)(in)}, "two");
  two.compile({.optimizer = "sgd", .loss = "mse"});
  CHECK(test::contains(test::error_of([&] { two.fit(d.x, d.y, {.verbose = 0, .class_weight = {{1, 2.0}}}); }),
                       "fit: class_weight is only supported for models with a single output; model 'two' has 2"));
}

TEST_CASE("weighted_metrics survive save and load_model (mpt's checkpoint and .keras)") {
  test::PolicyDeviceScope scope("float32", Device::cpu());
  const auto& r = recorded()["runs"]["weighted_metrics"];
  const RunData d = data_of(r, Device::cpu());
  auto m = classifier("sparse_categorical_crossentropy", {"accuracy"}, {"accuracy"});
  m->fit(d.x, d.y, {.batch_size = 4, .epochs = 1, .verbose = 0, .sample_weight = d.w});
  const auto expected = m->evaluate(d.x, d.y, {.batch_size = 3, .sample_weight = d.w});
  REQUIRE(expected.count("weighted_accuracy") == 1);
  const auto dir = std::filesystem::temp_directory_path() / ("mpt-fit-options-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const char* file : {"m.h5", "m.keras"}) {
    CAPTURE(file);
    const std::string path = (dir / file).string();
    const std::string e = test::error_of([&] { m->save(path); });
    if (test::contains(e, "without libzip")) continue;
    REQUIRE(e == "(no error)");
    auto loaded = load_model(path);
    const auto got = loaded->evaluate(d.x, d.y, {.batch_size = 3, .sample_weight = d.w});
    REQUIRE(got.size() == expected.size());
    for (const auto& kv : expected)
      CHECK_MESSAGE(got.at(kv.first) == doctest::Approx(kv.second).epsilon(1e-6), kv.first);
  }
  std::filesystem::remove_all(dir);
}

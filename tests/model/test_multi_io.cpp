// Models with several inputs and outputs through fit, evaluate, predict, train_on_batch and
// Datasets (Keras's x=[a, b], y=[y1, y2]): the same permutation, split and weights for every
// array, Keras 3's per-output losses and metric names, predict_outputs, and clear errors.
#include <cmath>
#include <set>

#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;

namespace {

/// Rows n of a (3 columns), b (2 columns), their join x = [a | b] and labels of x.
struct TwoInputs {
  Tensor a, b, x, y, w;
};
TwoInputs two_inputs(std::int64_t n) {
  TwoInputs d;
  d.x = Tensor::random_uniform({n, 5}, -1, 1, 11, float32, Device::cpu());
  const auto xv = d.x.to_vector<float>();
  std::vector<float> av, bv, wv;
  std::vector<std::int32_t> labels;
  for (std::int64_t i = 0; i < n; ++i) {
    for (int j = 0; j < 5; ++j) (j < 3 ? av : bv).push_back(xv[i * 5 + j]);
    labels.push_back(xv[i * 5] + xv[i * 5 + 4] > 0.3f ? 2 : xv[i * 5 + 3] > 0 ? 1 : 0);
    wv.push_back(0.5f + static_cast<float>(i % 3));
  }
  d.a = Tensor::from_vector(av, {n, 3}, Device::cpu());
  d.b = Tensor::from_vector(bv, {n, 2}, Device::cpu());
  d.y = Tensor::from_vector(labels, {n}, Device::cpu());
  d.w = Tensor::from_vector(wv, {n}, Device::cpu());
  return d;
}

CompileOptions classifier_options() {
  return {.optimizer = optimizers::Adam({.learning_rate = 0.01}),
          .loss = "sparse_categorical_crossentropy",
          .metrics = {"accuracy"}};
}

/// Two inputs joined, then the layers of joined_model: the same function of [a | b].
std::unique_ptr<Model> two_input_model() {
  auto a = mpt::Input({3}, {.name = "a"});
  auto b = mpt::Input({2}, {.name = "b"});
  auto h = layers::Dense(8, {.activation = "tanh", .name = "d1"})(layers::Concatenate()({a, b}));
  auto m = std::make_unique<Model>(std::vector<KerasTensor>{a, b},
                                   std::vector<KerasTensor>{layers::Dense(3, {.activation = "softmax", .name = "d2"})(h)},
                                   "two_in");
  m->compile(classifier_options());
  return m;
}
std::unique_ptr<Model> joined_model() {
  auto x = mpt::Input({5}, {.name = "x"});
  auto h = layers::Dense(8, {.activation = "tanh", .name = "d1"})(x);
  auto m = std::make_unique<Model>(x, layers::Dense(3, {.activation = "softmax", .name = "d2"})(h), "joined");
  m->compile(classifier_options());
  return m;
}

void check_same_weights(Model& a, Model& b) {
  const auto wa = a.get_weights(), wb = b.get_weights();
  REQUIRE(wa.size() == wb.size());
  for (std::size_t i = 0; i < wa.size(); ++i) CHECK(wa[i].to_vector<float>() == wb[i].to_vector<float>());
}

/// One input, two outputs: "cls" (softmax over 3 classes) and "reg" (one value).
std::unique_ptr<Model> two_output_model() {
  auto x = mpt::Input({4}, {.name = "x"});
  auto h = layers::Dense(6, {.activation = "relu", .name = "hid"})(x);
  auto cls = layers::Dense(3, {.activation = "softmax", .name = "cls"})(h);
  auto reg = layers::Dense(1, {.name = "reg"})(h);
  return std::make_unique<Model>(std::vector<KerasTensor>{x}, std::vector<KerasTensor>{cls, reg}, "two_out");
}
struct TwoOutputs {
  Tensor x, y1, y2;
};
TwoOutputs two_outputs(std::int64_t n) {
  TwoOutputs d;
  d.x = Tensor::random_normal({n, 4}, 0, 1, 21, float32, Device::cpu());
  const auto xv = d.x.to_vector<float>();
  std::vector<std::int32_t> labels;
  std::vector<float> target;
  for (std::int64_t i = 0; i < n; ++i) {
    labels.push_back(xv[i * 4] > 0.5f ? 2 : xv[i * 4 + 1] > 0 ? 1 : 0);
    target.push_back(xv[i * 4 + 2] - 0.5f * xv[i * 4 + 3]);
  }
  d.y1 = Tensor::from_vector(labels, {n}, Device::cpu());
  d.y2 = Tensor::from_vector(target, {n, 1}, Device::cpu());
  return d;
}

/// Keras's per-output losses and metrics of two_output_model, by hand from its predictions.
struct Hand {
  double cls_loss = 0, reg_loss = 0, accuracy = 0, mae = 0;
};
Hand by_hand(const Tensor& p1, const Tensor& p2, const TwoOutputs& d) {
  const auto pv = p1.to(Device::cpu()).to_vector<double>(), rv = p2.to(Device::cpu()).to_vector<double>();
  const auto lv = d.y1.to_vector<std::int32_t>();
  const auto tv = d.y2.to_vector<double>();
  Hand h;
  const auto n = static_cast<double>(lv.size());
  for (std::size_t i = 0; i < lv.size(); ++i) {
    const double* row = &pv[i * 3];
    h.cls_loss += -std::log(row[lv[i]]) / n;
    const auto best = static_cast<std::int32_t>(std::max_element(row, row + 3) - row);
    h.accuracy += (best == lv[i]) / n;
    h.reg_loss += (rv[i] - tv[i]) * (rv[i] - tv[i]) / n;
    h.mae += std::abs(rv[i] - tv[i]) / n;
  }
  return h;
}

std::set<std::string> keys(const std::map<std::string, double>& m) {
  std::set<std::string> out;
  for (const auto& [k, v] : m) out.insert(k);
  return out;
}

}  // namespace

TEST_CASE("two inputs: fit shuffles, splits and weighs both arrays alike; a Dataset of them trains the same") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const TwoInputs d = two_inputs(60);
    // Against one input holding both arrays' columns: the same function, so bit-identical
    // weights prove every array got the same permutation, split and weights.
    auto two = two_input_model();
    auto one = joined_model();
    one->set_weights(two->get_weights());
    const FitOptions o{.batch_size = 8, .epochs = 2, .verbose = 0, .validation_split = 0.2, .shuffle = true,
                       .sample_weight = d.w, .seed = 7};
    const History h2 = two->fit({d.a, d.b}, d.y, o);
    const History h1 = one->fit(d.x, d.y, o);
    check_same_weights(*two, *one);
    CHECK(h2.history.at("loss") == h1.history.at("loss"));
    CHECK(h2.history.at("val_accuracy") == h1.history.at("val_accuracy"));
    CHECK(h2.history.at("loss")[1] != h2.history.at("loss")[0]);  // it trained

    // The same on a TensorDataset of the two arrays (no shuffling: the same order), with workers.
    for (int workers : {0, 2}) {
      CAPTURE(workers);
      auto a = two_input_model();
      auto b = two_input_model();
      b->set_weights(a->get_weights());
      const History ha = a->fit({d.a, d.b}, d.y, {.batch_size = 16, .epochs = 2, .verbose = 0, .shuffle = false});
      data::TensorDataset ds({d.a, d.b}, d.y, 16);
      CHECK(ds.get(0).xs.size() == 2);
      CHECK(!ds.get(0).x.defined());
      const History hb = b->fit(ds, {.epochs = 2, .verbose = 0, .workers = workers, .max_queue_size = 2, .shuffle = false});
      check_same_weights(*a, *b);  // bit for bit
      CHECK(ha.history.at("loss") == hb.history.at("loss"));
      const auto ea = a->evaluate({d.a, d.b}, d.y, {.batch_size = 16});
      const auto eb = b->evaluate(ds, {.workers = workers});
      CHECK(ea.at("loss") == eb.at("loss"));
      CHECK(ea.at("accuracy") == eb.at("accuracy"));
      const Tensor pa = a->predict({d.a, d.b}, {.batch_size = 16}), pb = b->predict(ds, {.workers = workers});
      CHECK(pa.to(Device::cpu()).to_vector<float>() == pb.to_vector<float>());
      // predict_on_batch and train_on_batch take the list too.
      CHECK(a->predict_on_batch({d.a, d.b}).to(Device::cpu()).to_vector<float>() == pa.to(Device::cpu()).to_vector<float>());
      CHECK(keys(a->train_on_batch({d.a, d.b}, d.y)) == std::set<std::string>{"loss", "accuracy"});
    }
  });
}

TEST_CASE("two outputs: the weighted total and each output's loss and metrics, under Keras 3's names") {
  const TwoOutputs d = two_outputs(40);
  set_random_seed(5);
  auto m = two_output_model();
  m->compile({.optimizer = "sgd",
              .loss = {"sparse_categorical_crossentropy", "mse"},
              .metrics = {"accuracy", "mae"},  // one per output (Keras 3's rule)
              .loss_weights = {0.5, 2.0}});
  CHECK(m->output_names() == std::vector<std::string>{"cls", "reg"});
  const auto e = m->evaluate(d.x, {d.y1, d.y2}, {.batch_size = 16});
  CHECK(keys(e) == std::set<std::string>{"loss", "cls_loss", "reg_loss", "cls_accuracy", "reg_mae"});
  const std::vector<Tensor> p = m->predict_outputs(d.x, {.batch_size = 16});
  REQUIRE(p.size() == 2);
  const Hand h = by_hand(p[0], p[1], d);
  CHECK(e.at("cls_loss") == doctest::Approx(h.cls_loss).epsilon(1e-5));
  CHECK(e.at("reg_loss") == doctest::Approx(h.reg_loss).epsilon(1e-5));
  CHECK(e.at("cls_accuracy") == doctest::Approx(h.accuracy).epsilon(1e-6));
  CHECK(e.at("reg_mae") == doctest::Approx(h.mae).epsilon(1e-5));
  CHECK(e.at("loss") == doctest::Approx(0.5 * h.cls_loss + 2.0 * h.reg_loss).epsilon(1e-5));
  // test_on_batch: the same, in one batch.
  const auto t = m->test_on_batch(d.x, {d.y1, d.y2});
  CHECK(t.at("loss") == doctest::Approx(0.5 * h.cls_loss + 2.0 * h.reg_loss).epsilon(1e-5));

  // fit: every per-output log, for training and validation; the total stays the weighted sum.
  const History hist = m->fit(d.x, {d.y1, d.y2}, {.batch_size = 8, .epochs = 2, .verbose = 0, .validation_split = 0.25});
  for (const char* k : {"loss", "cls_loss", "reg_loss", "cls_accuracy", "reg_mae", "val_loss", "val_cls_loss",
                        "val_reg_loss", "val_cls_accuracy", "val_reg_mae"})
    CHECK_MESSAGE(hist.history.count(k) == 1, k);
  for (std::size_t ep = 0; ep < 2; ++ep) {
    CHECK(hist.history.at("loss")[ep] ==
          doctest::Approx(0.5 * hist.history.at("cls_loss")[ep] + 2.0 * hist.history.at("reg_loss")[ep]).epsilon(1e-5));
    CHECK(hist.history.at("val_loss")[ep] ==
          doctest::Approx(0.5 * hist.history.at("val_cls_loss")[ep] + 2.0 * hist.history.at("val_reg_loss")[ep])
              .epsilon(1e-5));
  }
  CHECK(hist.history.at("loss")[1] < hist.history.at("loss")[0]);

  // predict_outputs gives what call() gives; predict (one tensor) points to it.
  const std::vector<Tensor> q = m->predict_outputs(d.x, {.batch_size = 7});
  const std::vector<Tensor> c = m->call(std::vector<Tensor>{d.x}, false);
  REQUIRE(q.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(q[i].shape() == c[i].shape());
    const auto qv = q[i].to_vector<float>(), cv = c[i].to(Device::cpu()).to_vector<float>();
    for (std::size_t j = 0; j < qv.size(); ++j) CHECK(qv[j] == doctest::Approx(cv[j]).epsilon(1e-6));
  }
  CHECK_THROWS_WITH_AS(m->predict(d.x), doctest::Contains("predict_outputs"), Error);
  // On a Dataset of the two targets: the same results.
  data::TensorDataset ds(d.x, {d.y1, d.y2}, 16);
  const auto e2 = m->evaluate(d.x, {d.y1, d.y2}, {.batch_size = 16});
  const auto eds = m->evaluate(ds);
  for (const auto& [k, v] : e2) CHECK(eds.at(k) == doctest::Approx(v).epsilon(1e-6));
  const std::vector<Tensor> qds = m->predict_outputs(ds);
  CHECK(qds[1].to_vector<float>() == m->predict_outputs(d.x, {.batch_size = 16})[1].to_vector<float>());
}

TEST_CASE("two outputs: one loss for both, metric lists per output, weighted metrics' names, mixed precision") {
  const TwoOutputs d = two_outputs(24);
  {
    auto m = two_output_model();
    m->compile({.optimizer = "sgd", .loss = "mse", .output_metrics = {{}, {"mae", "mse"}}});
    Tensor onehot = ops::one_hot(d.y1, 3);
    const auto e = m->evaluate(d.x, {onehot, d.y2});
    CHECK(keys(e) == std::set<std::string>{"loss", "cls_loss", "reg_loss", "reg_mae", "reg_mse"});
    CHECK(e.at("loss") == doctest::Approx(e.at("cls_loss") + e.at("reg_loss")).epsilon(1e-5));
    CHECK(e.at("reg_mse") == doctest::Approx(e.at("reg_loss")).epsilon(1e-5));
  }
  {
    auto m = two_output_model();
    m->compile({.optimizer = "sgd", .loss = {"sparse_categorical_crossentropy", "mse"}, .metrics = {"accuracy", "mae"},
                .weighted_metrics = {"accuracy", "mae"}});
    const auto e = m->evaluate(d.x, {d.y1, d.y2});
    CHECK(keys(e) == std::set<std::string>{"loss", "cls_loss", "reg_loss", "cls_accuracy", "reg_mae",
                                           "cls_weighted_accuracy", "reg_weighted_mae"});
  }
  {
    // mixed_float16: the softmax output computes in float32, the other stays mixed; the loss
    // is scaled around the total.
    test::PolicyDeviceScope scope("mixed_float16", Device::cpu());
    auto m = two_output_model();
    m->compile({.optimizer = "sgd", .loss = {"sparse_categorical_crossentropy", "mse"}});
    CHECK(m->get_layer("cls")->dtype_policy().name() == "float32");
    CHECK(m->get_layer("reg")->dtype_policy().name() == "mixed_float16");
    REQUIRE(m->loss_scale_optimizer() != nullptr);
    const History h = m->fit(d.x, {d.y1, d.y2}, {.batch_size = 8, .epochs = 1, .verbose = 0});
    CHECK(std::isfinite(h.history.at("loss")[0]));
    CHECK(h.history.at("loss")[0] == doctest::Approx(h.history.at("cls_loss")[0] + h.history.at("reg_loss")[0]).epsilon(1e-4));
    for (const Tensor& p : m->predict_outputs(d.x)) CHECK(p.dtype() == float32);
  }
}

TEST_CASE("a custom train_step sees xs and ys; compute_loss takes the lists") {
  struct Custom : Model {
    using Model::Model;
    std::size_t inputs_seen = 0, targets_seen = 0;
    bool x_defined = true;
    Tensor train_step(const StepData& d) override {
      inputs_seen = d.xs.size(), targets_seen = d.ys.size(), x_defined = d.x.defined();
      return Model::train_step(d);
    }
  };
  auto a = mpt::Input({3}, {.name = "a"});
  auto b = mpt::Input({2}, {.name = "b"});
  auto h = layers::Dense(4, {.name = "h"})(layers::Concatenate()({a, b}));
  Custom m(std::vector<KerasTensor>{a, b},
           std::vector<KerasTensor>{layers::Dense(1, {.name = "o1"})(h), layers::Dense(1, {.name = "o2"})(h)}, "custom");
  m.compile({.optimizer = "sgd", .loss = "mse"});
  const TwoInputs d = two_inputs(8);
  const Tensor t = Tensor::ones({8, 1}, float32, Device::cpu());
  const auto logs = m.train_on_batch({d.a, d.b}, {t, t});
  CHECK(m.inputs_seen == 2);
  CHECK(m.targets_seen == 2);
  CHECK(!m.x_defined);
  CHECK(keys(logs) == std::set<std::string>{"loss", "o1_loss", "o2_loss"});
  const std::vector<Tensor> p = m.call(std::vector<Tensor>{d.a, d.b}, false);
  const double total = m.compute_loss({t, t}, {p[0], p[1]}).item();
  CHECK(total == doctest::Approx(m.evaluate({d.a, d.b}, {t, t}).at("loss")).epsilon(1e-5));
  CHECK_THROWS_WITH_AS(m.compute_loss(t, p[0]), doctest::Contains("2 outputs"), Error);
}

TEST_CASE("several inputs or outputs: wrong counts and row counts are clear mpt::Errors") {
  const TwoInputs d = two_inputs(12);
  auto m = two_input_model();
  auto fit_error = [&](const Tensors& x, const Tensors& y) {
    try {
      m->fit(x, y, {.batch_size = 4, .verbose = 0});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Tensor b9 = d.b.slice(0, 9);
  CHECK(test::contains(fit_error({d.a, b9}, d.y), "fit: x[0] and x[1] have different numbers of samples: x[0] (12, 3), x[1] (9, 2)"));
  CHECK(test::contains(fit_error(d.a, d.y), "fit: model 'two_in' has 2 inputs but 1 x array was given"));
  CHECK(test::contains(fit_error({d.a, d.b, d.a}, d.y), "fit: model 'two_in' has 2 inputs but 3 x arrays were given"));
  CHECK(test::contains(fit_error({d.a, d.b}, {d.y, d.y}), "fit: model 'two_in' has 1 output but 2 y arrays were given"));
  CHECK(test::contains(fit_error({d.a, d.b}, d.y.slice(0, 10)), "fit: x and y have different numbers of samples"));
  CHECK(test::contains(fit_error({d.b, d.a}, d.y), "input 0 should have shape (None, 3), got (12, 2)"));
  CHECK_THROWS_WITH_AS(data::TensorDataset({d.a, b9}, d.y, 4), doctest::Contains("different numbers of rows"), Error);
  CHECK_THROWS_WITH_AS(m->evaluate({d.a, b9}, d.y), doctest::Contains("evaluate: x[0] and x[1]"), Error);
  CHECK_THROWS_WITH_AS(m->predict(d.a), doctest::Contains("predict: model 'two_in' has 2 inputs"), Error);

  // A Dataset batch with the wrong arrays.
  struct Bad : data::Dataset {
    Tensor a, b, y;
    int mode = 0;
    std::int64_t size() const override { return 2; }
    data::Batch get(std::int64_t i) override {
      if (i == 0 || mode == 0) return {.y = y, .xs = {a, b}};
      if (mode == 1) return {.y = y, .xs = {a, b.slice(0, 3)}};
      return {a, y};
    }
  };
  for (int mode : {1, 2}) {
    Bad bad;
    bad.a = d.a.slice(0, 4), bad.b = d.b.slice(0, 4), bad.y = d.y.slice(0, 4), bad.mode = mode;
    CHECK_THROWS_WITH_AS(m->fit(bad, {.verbose = 0}), doctest::Contains(mode == 1 ? "different numbers of rows" : "has 2 inputs but a batch has 1"), Error);
  }

  // compile: losses, loss_weights and metrics per output must match the outputs.
  auto two = two_output_model();
  auto compile_error = [&](CompileOptions o) {
    try {
      two->compile(std::move(o));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(test::contains(compile_error({.loss = {"mse"}}), "compile: model 'two_out' has 2 outputs but 1 loss was given"));
  CHECK(test::contains(compile_error({.loss = {"mse", "mse", "mse"}}), "but 3 losses were given"));
  CHECK(test::contains(compile_error({.loss = "mse", .loss_weights = {1.0}}), "loss_weights holds 1 weights"));
  CHECK(test::contains(compile_error({.loss = "mse", .metrics = {"mae"}}), "metrics holds 1 entries"));
  two->compile({.loss = {"sparse_categorical_crossentropy", "mse"}});
  const TwoOutputs t = two_outputs(8);
  CHECK_THROWS_WITH_AS(two->fit(t.x, t.y1, {.verbose = 0}),
                       doctest::Contains("fit: model 'two_out' has 2 outputs but 1 y array was given"), Error);
  CHECK_THROWS_WITH_AS(two->evaluate(t.x, {t.y1, t.y2.slice(0, 5)}), doctest::Contains("x and y[1] have different"), Error);
}

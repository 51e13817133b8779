// The on_test_* and on_predict_* hooks (fit's validation runs them with fit's callbacks, as Keras),
// SwapEMAWeights, and a fixed loss_scale_factor through fit.
#include <cmath>

#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;
using mpt::test::for_each_device;

namespace {

std::pair<Tensor, Tensor> regression_data(std::int64_t n, std::uint64_t seed) {
  const Tensor x = Tensor::random_uniform({n, 4}, -1, 1, seed, float32, Device::cpu());
  return {x, ops::sum(ops::mul(x, x), {1}, true)};
}

std::unique_ptr<Sequential> make_model(optimizers::OptimizerArg opt) {
  set_random_seed(3);
  auto m = std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({4}), layers::Dense(8, {.activation = "tanh"}), layers::Dense(1)});
  m->compile({.optimizer = std::move(opt), .loss = "mse"});
  return m;
}

/// Counts every hook it sees, in order.
struct Recorder : callbacks::Callback {
  std::vector<std::string> events;
  Logs test_end_logs;
  void on_epoch_end(int e, Logs&) override { events.push_back("epoch_end " + std::to_string(e)); }
  void on_test_begin(const Logs&) override { events.push_back("test_begin"); }
  void on_test_end(const Logs& l) override {
    events.push_back("test_end");
    test_end_logs = l;
  }
  void on_test_batch_begin(std::int64_t b, const Logs&) override { events.push_back("test_batch_begin " + std::to_string(b)); }
  void on_test_batch_end(std::int64_t b, const Logs&) override { events.push_back("test_batch_end " + std::to_string(b)); }
  void on_predict_begin(const Logs&) override { events.push_back("predict_begin"); }
  void on_predict_end(const Logs&) override { events.push_back("predict_end"); }
  void on_predict_batch_begin(std::int64_t b, const Logs&) override { events.push_back("predict_batch_begin " + std::to_string(b)); }
  void on_predict_batch_end(std::int64_t b, const Logs&) override { events.push_back("predict_batch_end " + std::to_string(b)); }
  std::int64_t count(const std::string& prefix) const {
    return std::count_if(events.begin(), events.end(), [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
  }
};

}  // namespace

TEST_CASE("fit's validation, evaluate and predict run the on_test_* and on_predict_* hooks as Keras") {
  for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const auto xy = regression_data(40, 1), v = regression_data(20, 2);
    auto m = make_model(optimizers::SGD({.learning_rate = 0.05}));
    auto rec = std::make_shared<Recorder>();
    m->fit(xy.first, xy.second,
           {.batch_size = 8, .epochs = 2, .verbose = 0, .callbacks = {rec}, .validation_data = v});
    // Each epoch: validation (3 batches of 8, 8, 4) before on_epoch_end.
    const std::vector<std::string> epoch0{"test_begin",          "test_batch_begin 0", "test_batch_end 0",
                                          "test_batch_begin 1",  "test_batch_end 1",   "test_batch_begin 2",
                                          "test_batch_end 2",    "test_end",           "epoch_end 0"};
    REQUIRE(rec->events.size() == 18);
    CHECK(std::vector<std::string>(rec->events.begin(), rec->events.begin() + 9) == epoch0);
    CHECK(rec->test_end_logs.count("loss") == 1);

    auto r2 = std::make_shared<Recorder>();
    const auto scores = m->evaluate(v.first, v.second, {.batch_size = 10, .callbacks = {r2}});
    CHECK(r2->count("test_batch_end") == 2);
    CHECK(r2->test_end_logs.at("loss") == scores.at("loss"));
    auto r3 = std::make_shared<Recorder>();
    m->predict(v.first, {.batch_size = 6, .callbacks = {r3}});
    CHECK(r3->events.front() == "predict_begin");
    CHECK(r3->events.back() == "predict_end");
    CHECK(r3->count("predict_batch_end") == 4);
  });
}

TEST_CASE("SwapEMAWeights: validation and predict see the averages, training goes on with its own weights") {
  for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const auto xy = regression_data(64, 4), v = regression_data(32, 5);
    auto make = [] { return make_model(optimizers::Adam({.learning_rate = 0.05, .use_ema = true, .ema_momentum = 0.8})); };
    // Without the callback the validation uses the training weights; with it, the averages,
    // which fit then leaves in the model (finalize_variable_values): so after a one-epoch fit,
    // evaluate gives the callback's val_loss.
    auto a = make(), b = make();
    History ha = a->fit(xy.first, xy.second, {.batch_size = 8, .epochs = 1, .verbose = 0, .validation_data = v});
    History hb = b->fit(xy.first, xy.second,
                        {.batch_size = 8, .epochs = 1, .verbose = 0, .callbacks = {callbacks::SwapEMAWeights()},
                         .validation_data = v});
    CHECK(ha.history.at("loss") == hb.history.at("loss"));  // the same training
    const double after = b->evaluate(v.first, v.second).at("loss");
    CHECK(hb.history.at("val_loss")[0] == doctest::Approx(after).epsilon(1e-6));
    CHECK(ha.history.at("val_loss")[0] != doctest::Approx(after).epsilon(1e-3));
    // predict with the callback swaps the averages in and back out.
    auto c = make();
    c->fit(xy.first, xy.second, {.batch_size = 8, .epochs = 1, .verbose = 0});
    c->optimizer().swap_ema_weights(c->trainable_variables());  // the raw weights back in the model
    std::vector<std::vector<float>> before;
    for (const auto& w : c->trainable_variables()) before.push_back(w.value().to_vector<float>());
    auto swap = std::make_shared<callbacks::SwapEMAWeights>();
    const Tensor p = c->predict(v.first, {.callbacks = {swap}});
    CHECK_FALSE(swap->ema_weights_in_model());
    for (std::size_t i = 0; i < before.size(); ++i) CHECK(c->trainable_variables()[i].value().to_vector<float>() == before[i]);
    c->optimizer().swap_ema_weights(c->trainable_variables());  // the averages
    CHECK(c->predict(v.first).to_vector<float>() == p.to_vector<float>());
    // swap_on_epoch: the averages stay in the model between epochs, and fit still ends with them.
    auto d = make();
    d->fit(xy.first, xy.second,
           {.batch_size = 8, .epochs = 2, .verbose = 0,
            .callbacks = {callbacks::SwapEMAWeights({.swap_on_epoch = true})}});
    auto e = make();
    e->fit(xy.first, xy.second, {.batch_size = 8, .epochs = 2, .verbose = 0});
    CHECK(d->predict(v.first).to_vector<float>() == e->predict(v.first).to_vector<float>());
    // Without use_ema the callback says what is missing.
    auto plain = make_model(optimizers::Adam());
    CHECK_THROWS_WITH_AS(plain->fit(xy.first, xy.second,
                                    {.batch_size = 8, .epochs = 1, .verbose = 0,
                                     .callbacks = {callbacks::SwapEMAWeights()}, .validation_data = v}),
                         doctest::Contains("use_ema"), Error);
  });
}

TEST_CASE("loss_scale_factor: fit scales the loss and the optimizer the gradients back, bit for bit") {
  for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const auto xy = regression_data(48, 6);
    auto a = make_model(optimizers::Adam({.learning_rate = 0.01}));
    auto b = make_model(optimizers::Adam({.learning_rate = 0.01, .loss_scale_factor = 256.0}));
    a->fit(xy.first, xy.second, {.batch_size = 8, .epochs = 2, .verbose = 0});
    b->fit(xy.first, xy.second, {.batch_size = 8, .epochs = 2, .verbose = 0});
    for (std::size_t i = 0; i < a->trainable_variables().size(); ++i)  // a power of 2: exact both ways
      CHECK(a->trainable_variables()[i].value().to_vector<float>() ==
            b->trainable_variables()[i].value().to_vector<float>());
    CHECK(b->optimizer().scale_loss(Tensor::scalar(0.5, float32, dev)).item() == 128.0);
  });
}

TEST_CASE("a metric with several values logs one entry per value in fit and evaluate") {
  const auto xy = regression_data(48, 7);
  const Tensor labels = ops::cast(ops::greater(xy.second, Tensor::scalar(0.6, float32, Device::cpu())), float32);
  set_random_seed(3);
  Sequential m({layers::Input({4}), layers::Dense(1, {.activation = "sigmoid"})});
  std::shared_ptr<metrics::Metric> precision = std::make_shared<metrics::Precision>(metrics::PrecisionRecallOptions{.thresholds = std::vector<double>{0.3, 0.7}});
  m.compile({.optimizer = optimizers::SGD({.learning_rate = 0.1}), .loss = "binary_crossentropy",
             .metrics = {precision}});
  History h = m.fit(xy.first, labels, {.batch_size = 16, .epochs = 2, .verbose = 0});
  REQUIRE(h.history.count("precision[0]") == 1);
  REQUIRE(h.history.count("precision[1]") == 1);
  CHECK(h.history.count("precision") == 0);
  const auto scores = m.evaluate(xy.first, labels, {.batch_size = 48});
  CHECK(scores.count("precision[1]") == 1);
  CHECK(scores.at("precision[0]") >= 0.0);
}

TEST_CASE("under mixed_float16 an optimizer with a fixed loss_scale_factor is not wrapped in a LossScaleOptimizer") {
  test::PolicyDeviceScope scope("mixed_float16", Device::cpu());
  const auto xy = regression_data(32, 8);
  auto fixed = make_model(optimizers::Adam({.learning_rate = 0.01, .loss_scale_factor = 1024.0}));
  CHECK(fixed->loss_scale_optimizer() == nullptr);
  auto dynamic = make_model(optimizers::Adam({.learning_rate = 0.01}));
  CHECK(dynamic->loss_scale_optimizer() != nullptr);
  History h = fixed->fit(xy.first, xy.second, {.batch_size = 8, .epochs = 3, .verbose = 0});
  CHECK(h.history.at("loss")[2] < h.history.at("loss")[0]);
}

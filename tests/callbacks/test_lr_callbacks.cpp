// Learning-rate callbacks and the run-time rate: ReduceLROnPlateau and LearningRateScheduler
// against Keras 3 fits recorded by tests/interop/record_keras_callbacks.py
// (tests/data/keras_callbacks.json), Optimizer::set_learning_rate, and TerminateOnNaN.
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;

namespace {

const nlohmann::json& recorded() {
  static const nlohmann::json j = [] {
    std::ifstream in(test::test_data("keras_callbacks.json"));
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return j;
}

/// The recorded model with Keras's initial weights, fitted full-batch as the script fits it.
History replay(const nlohmann::json& c, callbacks::CallbackArg callback, Device dev) {
  auto x = mpt::Input({4}, {.name = "x"});
  auto h = layers::Dense(3, {.activation = "tanh", .name = "d1"})(x);
  Model m(x, layers::Dense(1, {.name = "d2"})(h), "m");
  for (const auto& v : m.variables()) {
    const auto& w = c["initial_weights"][v.path()];
    v.assign(Tensor::from_vector(w["values"].get<std::vector<float>>(), w["shape"].get<Shape>()).to(dev));
  }
  m.compile({.optimizer = optimizers::SGD({.learning_rate = 0.2}), .loss = "mse"});
  const Tensor xs = Tensor::from_vector(c["x"].get<std::vector<float>>(), {32, 4}).to(dev);
  const Tensor ys = Tensor::from_vector(c["y"].get<std::vector<float>>(), {32, 1}).to(dev);
  return m.fit(xs, ys, {.batch_size = 32, .epochs = 14, .verbose = 0, .callbacks = {std::move(callback)}, .shuffle = false});
}

void check_like_keras(const History& h, const nlohmann::json& c) {
  const auto& loss = h.history.at("loss");
  const auto& lr = h.history.at("learning_rate");
  REQUIRE(loss.size() == c["loss"].size());
  REQUIRE(lr.size() == c["learning_rate"].size());
  for (std::size_t e = 0; e < loss.size(); ++e) {
    CHECK_MESSAGE(lr[e] == doctest::Approx(c["learning_rate"][e].get<double>()).epsilon(1e-6), "epoch ", e);
    CHECK_MESSAGE(loss[e] == doctest::Approx(c["loss"][e].get<double>()).epsilon(2e-5), "epoch ", e);
  }
}

}  // namespace

TEST_CASE("ReduceLROnPlateau and LearningRateScheduler decide as Keras did, epoch for epoch") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const auto& p = recorded()["reduce_lr_on_plateau"];
    const auto& o = p["options"];
    check_like_keras(replay(p, callbacks::ReduceLROnPlateau({.monitor = o["monitor"],
                                                             .factor = o["factor"],
                                                             .patience = o["patience"],
                                                             .min_delta = o["min_delta"],
                                                             .cooldown = o["cooldown"],
                                                             .min_lr = o["min_lr"]}),
                            dev),
                     p);
    const auto& s = recorded()["learning_rate_scheduler"];
    check_like_keras(replay(s, callbacks::LearningRateScheduler([](int epoch, double lr) { return epoch < 3 ? lr : lr * 0.8; }),
                            dev),
                     s);
  });
}

TEST_CASE("set_learning_rate changes the next step's rate; a schedule's rate cannot be set") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    for (const char* wrapped : {"plain", "loss-scaled"}) {
      CAPTURE(wrapped);
      std::shared_ptr<optimizers::Optimizer> opt = optimizers::SGD({.learning_rate = 0.1});
      if (std::string(wrapped) == "loss-scaled") opt = std::make_shared<mixed_precision::LossScaleOptimizer>(opt);
      Variable v(Tensor::from_vector<float>({1.0f, 2.0f}, {2}).to(dev), "w");
      const Tensor g = Tensor::from_vector<float>({1.0f, 1.0f}, {2}).to(dev);
      opt->apply_gradients({g}, {v});
      opt->set_learning_rate(0.5);
      CHECK(opt->learning_rate() == 0.5);
      opt->apply_gradients({g}, {v});
      const auto w = v.value().to_vector<double>();
      CHECK(w[0] == doctest::Approx(1.0 - 0.1 - 0.5));
      CHECK(w[1] == doctest::Approx(2.0 - 0.1 - 0.5));
      CHECK(test::contains(test::error_of([&] { opt->set_learning_rate(-1.0); }), "finite number >= 0"));
    }
    auto scheduled = optimizers::SGD({.learning_rate = optimizers::schedules::ExponentialDecay({})});
    CHECK(test::contains(test::error_of([&] { scheduled->set_learning_rate(0.1); }),
                         "follows the schedule ExponentialDecay"));
    // A checkpoint keeps the rate set at run time (ReduceLROnPlateau's cut survives a resume).
    auto sgd = optimizers::SGD({.learning_rate = 0.1});
    sgd->set_learning_rate(0.025);
    CHECK(sgd->options().learning_rate.at(0) == 0.025);
    CHECK(sgd->clone()->learning_rate() == 0.025);
  });
}

TEST_CASE("TerminateOnNaN stops fit after the first batch with a non-finite loss") {
  test::for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("mixed_bfloat16", dev);  // no loss scaling to skip bad steps
    set_random_seed(2);
    Sequential m({layers::Input({4}), layers::Dense(8), layers::Dense(1)});
    m.compile({.optimizer = optimizers::SGD({.learning_rate = 1e6}), .loss = "mse"});
    Tensor x = Tensor::random_uniform({64, 4}, -1, 1, 1, float32, dev), y = Tensor::random_uniform({64, 1}, -1, 1, 2, float32, dev);
    auto stop = std::make_shared<callbacks::TerminateOnNaN>();
    std::int64_t batches = 0;
    callbacks::LambdaCallback count;
    count.batch_end = [&](std::int64_t, const Logs&) { ++batches; };
    auto h = m.fit(x, y, {.batch_size = 4, .epochs = 3, .verbose = 0, .callbacks = {stop, count}});
    REQUIRE(stop->stopped_batch() >= 0);
    CHECK(batches == stop->stopped_batch() + 1);  // not one batch more
    CHECK(h.history.at("loss").size() == 1);
  });
}

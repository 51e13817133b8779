// Model::train_step overridden by a subclass (Keras's custom train_step): fit and train_on_batch
// call the override; an override written like the default step trains like it; one that calls
// Model::train_step gets the default; the override's loss is logged; bad returns are refused.
#include "test_util.hpp"

using namespace mpt;
namespace layers = mpt::layers;
using mpt::test::for_each_device;

namespace {

std::pair<Tensor, Tensor> regression_data() {
  const Tensor x = Tensor::random_uniform({48, 4}, -1, 1, 21, float32, Device::cpu());
  return {x, ops::sum(ops::mul(x, x), {1}, true)};
}

std::vector<LayerRef> stack() {
  return {layers::Input({4}), layers::Dense(8, {.activation = "tanh"}), layers::Dense(1)};
}

/// The default step written with the public API, with the gradients scaled by `factor`.
struct Custom : Sequential {
  explicit Custom(double factor) : Sequential(stack()), factor(factor) {}
  double factor;
  int calls = 0;
  Tensor train_step(const StepData& d) override {
    ++calls;
    GradientTape tape;
    const Tensor y_pred = call(d.x, true);
    const Tensor loss = compute_loss(d.y, y_pred, d.sample_weight);
    const auto vars = trainable_variables();
    auto grads = tape.gradient(loss, vars);
    for (auto& g : grads) g = ops::mul(g, Tensor::scalar(factor, g.dtype(), g.device()));
    optimizer().apply_gradients(grads, vars);
    update_compiled_metrics(d.y, y_pred, d.sample_weight);
    return loss;
  }
};

/// Counts, then runs the default step.
struct Counting : Sequential {
  Counting() : Sequential(stack()) {}
  int calls = 0;
  Tensor train_step(const StepData& d) override {
    ++calls;
    return Sequential::train_step(d);
  }
};

struct BadReturn : Sequential {
  BadReturn() : Sequential(stack()) {}
  Tensor train_step(const StepData& d) override { return Tensor::zeros({2}, float32, d.x.device()); }
};

std::vector<std::vector<float>> weights_of(const Model& m) {
  std::vector<std::vector<float>> out;
  for (const auto& v : m.variables()) out.push_back(v.value().to(Device::cpu()).to_vector<float>());
  return out;
}

CompileOptions options() {
  return {.optimizer = optimizers::SGD({.learning_rate = 0.05}), .loss = "mse", .metrics = {"mae"}};
}

}  // namespace

TEST_CASE("fit and train_on_batch call an overridden train_step; written like the default, it trains like it") {
  for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const auto xy = regression_data();
    set_random_seed(4);
    Sequential plain(stack());
    set_random_seed(4);
    Custom same(1.0);
    set_random_seed(4);
    Counting counting;
    plain.compile(options());
    same.compile(options());
    counting.compile(options());
    const FitOptions fo{.batch_size = 8, .epochs = 2, .verbose = 0, .shuffle = false};
    History hp = plain.fit(xy.first, xy.second, fo);
    History hs = same.fit(xy.first, xy.second, fo);
    History hc = counting.fit(xy.first, xy.second, fo);
    CHECK(same.calls == 12);
    CHECK(counting.calls == 12);
    const auto wp = weights_of(plain), ws = weights_of(same), wc = weights_of(counting);
    CHECK(wc == wp);  // the default through the override: the same bits
    for (std::size_t i = 0; i < wp.size(); ++i)
      for (std::size_t j = 0; j < wp[i].size(); ++j) CHECK(ws[i][j] == doctest::Approx(wp[i][j]).epsilon(1e-6));
    CHECK(hs.history.at("loss")[1] == doctest::Approx(hp.history.at("loss")[1]).epsilon(1e-5));
    CHECK(hs.history.at("mae")[1] == doctest::Approx(hp.history.at("mae")[1]).epsilon(1e-5));

    // A different rule trains differently, through train_on_batch too.
    set_random_seed(4);
    Custom half(0.5);
    half.compile(options());
    const auto logs = half.train_on_batch(xy.first.slice(0, 8), xy.second.slice(0, 8));
    CHECK(half.calls == 1);
    CHECK(logs.count("loss") == 1);
    CHECK(logs.count("mae") == 1);
  });
}

TEST_CASE("an override that returns something other than one loss value is refused naming the model") {
  const auto xy = regression_data();
  BadReturn m;
  m.compile(options());
  CHECK_THROWS_WITH_AS(m.fit(xy.first, xy.second, {.batch_size = 8, .epochs = 1, .verbose = 0}),
                       doctest::Contains("override must return the batch's loss"), Error);
}

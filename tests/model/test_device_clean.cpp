// The training step is device-clean: fit, evaluate, predict and a custom GradientTape loop run
// on the test device (memory host code cannot touch; device/protected_device.hpp) with results
// bit-identical to the CPU's, and read back from it at most once per step.
#include <filesystem>
#include <functional>

#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;
namespace layers = mpt::layers;

namespace {

/// Host data: x [n, features...] in [0, 1), labels from the first features (learnable).
std::pair<Tensor, Tensor> make_data(const Shape& shape, std::uint64_t seed) {
  Tensor x = Tensor::random_uniform(shape, 0, 1, seed, float32, Device::cpu());
  auto v = x.to_vector<float>();
  const std::int64_t n = shape[0], row = x.numel() / n;
  std::vector<std::int32_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<std::int32_t>(v[i * row] * 5) + (v[i * row + 1] > 0.5f ? 5 : 0);
  return {x, Tensor::from_vector(y, {n}, Device::cpu())};
}

/// Model A: an MLP with Dropout; model C: a CNN with BatchNormalization.
std::unique_ptr<Sequential> model(char kind) {
  set_random_seed(1);
  if (kind == 'A')
    return std::make_unique<Sequential>(std::initializer_list<LayerRef>{
        layers::Input({32}), layers::Dense(64, {.activation = "relu"}), layers::Dropout(0.3),
        layers::Dense(64, {.activation = "relu"}), layers::Dense(10), layers::Activation("softmax")});
  return std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({12, 12, 1}), layers::Conv2D(8, {3, 3}, {.activation = "relu"}), layers::BatchNormalization(),
      layers::MaxPooling2D({2, 2}), layers::Conv2D(16, {3, 3}, {.padding = "same", .activation = "relu"}),
      layers::Flatten(), layers::Dense(10), layers::Activation("softmax")});
}

Shape input_of(char kind) { return kind == 'A' ? Shape{80, 32} : Shape{80, 12, 12, 1}; }

struct Run {
  std::map<std::string, std::vector<double>> history;
  std::map<std::string, double> scores;
  std::vector<float> predictions;
  std::vector<std::vector<float>> weights;
  std::int64_t fit_reads = 0, evaluate_reads = 0, predict_reads = 0;
};

Run train(char kind, const std::string& policy, Device device) {
  PolicyDeviceScope scope(policy, device);
  Tensor x, y;
  std::tie(x, y) = make_data(input_of(kind), 7);
  auto m = model(kind);
  m->compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
  Run r;
  reset_transfers();
  r.history = m->fit(x, y, {.batch_size = 16, .epochs = 3, .verbose = 0}).history;
  r.fit_reads = transfers().to_host;
  reset_transfers();
  r.scores = m->evaluate(x, y, {.batch_size = 32});
  r.evaluate_reads = transfers().to_host;
  reset_transfers();
  Tensor p = m->predict(x, {.batch_size = 32});
  r.predict_reads = transfers().to_host;
  CHECK(p.device() == Device::cpu());  // host data in, host results out
  r.predictions = p.to_vector<float>();
  for (const auto& w : m->get_weights()) r.weights.push_back(w.to_vector<float>());
  return r;
}

}  // namespace

TEST_CASE("fit, evaluate and predict on the test device match the CPU bit for bit, one read per step at most") {
  REQUIRE(test_device_registered());
  for (char kind : {'A', 'C'}) {
    for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
      CAPTURE(kind);
      CAPTURE(policy);
      Run cpu = train(kind, policy, Device::cpu());
      Run dev = train(kind, policy, Device::test());
      CHECK(cpu.history == dev.history);  // loss, accuracy, loss_scale, ... per epoch, exactly
      CHECK(cpu.scores == dev.scores);
      CHECK(cpu.predictions == dev.predictions);
      CHECK(cpu.weights == dev.weights);
      REQUIRE(cpu.history.count("loss"));
      CHECK(std::isfinite(cpu.history["loss"].back()));
      // 3 epochs of 5 steps. Per step: the LossScaleOptimizer's finite flag under mixed_float16,
      // nothing otherwise; per epoch: the loss and the accuracy.
      const std::int64_t steps = 3 * 5, per_step = std::string(policy) == "mixed_float16" ? 1 : 0;
      std::int64_t skipped = 0;  // each skipped step also reads its per-gradient flags
      for (double v : dev.history.at("skipped_steps")) skipped += static_cast<std::int64_t>(v);
      CHECK(dev.fit_reads == steps * per_step + skipped + 3 * 2);
      CHECK(dev.evaluate_reads == 2);
      CHECK(dev.predict_reads == 1);
      CHECK(cpu.fit_reads == 0);  // the counter belongs to the test device alone
    }
  }
}

TEST_CASE("a custom GradientTape loop with a LossScaleOptimizer on the test device matches the CPU") {
  auto run = [](Device device) {
    PolicyDeviceScope scope("mixed_float16", device);
    Tensor x, y;
    std::tie(x, y) = make_data(input_of('C'), 3);
    auto m = model('C');
    mixed_precision::LossScaleOptimizer opt(optimizers::Adam(), {.initial_scale = 65536.0, .dynamic_growth_steps = 3});
    losses::SparseCategoricalCrossentropy loss_fn;
    std::vector<double> scales;
    Tensor last_loss;
    reset_transfers();
    std::int64_t steps = 0, skipped = 0;
    for (auto [xb, yb] : data::batches(x, y, {.batch_size = 16, .shuffle = true, .seed = 5, .device = device})) {
      GradientTape tape;
      Tensor loss = loss_fn(yb, m->operator()(xb, {.training = true}));
      auto grads = tape.gradient(opt.get_scaled_loss(loss), m->trainable_variables());
      auto r = opt.apply_gradients_checked(opt.get_unscaled_gradients(grads), m->trainable_variables());
      m->finish_step(r.applied);
      skipped += !r.applied;
      scales.push_back(r.loss_scale);
      last_loss = loss;
      ++steps;
    }
    const std::int64_t reads = transfers().to_host;
    // The finite flag, once a step, and the per-gradient flags of each skipped step.
    if (device.is_test()) CHECK(reads == steps + skipped);
    std::vector<std::vector<float>> w;
    for (const auto& t : m->get_weights()) w.push_back(t.to_vector<float>());
    return std::make_tuple(scales, last_loss.item(), w);
  };
  auto [cpu_scales, cpu_loss, cpu_w] = run(Device::cpu());
  auto [dev_scales, dev_loss, dev_w] = run(Device::test());
  CHECK(cpu_scales == dev_scales);
  CHECK(cpu_loss == dev_loss);
  CHECK(cpu_w == dev_w);
  CHECK(cpu_scales.back() != 65536.0);  // the scale moved (grew after 3 finite steps, or halved)
}

TEST_CASE("an input on another device than the model is an error naming both devices") {
  PolicyDeviceScope scope("float32", Device::test());
  auto m = model('A');
  m->build({32});
  Tensor host = Tensor::zeros({2, 32}, float32, Device::cpu());
  std::string e = error_of([&] { (*m)(host); });
  CHECK(contains(e, "cpu"));
  CHECK(contains(e, "test"));
  CHECK(contains(e, "dense"));
  // fit and predict take host data for a model on the device.
  CHECK((*m)(host.to(Device::test())).device() == Device::test());
  CHECK(m->predict(host).device() == Device::cpu());
}

TEST_CASE("fit checks the data once, on the host copy: NaN and labels out of range name the sample") {
  PolicyDeviceScope scope("float32", Device::test());
  Tensor x, y;
  std::tie(x, y) = make_data(input_of('A'), 2);
  auto m = model('A');
  m->compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy"});
  auto yv = y.to_vector<std::int32_t>();
  yv[17] = 10;
  std::string e = error_of([&] { m->fit(x, Tensor::from_vector(yv, {80}, Device::cpu()), {.verbose = 0}); });
  CHECK(contains(e, "fit"));
  CHECK(contains(e, "label 10 of sample 17"));
  CHECK(contains(e, "[0, 10)"));
  e = error_of([&] { m->evaluate(x, Tensor::from_vector(yv, {80}, Device::cpu())); });
  CHECK(contains(e, "evaluate"));
  auto xv = x.to_vector<float>();
  xv[32 * 5 + 3] = NAN;
  e = error_of([&] { m->fit(Tensor::from_vector(xv, x.shape(), Device::cpu()), y, {.verbose = 0}); });
  CHECK(contains(e, "NaN"));
  CHECK(contains(e, "sample 5"));
  // Custom loops get the same checks from mpt::data::batches.
  e = error_of([&] { data::batches(x, Tensor::from_vector(yv, {80}, Device::cpu()), {.num_classes = 10}); });
  CHECK(contains(e, "label 10 of sample 17"));
  yv[17] = -1;
  e = error_of([&] { data::batches(x, Tensor::from_vector(yv, {80}, Device::cpu())); });
  CHECK(contains(e, "negative"));
}

namespace {
/// A Dense model fit on the given device with one optimizer / loss / metric combination.
struct Combo {
  const char* what;
  std::function<optimizers::OptimizerArg()> optimizer;
  const char* loss;
  std::vector<metrics::MetricArg> metrics;
  int outputs;        // units of the last layer
  bool one_hot;       // targets as one-hot float rows
  const char* final;  // last activation
};

std::tuple<std::map<std::string, std::vector<double>>, std::vector<std::vector<float>>, std::int64_t> fit_combo(
    const Combo& c, const std::string& policy, Device device) {
  PolicyDeviceScope scope(policy, device);
  Tensor x, labels;
  std::tie(x, labels) = make_data({64, 32}, 11);
  Tensor y = labels;
  if (c.one_hot) y = ops::one_hot(labels, c.outputs).to(Device::cpu());
  if (c.outputs == 1) y = ops::cast(ops::greater(labels, Tensor::scalar(4, int32, Device::cpu())), float32).reshape({64, 1});
  set_random_seed(3);
  Sequential m({layers::Input({32}), layers::Dense(16, {.activation = "gelu"}), layers::Dropout(0.2),
                layers::Dense(c.outputs, {.activation = c.final})});
  m.compile({.optimizer = c.optimizer(), .loss = c.loss, .metrics = c.metrics});
  reset_transfers();
  auto h = m.fit(x, y, {.batch_size = 16, .epochs = 2, .verbose = 0}).history;
  const std::int64_t reads = transfers().to_host;
  std::vector<std::vector<float>> w;
  for (const auto& t : m.get_weights()) w.push_back(t.to_vector<float>());
  return {h, w, reads};
}
}  // namespace

TEST_CASE("every optimizer, clipping, schedule, loss and metric keeps the step device-clean") {
  using namespace optimizers;
  const std::vector<Combo> combos = {
      {"SGD nesterov + clipnorm, categorical CE, categorical_accuracy + mse",
       [] { return SGD({.learning_rate = 0.05, .momentum = 0.9, .nesterov = true, .clipnorm = 1.0}); },
       "categorical_crossentropy", {"accuracy", "mse"}, 10, true, "softmax"},
      {"RMSprop centered + momentum + global_clipnorm, sparse CE from logits",
       [] { return RMSprop({.momentum = 0.5, .centered = true, .global_clipnorm = 0.5}); },
       "sparse_categorical_crossentropy", {"sparse_categorical_accuracy"}, 10, false, "linear"},
      {"AdamW amsgrad + clipvalue + exponential decay, binary CE, binary accuracy + mae",
       [] {
         return AdamW({.learning_rate = schedules::ExponentialDecay({.initial_learning_rate = 0.01, .decay_steps = 2,
                                                                     .decay_rate = 0.5}),
                       .amsgrad = true, .clipvalue = 0.1});
       },
       "binary_crossentropy", {"accuracy", "mae"}, 1, false, "sigmoid"},
      {"Adam, mean squared error", [] { return Adam(); }, "mean_squared_error", {"mae"}, 10, true, "linear"},
  };
  for (const auto& c : combos) {
    for (const char* policy : {"float32", "mixed_float16"}) {
      CAPTURE(c.what);
      CAPTURE(policy);
      auto [h_cpu, w_cpu, reads_cpu] = fit_combo(c, policy, Device::cpu());
      auto [h_dev, w_dev, reads_dev] = fit_combo(c, policy, Device::test());
      CHECK(h_cpu == h_dev);
      CHECK(w_cpu == w_dev);
      const std::int64_t steps = 2 * 4, per_step = std::string(policy) == "mixed_float16" ? 1 : 0;
      // Plus the per-gradient flags of each skipped step (overflow diagnostics).
      std::int64_t skipped = 0;
      for (double s : h_dev.at("skipped_steps")) skipped += static_cast<std::int64_t>(s);
      CHECK(reads_dev == steps * per_step + skipped + 2 * (1 + static_cast<std::int64_t>(c.metrics.size())));
    }
  }
}

TEST_CASE("checkpoints of a model on the test device: weights and a full resume match the CPU") {
  auto dir = std::filesystem::temp_directory_path() / "mpt_device_clean";
  std::filesystem::create_directories(dir);
  auto run = [&](Device device) {
    PolicyDeviceScope scope("mixed_float16", device);
    Tensor x, y;
    std::tie(x, y) = make_data(input_of('C'), 4);
    auto m = model('C');
    m->compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy", .metrics = {"accuracy"}});
    m->fit(x, y, {.batch_size = 16, .epochs = 1, .verbose = 0});
    const std::string tag = device.is_cpu() ? "cpu" : "test";
    m->save((dir / (tag + ".h5")).string());
    m->save_weights((dir / (tag + ".weights.h5")).string());
    auto resumed = load_model((dir / (tag + ".h5")).string());
    for (const auto& v : resumed->variables()) CHECK(v.value().device() == device);
    auto h = resumed->fit(x, y, {.batch_size = 16, .epochs = 2, .verbose = 0, .initial_epoch = resumed->epoch()});
    auto fresh = model('C');
    fresh->build({12, 12, 1});
    fresh->load_weights((dir / (tag + ".weights.h5")).string());
    std::vector<std::vector<float>> w;
    for (const auto& t : fresh->get_weights()) w.push_back(t.to_vector<float>());
    return std::make_pair(h.history, w);
  };
  auto cpu = run(Device::cpu());
  auto dev = run(Device::test());
  CHECK(cpu.first == dev.first);
  CHECK(cpu.second == dev.second);
  std::filesystem::remove_all(dir);
}

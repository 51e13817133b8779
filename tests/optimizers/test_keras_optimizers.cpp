// The optimizers against Keras 3: 20-step trajectories of every optimizer with weight decay,
// EMA, gradient accumulation and clipping, recorded by tests/interop/record_keras_optimizers.py
// (tests/data/keras_optimizers.json), on every device; the optimizers built from Keras's own
// configs. Then what the trajectories cannot show: accumulation equals one step of the whole
// batch, a LossScaleOptimizer makes one skip-or-apply decision per accumulation window, the new
// optimizers train under every policy, SwapEMAWeights, and the optimizers' errors.
#include <cmath>
#include <fstream>

#include <mpt/optim_ops.hpp>
#include <nlohmann/json.hpp>

#include "io/checkpoint_util.hpp"
#include "io/optimizer_io.hpp"
#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;
namespace opt = mpt::optimizers;
namespace layers = mpt::layers;

namespace {

const nlohmann::json& recorded() {
  static const nlohmann::json j = [] {
    std::ifstream in(test::test_data("keras_optimizers.json"));
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return j;
}

std::vector<float> floats(const nlohmann::json& j) { return j.get<std::vector<float>>(); }

/// |a - b| <= 1e-6 |b| (+ 1e-7 for values near 0), element by element.
void check_relative(const Tensor& got, const std::vector<float>& want, const std::string& what) {
  const std::vector<float> g = got.to(Device::cpu()).to(float32).to_vector<float>();
  REQUIRE(g.size() == want.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double err = std::abs(static_cast<double>(g[i]) - want[i]) / (std::abs(static_cast<double>(want[i])) + 0.1);
    if (err > worst) worst = err, at = i;
  }
  INFO(what, ": element ", at, " is ", g[at], ", Keras ", want[at]);
  CHECK(worst <= 1e-6);
}

/// The recorded gradient of call t: (0.5 * (w - target) + noise[t]) * mult, in float32 as the script.
Tensor gradient(const Variable& v, const std::string& name, int t, Device dev, float mult = 1.0f) {
  const auto& r = recorded();
  const std::vector<float> w = v.value().to(Device::cpu()).to_vector<float>();
  const std::vector<float> target = floats(r["target"][name]), noise = floats(r["noise"][t][name]);
  std::vector<float> g(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    const float d = w[i] - target[i];
    const float h = 0.5f * d;
    g[i] = (h + noise[i]) * mult;
  }
  return Tensor::from_vector(g, v.shape()).to(dev);
}

}  // namespace

TEST_CASE("every optimizer follows Keras's 20-step trajectory (decay, EMA, accumulation, clipping) to 1e-6") {
  for_each_device([](Device dev) {
    const auto& r = recorded();
    const int steps = r["steps"].get<int>();
    for (auto it = r["cases"].begin(); it != r["cases"].end(); ++it) {
      const std::string name = it.key();
      const nlohmann::json& c = it.value();
      CAPTURE(name);
      // Built from the config Keras wrote: every field read (and the reader refuses none).
      auto o = io::optimizer_from_json({{"class_name", c["class_name"]}, {"config", c["config"]}}, name);
      if (c.contains("extra") && c["extra"].contains("exclude"))
        o->exclude_from_weight_decay(c["extra"]["exclude"].get<std::vector<std::string>>());
      const float mult = c.contains("extra") ? c["extra"].value("grad_multiplier", 1.0f) : 1.0f;
      Variable kernel(Tensor::from_vector(floats(r["init"]["kernel"]), {4, 3}).to(dev), "kernel");
      Variable bias(Tensor::from_vector(floats(r["init"]["bias"]), {3}).to(dev), "bias");
      kernel.set_path("dense/kernel");
      bias.set_path("dense/bias");
      const std::vector<Variable> vars{kernel, bias};
      o->build(vars);
      for (int t = 0; t < steps; ++t) {
        CAPTURE(t);
        o->apply_gradients({gradient(kernel, "kernel", t, dev, mult), gradient(bias, "bias", t, dev, mult)}, vars);
        const auto& want = c["steps"][t];
        check_relative(kernel.value(), floats(want["kernel"]), name + " kernel");
        check_relative(bias.value(), floats(want["bias"]), name + " bias");
        CHECK(o->iterations() == want["iterations"].get<std::int64_t>());
      }
      if (c.contains("finalized")) {
        o->finalize_variable_values(vars);
        check_relative(kernel.value(), floats(c["finalized"]["kernel"]), name + " finalized kernel");
        check_relative(bias.value(), floats(c["finalized"]["bias"]), name + " finalized bias");
      }
      // The config mpt writes is Keras's (the fields Keras wrote, with their values).
      const auto mine = io::optimizer_to_json(*o, true)["config"];
      for (auto f = c["config"].begin(); f != c["config"].end(); ++f) {
        const std::string k = f.key();
        const nlohmann::json& v = f.value();
        if (k == "name") continue;  // Keras numbers its auto names (nadam_1, ...)
        CAPTURE(k);
        REQUIRE(mine.contains(k));
        if (v.is_number_float()) CHECK(mine[k].get<double>() == doctest::Approx(v.get<double>()).epsilon(1e-7));
        else CHECK(mine[k].dump() == v.dump());
      }
    }
  });
}

namespace {

/// A regression the small models below learn: y = x · w_true.
std::pair<Tensor, Tensor> regression(std::int64_t n, Device dev, std::uint64_t seed = 3) {
  const Tensor x = test::random({n, 4}, float32, Device::cpu(), seed, -1.0, 1.0);
  const Tensor w = Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 0.25f, 2.0f}, {4, 1}, Device::cpu());
  return {x.to(dev), ops::matmul(x, w).to(dev)};
}

std::unique_ptr<Sequential> dense_model(std::uint64_t seed) {
  set_random_seed(seed);
  return std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({4}), layers::Dense(8, {.activation = "tanh"}), layers::Dense(1)});
}

std::vector<std::vector<float>> weights_of(const Model& m) {
  std::vector<std::vector<float>> out;
  for (const auto& v : m.variables()) out.push_back(v.value().to(Device::cpu()).to(float32).to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("gradient accumulation over k calls of batch b gives one step of batch k*b") {
  for_each_device([](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const auto [x, y] = regression(32, dev);
    const std::vector<std::shared_ptr<opt::Optimizer>> plain{opt::SGD({.learning_rate = 0.1, .momentum = 0.5}),
                                                            opt::Adam({.learning_rate = 0.01}),
                                                            opt::Lion({.learning_rate = 0.01, .weight_decay = 0.1})};
    const std::vector<std::shared_ptr<opt::Optimizer>> accumulating{
        opt::SGD({.learning_rate = 0.1, .momentum = 0.5, .gradient_accumulation_steps = 4}),
        opt::Adam({.learning_rate = 0.01, .gradient_accumulation_steps = 4}),
        opt::Lion({.learning_rate = 0.01, .weight_decay = 0.1, .gradient_accumulation_steps = 4})};
    for (std::size_t i = 0; i < plain.size(); ++i) {
      CAPTURE(plain[i]->name());
      auto a = dense_model(11), b = dense_model(11);
      a->compile({.optimizer = plain[i], .loss = "mse"});
      b->compile({.optimizer = accumulating[i], .loss = "mse"});
      // Three updates: batches of 32 against windows of four batches of 8.
      a->fit(x, y, {.batch_size = 32, .epochs = 3, .verbose = 0, .shuffle = false});
      b->fit(x, y, {.batch_size = 8, .epochs = 3, .verbose = 0, .shuffle = false});
      CHECK(a->optimizer().iterations() == 3);
      CHECK(b->optimizer().iterations() == 3);
      CHECK(b->optimizer().raw_iterations() == 12);
      const auto wa = weights_of(*a), wb = weights_of(*b);
      for (std::size_t k = 0; k < wa.size(); ++k)
        for (std::size_t j = 0; j < wa[k].size(); ++j)
          CHECK(wb[k][j] == doctest::Approx(wa[k][j]).epsilon(1e-6).scale(1.0));
    }
  });
}

TEST_CASE("under a LossScaleOptimizer an overflow in any call of an accumulation window skips the whole update once") {
  for_each_device([](Device dev) {
    auto inner = opt::SGD({.learning_rate = 0.5, .gradient_accumulation_steps = 3});
    mixed_precision::LossScaleOptimizer lso(inner, {.initial_scale = 1024.0});
    Variable w(Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {2}).to(dev), "w");
    auto scaled = [&](float a, float b) {
      (void)lso.get_scaled_loss(Tensor::scalar(1.0, float32, dev));
      return Tensor::from_vector(std::vector<float>{a * 1024.0f, b * 1024.0f}, {2}).to(dev);
    };
    const float inf = std::numeric_limits<float>::infinity();
    auto r1 = lso.apply_gradients({scaled(0.1f, 0.2f)}, {w});
    auto r2 = lso.apply_gradients({scaled(inf, 0.2f)}, {w});  // the overflow, mid-window
    CHECK(r1.accumulated);
    CHECK(r2.accumulated);
    CHECK(lso.loss_scale() == 1024.0);  // no decision inside the window
    auto r3 = lso.apply_gradients({scaled(0.3f, 0.4f)}, {w});
    CHECK_FALSE(r3.accumulated);
    CHECK_FALSE(r3.applied);
    CHECK(r3.found_nonfinite);
    CHECK(r3.nonfinite_variables == std::vector<std::string>{"w"});
    CHECK(lso.skipped_steps() == 1);
    CHECK(lso.loss_scale() == 512.0);  // lowered once, for the window
    CHECK(w.value().to(Device::cpu()).to_vector<float>() == std::vector<float>{1.0f, 2.0f});
    CHECK(lso.iterations() == 0);
    CHECK(lso.raw_iterations() == 0);  // the window is discarded
    // The next window is clean (the accumulators restarted): one update with the mean.
    for (int k = 0; k < 3; ++k) {
      (void)lso.get_scaled_loss(Tensor::scalar(1.0, float32, dev));
      lso.apply_gradients({Tensor::from_vector(std::vector<float>{0.3f * 512.0f, 0.6f * 512.0f}, {2}).to(dev)}, {w});
    }
    CHECK(lso.iterations() == 1);
    CHECK(lso.skipped_steps() == 1);
    const auto v = w.value().to(Device::cpu()).to_vector<float>();
    CHECK(v[0] == doctest::Approx(1.0 - 0.5 * 0.3).epsilon(1e-6));
    CHECK(v[1] == doctest::Approx(2.0 - 0.5 * 0.6).epsilon(1e-6));
  });
}

TEST_CASE("the new optimizers train under every policy on every device, float32 masters, finite, loss going down") {
  const std::vector<std::string> policies{"float32", "mixed_float16", "mixed_bfloat16"};
  for_each_device([&](Device dev) {
    for (const auto& policy : policies) {
      CAPTURE(policy);
      test::PolicyDeviceScope scope(policy, dev);
      const auto [x, y] = regression(64, dev, 5);
      const std::vector<std::shared_ptr<opt::Optimizer>> optimizers{
          opt::Nadam({.learning_rate = 0.02}), opt::Adamax({.learning_rate = 0.05}),
          opt::Adagrad({.learning_rate = 0.2}), opt::Lion({.learning_rate = 0.005}),
          opt::Adafactor({.learning_rate = 0.05}),
          opt::AdamW({.learning_rate = 0.02, .use_ema = true, .ema_momentum = 0.5, .gradient_accumulation_steps = 2})};
      for (const auto& o : optimizers) {
        CAPTURE(o->name());
        auto m = dense_model(21);
        m->compile({.optimizer = o, .loss = "mse"});
        const double before = m->evaluate(x, y, {.batch_size = 64}).at("loss");
        History h = m->fit(x, y, {.batch_size = 16, .epochs = 8, .verbose = 0, .shuffle = false});
        const double after = m->evaluate(x, y, {.batch_size = 64}).at("loss");
        CHECK(std::isfinite(after));
        CHECK(after < 0.7 * before);
        for (const auto& v : m->trainable_variables()) {
          CHECK(v.dtype() == float32);
          const auto vals = v.value().to(Device::cpu()).to_vector<float>();
          CHECK(std::all_of(vals.begin(), vals.end(), [](float f) { return std::isfinite(f); }));
        }
      }
    }
  });
}

TEST_CASE("the new optimizers resume bit for bit from save_weights (slots, Nadam's u_product, accumulators, EMA)") {
  const std::vector<std::function<std::shared_ptr<opt::Optimizer>()>> makers{
      [] { return opt::Nadam({.learning_rate = 0.02}); },
      [] { return opt::Adafactor({.learning_rate = 0.05, .weight_decay = 0.01}); },
      [] { return opt::Adagrad({.learning_rate = 0.2, .use_ema = true}); },
      [] { return opt::Lion({.learning_rate = 0.01, .gradient_accumulation_steps = 3}); }};
  test::ScratchDir dir("keras-optimizers");
  for_each_device([&](Device dev) {
    test::PolicyDeviceScope scope("float32", dev);
    const auto [x, y] = regression(40, dev, 9);
    for (const auto& make : makers) {
      auto a = dense_model(31);
      a->compile({.optimizer = make(), .loss = "mse"});
      CAPTURE(a->optimizer().name());
      // 5 batches of 8 per epoch: the Lion run stops mid-window (10 calls, windows of 3).
      a->fit(x, y, {.batch_size = 8, .epochs = 2, .verbose = 0, .shuffle = false});
      const std::string path = dir / (a->optimizer().name() + ".weights.h5");
      a->save_weights(path);
      auto b = dense_model(99);
      b->compile({.optimizer = make(), .loss = "mse"});
      b->load_weights(path);
      CHECK(b->optimizer().raw_iterations() == a->optimizer().raw_iterations());
      a->fit(x, y, {.batch_size = 8, .epochs = 2, .verbose = 0, .shuffle = false});
      b->fit(x, y, {.batch_size = 8, .epochs = 2, .verbose = 0, .shuffle = false});
      CHECK(weights_of(*a) == weights_of(*b));
    }
  });
}

TEST_CASE("bad optimizer arguments are refused naming the optimizer and the argument") {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(contains(message([] { opt::Adam({.weight_decay = -0.1}); }), "weight_decay"));
  CHECK(contains(message([] { opt::SGD({.gradient_accumulation_steps = 1}); }), "gradient_accumulation_steps"));
  CHECK(contains(message([] { opt::Nadam({.use_ema = true, .ema_momentum = 1.5}); }), "ema_momentum"));
  CHECK(contains(message([] { opt::RMSprop({.ema_overwrite_frequency = 0}); }), "ema_overwrite_frequency"));
  CHECK(contains(message([] { opt::Lion({.beta_1 = 0.0}); }), "Lion: beta_1"));
  CHECK(contains(message([] { opt::Adamax({.beta_2 = 1.0}); }), "Adamax: beta_2"));
  CHECK(contains(message([] { opt::Adagrad({.initial_accumulator_value = -1}); }), "initial_accumulator_value"));
  CHECK(contains(message([] { opt::Adafactor({.clip_threshold = 0}); }), "clip_threshold"));
  // SwapEMAWeights' swap needs EMA on the optimizer.
  auto plain = opt::Adam();
  Variable w(Tensor::zeros({2}), "w");
  CHECK(contains(message([&] { plain->swap_ema_weights({w}); }), "use_ema"));
  // After the first step the exclusions are fixed, on every optimizer (Keras's rule).
  auto lion = opt::Lion({.weight_decay = 0.1});
  lion->apply_gradients({Tensor::ones({2})}, {w});
  CHECK(contains(message([&] { lion->exclude_from_weight_decay({"bias"}); }), "before the optimizer is built"));
  // Keras configs: a field mpt does not know is refused by name.
  const nlohmann::json cfg = {{"class_name", "Nadam"}, {"config", {{"learning_rate", 0.1}, {"momentum_decay", 0.004}}}};
  CHECK(contains(message([&] { (void)io::optimizer_from_json(cfg, "test"); }), "momentum_decay"));
  CHECK(contains(message([] { opt::Adam({.loss_scale_factor = 0.0}); }), "loss_scale_factor"));
  CHECK(contains(message([] { mixed_precision::LossScaleOptimizer(opt::SGD({.loss_scale_factor = 8.0})); }),
                 "loss_scale_factor"));
  // Names: the new ones by Keras's names.
  for (const char* n : {"nadam", "Adamax", "adagrad", "lion", "adafactor"}) CHECK(opt::get(n) != nullptr);
}

TEST_CASE("EMA: the averages follow Keras's rule, swap in and out, and finalize_variable_values installs them") {
  for_each_device([](Device dev) {
    auto o = opt::SGD({.learning_rate = 0.5, .use_ema = true, .ema_momentum = 0.75});
    Variable w(Tensor::from_vector(std::vector<float>{1.0f}, {1}).to(dev), "w");
    o->apply_gradients({Tensor::from_vector(std::vector<float>{1.0f}, {1}).to(dev)}, {w});  // w = 0.5, avg = 0.5
    o->apply_gradients({Tensor::from_vector(std::vector<float>{1.0f}, {1}).to(dev)}, {w});  // w = 0, avg = 0.375
    auto value = [&] { return w.value().to(Device::cpu()).to_vector<float>()[0]; };
    CHECK(value() == 0.0f);
    o->swap_ema_weights({w});
    CHECK(value() == 0.375f);
    o->swap_ema_weights({w});
    CHECK(value() == 0.0f);
    o->finalize_variable_values({w});
    CHECK(value() == 0.375f);
  });
}

// LossScaleOptimizer: Keras's dynamic loss scaling (skip and halve on inf/NaN, double after
// dynamic_growth_steps finite steps), mpt's extras (fixed scale, hysteresis, min/max), the fused
// unscale-and-check, and a float16 model that only learns with loss scaling.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <sstream>

#include <mpt/optim_ops.hpp>

#include "test_util.hpp"

using namespace mpt;
using mpt::mixed_precision::LossScaleOptimizer;
using namespace mpt::test;  // check_close, for_each_device, random, tolerance, ...
namespace opt = mpt::optimizers;

namespace {

using Vec = std::vector<double>;
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor f32(const Vec& v) { return Tensor::from_vector(v).to(float32); }

/// Captures what std::cerr receives while alive.
class CerrCapture {
 public:
  CerrCapture() : old_(std::cerr.rdbuf(buf_.rdbuf())) {}
  ~CerrCapture() { std::cerr.rdbuf(old_); }
  std::string str() const { return buf_.str(); }

 private:
  std::ostringstream buf_;
  std::streambuf* old_;
};

/// One step whose unscaled gradients are `g`, as in a real loop: the gradients of the scaled
/// loss (g times the scale) through get_unscaled_gradients.
mixed_precision::ApplyResult step(LossScaleOptimizer& o, const Vec& g, const Variable& w) {
  o.get_scaled_loss(Tensor::scalar(1.0));
  return o.apply_gradients(o.get_unscaled_gradients({f32(g) * o.loss_scale()}), {w});
}

}  // namespace

TEST_CASE("a finite step applies through the inner optimizer") {
  LossScaleOptimizer o(opt::SGD({.learning_rate = 1.0}), {.initial_scale = 4.0});
  Variable w(f32({1, 2, 3}), "w");
  CHECK(o.loss_scale() == 4.0);
  // Scaled gradients [4, -8, 2] unscale to [1, -2, 0.5].
  o.get_scaled_loss(Tensor::scalar(1.0));
  auto grads = o.get_unscaled_gradients({f32({4, -8, 2})});
  auto r = o.apply_gradients_checked(grads, {w});
  CHECK(r.applied);
  CHECK_FALSE(r.found_nonfinite);
  CHECK(r.loss_scale == 4.0);
  check_close(w.value(), {0, 4, 2.5}, tolerance(float32), "w after the step");
  CHECK(o.iterations() == 1);
  CHECK(o.inner_optimizer().iterations() == 1);
  CHECK(o.step_counter() == 1);
  CHECK(o.skipped_steps() == 0);
}

TEST_CASE("an inf or NaN gradient skips the step: weights, slots, iterations, LR unchanged") {
  for (double bad : {kInf, -kInf, kNaN}) {
    CAPTURE(bad);
    LossScaleOptimizer o(opt::Adam({.learning_rate = opt::schedules::PiecewiseConstantDecay({0}, {0.1, 0.01})}),
                         {.initial_scale = 1024.0});
    Variable w(f32({1, 2, 3}), "w"), b(f32({0.5}), "b");
    CHECK(step(o, {0.1, 0.2, 0.3}, w).applied);  // builds the slots
    const Vec w0 = w.value().to_vector<double>(), b0 = b.value().to_vector<double>();
    const auto slots0 = o.inner_optimizer().slots_by_path();
    const Vec m0 = slots0.at("w").at("m").to_vector<double>(), v0 = slots0.at("w").at("v").to_vector<double>();
    const double lr0 = o.learning_rate();
    CHECK(lr0 == 0.01);

    o.get_scaled_loss(Tensor::scalar(1.0));
    auto grads = o.get_unscaled_gradients({f32({1024, bad, 0}), f32({2048})});
    auto r = o.apply_gradients_checked(grads, {w, b});
    CHECK_FALSE(r.applied);
    CHECK(r.found_nonfinite);
    CHECK(r.loss_scale == 512.0);
    CHECK(o.loss_scale() == 512.0);
    CHECK(w.value().to_vector<double>() == w0);
    CHECK(b.value().to_vector<double>() == b0);  // the finite gradient is not applied either
    const auto slots1 = o.inner_optimizer().slots_by_path();
    CHECK(slots1.at("w").at("m").to_vector<double>() == m0);
    CHECK(slots1.at("w").at("v").to_vector<double>() == v0);
    CHECK(slots1.count("b") == 0);
    CHECK(o.iterations() == 1);
    CHECK(o.learning_rate() == lr0);
    CHECK(o.skipped_steps() == 1);
    CHECK(o.step_counter() == 0);
  }
}

TEST_CASE("four overflows take the scale from 400 to 25") {
  LossScaleOptimizer o(opt::SGD(), {.initial_scale = 400.0});
  Variable w(f32({1}), "w");
  std::vector<double> scales;
  for (int i = 0; i < 4; ++i) scales.push_back(step(o, {kNaN}, w).loss_scale);
  CHECK(scales == std::vector<double>{200, 100, 50, 25});
  CHECK(o.skipped_steps() == 4);
  CHECK(o.iterations() == 0);
  CHECK(w.value().item() == 1.0);
}

TEST_CASE("the scale doubles after dynamic_growth_steps consecutive finite steps") {
  LossScaleOptimizer o(opt::SGD({.learning_rate = 0.0}), {.initial_scale = 8.0, .dynamic_growth_steps = 3});
  Variable w(f32({1}), "w");
  CHECK(step(o, {1}, w).loss_scale == 8.0);
  CHECK(step(o, {1}, w).loss_scale == 8.0);
  CHECK(o.step_counter() == 2);
  CHECK(step(o, {1}, w).loss_scale == 16.0);
  CHECK(o.step_counter() == 0);
  // An overflow resets the count: two finite, one overflow, then three more finite to grow.
  step(o, {1}, w);
  step(o, {1}, w);
  CHECK(step(o, {kInf}, w).loss_scale == 8.0);
  CHECK(step(o, {1}, w).loss_scale == 8.0);
  CHECK(step(o, {1}, w).loss_scale == 8.0);
  CHECK(step(o, {1}, w).loss_scale == 16.0);
  CHECK(o.iterations() == 8);
}

TEST_CASE("dynamic = false keeps the scale fixed and still skips non-finite steps") {
  LossScaleOptimizer o(opt::SGD({.learning_rate = 1.0}),
                       {.initial_scale = 128.0, .dynamic_growth_steps = 1, .dynamic = false});
  Variable w(f32({1}), "w");
  for (int i = 0; i < 3; ++i) CHECK(step(o, {0.25}, w).applied);
  auto r = step(o, {kInf}, w);
  CHECK_FALSE(r.applied);
  CHECK(r.found_nonfinite);
  CHECK(o.loss_scale() == 128.0);
  CHECK(w.value().item() == 0.25);
  CHECK(o.iterations() == 3);
  CHECK(o.get_scaled_loss(Tensor::scalar(2.0)).item() == 256.0);
}

TEST_CASE("hysteresis: back off only after that many overflows in a row") {
  LossScaleOptimizer o(opt::SGD(), {.initial_scale = 64.0, .hysteresis = 2});
  Variable w(f32({1}), "w");
  auto r = step(o, {kNaN}, w);
  CHECK_FALSE(r.applied);  // skipped, but the scale holds
  CHECK(o.loss_scale() == 64.0);
  CHECK(o.overflow_count() == 1);
  CHECK(step(o, {kNaN}, w).loss_scale == 32.0);
  CHECK(o.overflow_count() == 0);
  // Overflows separated by a finite step are not consecutive.
  step(o, {kNaN}, w);
  CHECK(step(o, {1}, w).applied);
  CHECK(o.overflow_count() == 0);
  step(o, {kNaN}, w);
  CHECK(o.loss_scale() == 32.0);
  CHECK(step(o, {kNaN}, w).loss_scale == 16.0);
  CHECK(o.skipped_steps() == 5);
}

TEST_CASE("the scale stays within [min_scale, max_scale]") {
  LossScaleOptimizer low(opt::SGD(), {.initial_scale = 4.0, .min_scale = 1.0});
  Variable w(f32({1}), "w");
  for (int i = 0; i < 5; ++i) step(low, {kInf}, w);
  CHECK(low.loss_scale() == 1.0);

  LossScaleOptimizer high(opt::SGD({.learning_rate = 0.0}),
                          {.initial_scale = 4.0, .dynamic_growth_steps = 1, .max_scale = 16.0});
  CHECK(step(high, {1}, w).loss_scale == 8.0);
  CHECK(step(high, {1}, w).loss_scale == 16.0);
  CHECK(step(high, {1}, w).loss_scale == 16.0);

  CHECK_THROWS_AS(LossScaleOptimizer(opt::SGD(), {.initial_scale = 1e9}), Error);  // above 2^24
  CHECK_THROWS_AS(LossScaleOptimizer(opt::SGD(), {.initial_scale = 0.5}), Error);  // below 1
  CHECK_THROWS_AS(LossScaleOptimizer(opt::SGD(), {.dynamic_growth_steps = 0}), Error);
  CHECK_THROWS_AS(LossScaleOptimizer(opt::SGD(), {.hysteresis = 0}), Error);
  CHECK_THROWS_AS(LossScaleOptimizer(opt::SGD(), {.min_scale = 8.0, .max_scale = 4.0}), Error);
  CHECK_THROWS_AS(LossScaleOptimizer(std::make_shared<LossScaleOptimizer>(opt::SGD())), Error);
  CHECK_THROWS_AS(LossScaleOptimizer("unknown"), Error);
}

namespace {
class HalvingOptimizer : public opt::Optimizer {  // w -= lr * g, lr halves each step
 public:
  HalvingOptimizer() : Optimizer("halving", {.learning_rate = 1.0}) {}
  std::shared_ptr<Optimizer> clone() const override { return std::make_shared<HalvingOptimizer>(); }
  double learning_rate() const override { return std::pow(0.5, static_cast<double>(iterations())); }
  void update_step(const Tensor& g, const Variable& v, double lr) override {
    v.assign(ops::sub(v.value(), ops::mul(g, Tensor::scalar(lr))));
  }
};
}  // namespace

TEST_CASE("wraps a user-defined optimizer; Keras names and shared optimizers work too") {
  LossScaleOptimizer o(HalvingOptimizer{}, {.initial_scale = 2.0});
  Variable w(f32({0}), "w");
  step(o, {1}, w);           // lr 1
  step(o, {kNaN}, w);        // skipped: lr stays 0.5
  CHECK(o.learning_rate() == 0.5);
  step(o, {1}, w);           // lr 0.5
  CHECK(w.value().item() == -1.5);
  CHECK(o.iterations() == 2);
  CHECK(o.inner_optimizer().name() == "halving");

  LossScaleOptimizer by_name("adam");
  CHECK(by_name.inner_optimizer().name() == "adam");
  CHECK(by_name.loss_scale() == 32768.0);
  CHECK(by_name.options().dynamic_growth_steps == 2000);
  auto shared = std::make_shared<opt::SGDOptimizer>();
  LossScaleOptimizer wraps_shared(shared);
  CHECK(&wraps_shared.inner_optimizer() == shared.get());

  // Usable through the base interface (apply_gradients is virtual).
  opt::Optimizer& base = o;
  o.get_scaled_loss(Tensor::scalar(1.0));
  base.apply_gradients({f32({kInf})}, {w});
  CHECK(o.skipped_steps() == 2);
  CHECK(base.iterations() == 2);

  auto c = std::dynamic_pointer_cast<LossScaleOptimizer>(o.clone());
  REQUIRE(c);
  CHECK(c->loss_scale() == 2.0);
  CHECK(c->iterations() == 0);
  CHECK(c->inner_optimizer().name() == "halving");
}

TEST_CASE("get_scaled_loss multiplies by the scale in float32, on the tape") {
  LossScaleOptimizer o(opt::SGD(), {.initial_scale = 1024.0});
  Tensor loss = Tensor::scalar(0.375);
  Tensor scaled = o.get_scaled_loss(loss);
  CHECK(scaled.dtype() == float32);
  CHECK(scaled.item() == 384.0);
  Tensor loss16 = Tensor::scalar(0.5, float16);
  CHECK(o.get_scaled_loss(loss16).dtype() == float32);
  CHECK(o.get_scaled_loss(loss16).item() == 512.0);

  Variable w(f32({1, -2}), "w");
  GradientTape tape;
  Tensor l = ops::sum(ops::square(w.read(float16)));  // float16 loss
  auto g = tape.gradient(o.get_scaled_loss(l), std::vector<Variable>{w});
  check_close(g[0], {2048, -4096}, tolerance(float32), "scaled gradient");
  CHECK_THROWS_AS(o.get_scaled_loss(Tensor()), Error);
  CHECK_THROWS_AS(o.get_scaled_loss(Tensor::scalar(1, int32)), Error);
}

TEST_CASE("get_unscaled_gradients: float32 values in one fused pass, inf/NaN detected") {
  for_each_device([](Device dev) {
    LossScaleOptimizer o(opt::SGD(), {.initial_scale = 256.0});
    Tensor a = Tensor::from_vector(Vec{256, -512, 1}, {3}, dev).to(float16);
    Tensor b = Tensor::from_vector(Vec{128, 64, 32, 16}, {2, 2}, dev).to(float32);
    auto out = o.get_unscaled_gradients({a, Tensor(), b});
    REQUIRE(out.size() == 3);
    CHECK(out[0].dtype() == float32);
    CHECK(out[0].device() == dev);
    check_close(out[0], {1, -2, 1.0 / 256}, tolerance(float32), "unscaled float16 gradient");
    CHECK_FALSE(out[1].defined());
    CHECK(out[2].shape() == Shape{2, 2});
    check_close(out[2], {0.5, 0.25, 0.125, 0.0625}, tolerance(float32), "unscaled float32 gradient");
    check_close(b, {128, 64, 32, 16}, tolerance(float32), "input left untouched");

    // The fused op itself: NaN and inf anywhere in any tensor, large tensors included.
    std::vector<double> big(100000, 1.0);
    auto clean = ops::unscale_and_check({Tensor::from_vector(big, {}, dev).to(float32), a}, 0.5);
    CHECK_FALSE(clean.found_nonfinite);
    for (double bad : {kNaN, kInf, -kInf}) {
      big[77777] = bad;
      auto r = ops::unscale_and_check({a, Tensor::from_vector(big, {}, dev).to(float32)}, 0.5);
      CHECK(r.found_nonfinite);
      big[77777] = 1.0;
    }
    // float16 inf (overflowed gradient) and a product that overflows float32.
    auto r16 = ops::unscale_and_check({Tensor::from_vector(Vec{1, 70000}, {}, dev).to(float16)}, 1.0);
    CHECK(r16.found_nonfinite);
    auto over = ops::unscale_and_check({Tensor::from_vector(Vec{3e38}, {}, dev).to(float32)}, 4.0);
    CHECK(over.found_nonfinite);
    CHECK_FALSE(ops::unscale_and_check({}, 1.0).found_nonfinite);
    CHECK_THROWS_AS(ops::unscale_and_check({Tensor::ones({2}, int32, dev)}, 1.0), Error);
  });
}

TEST_CASE("apply reuses the fused check for the same tensors, checks others itself") {
  LossScaleOptimizer o(opt::SGD({.learning_rate = 1.0}), {.initial_scale = 2.0});
  Variable w(f32({0, 0}), "w");
  o.get_scaled_loss(Tensor::scalar(1.0));
  auto grads = o.get_unscaled_gradients({f32({2, kNaN})});
  CHECK_FALSE(o.apply_gradients_checked(grads, {w}).applied);
  // Gradients that did not come from get_unscaled_gradients are checked by apply.
  o.get_scaled_loss(Tensor::scalar(1.0));
  o.get_unscaled_gradients({f32({2, 2})});
  auto r = o.apply_gradients_checked({f32({kInf, 0})}, {w});
  CHECK_FALSE(r.applied);
  CHECK(r.found_nonfinite);
  // ... and, after get_scaled_loss, taken as gradients of the scaled loss: unscaled first, as
  // Keras 3's apply does (the scale is 1 after the two overflows).
  CHECK(o.loss_scale() == 1.0);
  o.get_scaled_loss(Tensor::scalar(1.0));
  CHECK(o.apply_gradients_checked({f32({1, 1})}, {w}).applied);
  check_close(w.value(), {-1, -1}, tolerance(float32), "w");
}

TEST_CASE("apply without get_scaled_loss warns once") {
  LossScaleOptimizer o{opt::SGD()};
  Variable w(f32({0}), "w");
  std::string first, second;
  {
    CerrCapture cap;
    o.apply_gradients_checked({f32({1})}, {w});
    first = cap.str();
  }
  {
    CerrCapture cap;
    o.apply_gradients_checked({f32({1})}, {w});
    second = cap.str();
  }
  CHECK(first.rfind("mpt: LossScaleOptimizer:", 0) == 0);
  CHECK(std::count(first.begin(), first.end(), '\n') == 1);
  CHECK(second.empty());

  LossScaleOptimizer quiet{opt::SGD()};
  CerrCapture cap;
  step(quiet, {1}, w);
  step(quiet, {1}, w);
  CHECK(cap.str().empty());
}

TEST_CASE("set_state restores the scale and counters") {
  LossScaleOptimizer o(opt::SGD({.learning_rate = 0.0}), {.dynamic_growth_steps = 3});
  o.set_state(64.0, 2, 0);
  CHECK(o.loss_scale() == 64.0);
  CHECK(o.step_counter() == 2);
  Variable w(f32({0}), "w");
  CHECK(step(o, {1}, w).loss_scale == 128.0);
  CHECK_THROWS_AS(o.set_state(0.0, 0, 0), Error);
  CHECK_THROWS_AS(o.set_state(kNaN, 0, 0), Error);
}

TEST_CASE("float16 gradients that underflow: no learning without loss scaling, learning with it") {
  // y = x . w in float16 with x = 64 everywhere; loss = 1e-5 * mean((y - 1)^2) over 2048 rows.
  // dloss/dy = 2e-5 (y - 1) / 2048 ~ 1e-8 < 2^-25 rounds to 0 in float16, so without scaling
  // the gradient reaching w is exactly 0, although the true one (-1.28e-3) is a fine float32.
  const std::int64_t n = 2048;
  Tensor x = Tensor::full({n, 2}, 64.0, float16);
  Tensor target = Tensor::ones({n, 1});
  auto loss_of = [&](const Variable& w) {
    Tensor y = ops::cast(ops::matmul(x, w.read(float16)), float32);
    return ops::mul(ops::mean(ops::square(ops::sub(y, target))), Tensor::scalar(1e-5));
  };

  SUBCASE("plain SGD: gradients flush to zero, the weights never change") {
    Variable w(Tensor::zeros({2, 1}), "w");
    opt::SGDOptimizer sgd({.learning_rate = 2.0});
    for (int i = 0; i < 10; ++i) {
      GradientTape tape;
      auto grads = tape.gradient(loss_of(w), std::vector<Variable>{w});
      CHECK(grads[0].dtype() == float32);
      CHECK(grads[0].to_vector<double>() == Vec{0, 0});
      sgd.apply_gradients(grads, {w});
    }
    CHECK(w.value().to_vector<double>() == Vec{0, 0});
  }
  SUBCASE("LossScaleOptimizer(SGD): the weights move to the target") {
    Variable w(Tensor::zeros({2, 1}), "w");
    LossScaleOptimizer o(opt::SGD({.learning_rate = 2.0}));
    double first = 0, last = 0;
    for (int i = 0; i < 10; ++i) {
      GradientTape tape;
      Tensor loss = loss_of(w);
      auto grads = tape.gradient(o.get_scaled_loss(loss), std::vector<Variable>{w});
      auto unscaled = o.get_unscaled_gradients(grads);
      if (i == 0) check_close(unscaled[0], {-1.28e-3, -1.28e-3}, tolerance(float16), "first gradient");
      CHECK(o.apply_gradients_checked(unscaled, {w}).applied);
      (i == 0 ? first : last) = loss.item();
    }
    // w0 + w1 -> 1/64 (y = 1); each step closes a third of the gap.
    const auto v = w.value().to_vector<double>();
    CHECK(v[0] > 0.007);
    CHECK(64 * (v[0] + v[1]) == doctest::Approx(1.0).epsilon(0.05));
    CHECK(last < first * 1e-2);
    CHECK(o.skipped_steps() == 0);
  }
}

TEST_CASE("apply_gradients returns the step's result and unscales gradients of the scaled loss") {
  // Keras 3's pattern: the gradients of the scaled loss go straight to apply_gradients. Before,
  // they were applied as they were: 1024 times too large here.
  for_each_device([](Device dev) {
    LossScaleOptimizer o(opt::SGD({.learning_rate = 0.5}), {.initial_scale = 1024.0});
    Variable w(Tensor::from_vector(Vec{1, 2}, {}, dev).to(float32), "w");
    GradientTape tape;
    Tensor loss = ops::sum(ops::mul(w.value(), Tensor::from_vector(Vec{3, -1}, {}, dev).to(float32)));
    auto grads = tape.gradient(o.get_scaled_loss(loss), std::vector<Variable>{w});
    opt::Optimizer& base = o;  // the result through the base interface too
    opt::ApplyResult r = base.apply_gradients(grads, {w});
    CHECK(r.applied);
    CHECK_FALSE(r.found_nonfinite);
    CHECK(r.loss_scale == 1024.0);
    check_close(w.value(), {1 - 0.5 * 3, 2 + 0.5 * 1}, tolerance(float32), "w after one unscaled step");
    // A plain optimizer's result: always applied, scale 1.
    auto sgd = opt::SGD();
    opt::ApplyResult plain = sgd->apply_gradients({Tensor::from_vector(Vec{0, 0}, {}, dev).to(float32)}, {w});
    CHECK(plain.applied);
    CHECK(plain.loss_scale == 1.0);
  });
}

TEST_CASE("a skipped step's BatchNormalization statistics never commit, even without finish_step") {
  for_each_device([](Device dev) {
    set_default_device(dev);  // the layer's variables go there
    auto bn = layers::BatchNormalization();
    Tensor x = Tensor::random_uniform({8, 3}, 0, 4, 1, float32, dev);
    bn(x, {.training = true});  // builds; its statistics wait for the step
    auto moving = [&] { return bn->variables()[2].value().to_vector<float>(); };  // moving_mean
    const auto before = moving();
    LossScaleOptimizer o(opt::SGD());
    Variable v(Tensor::zeros({1}, float32, dev), "v");
    o.get_scaled_loss(Tensor::scalar(1.0, float32, dev));
    CHECK_FALSE(o.apply_gradients({Tensor::full({1}, INFINITY, float32, dev)}, {v}).applied);  // skipped
    bn(x, {.training = true});  // no finish_step: the skipped step's statistics are dropped here
    CHECK(moving() == before);
    bn(x, {.training = true});  // nothing skipped since the last call: its statistics commit
    CHECK(moving() != before);
    set_default_device(Device::cpu());
  });
}

TEST_CASE("compile forces softmax outputs to float32 only under mixed policies, on every output") {
  mixed_precision::set_global_policy("mixed_bfloat16");
  auto in = Input({4});
  auto h = layers::Dense(8)(in);
  auto probs = layers::Dense(3, {.activation = "softmax", .name = "probs"})(h);
  auto side = layers::Activation("softmax", {.name = "side"})(layers::Dense(2)(h));
  Model m(std::vector<KerasTensor>{in}, std::vector<KerasTensor>{probs, side});
  m.compile({.optimizer = "sgd", .loss = "mse"});
  for (const auto& l : m.layers())
    if (l->name() == "probs" || l->name() == "side") CHECK(l->dtype_policy().name() == "float32");
  // A pure float16 model keeps the dtype it asked for.
  mixed_precision::set_global_policy("float16");
  Sequential f({layers::Input({4}), layers::Dense(3), layers::Activation("softmax")});
  f.compile({.optimizer = "sgd", .loss = "mse"});
  CHECK(f.layers().back()->dtype_policy().name() == "float16");
  mixed_precision::set_global_policy("float32");
}

TEST_CASE("overflow diagnostics: a skipped step names the variables whose gradients held inf/NaN") {
  for_each_device([](Device dev) {
    LossScaleOptimizer o(opt::Adam(), {.initial_scale = 1024.0});
    Variable a(Tensor::zeros({3}, float32, dev), "dense/kernel"), b(Tensor::zeros({2}, float32, dev), "dense/bias"),
        c(Tensor::zeros({4}, float32, dev), "conv2d/kernel");
    auto grads_with = [&](int bad_in) {
      std::vector<Tensor> g;
      for (int i = 0; i < 3; ++i) {
        Tensor t = Tensor::full({i == 2 ? 4 : 3 - i}, 1.0, float32, dev);
        if (i == bad_in) t = ops::mul(t, Tensor::scalar(bad_in == 1 ? kNaN : kInf, float32, dev));
        g.push_back(t);
      }
      return g;
    };
    o.get_scaled_loss(Tensor::scalar(1.0, float32, dev));
    auto r = o.apply_gradients_checked(o.get_unscaled_gradients(grads_with(2)), {a, b, c});
    CHECK_FALSE(r.applied);
    CHECK(r.nonfinite_variables == std::vector<std::string>{"conv2d/kernel"});
    // Handed the gradients of the scaled loss directly: the same fused check names them.
    o.get_scaled_loss(Tensor::scalar(1.0, float32, dev));
    r = o.apply_gradients(grads_with(1), {a, b, c});
    CHECK(r.nonfinite_variables == std::vector<std::string>{"dense/bias"});
    o.get_scaled_loss(Tensor::scalar(1.0, float32, dev));
    r = o.apply_gradients(grads_with(-1), {a, b, c});
    CHECK(r.applied);
    CHECK(r.nonfinite_variables.empty());
  });
}

namespace {
/// out = x + sqrt(v) * 0 with v = 0: the forward is x, and v's gradient is 0 * inf = NaN at every
/// step, so this layer alone overflows.
class BadGradient : public Layer {
 public:
  BadGradient() : Layer("BadGradient") { set_name("bad_gradient"); }
  void build(const Shape& s) override { v_ = add_weight("v", {1}, "zeros"); }
  Tensor call(const Tensor& x, bool) override {
    return ops::add(x, ops::mul(ops::sqrt(read(v_)), Tensor::scalar(0.0, x.dtype(), x.device())));
  }

 private:
  Variable v_;
};
}  // namespace

TEST_CASE("overflow diagnostics in fit: History counts per epoch and verbose names the layer") {
  mixed_precision::set_global_policy("mixed_float16");
  set_random_seed(2);
  Sequential m({layers::Input({4}), layers::Dense(8, {.activation = "relu"}), std::make_shared<BadGradient>(),
                layers::Dense(3), layers::Activation("softmax")});
  m.compile({.optimizer = opt::SGD(), .loss = "sparse_categorical_crossentropy"});
  Tensor x = Tensor::random_uniform({32, 4}, 0, 1, 3);
  Tensor y = ops::cast(Tensor::random_uniform({32}, 0, 2.99, 4), int32);
  std::vector<std::string> lines;
  set_log_sink([&](LogLevel, const std::string& line) { lines.push_back(line); });
  auto h = m.fit(x, y, {.batch_size = 8, .epochs = 2, .verbose = 2});
  set_log_sink(nullptr);
  mixed_precision::set_global_policy("float32");
  REQUIRE(h.nonfinite_layers.size() == 2);
  for (const auto& epoch : h.nonfinite_layers) CHECK(epoch == std::map<std::string, std::int64_t>{{"bad_gradient", 4}});
  CHECK(h.history.at("skipped_steps") == std::vector<double>{4, 4});
  std::int64_t named = 0;
  for (const auto& l : lines)
    if (l.find("skipped: inf/NaN gradients in layer bad_gradient (bad_gradient/v)") != std::string::npos) ++named;
  CHECK(named == 8);
}

TEST_CASE("the unscale fused into the inner update gives the unfused step's bits, overflows included") {
  for_each_device([](Device dev) {
    for (DType gd : {float16, bfloat16, float32}) {
      CAPTURE(to_string(gd));
      for (int kind = 0; kind < 3; ++kind) {
        CAPTURE(kind);
        auto inner = [&]() -> std::shared_ptr<opt::Optimizer> {
          if (kind == 0) return opt::Adam({.learning_rate = 0.01});
          if (kind == 1) return opt::SGD({.learning_rate = 0.05, .momentum = 0.9, .nesterov = true});
          return opt::RMSprop({.learning_rate = 0.01, .momentum = 0.5, .centered = true});
        };
        const mixed_precision::LossScaleOptions o{.initial_scale = 1024, .dynamic_growth_steps = 2};
        LossScaleOptimizer fused(inner(), o), plain(inner(), o);
        REQUIRE(fused.inner_optimizer().fuses_gradient_scale());
        std::vector<Variable> va, vb;
        for (int i = 0; i < 3; ++i) {
          const Tensor w = Tensor::random_uniform({4 + i, 3}, -1, 1, 50 + i).to(dev).copy();
          va.emplace_back(w, "w" + std::to_string(i));
          vb.emplace_back(w.copy(), "w" + std::to_string(i));
        }
        for (int step = 0; step < 6; ++step) {
          CAPTURE(step);
          std::vector<Tensor> g;
          for (int i = 0; i < 3; ++i) {
            Tensor gi = Tensor::random_uniform({4 + i, 3}, -500, 500, 60 + 3 * step + i, float32, Device::cpu());
            if (step == 3 && i == 1) {  // an overflow: the step is skipped and the scale halves
              std::vector<double> v = gi.to_vector<double>();
              v[2] = kInf;
              gi = Tensor::from_vector(v, gi.shape(), Device::cpu()).to(float32);
            }
            g.push_back(gi.to(gd).to(dev).copy());
          }
          fused.get_scaled_loss(Tensor::scalar(1.0, float32, dev));
          plain.get_scaled_loss(Tensor::scalar(1.0, float32, dev));
          const auto ra = fused.apply_gradients(g, va);                               // fused: raw gradients
          const auto rb = plain.apply_gradients(plain.get_unscaled_gradients(g), vb);  // unscaled copies first
          CHECK(ra.applied == rb.applied);
          CHECK(ra.applied == (step != 3));
          CHECK(ra.nonfinite_variables == rb.nonfinite_variables);
          CHECK(fused.loss_scale() == plain.loss_scale());
          for (int i = 0; i < 3; ++i) {
            CAPTURE(i);
            CHECK(va[i].value().to_vector<double>() == vb[i].value().to_vector<double>());
          }
        }
        CHECK(fused.loss_scale() != 1024.0);  // the scale moved: halved at the overflow, grown after
        CHECK(fused.iterations() == 5);
      }
    }
  });
}

TEST_CASE("apply_scaled_gradients: only where the updates apply the scale and no clipping is set") {
  Variable w(Tensor::ones({3}), "w");
  auto adam = opt::Adam({.learning_rate = 0.1});
  CHECK(adam->fuses_gradient_scale());
  CHECK(adam->gradient_scale() == 1.0);
  adam->apply_scaled_gradients({Tensor::full({3}, 4.0)}, {w}, 0.25);
  CHECK(adam->gradient_scale() == 1.0);  // reset after the step
  CHECK(adam->iterations() == 1);
  auto clipped = opt::Adam({.learning_rate = 0.1, .clipnorm = 1.0});
  CHECK_FALSE(clipped->fuses_gradient_scale());
  CHECK(contains(error_of([&] { clipped->apply_scaled_gradients({Tensor::ones({3})}, {w}, 0.5); }),
                 "apply_scaled_gradients needs an optimizer whose updates apply gradient_scale() and no clipping"));
  CHECK(contains(error_of([&] { adam->apply_scaled_gradients({Tensor::ones({3})}, {w}, std::nan("")); }),
                 "grad_scale must be a finite number > 0"));
  CHECK(contains(error_of([&] { adam->apply_scaled_gradients({Tensor::ones({3})}, {w}, 0.0); }),
                 "grad_scale must be a finite number > 0"));
  CHECK(adam->iterations() == 1);  // refused steps change nothing
  LossScaleOptimizer lso(opt::Adam({.learning_rate = 0.1}));
  CHECK_FALSE(lso.fuses_gradient_scale());  // a wrapper: its inner optimizer fuses
}

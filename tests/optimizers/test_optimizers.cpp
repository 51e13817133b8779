// Optimizers against float64 references written here from Keras 3's update rules, the fused
// update ops on every device, clipping, learning-rate schedules and the Optimizer base.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <limits>

#include <mpt/optim_ops.hpp>
#include <nlohmann/json.hpp>

#include "io/optimizer_io.hpp"
#include "test_util.hpp"

using namespace mpt;
using namespace mpt::test;  // check_close, for_each_device, random, tolerance, ...
namespace opt = mpt::optimizers;
namespace sched = mpt::optimizers::schedules;

namespace {

using Vec = std::vector<double>;

const Vec kW0 = {0.5, -1.25, 2.0, 0.0, -0.3, 1.5};
// Three steps of gradients, with signs flipping and a large-then-small pattern (amsgrad).
const std::vector<Vec> kGrads = {{0.4, -0.8, 1.5, 0.0, 2.0, -0.05},
                                 {-0.2, -0.6, 0.01, 0.3, 0.1, -0.5},
                                 {0.1, 0.9, -0.02, -0.7, 0.05, 0.25}};
const Shape kShape = {2, 3};

Tensor f32(const Vec& v, const Shape& s = kShape) { return Tensor::from_vector(v, s).to(float32); }

/// Runs `o` for the three kGrads steps on a fresh variable; after each step compares the
/// variable with `ref` advanced by one step (ref(w, g, t) updates w in place, t from 1).
void run_three_steps(opt::Optimizer& o, const std::function<void(Vec&, const Vec&, int)>& ref,
                     const std::string& what) {
  Variable w(f32(kW0), "w");
  Vec wr = kW0;
  for (int t = 1; t <= 3; ++t) {
    o.apply_gradients({f32(kGrads[t - 1])}, {w});
    ref(wr, kGrads[t - 1], t);
    CHECK(o.iterations() == t);
    check_close(w.value(), wr, tolerance(float32), what + " step " + std::to_string(t));
  }
}

// ---- float64 references of Keras's rules -----------------------------------------------------

struct SgdRef {
  double lr, mu;
  bool nesterov;
  Vec m = Vec(6, 0.0);
  void operator()(Vec& w, const Vec& g, int) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (mu == 0) {
        w[i] -= lr * g[i];
        continue;
      }
      m[i] = mu * m[i] - lr * g[i];
      w[i] += nesterov ? mu * m[i] - lr * g[i] : m[i];
    }
  }
};

struct AdamRef {
  double lr, b1, b2, eps;
  bool amsgrad = false;
  double weight_decay = 0;
  Vec m = Vec(6, 0.0), v = Vec(6, 0.0), vhat = Vec(6, 0.0);
  void operator()(Vec& w, const Vec& g, int t) {
    const double step = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    for (std::size_t i = 0; i < w.size(); ++i) {
      w[i] *= 1 - weight_decay * lr;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      vhat[i] = std::max(vhat[i], v[i]);
      const double second = amsgrad ? vhat[i] : v[i];
      w[i] -= step * m[i] / (std::sqrt(second) + eps);
    }
  }
};

struct RmsRef {
  double lr, rho, mu, eps;
  bool centered;
  Vec vel = Vec(6, 0.0), avg = Vec(6, 0.0), mom = Vec(6, 0.0);
  void operator()(Vec& w, const Vec& g, int) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      vel[i] = rho * vel[i] + (1 - rho) * g[i] * g[i];
      double denom = vel[i] + eps;
      if (centered) {
        avg[i] = rho * avg[i] + (1 - rho) * g[i];
        denom = vel[i] - avg[i] * avg[i] + eps;
      }
      const double inc = lr * g[i] / std::sqrt(denom);
      if (mu > 0) {
        mom[i] = mu * mom[i] + inc;
        w[i] -= mom[i];
      } else {
        w[i] -= inc;
      }
    }
  }
};

double l2(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("SGD: plain, momentum and nesterov match Keras's rule for three steps") {
  {
    opt::SGDOptimizer o({.learning_rate = 0.1});
    run_three_steps(o, SgdRef{0.1, 0.0, false}, "SGD");
  }
  {
    opt::SGDOptimizer o({.learning_rate = 0.1, .momentum = 0.9});
    SgdRef ref{0.1, 0.9, false};
    run_three_steps(o, std::ref(ref), "SGD momentum");
    auto slots = o.slots_by_path();
    REQUIRE(slots.count("w") == 1);
    check_close(slots["w"].at("momentum"), ref.m, tolerance(float32), "SGD momentum slot");
  }
  {
    opt::SGDOptimizer o({.learning_rate = 0.05, .momentum = 0.8, .nesterov = true});
    run_three_steps(o, SgdRef{0.05, 0.8, true}, "SGD nesterov");
  }
  CHECK_THROWS_AS(opt::SGD({.momentum = 1.5}), Error);
}

TEST_CASE("Adam and AMSGrad match Keras's rule for three steps") {
  {
    opt::AdamOptimizer o({.learning_rate = 0.01});
    AdamRef ref{0.01, 0.9, 0.999, 1e-7};
    run_three_steps(o, std::ref(ref), "Adam");
    auto slots = o.slots_by_path()["w"];
    check_close(slots.at("m"), ref.m, tolerance(float32), "Adam m");
    check_close(slots.at("v"), ref.v, tolerance(float32), "Adam v");
    CHECK(slots.count("vhat") == 0);
  }
  {
    opt::AdamOptimizer o({.learning_rate = 0.02, .beta_1 = 0.5, .beta_2 = 0.6, .epsilon = 1e-3, .amsgrad = true});
    AdamRef ref{0.02, 0.5, 0.6, 1e-3, true};
    run_three_steps(o, std::ref(ref), "AMSGrad");
    // The large-then-small gradients make vhat differ from v: the amsgrad branch mattered.
    auto slots = o.slots_by_path()["w"];
    check_close(slots.at("vhat"), ref.vhat, tolerance(float32), "AMSGrad vhat");
    CHECK(ref.vhat[4] > ref.v[4] * 2);
  }
}

TEST_CASE("AdamW applies decoupled weight decay before the Adam step") {
  opt::AdamWOptimizer o({.learning_rate = 0.01, .weight_decay = 0.5});
  AdamRef ref{0.01, 0.9, 0.999, 1e-7, false, 0.5};
  run_three_steps(o, std::ref(ref), "AdamW");

  // The decay moves a variable even with zero gradients; plain Adam does not.
  Variable w(f32({1, -2, 3, -4, 5, -6}), "w");
  opt::AdamWOptimizer decay({.learning_rate = 0.1, .weight_decay = 0.2});
  decay.apply_gradients({Tensor::zeros(kShape)}, {w});
  check_close(w.value(), {0.98, -1.96, 2.94, -3.92, 4.9, -5.88}, tolerance(float32), "AdamW decay");
  CHECK_THROWS_AS(opt::AdamW({.weight_decay = -1}), Error);
}

TEST_CASE("RMSprop: plain, momentum, centered match Keras's rule for three steps") {
  {
    opt::RMSpropOptimizer o({.learning_rate = 0.01});
    run_three_steps(o, RmsRef{0.01, 0.9, 0.0, 1e-7, false}, "RMSprop");
  }
  {
    opt::RMSpropOptimizer o({.learning_rate = 0.01, .rho = 0.8, .momentum = 0.5});
    run_three_steps(o, RmsRef{0.01, 0.8, 0.5, 1e-7, false}, "RMSprop momentum");
  }
  {
    opt::RMSpropOptimizer o({.learning_rate = 0.01, .rho = 0.7, .epsilon = 1e-4, .centered = true});
    RmsRef ref{0.01, 0.7, 0.0, 1e-4, true};
    run_three_steps(o, std::ref(ref), "RMSprop centered");
    check_close(o.slots_by_path()["w"].at("average_gradient"), ref.avg, tolerance(float32),
                "RMSprop average_gradient");
  }
  {
    opt::RMSpropOptimizer o({.learning_rate = 0.01, .rho = 0.7, .momentum = 0.9, .epsilon = 1e-4, .centered = true});
    run_three_steps(o, RmsRef{0.01, 0.7, 0.9, 1e-4, true}, "RMSprop centered momentum");
  }
  // Keras's docstring example: var 10, loss var^2/2, lr 0.1, one step -> 9.683772.
  Variable v(Tensor::scalar(10.0), "v");
  opt::RMSpropOptimizer o({.learning_rate = 0.1});
  o.apply_gradients({Tensor::scalar(10.0)}, {v});
  CHECK(v.value().item() == doctest::Approx(9.683772).epsilon(1e-6));
}

TEST_CASE("clipnorm clips each gradient, global_clipnorm all jointly, clipvalue elementwise") {
  const Vec ga = {3, 4, 0, 0, 0, 0};      // norm 5
  const Vec gb = {0.3, 0, 0, -0.4, 0, 0};  // norm 0.5
  auto run = [&](opt::CommonOptions c) {
    opt::SGDOptimizer o({.learning_rate = 1.0, .clipnorm = c.clipnorm, .clipvalue = c.clipvalue,
                .global_clipnorm = c.global_clipnorm});
    Variable a(Tensor::zeros(kShape), "a"), b(Tensor::zeros(kShape), "b");
    o.apply_gradients({f32(ga), f32(gb)}, {a, b});
    // w = -clipped g
    auto neg = [](Vec v) {
      for (auto& x : v) x = -x;
      return v;
    };
    return std::pair{neg(a.value().to_vector<double>()), neg(b.value().to_vector<double>())};
  };
  {
    auto [a, b] = run({.clipnorm = 1.0});
    check_close(a, {0.6, 0.8, 0, 0, 0, 0}, tolerance(float32), "clipnorm large");
    check_close(b, gb, tolerance(float32), "clipnorm small (untouched)");
  }
  {
    auto [a, b] = run({.global_clipnorm = 1.0});
    const double norm = std::sqrt(25 + 0.25);
    Vec ea = ga, eb = gb;
    for (auto& x : ea) x /= norm;
    for (auto& x : eb) x /= norm;
    check_close(a, ea, tolerance(float32), "global_clipnorm a");
    check_close(b, eb, tolerance(float32), "global_clipnorm b");
    CHECK(l2(a) * l2(a) + l2(b) * l2(b) == doctest::Approx(1.0).epsilon(1e-5));
  }
  {
    auto [a, b] = run({.global_clipnorm = 100.0});
    check_close(a, ga, tolerance(float32), "global_clipnorm above the norm");
  }
  {
    auto [a, b] = run({.clipvalue = 0.35});
    check_close(a, {0.35, 0.35, 0, 0, 0, 0}, tolerance(float32), "clipvalue a");
    check_close(b, {0.3, 0, 0, -0.35, 0, 0}, tolerance(float32), "clipvalue b");
  }
  CHECK_THROWS_AS(opt::SGD({.clipnorm = 1.0, .global_clipnorm = 1.0}), Error);
  CHECK_THROWS_AS(opt::Adam({.clipvalue = -1.0}), Error);
}

TEST_CASE("schedules give Keras's values") {
  sched::ExponentialDecay exp_decay({.initial_learning_rate = 0.1, .decay_steps = 10, .decay_rate = 0.5});
  CHECK(exp_decay(0) == doctest::Approx(0.1));
  CHECK(exp_decay(5) == doctest::Approx(0.1 * std::pow(0.5, 0.5)));
  CHECK(exp_decay(20) == doctest::Approx(0.025));
  sched::ExponentialDecay stairs({.initial_learning_rate = 0.1, .decay_steps = 10, .decay_rate = 0.5,
                                  .staircase = true});
  CHECK(stairs(9) == doctest::Approx(0.1));
  CHECK(stairs(10) == doctest::Approx(0.05));
  CHECK(stairs(25) == doctest::Approx(0.025));
  CHECK_THROWS_AS(sched::ExponentialDecay({.decay_steps = 0}), Error);

  sched::PiecewiseConstantDecay pw({10, 20}, {1.0, 0.5, 0.1});
  CHECK(pw(0) == 1.0);
  CHECK(pw(10) == 1.0);  // step <= boundaries[0]
  CHECK(pw(11) == 0.5);
  CHECK(pw(20) == 0.5);
  CHECK(pw(21) == 0.1);
  CHECK(pw(1000) == 0.1);
  CHECK_THROWS_AS(sched::PiecewiseConstantDecay({10, 20}, {1.0, 0.5}), Error);
  CHECK_THROWS_AS(sched::PiecewiseConstantDecay({20, 10}, {1.0, 0.5, 0.1}), Error);

  sched::CosineDecay cosine({.initial_learning_rate = 0.1, .decay_steps = 100, .alpha = 0.1});
  CHECK(cosine(0) == doctest::Approx(0.1));
  CHECK(cosine(50) == doctest::Approx(0.1 * (0.9 * 0.5 + 0.1)));
  CHECK(cosine(100) == doctest::Approx(0.01));
  CHECK(cosine(500) == doctest::Approx(0.01));

  sched::CosineDecay warm({.initial_learning_rate = 0.0, .decay_steps = 100, .warmup_steps = 10,
                           .warmup_target = 0.2});
  CHECK(warm(0) == doctest::Approx(0.0));
  CHECK(warm(5) == doctest::Approx(0.1));
  CHECK(warm(10) == doctest::Approx(0.2));
  CHECK(warm(60) == doctest::Approx(0.1));  // halfway through the decay
  CHECK(warm(110) == doctest::Approx(0.0));
  CHECK(warm(1000) == doctest::Approx(0.0));
}

TEST_CASE("learning_rate() follows a schedule of iterations(); steps use it") {
  opt::SGDOptimizer o({.learning_rate = sched::PiecewiseConstantDecay({1}, {0.5, 0.25})});
  Variable w(f32({0, 0, 0, 0, 0, 0}), "w");
  const Tensor g = Tensor::ones(kShape);
  CHECK(o.iterations() == 0);
  CHECK(o.learning_rate() == 0.5);
  o.apply_gradients({g}, {w});  // step 0 -> 0.5
  CHECK(o.learning_rate() == 0.5);
  o.apply_gradients({g}, {w});  // step 1 -> 0.5
  CHECK(o.iterations() == 2);
  CHECK(o.learning_rate() == 0.25);
  o.apply_gradients({g}, {w});  // step 2 -> 0.25
  check_close(w.value(), Vec(6, -1.25), tolerance(float32), "scheduled SGD");
  o.set_iterations(0);
  CHECK(o.learning_rate() == 0.5);
}

TEST_CASE("get() and OptimizerArg build optimizers by Keras name") {
  CHECK(dynamic_cast<opt::AdamOptimizer*>(opt::get("adam").get()) != nullptr);
  CHECK(dynamic_cast<opt::SGDOptimizer*>(opt::get("sgd").get()) != nullptr);
  CHECK(dynamic_cast<opt::AdamWOptimizer*>(opt::get("AdamW").get()) != nullptr);
  CHECK(dynamic_cast<opt::RMSpropOptimizer*>(opt::get("rmsprop").get()) != nullptr);
  CHECK(opt::get("adam")->learning_rate() == doctest::Approx(0.001));
  CHECK(opt::get("sgd")->learning_rate() == doctest::Approx(0.01));
  CHECK_THROWS_AS(opt::get("adagrad_typo"), Error);
  try {
    opt::get("nope");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("sgd, adam, adamw, rmsprop") != std::string::npos);
  }
  CHECK(dynamic_cast<opt::RMSpropOptimizer*>(opt::OptimizerArg("rmsprop").get().get()) != nullptr);
  auto shared = std::make_shared<opt::SGDOptimizer>();
  CHECK(opt::OptimizerArg(shared).get() == shared);
  CHECK(dynamic_cast<opt::AdamOptimizer*>(opt::OptimizerArg(opt::Adam({.learning_rate = 0.1})).get().get()) != nullptr);
  CHECK(opt::OptimizerArg().empty());
  CHECK_THROWS_AS(opt::OptimizerArg().get(), Error);
  CHECK_THROWS_AS(opt::OptimizerArg("bogus").get(), Error);
}

namespace {
class MySGD : public opt::Optimizer {
 public:
  MySGD() : Optimizer("my_sgd", {.learning_rate = 0.1}) {}
  std::shared_ptr<Optimizer> clone() const override { return std::make_shared<MySGD>(); }
  void update_step(const Tensor& g, const Variable& v, double lr) override {
    Tensor& count = slot(v, "count");  // a slot of its own
    count.assign(ops::add(count, Tensor::scalar(1.0)));
    v.assign(ops::sub(v.value(), ops::mul(g, Tensor::scalar(lr))));
  }
};
}  // namespace

TEST_CASE("a user-defined optimizer gets clipping, iterations and slots from the base") {
  MySGD o;
  Variable w(f32({1, 2, 3, 4, 5, 6}), "w");
  o.apply_gradients({f32({10, 0, 0, 0, 0, 0})}, {w});
  check_close(w.value(), {0, 2, 3, 4, 5, 6}, tolerance(float32), "MySGD");
  CHECK(o.iterations() == 1);
  CHECK(o.name() == "my_sgd");
  check_close(o.slots_by_path()["w"].at("count"), Vec(6, 1.0), tolerance(float32), "MySGD slot");
  auto c = o.clone();
  CHECK(c->iterations() == 0);
  CHECK(c->slots_by_path().empty());
}

TEST_CASE("apply_gradients: casts, skips missing gradients, rejects bad ones, records nothing") {
  Variable a(f32({1, 1, 1, 1, 1, 1}), "a"), b(f32({2, 2, 2, 2, 2, 2}), "b");
  opt::SGDOptimizer o({.learning_rate = 1.0});
  // float16 and bfloat16 gradients update as their float32 widening (SGD widens them itself).
  o.apply_gradients({Tensor::full(kShape, 0.5, float16), Tensor::full(kShape, 0.25, bfloat16)}, {a, b});
  check_close(a.value(), Vec(6, 0.5), tolerance(float32), "float16 gradient");
  check_close(b.value(), Vec(6, 1.75), tolerance(float32), "bfloat16 gradient");
  // An undefined gradient leaves its variable alone (Keras warns and ignores it).
  o.apply_gradients({Tensor(), Tensor::ones(kShape)}, {a, b});
  check_close(a.value(), Vec(6, 0.5), tolerance(float32), "skipped variable");
  check_close(b.value(), Vec(6, 0.75), tolerance(float32), "updated variable");
  CHECK_THROWS_AS(o.apply_gradients({Tensor(), Tensor()}, {a, b}), Error);
  CHECK_THROWS_AS(o.apply_gradients({Tensor::ones({3, 2})}, {a}), Error);
  CHECK_THROWS_AS(o.apply_gradients({Tensor::ones(kShape)}, {a, b}), Error);
  CHECK_THROWS_AS(o.apply_gradients({Tensor::ones(kShape, int32)}, {a}), Error);
  CHECK(o.iterations() == 2);

  // Inside a live tape the update is not recorded and the variable stays a leaf.
  GradientTape tape;
  Tensor y = ops::sum(ops::square(a.value()));
  CHECK(y.impl()->grad_fn != nullptr);
  o.apply_gradients({Tensor::ones(kShape)}, {a});
  CHECK(a.value().impl()->grad_fn == nullptr);
  CHECK(a.value().requires_grad());
}

TEST_CASE("an optimizer step invalidates the variable's cached 16-bit cast") {
  Variable w(f32({1, 2, 3, 4, 5, 6}), "w");
  check_close(w.read(float16), {1, 2, 3, 4, 5, 6}, tolerance(float16), "before");
  const auto version = w.version();
  opt::AdamOptimizer o({.learning_rate = 0.5});
  o.apply_gradients({Tensor::ones(kShape)}, {w});
  CHECK(w.version() > version);
  check_close(w.read(float16), {0.5, 1.5, 2.5, 3.5, 4.5, 5.5}, tolerance(float16), "after");
}

TEST_CASE("slots: set_slot restores before the first step; clone starts fresh") {
  Variable w(f32({0, 0, 0, 0, 0, 0}), "dense/kernel");
  opt::SGDOptimizer o({.learning_rate = 0.1, .momentum = 0.5});
  o.set_slot("dense/kernel", "momentum", f32({1, 1, 1, 1, 1, 1}));
  o.apply_gradients({Tensor::zeros(kShape)}, {w});
  // m = 0.5 * 1 - 0.1 * 0 = 0.5; w += m
  check_close(w.value(), Vec(6, 0.5), tolerance(float32), "restored momentum used");
  check_close(o.slots_by_path().at("dense/kernel").at("momentum"), Vec(6, 0.5), tolerance(float32),
              "momentum after step");
  o.set_slot("dense/kernel", "momentum", f32(Vec(6, 2.0)));
  check_close(o.slots_by_path().at("dense/kernel").at("momentum"), Vec(6, 2.0), tolerance(float32),
              "momentum overwritten");
  CHECK_THROWS_AS(o.set_slot("dense/kernel", "momentum", Tensor::zeros({2})), Error);

  opt::SGDOptimizer o2({.momentum = 0.5});
  o2.set_slot("other", "momentum", Tensor::zeros({5}));
  Variable other(Tensor::zeros({6}), "other");
  CHECK_THROWS_AS(o2.apply_gradients({Tensor::zeros({6})}, {other}), Error);

  auto c = o.clone();
  CHECK(c->slots_by_path().empty());
  CHECK(c->iterations() == 0);
  CHECK(dynamic_cast<opt::SGDOptimizer&>(*c).options().momentum == 0.5);
}

TEST_CASE("every built-in's clone has its type, name and options, no state, and steps as a fresh one") {
  auto check = [](opt::Optimizer& o, auto* typed, const auto& same_options, const std::string& what) {
    CAPTURE(what);
    Variable w(f32(kW0), "w");
    o.apply_gradients({f32(kGrads[0])}, {w});  // state the clone must not copy
    auto c = o.clone();
    using T = std::remove_pointer_t<decltype(typed)>;
    auto* ct = dynamic_cast<T*>(c.get());
    REQUIRE(ct != nullptr);
    CHECK(same_options(ct->options()));
    CHECK(c->name() == o.name());
    CHECK(c->iterations() == 0);
    CHECK(c->slots_by_path().empty());
    // Two steps of the clone give the bits of two steps of a fresh optimizer of the same options.
    auto fresh = std::make_shared<T>(ct->options());
    Variable a(f32(kW0), "w"), b(f32(kW0), "w");
    for (int t = 0; t < 2; ++t) {
      c->apply_gradients({f32(kGrads[t])}, {a});
      fresh->apply_gradients({f32(kGrads[t])}, {b});
    }
    CHECK(a.value().to_vector<float>() == b.value().to_vector<float>());
  };
  opt::SGDOptimizer sgd({.learning_rate = 0.05, .momentum = 0.7, .nesterov = true, .clipvalue = 0.5});
  check(sgd, &sgd, [](const opt::SGDOptions& x) { return x.momentum == 0.7 && x.nesterov && x.clipvalue == 0.5; }, "SGD");
  opt::AdamOptimizer adam({.learning_rate = 0.01, .beta_2 = 0.99, .amsgrad = true, .clipnorm = 1.0});
  check(adam, &adam, [](const opt::AdamOptions& x) { return x.beta_2 == 0.99 && x.amsgrad && x.clipnorm == 1.0; },
        "Adam");
  opt::AdamWOptimizer adamw({.learning_rate = 0.01, .weight_decay = 0.1, .global_clipnorm = 2.0});
  check(adamw, &adamw,
        [](const opt::AdamWOptions& x) { return x.weight_decay == 0.1 && x.global_clipnorm == 2.0; }, "AdamW");
  opt::RMSpropOptimizer rms({.learning_rate = 0.01, .rho = 0.8, .momentum = 0.3, .centered = true});
  check(rms, &rms, [](const opt::RMSpropOptions& x) { return x.rho == 0.8 && x.momentum == 0.3 && x.centered; },
        "RMSprop");
}

TEST_CASE("fused update ops on every device, 16-bit variables, and their validation") {
  for_each_device([](Device dev) {
    for (DType dt : {float32, float16, bfloat16}) {
      CAPTURE(to_string(dt));
      Tensor var = Tensor::from_vector(kW0, kShape, dev).to(dt);
      const Vec w0 = var.to_vector<double>();  // as rounded to dt
      Tensor g = Tensor::from_vector(kGrads[0], kShape, dev).to(float32);
      Tensor m = Tensor::zeros(kShape, float32, dev), v = Tensor::zeros(kShape, float32, dev);
      // alpha = 0.1 given directly, decay 0.01: w = w0 * 0.99 - 0.1 * m / (sqrt(v) + eps)
      ops::adam_update(var, g, m, v, nullptr, 0.1, 0.9, 0.999, 1e-7, 0.01);
      Vec w = w0, em(6), ev(6);
      for (std::size_t i = 0; i < w.size(); ++i) {
        em[i] = 0.1 * kGrads[0][i];
        ev[i] = 0.001 * kGrads[0][i] * kGrads[0][i];
        w[i] = w[i] * 0.99 - 0.1 * em[i] / (std::sqrt(ev[i]) + 1e-7);
      }
      CHECK(var.dtype() == dt);
      check_close(var, w, tolerance(dt), "adam_update var");
      check_close(m, em, tolerance(float32), "adam_update m");
      check_close(v, ev, tolerance(float32), "adam_update v");

      Tensor var2 = Tensor::from_vector(kW0, kShape, dev).to(dt);
      Tensor mom = Tensor::zeros(kShape, float32, dev);
      ops::sgd_update(var2, g, &mom, 0.5, 0.9, false);
      Vec w2 = w0;
      for (std::size_t i = 0; i < w2.size(); ++i) w2[i] -= 0.5 * kGrads[0][i];
      check_close(var2, w2, tolerance(dt), "sgd_update var");

      Tensor var3 = Tensor::from_vector(kW0, kShape, dev).to(dt);
      Tensor vel = Tensor::zeros(kShape, float32, dev);
      ops::rmsprop_update(var3, g, vel, nullptr, nullptr, 0.01, 0.9, 0.0, 1e-7);
      Vec w3 = w0;
      RmsRef rref{0.01, 0.9, 0.0, 1e-7, false};
      rref(w3, kGrads[0], 1);
      check_close(var3, w3, tolerance(dt), "rmsprop_update var");
    }
    Tensor var = Tensor::zeros(kShape, float32, dev), g = Tensor::zeros(kShape, float32, dev);
    Tensor m = Tensor::zeros(kShape, float32, dev), v = Tensor::zeros(kShape, float32, dev);
    Tensor m16 = Tensor::zeros(kShape, float16, dev), bad = Tensor::zeros({3}, float32, dev);
    CHECK_THROWS_AS(ops::adam_update(var, g, m16, v, nullptr, 0.1, 0.9, 0.999, 1e-7), Error);
    CHECK_THROWS_AS(ops::adam_update(var, bad, m, v, nullptr, 0.1, 0.9, 0.999, 1e-7), Error);
    CHECK_THROWS_AS(ops::sgd_update(var, g, &bad, 0.1, 0.9, false), Error);
    Tensor var64 = Tensor::zeros(kShape, float64, dev);
    CHECK_THROWS_AS(ops::sgd_update(var64, g, nullptr, 0.1, 0.0, false), Error);
  });
}

TEST_CASE("Adam learns a least-squares fit through the tape") {
  // y = x . w_true; Adam recovers w_true.
  Tensor x = Tensor::random_uniform({64, 3}, -1, 1, 7);
  Tensor w_true = Tensor::from_vector(Vec{1.5, -2.0, 0.5}, {3, 1}).to(float32);
  Tensor y = ops::matmul(x, w_true);
  Variable w(Tensor::zeros({3, 1}), "w");
  opt::AdamOptimizer o({.learning_rate = 0.05});
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    GradientTape tape;
    Tensor loss = ops::mean(ops::square(ops::sub(ops::matmul(x, w.value()), y)));
    auto grads = tape.gradient(loss, std::vector<Variable>{w});
    o.apply_gradients(grads, {w});
    (step == 0 ? first : last) = loss.item();
  }
  CHECK(last < first * 1e-3);
  check_close(w.value(), {1.5, -2.0, 0.5}, {1e-2, 1e-2}, "recovered weights");
}

TEST_CASE("a learning rate that is NaN, infinite or negative is an error, constant or from a schedule") {
  // Before, these trained to non-finite weights without a word (issue 14, defect 8).
  CHECK(contains(error_of([] { optimizers::Adam({.learning_rate = NAN}); }), "learning_rate"));
  CHECK(contains(error_of([] { optimizers::SGD({.learning_rate = INFINITY}); }), "inf"));
  CHECK(contains(error_of([] { optimizers::RMSprop({.learning_rate = -0.1}); }), "-0.1"));
  CHECK(error_of([] { optimizers::SGD({.learning_rate = 0.0}); }) == "(no error)");
  for_each_device([](Device dev) {
    struct Broken : optimizers::schedules::LearningRateSchedule {  // 0.1, then NaN
      double operator()(std::int64_t step) const override { return step == 0 ? 0.1 : NAN; }
      std::string name() const override { return "Broken"; }
    };
    auto opt = optimizers::SGD({.learning_rate = Broken()});
    Variable v(Tensor::ones({3}, float32, dev), "v");
    std::vector<Tensor> g{Tensor::ones({3}, float32, dev)};
    opt->apply_gradients(g, {v});  // step 0: 0.1
    CHECK(contains(error_of([&] { opt->apply_gradients(g, {v}); }), "learning_rate must be a finite number >= 0"));
    CHECK(opt->iterations() == 1);  // the refused step changed nothing
    CHECK(v.value().to_vector<float>() == std::vector<float>(3, 0.9f));
  });
}

// ---- the list updates (ops::*_update_all, Optimizer::update_steps) ------------------------------

namespace {

/// Variables of mixed dtypes and sizes (one empty), their gradients (one float16) and float32
/// slots, all on dev; deterministic, so two calls give the same state.
struct ListState {
  std::vector<Tensor> vars, grads;
  std::vector<std::vector<Tensor>> slots;  // slots[s][i]: slot s of variable i
};

ListState list_state(Device dev) {
  const std::vector<std::pair<Shape, DType>> vars = {{{2, 3}, float32}, {{7}, float16},  {{0}, float32},
                                                     {{4, 5}, bfloat16}, {{1}, float32}, {{3, 3}, float16}};
  ListState s;
  s.slots.resize(3);
  unsigned seed = 1;
  for (const auto& [shape, dt] : vars) {
    s.vars.push_back(Tensor::random_uniform(shape, -2, 2, seed++).to(dt).to(dev).copy());
    s.grads.push_back(Tensor::random_uniform(shape, -1, 1, seed++).to(dt == float16 ? float16 : float32).to(dev).copy());
    s.slots[0].push_back(Tensor::random_uniform(shape, -0.5, 0.5, seed++).to(float32).to(dev).copy());
    s.slots[1].push_back(Tensor::random_uniform(shape, 1, 2, seed++).to(float32).to(dev).copy());  // > avg^2
    s.slots[2].push_back(Tensor::random_uniform(shape, 0, 3, seed++).to(float32).to(dev).copy());
  }
  return s;
}

/// Pointers to slot s of every variable where use(i), null elsewhere; empty when `none`.
std::vector<Tensor*> slot_list(ListState& st, int s, bool none = false,
                               const std::function<bool(std::size_t)>& use = nullptr) {
  std::vector<Tensor*> out;
  if (none) return out;
  for (std::size_t i = 0; i < st.vars.size(); ++i) out.push_back(!use || use(i) ? &st.slots[s][i] : nullptr);
  return out;
}

/// The same values, element for element (exact: every dtype converts to float64 exactly).
void check_same(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(a[i].dtype() == b[i].dtype());
    CHECK_MESSAGE(a[i].to_vector<double>() == b[i].to_vector<double>(), what);
  }
}

void check_same(const ListState& a, const ListState& b) {
  check_same(a.vars, b.vars, "variables");
  for (std::size_t s = 0; s < a.slots.size(); ++s) check_same(a.slots[s], b.slots[s], "slot " + std::to_string(s));
}

}  // namespace

TEST_CASE("the list updates give the per-variable updates' bits on every device") {
  for_each_device([](Device dev) {
    SUBCASE("adam, and adamw with amsgrad") {
      for (bool amsgrad : {false, true}) {
        CAPTURE(amsgrad);
        const double decay = amsgrad ? 0.004 * 0.01 : 0.0;
        ListState one = list_state(dev), all = list_state(dev);
        for (int step = 0; step < 2; ++step) {
          for (std::size_t i = 0; i < one.vars.size(); ++i)
            ops::adam_update(one.vars[i], one.grads[i], one.slots[0][i], one.slots[1][i],
                             amsgrad ? &one.slots[2][i] : nullptr, 0.01, 0.9, 0.999, 1e-7, decay);
          ops::adam_update_all(all.vars, all.grads, slot_list(all, 0), slot_list(all, 1), slot_list(all, 2, !amsgrad),
                               0.01, 0.9, 0.999, 1e-7, decay);
        }
        check_same(one, all);
      }
    }
    SUBCASE("sgd: plain, momentum, nesterov, momentum for some variables only") {
      for (int mode = 0; mode < 4; ++mode) {
        CAPTURE(mode);
        auto use = [&](std::size_t i) { return mode == 3 ? i % 2 == 0 : mode > 0; };
        ListState one = list_state(dev), all = list_state(dev);
        for (int step = 0; step < 2; ++step) {
          for (std::size_t i = 0; i < one.vars.size(); ++i)
            ops::sgd_update(one.vars[i], one.grads[i], use(i) ? &one.slots[0][i] : nullptr, 0.05, 0.9, mode == 2);
          ops::sgd_update_all(all.vars, all.grads, slot_list(all, 0, mode == 0, use), 0.05, 0.9, mode == 2);
        }
        check_same(one, all);
      }
    }
    SUBCASE("rmsprop: plain, centered, momentum, centered with momentum") {
      for (int mode = 0; mode < 4; ++mode) {
        CAPTURE(mode);
        const bool centered = mode & 1, momentum = mode & 2;
        ListState one = list_state(dev), all = list_state(dev);
        for (int step = 0; step < 2; ++step) {
          for (std::size_t i = 0; i < one.vars.size(); ++i)
            ops::rmsprop_update(one.vars[i], one.grads[i], one.slots[1][i], centered ? &one.slots[0][i] : nullptr,
                                momentum ? &one.slots[2][i] : nullptr, 0.01, 0.9, 0.5, 1e-7);
          ops::rmsprop_update_all(all.vars, all.grads, slot_list(all, 1), slot_list(all, 0, !centered),
                                  slot_list(all, 2, !momentum), 0.01, 0.9, 0.5, 1e-7);
        }
        check_same(one, all);
      }
    }
    SUBCASE("empty lists do nothing") {
      std::vector<Tensor> none;
      ops::adam_update_all(none, {}, {}, {}, {}, 0.1, 0.9, 0.999, 1e-7);
      ops::sgd_update_all(none, {}, {}, 0.1, 0.0, false);
      ops::rmsprop_update_all(none, {}, {}, {}, {}, 0.1, 0.9, 0.0, 1e-7);
    }
  });
}

TEST_CASE("the list updates validate every entry and name the op and the entry") {
  for_each_device([](Device dev) {
    ListState st = list_state(dev);
    const ListState before = list_state(dev);
    auto adam = [&] {
      ops::adam_update_all(st.vars, st.grads, slot_list(st, 0), slot_list(st, 1), {}, 0.1, 0.9, 0.999, 1e-7);
    };
    auto expect = [&](const std::string& what, const std::string& part) {
      const std::string e = error_of(adam);
      CAPTURE(what);
      CAPTURE(e);
      CHECK(contains(e, "adam_update_all"));
      CHECK(contains(e, part));
    };
    Tensor keep = st.grads[3];
    st.grads[3] = Tensor::zeros({3}, float32, dev);
    expect("gradient shape", "(entry 3): gradient");
    st.grads[3] = Tensor();
    expect("undefined gradient", "(entry 3): gradient is an undefined tensor");
    st.grads[3] = keep;
    keep = st.slots[1][4];
    st.slots[1][4] = Tensor::zeros({1}, float16, dev);
    expect("slot dtype", "(entry 4): slot 'v' must be float32");
    st.slots[1][4] = keep;
    keep = st.vars[5];
    st.vars[5] = Tensor::zeros({3, 3}, float64, dev);
    expect("float64 variable", "(entry 5): the variable must be float32, float16 or bfloat16");
    st.vars[5] = st.vars[0];
    st.grads[5] = st.grads[0], st.slots[0][5] = st.slots[0][0], st.slots[1][5] = st.slots[1][0];
    expect("a variable twice", "entries 0 and 5 update the same variable");
    st = list_state(dev);
    st.grads.pop_back();
    expect("list sizes", "5 gradients for 6 variables");
    st = list_state(dev);
    st.vars[1] = st.vars[1].to(dev == Device::cpu() ? Device::test() : Device::cpu());
    st.grads[1] = st.grads[1].to(st.vars[1].device());
    st.slots[0][1] = st.slots[0][1].to(st.vars[1].device());
    st.slots[1][1] = st.slots[1][1].to(st.vars[1].device());
    expect("two devices", "(entry 1): variable");
    check_same(st, before);  // a refused call changes nothing
    st = list_state(dev);

    std::vector<Tensor*> m = slot_list(st, 0), v = slot_list(st, 1);
    v[2] = nullptr;
    CHECK(contains(error_of([&] { ops::adam_update_all(st.vars, st.grads, m, v, {}, 0.1, 0.9, 0.999, 1e-7); }),
                   "adam_update_all (entry 2): slot 'v' is missing"));
    CHECK(contains(error_of([&] { ops::adam_update_all(st.vars, st.grads, m, {}, {}, 0.1, 0.9, 0.999, 1e-7); }),
                   "adam_update_all: 0 'v' slots for 6 variables"));
    std::vector<Tensor*> two = {m[0], m[1]};
    CHECK(contains(error_of([&] { ops::sgd_update_all(st.vars, st.grads, two, 0.1, 0.9, false); }),
                   "sgd_update_all: 2 'momentum' slots for 6 variables"));
    Tensor bad = Tensor::zeros({2}, float32, dev);
    std::vector<Tensor*> avg = slot_list(st, 0);
    avg[3] = &bad;
    CHECK(contains(error_of([&] {
                     ops::rmsprop_update_all(st.vars, st.grads, slot_list(st, 1), avg, {}, 0.1, 0.9, 0.0, 1e-7);
                   }),
                   "rmsprop_update_all (entry 3): slot 'average_gradient'"));
    check_same(st, before);
  });
}

namespace {

/// A built-in optimizer whose update_steps is the base class's loop over update_step.
template <class O>
class PerVariable : public O {
 public:
  using O::O;

 protected:
  void update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) override {
    opt::Optimizer::update_steps(grads, vars, lr);
  }
};

/// Three steps of `a` (the built-in) and `b` (its per-variable loop) over the same variables
/// and gradients (one missing at the second step) give the same variables and slots, bit for bit.
void check_list_step(opt::Optimizer& a, opt::Optimizer& b, Device dev) {
  ListState sa = list_state(dev), sb = list_state(dev);
  std::vector<Variable> va, vb;
  for (std::size_t i = 0; i < sa.vars.size(); ++i) {
    va.emplace_back(sa.vars[i], "v" + std::to_string(i));
    vb.emplace_back(sb.vars[i], "v" + std::to_string(i));
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> ga = sa.grads, gb = sb.grads;
    if (step == 1) ga[4] = gb[4] = Tensor();
    a.apply_gradients(ga, va);
    b.apply_gradients(gb, vb);
  }
  CHECK(a.iterations() == 3);
  CHECK(b.iterations() == 3);
  for (std::size_t i = 0; i < va.size(); ++i) {
    CAPTURE(i);
    CHECK(va[i].value().to_vector<double>() == vb[i].value().to_vector<double>());
  }
  const auto slots_a = a.slots_by_path(), slots_b = b.slots_by_path();
  REQUIRE(slots_a.size() == slots_b.size());
  for (const auto& by_path : slots_a) {  // no structured bindings: clang 14 cannot capture them in CAPTURE
    const std::string& path = by_path.first;
    CAPTURE(path);
    REQUIRE(slots_b.count(path));
    REQUIRE(by_path.second.size() == slots_b.at(path).size());
    for (const auto& slot : by_path.second) {
      const std::string& name = slot.first;
      CAPTURE(name);
      CHECK(slot.second.to_vector<double>() == slots_b.at(path).at(name).to_vector<double>());
    }
  }
}

}  // namespace

namespace {
/// The same bits (16-bit and float32 values convert to float64 exactly; NaN never occurs here).
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.to_vector<double>() == b.to_vector<double>();
}
}  // namespace

TEST_CASE("the fused updates write a copy of the updated variable with cast's bits, and validate it") {
  for_each_device([](Device dev) {
    SUBCASE("single and list ops, every optimizer, copies in bfloat16, float16 and float32") {
      const DType copy_dtypes[] = {bfloat16, float16, float32, bfloat16, float16, float32};
      for (int op = 0; op < 3; ++op) {
        CAPTURE(op);
        ListState one = list_state(dev), all = list_state(dev);
        std::vector<Tensor> c_one, c_all;
        std::vector<Tensor*> p_one, p_all;
        for (std::size_t i = 0; i < one.vars.size(); ++i) {  // entry 4 has none
          const bool has = i != 4;
          c_one.push_back(has ? Tensor::zeros(one.vars[i].shape(), copy_dtypes[i], dev) : Tensor());
          c_all.push_back(has ? Tensor::zeros(one.vars[i].shape(), copy_dtypes[i], dev) : Tensor());
        }
        for (std::size_t i = 0; i < one.vars.size(); ++i) {
          p_one.push_back(c_one[i].defined() ? &c_one[i] : nullptr);
          p_all.push_back(c_all[i].defined() ? &c_all[i] : nullptr);
        }
        for (std::size_t i = 0; i < one.vars.size(); ++i) {
          if (op == 0)
            ops::adam_update(one.vars[i], one.grads[i], one.slots[0][i], one.slots[1][i], &one.slots[2][i], 0.01, 0.9,
                             0.999, 1e-7, 0.001, p_one[i]);
          else if (op == 1)
            ops::sgd_update(one.vars[i], one.grads[i], &one.slots[0][i], 0.05, 0.9, true, p_one[i]);
          else
            ops::rmsprop_update(one.vars[i], one.grads[i], one.slots[1][i], &one.slots[0][i], &one.slots[2][i], 0.01,
                                0.9, 0.5, 1e-7, p_one[i]);
        }
        if (op == 0)
          ops::adam_update_all(all.vars, all.grads, slot_list(all, 0), slot_list(all, 1), slot_list(all, 2), 0.01, 0.9,
                               0.999, 1e-7, 0.001, p_all);
        else if (op == 1)
          ops::sgd_update_all(all.vars, all.grads, slot_list(all, 0), 0.05, 0.9, true, p_all);
        else
          ops::rmsprop_update_all(all.vars, all.grads, slot_list(all, 1), slot_list(all, 0), slot_list(all, 2), 0.01,
                                  0.9, 0.5, 1e-7, p_all);
        check_same(one, all);
        for (std::size_t i = 0; i < one.vars.size(); ++i) {
          if (!c_one[i].defined()) continue;
          CAPTURE(i);
          CHECK(same_bits(c_one[i], one.vars[i].to(c_one[i].dtype())));
          CHECK(same_bits(c_all[i], c_one[i]));
        }
      }
    }
    SUBCASE("bad copies are refused before anything is written") {
      ListState st = list_state(dev);
      const ListState before = list_state(dev);
      Tensor var = st.vars[0], g = st.grads[0];
      Tensor wrong_shape = Tensor::zeros({3, 2}, bfloat16, dev), f64 = Tensor::zeros({2, 3}, float64, dev);
      Tensor other_dev = Tensor::zeros({2, 3}, bfloat16, dev == Device::cpu() ? Device::test() : Device::cpu());
      auto sgd = [&](Tensor* c) { return error_of([&] { ops::sgd_update(var, g, nullptr, 0.1, 0.0, false, c); }); };
      CHECK(contains(sgd(&wrong_shape), "sgd_update: copy"));
      CHECK(contains(sgd(&wrong_shape), "does not match variable"));
      CHECK(contains(sgd(&f64), "the copy must be float32, float16 or bfloat16"));
      CHECK(contains(sgd(&other_dev), "does not match variable"));
      CHECK(contains(sgd(&var), "the copy is the variable's own memory"));
      Tensor undefined;
      CHECK(contains(sgd(&undefined), "copy is an undefined tensor"));
      std::vector<Tensor*> copies(st.vars.size(), nullptr);
      CHECK(contains(error_of([&] {
                       ops::adam_update_all(st.vars, st.grads, slot_list(st, 0), slot_list(st, 1), {}, 0.1, 0.9,
                                            0.999, 1e-7, 0.0, {copies[0], copies[1]});
                     }),
                     "adam_update_all: 2 copies for 6 variables"));
      std::vector<Tensor> same_shape = {st.vars[0], st.vars[0].copy()};
      std::vector<Tensor> same_grads = {st.grads[0], st.grads[0]};
      CHECK(contains(error_of([&] {
                       ops::sgd_update_all(same_shape, same_grads, {}, 0.1, 0.0, false, {nullptr, &same_shape[0]});
                     }),
                     "sgd_update_all (entry 1): the copy is the memory of a variable of the list"));
      Tensor shared = Tensor::zeros({2, 3}, bfloat16, dev);
      Tensor shared_b = shared.detach();
      CHECK(contains(error_of([&] { ops::sgd_update_all(same_shape, same_grads, {}, 0.1, 0.0, false, {&shared, &shared_b}); }),
                     "sgd_update_all (entry 1): the copy is also entry 0's copy"));
      copies.assign(st.vars.size(), nullptr);
      copies[5] = &wrong_shape;
      CHECK(contains(error_of([&] {
                       ops::rmsprop_update_all(st.vars, st.grads, slot_list(st, 1), {}, {}, 0.1, 0.9, 0.0, 1e-7, copies);
                     }),
                     "rmsprop_update_all (entry 5): copy"));
      check_same(st, before);  // a refused call changes nothing
    }
  });
}

TEST_CASE("grad_scale fuses unscale_and_check's product into the updates; check_unscaled writes nothing") {
  for_each_device([](Device dev) {
    const double s = 1.0 / 2048;
    for (int op = 0; op < 3; ++op) {
      CAPTURE(op);
      ListState fused = list_state(dev), one = list_state(dev), ref = list_state(dev);
      const ops::UnscaleResult u = ops::unscale_and_check(ref.grads, Tensor::scalar(s, float32, dev));
      const ops::UnscaleResult c = ops::check_unscaled(fused.grads, Tensor::scalar(s, float32, dev));
      CHECK(c.grads.empty());
      CHECK(c.found_flag.item() == u.found_flag.item());
      CHECK(c.nonfinite_flags.to_vector<double>() == u.nonfinite_flags.to_vector<double>());
      std::vector<Tensor> unscaled = u.grads;
      for (std::size_t i = 0; i < unscaled.size(); ++i)  // the empty entry's product is its own
        if (!unscaled[i].defined()) unscaled[i] = ref.grads[i];
      if (op == 0) {
        ops::adam_update_all(fused.vars, fused.grads, slot_list(fused, 0), slot_list(fused, 1), slot_list(fused, 2),
                             0.01, 0.9, 0.999, 1e-7, 0.0, {}, s);
        for (std::size_t i = 0; i < one.vars.size(); ++i)
          ops::adam_update(one.vars[i], one.grads[i], one.slots[0][i], one.slots[1][i], &one.slots[2][i], 0.01, 0.9,
                           0.999, 1e-7, 0.0, nullptr, s);
        ops::adam_update_all(ref.vars, unscaled, slot_list(ref, 0), slot_list(ref, 1), slot_list(ref, 2), 0.01, 0.9,
                             0.999, 1e-7);
      } else if (op == 1) {
        ops::sgd_update_all(fused.vars, fused.grads, slot_list(fused, 0), 0.05, 0.9, true, {}, s);
        for (std::size_t i = 0; i < one.vars.size(); ++i)
          ops::sgd_update(one.vars[i], one.grads[i], &one.slots[0][i], 0.05, 0.9, true, nullptr, s);
        ops::sgd_update_all(ref.vars, unscaled, slot_list(ref, 0), 0.05, 0.9, true);
      } else {
        ops::rmsprop_update_all(fused.vars, fused.grads, slot_list(fused, 1), slot_list(fused, 0), slot_list(fused, 2),
                                0.01, 0.9, 0.5, 1e-7, {}, s);
        for (std::size_t i = 0; i < one.vars.size(); ++i)
          ops::rmsprop_update(one.vars[i], one.grads[i], one.slots[1][i], &one.slots[0][i], &one.slots[2][i], 0.01,
                              0.9, 0.5, 1e-7, nullptr, s);
        ops::rmsprop_update_all(ref.vars, unscaled, slot_list(ref, 1), slot_list(ref, 0), slot_list(ref, 2), 0.01,
                                0.9, 0.5, 1e-7);
      }
      check_same(fused.vars, ref.vars, "variables (list op)");
      check_same(one.vars, ref.vars, "variables (single ops)");
      for (std::size_t k = 0; k < 3; ++k) {
        check_same(fused.slots[k], ref.slots[k], "slots (list op)");
        check_same(one.slots[k], ref.slots[k], "slots (single ops)");
      }
    }
    // The check alone still finds inf and NaN, per gradient.
    std::vector<Tensor> bad = {Tensor::ones({3}, float16, dev), Tensor::full({2}, std::nan(""), float32, dev),
                               Tensor(), Tensor::full({4}, 65504.0, float16, dev)};
    const ops::UnscaleResult c = ops::check_unscaled(bad, Tensor::scalar(4.0, float32, dev));  // 65504 * 4 fits f32
    CHECK(c.found_flag.item() == 1.0);
    CHECK(c.nonfinite_flags.to_vector<double>() == std::vector<double>{0, 1, 0, 0});
    // 16-bit checks alone (read from the bits where no finite value times the scale overflows):
    // inf and NaN of either dtype found, finite ones not; a scale that overflows bfloat16's
    // largest, or a NaN scale, found as the product says.
    const double inf = std::numeric_limits<double>::infinity();
    for (const DType h : {float16, bfloat16}) {
      CAPTURE(to_string(h));
      std::vector<Tensor> g16 = {Tensor::from_vector(std::vector<float>{1, -2, 0, 1e-7f}, {}, dev).to(h),
                                 Tensor::from_vector(std::vector<float>{1, -float(inf), 3}, {}, dev).to(h),
                                 Tensor::from_vector(std::vector<float>{std::nanf(""), 0}, {}, dev).to(h),
                                 Tensor::full({70000}, h == float16 ? 65504.0 : 3.3895313892515355e38, h, dev)};
      const ops::UnscaleResult r = ops::check_unscaled(g16, Tensor::scalar(1.0 / 1024, float32, dev));
      CHECK(r.nonfinite_flags.to_vector<double>() == std::vector<double>{0, 1, 1, 0});
      CHECK(r.found_flag.item() == 1.0);
      const ops::UnscaleResult z = ops::check_unscaled({g16[0], g16[3]}, Tensor::scalar(0.0, float32, dev));
      CHECK(z.found_flag.item() == 0.0);
      const ops::UnscaleResult n = ops::check_unscaled({g16[0]}, Tensor::scalar(std::nan(""), float32, dev));
      CHECK(n.found_flag.item() == 1.0);
    }
    // bfloat16's largest times 2 overflows float32: found, as unscale_and_check's product says.
    const Tensor big = Tensor::full({3}, 3.3895313892515355e38, bfloat16, dev);
    CHECK(ops::check_unscaled({big}, Tensor::scalar(2.0, float32, dev)).found_flag.item() == 1.0);
    CHECK(ops::unscale_and_check({big}, Tensor::scalar(2.0, float32, dev)).found_flag.item() == 1.0);
    CHECK(ops::check_unscaled({big}, Tensor::scalar(1.0, float32, dev)).found_flag.item() == 0.0);
    ListState st = list_state(dev);
    const ListState before = list_state(dev);
    for (double g : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
      CAPTURE(g);
      CHECK(contains(error_of([&] { ops::sgd_update(st.vars[0], st.grads[0], nullptr, 0.1, 0.0, false, nullptr, g); }),
                     "sgd_update: grad_scale must be a finite number > 0"));
      CHECK(contains(error_of([&] {
                       ops::adam_update_all(st.vars, st.grads, slot_list(st, 0), slot_list(st, 1), {}, 0.1, 0.9, 0.999,
                                            1e-7, 0.0, {}, g);
                     }),
                     "adam_update_all: grad_scale must be a finite number > 0"));
    }
    check_same(st, before);
  });
}

TEST_CASE("an optimizer step hands a variable read in 16 bits its new 16-bit copy: the next read casts nothing") {
  for_each_device([](Device dev) {
    for (DType d : {bfloat16, float16}) {
      CAPTURE(to_string(d));
      for (int kind = 0; kind < 4; ++kind) {
        CAPTURE(kind);
        for (bool per_variable : {false, true}) {
          CAPTURE(per_variable);
          std::shared_ptr<opt::Optimizer> o;
          if (kind == 0) o = per_variable ? std::make_shared<PerVariable<opt::AdamOptimizer>>(opt::AdamOptions{.learning_rate = 0.01})
                                          : std::shared_ptr<opt::Optimizer>(opt::Adam({.learning_rate = 0.01}));
          if (kind == 1) {
            const opt::AdamWOptions w{.learning_rate = 0.01, .weight_decay = 0.1, .amsgrad = true};
            o = per_variable ? std::make_shared<PerVariable<opt::AdamWOptimizer>>(w)
                             : std::shared_ptr<opt::Optimizer>(std::make_shared<opt::AdamWOptimizer>(w));
          }
          if (kind == 2) {
            const opt::SGDOptions w{.learning_rate = 0.05, .momentum = 0.9, .nesterov = true};
            o = per_variable ? std::make_shared<PerVariable<opt::SGDOptimizer>>(w)
                             : std::shared_ptr<opt::Optimizer>(std::make_shared<opt::SGDOptimizer>(w));
          }
          if (kind == 3) {
            const opt::RMSpropOptions w{.learning_rate = 0.01, .momentum = 0.5, .centered = true};
            o = per_variable ? std::make_shared<PerVariable<opt::RMSpropOptimizer>>(w)
                             : std::shared_ptr<opt::Optimizer>(std::make_shared<opt::RMSpropOptimizer>(w));
          }
          std::vector<Variable> vars;
          const std::vector<Shape> shapes = {{5, 7}, {16}, {3}};
          for (std::size_t i = 0; i < shapes.size(); ++i)
            vars.emplace_back(Tensor::random_uniform(shapes[i], -1, 1, 30 + i).to(dev).copy(), "w" + std::to_string(i));
          vars[0].read(d), vars[1].read(d);  // vars[2] is only ever used in float32
          CHECK(vars[0].last_cast_dtype() == d);
          CHECK(vars[2].last_cast_dtype() == float32);
          for (int step = 0; step < 2; ++step) {
            std::vector<Tensor> grads;
            for (std::size_t i = 0; i < shapes.size(); ++i)
              grads.push_back(Tensor::random_uniform(shapes[i], -1, 1, 40 + 3 * step + i, d, dev));
            const std::uint64_t version = vars[0].version();
            o->apply_gradients(grads, vars);
            CHECK(vars[0].version() > version);
            for (std::size_t i = 0; i < 2; ++i) {
              CAPTURE(i);
              const std::size_t before = memory_stats(dev).allocations;
              const Tensor r = vars[i].read(d);
              CHECK(memory_stats(dev).allocations == before);  // the optimizer's copy, no cast
              CHECK(same_bits(r, vars[i].value().to(d)));
            }
          }
          // The measure sees a cast: after a plain modification the read allocates one.
          vars[0].mark_modified();
          const std::size_t before = memory_stats(dev).allocations;
          const Tensor r = vars[0].read(d);
          CHECK(memory_stats(dev).allocations > before);
          CHECK(same_bits(r, vars[0].value().to(d)));
        }
      }
    }
  });
}

TEST_CASE("the built-in optimizers' update_steps equal their per-variable update_step") {
  for_each_device([](Device dev) {
    SUBCASE("adam") {
      opt::AdamOptimizer a({.learning_rate = 0.01});
      PerVariable<opt::AdamOptimizer> b({.learning_rate = 0.01});
      check_list_step(a, b, dev);
    }
    SUBCASE("adamw with amsgrad") {
      opt::AdamWOptimizer a({.learning_rate = 0.01, .weight_decay = 0.1, .amsgrad = true});
      PerVariable<opt::AdamWOptimizer> b({.learning_rate = 0.01, .weight_decay = 0.1, .amsgrad = true});
      check_list_step(a, b, dev);
    }
    SUBCASE("sgd with nesterov momentum") {
      opt::SGDOptimizer a({.learning_rate = 0.05, .momentum = 0.9, .nesterov = true});
      PerVariable<opt::SGDOptimizer> b({.learning_rate = 0.05, .momentum = 0.9, .nesterov = true});
      check_list_step(a, b, dev);
    }
    SUBCASE("rmsprop, centered with momentum") {
      opt::RMSpropOptimizer a({.learning_rate = 0.01, .momentum = 0.5, .centered = true});
      PerVariable<opt::RMSpropOptimizer> b({.learning_rate = 0.01, .momentum = 0.5, .centered = true});
      check_list_step(a, b, dev);
    }
    SUBCASE("nadam with weight decay") {
      opt::NadamOptimizer a({.learning_rate = 0.01, .weight_decay = 0.1});
      PerVariable<opt::NadamOptimizer> b({.learning_rate = 0.01, .weight_decay = 0.1});
      check_list_step(a, b, dev);
    }
    SUBCASE("adamax") {
      opt::AdamaxOptimizer a({.learning_rate = 0.01});
      PerVariable<opt::AdamaxOptimizer> b({.learning_rate = 0.01});
      check_list_step(a, b, dev);
    }
    SUBCASE("adagrad") {
      opt::AdagradOptimizer a({.learning_rate = 0.01});
      PerVariable<opt::AdagradOptimizer> b({.learning_rate = 0.01});
      check_list_step(a, b, dev);
    }
    SUBCASE("lion with weight decay and an excluded variable") {
      opt::LionOptimizer a({.learning_rate = 0.01, .weight_decay = 0.1});
      PerVariable<opt::LionOptimizer> b({.learning_rate = 0.01, .weight_decay = 0.1});
      a.exclude_from_weight_decay({"v1", "v3"});
      b.exclude_from_weight_decay({"v1", "v3"});
      check_list_step(a, b, dev);
    }
    SUBCASE("sgd and rmsprop with weight decay") {
      opt::SGDOptimizer a({.learning_rate = 0.05, .momentum = 0.9, .weight_decay = 0.01});
      PerVariable<opt::SGDOptimizer> b({.learning_rate = 0.05, .momentum = 0.9, .weight_decay = 0.01});
      check_list_step(a, b, dev);
      opt::RMSpropOptimizer c({.learning_rate = 0.01, .weight_decay = 0.01});
      PerVariable<opt::RMSpropOptimizer> d({.learning_rate = 0.01, .weight_decay = 0.01});
      check_list_step(c, d, dev);
    }
    SUBCASE("a variable given twice is updated twice, one after another") {
      opt::AdamOptimizer a({.learning_rate = 0.01});
      PerVariable<opt::AdamOptimizer> b({.learning_rate = 0.01});
      Variable wa(Tensor::random_uniform({4}, -1, 1, 3).to(dev).copy(), "w");
      Variable wb(Tensor::random_uniform({4}, -1, 1, 3).to(dev).copy(), "w");
      Tensor g = Tensor::random_uniform({4}, -1, 1, 4).to(dev);
      a.apply_gradients({g, g}, {wa, wa});
      b.apply_gradients({g, g}, {wb, wb});
      CHECK(wa.value().to_vector<double>() == wb.value().to_vector<double>());
    }
  });
}

TEST_CASE("AdamW's exclude_from_weight_decay: excluded variables get exactly Adam's update, the others AdamW's") {
  for_each_device([](Device dev) {
    // Keras 3 matches the names against variable.name, as regular expressions searched in it:
    // "bias" excludes "bias" and "query/bias"; "^gamma$" excludes "gamma" only. The kernel's path
    // names a layer "bias_proj", which does not matter.
    const std::vector<std::pair<std::string, bool>> names = {
        {"kernel", false}, {"bias", true}, {"query/bias", true}, {"gamma", true}, {"gamma_2", false}, {"embeddings", true}};
    for (bool per_variable : {false, true}) {
      CAPTURE(per_variable);
      const opt::AdamWOptions wo{.learning_rate = 0.01, .weight_decay = 0.5};
      const opt::AdamOptions ao{.learning_rate = 0.01};
      std::shared_ptr<opt::AdamWOptimizer> o = per_variable ? std::make_shared<PerVariable<opt::AdamWOptimizer>>(wo)
                                                            : std::make_shared<opt::AdamWOptimizer>(wo);
      o->exclude_from_weight_decay({"bias", "^gamma$", "embeddings"});
      CHECK(o->excluded_from_weight_decay() == std::vector<std::string>{"bias", "^gamma$", "embeddings"});
      opt::AdamWOptimizer adamw(wo);  // no exclusions: the reference of the decayed ones
      opt::AdamOptimizer adam(ao);    // the reference of the excluded ones
      std::vector<Variable> vars, ref_w, ref_a;
      for (std::size_t i = 0; i < names.size(); ++i) {
        const Tensor w0 = Tensor::random_uniform({3, 4}, -1, 1, 50 + i).to(dev);
        vars.emplace_back(w0.copy(), names[i].first);
        ref_w.emplace_back(w0.copy(), names[i].first);
        ref_a.emplace_back(w0.copy(), names[i].first);
      }
      vars[0].set_path("bias_proj/kernel");
      for (std::size_t i = 0; i < names.size(); ++i) CHECK(o->use_weight_decay(vars[i]) == !names[i].second);
      for (int step = 0; step < 3; ++step) {
        std::vector<Tensor> grads;
        for (std::size_t i = 0; i < names.size(); ++i)
          grads.push_back(Tensor::random_uniform({3, 4}, -1, 1, 60 + 10 * step + i).to(dev));
        o->apply_gradients(grads, vars);
        adamw.apply_gradients(grads, ref_w);
        adam.apply_gradients(grads, ref_a);
      }
      for (std::size_t i = 0; i < names.size(); ++i) {
        CAPTURE(names[i].first);
        const std::vector<Variable>& ref = names[i].second ? ref_a : ref_w;
        const std::vector<Variable>& other = names[i].second ? ref_w : ref_a;
        CHECK(vars[i].value().to_vector<double>() == ref[i].value().to_vector<double>());
        CHECK(vars[i].value().to_vector<double>() != other[i].value().to_vector<double>());  // the decay mattered
      }
      // A clone keeps the exclusions; once built (slots made, a step taken) they are fixed, as in Keras.
      auto c = std::dynamic_pointer_cast<opt::AdamWOptimizer>(o->clone());
      REQUIRE(c != nullptr);
      CHECK(c->excluded_from_weight_decay() == o->excluded_from_weight_decay());
      CHECK_FALSE(c->use_weight_decay(vars[1]));
      CHECK(contains(error_of([&] { o->exclude_from_weight_decay({"kernel"}); }), "before the optimizer is built"));
    }
    opt::AdamWOptimizer fresh({.weight_decay = 0.1});
    CHECK(contains(error_of([&] { fresh.exclude_from_weight_decay({"("}); }), "invalid pattern"));
    fresh.exclude_from_weight_decay({});  // excludes nothing
    CHECK(fresh.use_weight_decay(Variable(Tensor::zeros({2}).to(dev), "bias")));
  });
}

namespace {
/// Records the dtype of every gradient its update_step gets.
class DtypeProbe : public opt::Optimizer {
 public:
  DtypeProbe() : Optimizer("dtype_probe", {.learning_rate = 0.1}) {}
  std::shared_ptr<Optimizer> clone() const override { return std::make_shared<DtypeProbe>(); }
  void update_step(const Tensor& g, const Variable&, double) override { seen.push_back(g.dtype()); }
  std::vector<DType> seen;
};

/// Two steps of `a` with 16-bit gradients as given and of `b` with their float32 widening.
template <class O>
void check_16bit_gradients(O& a, O& b, DType gd, Device dev) {
  Variable wa(Tensor::random_uniform({5, 7}, -1, 1, 11).to(dev).copy(), "w");
  Variable wb(Tensor::random_uniform({5, 7}, -1, 1, 11).to(dev).copy(), "w");
  for (std::uint64_t step = 0; step < 2; ++step) {
    const Tensor g = Tensor::random_uniform({5, 7}, -2, 2, 20 + step, gd, dev);
    a.apply_gradients({g}, {wa});
    b.apply_gradients({g.to(float32)}, {wb});
  }
  CHECK(wa.value().to_vector<double>() == wb.value().to_vector<double>());
  const std::map<std::string, Tensor> sa = a.slots_by_path().at("w"), sb = b.slots_by_path().at("w");
  REQUIRE(sa.size() == sb.size());
  for (const auto& kv : sa) CHECK(kv.second.to_vector<double>() == sb.at(kv.first).to_vector<double>());
}
}  // namespace

TEST_CASE("the built-in optimizers take 16-bit gradients as given, with their float32 widening's bits") {
  for_each_device([](Device dev) {
    for (DType gd : {float16, bfloat16}) {
      CAPTURE(to_string(gd));
      {
        opt::AdamOptimizer a({.learning_rate = 0.01}), b({.learning_rate = 0.01});
        check_16bit_gradients(a, b, gd, dev);
      }
      {
        opt::AdamWOptimizer a({.learning_rate = 0.01, .weight_decay = 0.1, .amsgrad = true}),
            b({.learning_rate = 0.01, .weight_decay = 0.1, .amsgrad = true});
        check_16bit_gradients(a, b, gd, dev);
      }
      {
        opt::SGDOptimizer a({.learning_rate = 0.05, .momentum = 0.9, .nesterov = true}),
            b({.learning_rate = 0.05, .momentum = 0.9, .nesterov = true});
        check_16bit_gradients(a, b, gd, dev);
      }
      {
        opt::RMSpropOptimizer a({.learning_rate = 0.01, .momentum = 0.5, .centered = true}),
            b({.learning_rate = 0.01, .momentum = 0.5, .centered = true});
        check_16bit_gradients(a, b, gd, dev);
      }
      {  // clipping converts first (it runs on float32 gradients)
        opt::AdamOptimizer a({.learning_rate = 0.01, .clipnorm = 0.5}), b({.learning_rate = 0.01, .clipnorm = 0.5});
        check_16bit_gradients(a, b, gd, dev);
      }
    }
  });
}

TEST_CASE("a user-defined optimizer still gets float32 gradients") {
  DtypeProbe o;
  Variable w(f32({1, 2, 3, 4, 5, 6}), "w");
  o.apply_gradients({Tensor::full(kShape, 0.5, bfloat16)}, {w});
  o.apply_gradients({Tensor::full(kShape, 0.5, float16)}, {w});
  CHECK(o.seen == std::vector<DType>{float32, float32});
}

TEST_CASE("fit builds every optimizer slot before its first step; slot_names() is what update_step creates") {
  // Keras's fit builds the optimizer before the first step. Slots created inside the first step
  // took the memory its temporaries had freed, so the second step needed more: on an H100 a
  // cudaMalloc in step 2 of model C (2026-11-26).
  struct Case {
    const char* name;
    std::function<optimizers::OptimizerArg()> make;
    std::vector<std::string> slots;
  };
  const std::vector<Case> cases = {
      {"adam", [] { return optimizers::Adam({}); }, {"m", "v"}},
      {"adam amsgrad", [] { return optimizers::Adam({.amsgrad = true}); }, {"m", "v", "vhat"}},
      {"adamw", [] { return optimizers::AdamW({}); }, {"m", "v"}},
      {"sgd", [] { return optimizers::SGD({}); }, {}},
      {"sgd momentum", [] { return optimizers::SGD({.momentum = 0.9}); }, {"momentum"}},
      {"rmsprop centered momentum", [] { return optimizers::RMSprop({.momentum = 0.5, .centered = true}); },
       {"velocity", "average_gradient", "momentum"}},
  };
  for_each_device([&](Device dev) {
    set_default_device(dev);
    for (const Case& c : cases)
      for (const char* policy : {"float32", "mixed_float16"}) {
        CAPTURE(c.name);
        CAPTURE(policy);
        mixed_precision::set_global_policy(policy);
        set_random_seed(3);
        Sequential m({layers::Input({5}), layers::Dense(4, {.activation = "relu"}), layers::Dense(3)});
        m.compile({.optimizer = c.make(), .loss = "sparse_categorical_crossentropy"});
        auto& opt = m.loss_scale_optimizer() ? m.loss_scale_optimizer()->inner_optimizer() : m.optimizer();
        std::vector<std::string> paths;
        for (const Variable& v : m.trainable_variables()) paths.push_back(v.path());
        // The slots each variable has, as names, sorted.
        const auto slot_sets = [&] {
          std::map<std::string, std::vector<std::string>> out;
          for (const auto& [path, slots] : opt.slots_by_path())
            for (const auto& [name, t] : slots) out[path].push_back(name);
          return out;
        };
        std::vector<std::string> want = c.slots;
        std::sort(want.begin(), want.end());
        int checked = 0;
        auto before_first = std::make_shared<callbacks::LambdaCallback>();
        before_first->batch_begin = [&](std::int64_t batch, const Logs&) {
          if (batch != 0) return;
          const auto sets = slot_sets();
          for (const std::string& p : paths) {
            std::vector<std::string> have = sets.count(p) ? sets.at(p) : std::vector<std::string>{};
            std::sort(have.begin(), have.end());
            CHECK_MESSAGE(have == want, p);
            ++checked;
          }
        };
        Tensor x = Tensor::random_uniform({8, 5}, -1, 1, 1, float32, dev);
        Tensor y = ops::cast(Tensor::random_uniform({8}, 0, 2.99, 2, float32, dev), int32);
        m.fit(x, y, {.batch_size = 4, .epochs = 1, .verbose = 0, .callbacks = {before_first}});
        CHECK(checked == static_cast<int>(paths.size()));
        // After two steps the slots are the same set: update_step created none beyond slot_names().
        for (const auto& entry : slot_sets()) {  // no structured binding: clang 14's lambdas cannot capture one
          std::vector<std::string> have = entry.second;
          std::sort(have.begin(), have.end());
          CHECK_MESSAGE(have == want, entry.first);
        }
      }
    set_default_device(Device::cpu());
    mixed_precision::set_global_policy("float32");
  });
}

TEST_CASE("every learning-rate schedule follows Keras's recorded values step by step, and saves as Keras's") {
  // tests/interop/record_keras_schedules.py: Keras 3's schedules at steps 0..160 (float32).
  std::ifstream in(test_data("keras_schedules.json"));
  REQUIRE(in.good());
  const auto recorded = nlohmann::json::parse(in);
  std::set<std::string> classes;
  for (const auto& c : recorded["cases"]) {
    const io::Json serialized = io::Json::parse(c["serialized"].dump());
    const std::string cls = serialized["class_name"];
    classes.insert(cls);
    CAPTURE(serialized.dump());
    const io::Json sgd = {{"class_name", "SGD"}, {"config", {{"learning_rate", serialized}}}};
    auto o = io::optimizer_from_json(sgd, "test");
    const auto& lr = c["lr"];
    // Keras computes in float32: near a cosine's trough 1 + cos(.) keeps only the peak's
    // absolute precision, so the tolerance is relative to the schedule's largest value.
    double peak = 0;
    for (const auto& v : lr) peak = std::max(peak, std::abs(v.get<double>()));
    for (std::size_t step = 0; step < lr.size(); ++step) {
      o->set_iterations(static_cast<std::int64_t>(step));
      const double want = lr[step].get<double>(), got = o->learning_rate();
      CHECK_MESSAGE(std::abs(got - want) <= 2e-6 * std::max(std::abs(want), 0.1 * peak), cls, " step ", step,
                    ": mpt ", got, ", Keras ", want);
    }
    // Saved back in Keras's form: the same class and every Keras field at the same value.
    const io::Json back = io::optimizer_to_json(*o)["config"]["learning_rate"];
    CHECK(back["class_name"] == cls);
    for (auto it = serialized["config"].begin(); it != serialized["config"].end(); ++it) {
      // no structured binding: clang 14 (the sanitizer build) refuses them in doctest macros
      const std::string k = it.key();
      const io::Json& v = it.value();
      if (k == "name") continue;
      CHECK_MESSAGE(back["config"].contains(k), cls, " drops ", k);
      if (v.is_number()) CHECK(back["config"][k].get<double>() == doctest::Approx(v.get<double>()).epsilon(1e-7));
      else CHECK_MESSAGE(back["config"][k] == v, cls, " ", k);
    }
  }
  CHECK(classes == std::set<std::string>{"ExponentialDecay", "PiecewiseConstantDecay", "CosineDecay", "PolynomialDecay",
                                         "InverseTimeDecay", "CosineDecayRestarts"});
  CHECK(contains(error_of([] { sched::PolynomialDecay({.decay_steps = 0}); }), "decay_steps must be > 0"));
  CHECK(contains(error_of([] { sched::CosineDecayRestarts({.t_mul = 0.0}); }), "t_mul must be a finite number > 0"));
}

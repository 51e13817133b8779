// Model A (the Fashion-MNIST MLP) training steps under float32, mixed_float16 and
// mixed_bfloat16, measured in one run, and the fit loop's own overhead (batching with
// shuffle, metrics, callbacks, logs) relative to the bare training step.
//
//   ./bench_mlp [--steps 100]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

namespace layers = mpt::layers;
using namespace mpt;

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr int kRounds = 21;

std::unique_ptr<Sequential> model_a() {
  return std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({28, 28, 1}), layers::Flatten(), layers::Dense(512, {.activation = "relu"}),
      layers::Dense(512, {.activation = "relu"}), layers::Dense(10), layers::Activation("softmax")});
}

/// A callback on every batch that, like the progress bar between redraws, does not read the logs.
struct BatchCounter : callbacks::Callback {
  bool wants_batch_logs(std::int64_t) override { return false; }
  void on_train_batch_end(std::int64_t, const Logs&) override { ++seen; }
  std::int64_t seen = 0;
};

struct Result {
  double step_ms, fit_step_ms;
  double overhead;  ///< median over rounds of fit / bare - 1
};

Result measure(const std::string& policy, const Tensor& x, const Tensor& y, int steps) {
  mixed_precision::set_global_policy(policy);
  set_random_seed(1);
  auto m = model_a();
  m->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}), .loss = "sparse_categorical_crossentropy",
              .metrics = {"accuracy"}});
  const std::int64_t bs = 128;
  // The bare step: tape, forward, loss, gradients, (scaled) update on pre-sliced batches.
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < steps; ++i) batches.push_back({x.slice(i * bs, (i + 1) * bs), y.slice(i * bs, (i + 1) * bs)});
  auto& opt = m->optimizer();
  auto* lso = m->loss_scale_optimizer();
  const auto& loss_fn = m->loss();
  auto bare_step = [&](const Tensor& xb, const Tensor& yb) {
    GradientTape tape;
    Tensor pred = (*m)(xb, {.training = true}).to(float32);
    auto vars = m->trainable_variables();
    Tensor loss = loss_fn(yb, pred);
    if (lso) {
      auto g = tape.gradient(lso->get_scaled_loss(loss), vars);
      lso->apply_gradients(lso->get_unscaled_gradients(g), vars);
    } else {
      opt.apply_gradients(tape.gradient(loss, vars), vars);
    }
    loss.item();
  };
  for (int i = 0; i < 5; ++i) bare_step(batches[i].first, batches[i].second);  // warm-up: primitives, caches
  // Interleave the two measurements in rounds so machine noise hits both alike: the overhead
  // is the median of the rounds' fit/bare ratios, the times the best rounds'.
  double best_bare = 1e30, best_fit = 1e30;
  std::vector<double> ratios;
  const Tensor xf = x.slice(0, steps * bs), yf = y.slice(0, steps * bs);
  for (int round = 0; round < kRounds; ++round) {
    double t0 = now();
    for (int i = 0; i < steps; ++i) bare_step(batches[i].first, batches[i].second);
    const double bare = (now() - t0) / steps;
    auto cb = std::make_shared<BatchCounter>();
    t0 = now();
    m->fit(xf, yf, {.batch_size = bs, .epochs = 1, .verbose = 0, .callbacks = {std::shared_ptr<callbacks::Callback>(cb)}, .shuffle = true});
    const double fit = (now() - t0) / steps;
    if (cb->seen != steps) std::printf("fit ran %lld steps, expected %d\n", static_cast<long long>(cb->seen), steps);
    best_bare = std::min(best_bare, bare), best_fit = std::min(best_fit, fit);
    ratios.push_back(fit / bare);
  }
  std::nth_element(ratios.begin(), ratios.begin() + ratios.size() / 2, ratios.end());
  return {best_bare * 1e3, best_fit * 1e3, ratios[ratios.size() / 2] - 1.0};
}
}  // namespace

int main(int argc, char** argv) {
  int steps = 100;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
  auto data = datasets::fashion_mnist::load();
  std::printf("Model A (MLP 784-512-512-10), batch 128, Adam, %d threads, %d steps per measurement\n", num_threads(), steps);
  std::printf("%-16s %12s %14s %12s\n", "policy", "step ms", "fit ms/step", "fit overhead");
  std::printf("(times: best of %d interleaved rounds; overhead: median of the rounds' fit/step ratios)\n", kRounds);
  std::vector<std::pair<std::string, Result>> results;
  for (const char* p : {"float32", "mixed_float16", "mixed_bfloat16"}) {
    Result r = measure(p, data.x_train, data.y_train, steps);
    results.push_back({p, r});
    std::printf("%-16s %12.2f %14.2f %11.1f%%\n", p, r.step_ms, r.fit_step_ms, 100.0 * r.overhead);
  }
  const double f32 = results[0].second.step_ms;
  std::printf("speed-up vs float32: mixed_float16 %.2fx, mixed_bfloat16 %.2fx\n", f32 / results[1].second.step_ms,
              f32 / results[2].second.step_ms);
  double worst = 0;
  for (auto& [p, r] : results) worst = std::max(worst, r.overhead);
  std::printf("fit loop overhead (worst policy): %.1f%% of the step (target <= 3%%)\n", 100.0 * worst);
}

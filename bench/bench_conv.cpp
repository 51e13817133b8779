// Training steps of two convolutional networks under float32, mixed_float16 and mixed_bfloat16,
// measured in one run (ratios against float32 printed at the end):
//   model C: the Fashion-MNIST CNN of API.md (28x28x1, batch 128);
//   model B: a small ResNet on CIFAR-shaped data (32x32x3, batch 128): Conv 32 + BN + ReLU, two
//            residual blocks of 32 channels, a stride-2 Conv 64 + BN + ReLU, one residual block
//            of 64, global average pooling, Dense 10, softmax. The residual block is a custom
//            Layer written with mpt::ops (conv2d, batch_norm with its fused ReLU, add, relu).
// mixed_bfloat16 is also measured with MPT_CPU_BF16_CONV=native (oneDNN's bf16 convolutions) to
// show the CPU path choice (see src/backend/cpu/conv.cpp).
//
//   ./bench_conv [--steps 20] [--rounds 3] [--models CB] [--policy mixed_bfloat16]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

namespace layers = mpt::layers;
using namespace mpt;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// Conv-BN-ReLU-Conv-BN + shortcut, ReLU; BN statistics handled as BatchNormalization does.
class ResidualBlock : public Layer {
 public:
  explicit ResidualBlock(std::int64_t channels) : Layer("ResidualBlock"), channels_(channels) {}

  void build(const Shape& s) override {
    if (s.size() != 4 || s[3] != channels_) error("expects [batch, h, w, ", channels_, "], got ", to_string(s));
    for (int i = 0; i < 2; ++i) {
      const std::string n = std::to_string(i + 1);
      kernel_[i] = add_weight("conv" + n + "/kernel", {3, 3, channels_, channels_}, "he_normal");
      gamma_[i] = add_weight("bn" + n + "/gamma", {channels_}, "ones");
      beta_[i] = add_weight("bn" + n + "/beta", {channels_}, "zeros");
      mean_[i] = add_weight("bn" + n + "/moving_mean", {channels_}, "zeros", false);
      var_[i] = add_weight("bn" + n + "/moving_variance", {channels_}, "ones", false);
    }
  }

  Tensor call(const Tensor& x, bool training) override {
    commit();
    Tensor h = ops::conv2d(x, read(kernel_[0]), {}, {.padding = "same"});
    h = norm(0, h, training, "relu");
    h = ops::conv2d(h, read(kernel_[1]), {}, {.padding = "same"});
    h = norm(1, h, training, "linear");
    return ops::relu(ops::add(h, x));
  }

  void finish_step(bool applied) override {
    if (applied) commit();
    for (auto& p : pending_) p = Tensor();
  }

 private:
  Tensor norm(int i, const Tensor& h, bool training, const char* act) {
    if (!training)
      return ops::batch_norm(h, gamma_[i].read(float32), beta_[i].read(float32), mean_[i].read(float32), var_[i].read(float32),
                             {.activation = act})
          .y;
    auto r = ops::batch_norm(h, gamma_[i].read(float32), beta_[i].read(float32), {}, {}, {.training = true, .activation = act});
    NoGradGuard no_grad;
    pending_[2 * i] = mean_[i].value() * 0.99 + r.mean * 0.01;
    pending_[2 * i + 1] = var_[i].value() * 0.99 + r.variance * 0.01;
    return r.y;
  }
  void commit() {
    for (int i = 0; i < 2; ++i)
      if (pending_[2 * i].defined()) mean_[i].assign(pending_[2 * i]), var_[i].assign(pending_[2 * i + 1]);
    for (auto& p : pending_) p = Tensor();
  }

  std::int64_t channels_;
  Variable kernel_[2], gamma_[2], beta_[2], mean_[2], var_[2];
  Tensor pending_[4];
};

std::unique_ptr<Sequential> model_c() {
  return std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({28, 28, 1}), layers::Conv2D(32, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}),
      layers::Conv2D(64, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}), layers::Flatten(),
      layers::Dense(128, {.activation = "relu"}), layers::Dense(10), layers::Activation("softmax")});
}

std::unique_ptr<Sequential> model_b() {
  return std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      layers::Input({32, 32, 3}), layers::Conv2D(32, 3, {.padding = "same", .use_bias = false}), layers::BatchNormalization(),
      layers::ReLU(), std::make_shared<ResidualBlock>(32), std::make_shared<ResidualBlock>(32),
      layers::Conv2D(64, 3, {.strides = 2, .padding = "same", .use_bias = false}), layers::BatchNormalization(), layers::ReLU(),
      std::make_shared<ResidualBlock>(64), layers::GlobalAveragePooling2D(), layers::Dense(10), layers::Activation("softmax")});
}

struct Config {
  int steps = 20, rounds = 3;
};

/// One model under one policy, with its batches and its training step.
class Runner {
 public:
  Runner(char which, const std::string& policy, const char* bf16_conv) : bf16_conv_(bf16_conv) {
    mixed_precision::set_global_policy(policy);
    set_random_seed(1);
    m_ = which == 'C' ? model_c() : model_b();
    m_->compile({.optimizer = optimizers::Adam({.learning_rate = 1e-3}), .loss = "sparse_categorical_crossentropy"});
    const Shape in = which == 'C' ? Shape{128, 28, 28, 1} : Shape{128, 32, 32, 3};
    for (int i = 0; i < 4; ++i)
      batches_.push_back({Tensor::random_uniform(in, 0, 1, 10 + i),
                          ops::cast(Tensor::random_uniform({128}, 0, 9.99, 20 + i), int32)});
  }

  /// Mean ms per step over `steps` steps.
  double run(int steps) {
    if (bf16_conv_) setenv("MPT_CPU_BF16_CONV", bf16_conv_, 1);
    const double t0 = now();
    for (int i = 0; i < steps; ++i) step(batches_[i % batches_.size()]);
    const double ms = (now() - t0) / steps * 1e3;
    if (bf16_conv_) unsetenv("MPT_CPU_BF16_CONV");
    return ms;
  }

 private:
  // The step fit runs: tape, forward, float32 loss, gradients, (scaled) update, layer hooks.
  void step(const std::pair<Tensor, Tensor>& batch) {
    auto* lso = m_->loss_scale_optimizer();
    GradientTape tape;
    Tensor pred = (*m_)(batch.first, {.training = true}).to(float32);
    auto vars = m_->trainable_variables();
    Tensor loss = m_->loss()(batch.second, pred);
    bool applied = true;
    if (lso) {
      auto g = tape.gradient(lso->get_scaled_loss(loss), vars);
      applied = lso->apply_gradients_checked(lso->get_unscaled_gradients(g), vars).applied;
    } else {
      m_->optimizer().apply_gradients(tape.gradient(loss, vars), vars);
    }
    m_->finish_step(applied);
    loss.item();
  }

  const char* bf16_conv_;
  std::unique_ptr<Sequential> m_;
  std::vector<std::pair<Tensor, Tensor>> batches_;
};

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  std::string models = "CB", only;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps")) cfg.steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--rounds")) cfg.rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--models")) models = argv[i + 1];
    if (!std::strcmp(argv[i], "--policy")) only = argv[i + 1];  // one row, e.g. for perf
  }
  std::printf("Conv nets, batch 128, Adam, %d threads; best of %d interleaved rounds of %d steps\n", num_threads(),
              cfg.rounds, cfg.steps);
  std::printf("%-6s %-34s %10s %12s\n", "model", "policy", "ms/step", "vs float32");
  struct Row {
    const char* policy;
    const char* label;
    const char* bf16_conv;
  };
  const std::vector<Row> all = {{"float32", "float32", nullptr},
                                {"mixed_float16", "mixed_float16", nullptr},
                                {"mixed_bfloat16", "mixed_bfloat16", nullptr},
                                {"mixed_bfloat16", "mixed_bfloat16 (native bf16 convs)", "native"}};
  std::vector<Row> rows;
  for (const Row& r : all)
    if (only.empty() || only == r.label) rows.push_back(r);
  for (char which : models) {
    std::vector<std::unique_ptr<Runner>> runners;
    for (const Row& r : rows) {
      runners.push_back(std::make_unique<Runner>(which, r.policy, r.bf16_conv));
      runners.back()->run(3);  // warm-up: primitives, caches
    }
    // Rounds interleave the policies so that machine noise hits them alike; keep each one's best.
    std::vector<double> best(rows.size(), 1e30);
    for (int round = 0; round < cfg.rounds; ++round)
      for (std::size_t i = 0; i < rows.size(); ++i) best[i] = std::min(best[i], runners[i]->run(cfg.steps));
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::printf("%-6c %-34s %10.2f %11.2fx\n", which, rows[i].label, best[i], best[0] / best[i]);
    std::fflush(stdout);
  }
}

// The benchmark models, as Keras code would build them, shared by the benchmarks:
//   A  MLP 784-512-512-10 on 28x28x1 (batch 256)
//   B  CIFAR CNN on 32x32x3: conv32-pool-conv64-pool-dense128-10 (batch 128)
//   C  Fashion-MNIST CNN on 28x28x1: conv32-pool-conv64-pool-dense128-10 (batch 128)
//   D  MLP 1024-2048x3-10 (batch 512)
//   G  GPT-mini (issue 26): token Embedding(128, 256) + PositionEmbedding(256); 4 pre-norm blocks of
//      causal MultiHeadAttention(4 heads of 64) and a GELU MLP (1024), residual Adds; final
//      LayerNormalization; Dense(128) logits in float32; batch 16 of T = 256 (functional_model)
// and a callback that timestamps every training step of fit.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

namespace bench {

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Model `name` (A, B, C or D), softmax output; null for another name.
inline std::shared_ptr<mpt::Sequential> model(const std::string& name) {
  namespace layers = mpt::layers;
  auto cnn = [](std::int64_t side, std::int64_t channels) {
    return std::make_shared<mpt::Sequential>(std::initializer_list<mpt::LayerRef>{
        layers::Input({side, side, channels}), layers::Conv2D(32, {3, 3}, {.activation = "relu"}),
        layers::MaxPooling2D({2, 2}), layers::Conv2D(64, {3, 3}, {.activation = "relu"}), layers::MaxPooling2D({2, 2}),
        layers::Flatten(), layers::Dense(128, {.activation = "relu"}), layers::Dense(10), layers::Activation("softmax")});
  };
  if (name == "A")
    return std::make_shared<mpt::Sequential>(std::initializer_list<mpt::LayerRef>{
        layers::Input({28, 28, 1}), layers::Flatten(), layers::Dense(512, {.activation = "relu"}),
        layers::Dense(512, {.activation = "relu"}), layers::Dense(10), layers::Activation("softmax")});
  if (name == "B") return cnn(32, 3);
  if (name == "C") return cnn(28, 1);
  if (name == "D")
    return std::make_shared<mpt::Sequential>(std::initializer_list<mpt::LayerRef>{
        layers::Input({1024}), layers::Dense(2048, {.activation = "relu"}), layers::Dense(2048, {.activation = "relu"}),
        layers::Dense(2048, {.activation = "relu"}), layers::Dense(10), layers::Activation("softmax")});
  return nullptr;
}

/// Model G's sizes (bench/torch_cpu.py builds the same).
struct GptMini {
  static constexpr std::int64_t vocab = 128, seq = 256, d = 256, heads = 4, blocks = 4;
};

/// Model `name` as a trainable model: A-D as model() gives them, G the GPT-mini (int32 ids
/// [B, 256] in, float32 logits [B, 256, 128] out); null for another name.
inline std::shared_ptr<mpt::Model> training_model(const std::string& name) {
  namespace layers = mpt::layers;
  if (name != "G") return model(name);
  using G = GptMini;
  auto ids = mpt::Input({G::seq}, {.dtype = mpt::int32, .name = "ids"});
  auto tokens = layers::Embedding(G::vocab, G::d)(ids);
  auto h = layers::Add()({tokens, layers::PositionEmbedding(G::seq)(tokens)});
  for (std::int64_t b = 0; b < G::blocks; ++b) {
    auto a = layers::LayerNormalization({.epsilon = 1e-5})(h);
    a = layers::MultiHeadAttention(G::heads, G::d / G::heads, {.use_causal_mask = true})({a, a});
    h = layers::Add()({h, a});
    auto f = layers::Dense(4 * G::d, {.activation = "gelu"})(layers::LayerNormalization({.epsilon = 1e-5})(h));
    h = layers::Add()({h, layers::Dense(G::d)(f)});
  }
  auto logits = layers::Dense(G::vocab, {.dtype = "float32"})(layers::LayerNormalization({.epsilon = 1e-5})(h));
  return std::make_shared<mpt::Model>(ids, logits, "gpt_mini");
}

/// Rows per batch of model `name` (per rank, under data parallelism).
inline std::int64_t batch_size(const std::string& name) {
  return name == "A" ? 256 : name == "D" ? 512 : name == "G" ? 16 : 128;
}

/// One input row's shape.
inline mpt::Shape input_shape(const std::string& name) {
  if (name == "G") return {GptMini::seq};
  if (name == "B") return {32, 32, 3};
  if (name == "D") return {1024};
  return {28, 28, 1};
}

/// The start of every batch of a fit, and its end.
struct StepClock : mpt::callbacks::Callback {
  std::vector<double> starts;
  bool wants_batch_logs(std::int64_t) override { return false; }
  void on_train_batch_begin(std::int64_t, const mpt::Logs&) override { starts.push_back(now()); }
  void on_train_end(const mpt::Logs&) override { starts.push_back(now()); }
  /// Milliseconds of each step, sorted.
  std::vector<double> sorted_ms() const {
    std::vector<double> ms;
    for (std::size_t i = 1; i < starts.size(); ++i) ms.push_back(1e3 * (starts[i] - starts[i - 1]));
    std::sort(ms.begin(), ms.end());
    return ms;
  }
};

}  // namespace bench

// The C++ half of tests/interop/torch_gpt_replay.py (run by hand, not by CTest): a GPT-mini
// (token Embedding + PositionEmbedding, pre-norm blocks of causal MultiHeadAttention and a GELU
// MLP with residual Adds, a final LayerNormalization and a Dense head) trained with AdamW on
// fixed batches, one train_on_batch per step.
//
//   gpt_replay_helper <dir> [--vocab 64] [--seq 64] [--d 64] [--heads 4] [--blocks 2] [--batch 8]
//                     [--steps 50] [--lr 1e-3] [--weight-decay 0.01] [--policy float32]
//
// Writes into <dir>: config.json (the sizes), initial.weights.h5 (the weights before training,
// mpt's .weights.h5 layout), batches.i32 ([steps, 2, batch, seq] int32: inputs, then targets)
// and losses.txt (one loss per step, as train_on_batch reports it).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <mpt/mpt.hpp>

namespace layers = mpt::layers;

namespace {

struct Config {
  std::int64_t vocab = 64, seq = 64, d = 64, heads = 4, blocks = 2, batch = 8, steps = 50;
  double lr = 1e-3, weight_decay = 0.01;
  std::string policy = "float32";
};

/// The layer names the Python side reads the weights file by.
std::unique_ptr<mpt::Model> gpt(const Config& c) {
  auto ids = mpt::Input({c.seq}, {.dtype = mpt::int32, .name = "ids"});
  auto tok = layers::Embedding(c.vocab, c.d, {.name = "tok"})(ids);
  auto x = layers::Add({.name = "embed_add"})({tok, layers::PositionEmbedding(c.seq, {.name = "pos"})(tok)});
  for (std::int64_t b = 0; b < c.blocks; ++b) {
    const std::string p = "b" + std::to_string(b) + "_";
    auto h = layers::LayerNormalization({.name = p + "ln1"})(x);
    h = layers::MultiHeadAttention(c.heads, c.d / c.heads, {.use_causal_mask = true, .name = p + "mha"})({h, h});
    x = layers::Add({.name = p + "add1"})({x, h});
    h = layers::LayerNormalization({.name = p + "ln2"})(x);
    h = layers::Dense(4 * c.d, {.activation = "gelu", .name = p + "fc1"})(h);
    h = layers::Dense(c.d, {.name = p + "fc2"})(h);
    x = layers::Add({.name = p + "add2"})({x, h});
  }
  auto logits = layers::Dense(c.vocab, {.name = "head"})(layers::LayerNormalization({.name = "ln_f"})(x));
  return std::make_unique<mpt::Model>(ids, logits, "gpt_mini");
}

/// Deterministic token batches: a repeating pattern with noise from a fixed LCG, so the model
/// has something to learn.
std::vector<std::int32_t> batches(const Config& c) {
  std::vector<std::int32_t> out;
  std::uint64_t s = 12345;
  auto next = [&] { return s = s * 6364136223846793005ULL + 1442695040888963407ULL, static_cast<std::int32_t>(s >> 33); };
  for (std::int64_t step = 0; step < c.steps; ++step) {
    std::vector<std::int32_t> text(static_cast<std::size_t>(c.batch * (c.seq + 1)));
    for (std::int64_t b = 0; b < c.batch; ++b) {
      const std::int32_t start = next() % static_cast<std::int32_t>(c.vocab);
      for (std::int64_t t = 0; t <= c.seq; ++t)
        text[b * (c.seq + 1) + t] = next() % 4 == 0 ? next() % static_cast<std::int32_t>(c.vocab)
                                                     : static_cast<std::int32_t>((start + 3 * t) % c.vocab);
    }
    for (int part = 0; part < 2; ++part)
      for (std::int64_t b = 0; b < c.batch; ++b)
        for (std::int64_t t = 0; t < c.seq; ++t) out.push_back(text[b * (c.seq + 1) + t + part]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpt_replay_helper <dir> [--vocab N] [--seq N] [--d N] [--heads N] [--blocks N] "
                         "[--batch N] [--steps N] [--lr X] [--weight-decay X] [--policy P]\n");
    return 2;
  }
  const std::string dir = argv[1];
  Config c;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--vocab") c.vocab = std::stoll(v);
    else if (f == "--seq") c.seq = std::stoll(v);
    else if (f == "--d") c.d = std::stoll(v);
    else if (f == "--heads") c.heads = std::stoll(v);
    else if (f == "--blocks") c.blocks = std::stoll(v);
    else if (f == "--batch") c.batch = std::stoll(v);
    else if (f == "--steps") c.steps = std::stoll(v);
    else if (f == "--lr") c.lr = std::stod(v);
    else if (f == "--weight-decay") c.weight_decay = std::stod(v);
    else if (f == "--policy") c.policy = v;
    else {
      std::fprintf(stderr, "gpt_replay_helper: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  try {
    mpt::mixed_precision::set_global_policy(c.policy);
    mpt::set_random_seed(7);
    auto m = gpt(c);
    m->compile({.optimizer = mpt::optimizers::AdamW({.learning_rate = c.lr, .weight_decay = c.weight_decay}),
                .loss = mpt::losses::SparseCategoricalCrossentropy({.from_logits = true})});
    m->save_weights(dir + "/initial.weights.h5");
    const auto data = batches(c);
    std::ofstream(dir + "/batches.i32", std::ios::binary)
        .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * 4));
    std::ofstream(dir + "/config.json") << nlohmann::json{{"vocab", c.vocab}, {"seq", c.seq}, {"d", c.d},
                                                          {"heads", c.heads}, {"blocks", c.blocks},
                                                          {"batch", c.batch}, {"steps", c.steps}, {"lr", c.lr},
                                                          {"weight_decay", c.weight_decay}, {"policy", c.policy}}
                                                             .dump();
    std::ofstream losses(dir + "/losses.txt");
    const std::size_t per = static_cast<std::size_t>(c.batch * c.seq);
    for (std::int64_t step = 0; step < c.steps; ++step) {
      const std::int32_t* at = data.data() + step * 2 * per;
      auto x = mpt::Tensor::from_vector(std::vector<std::int32_t>(at, at + per), {c.batch, c.seq});
      auto y = mpt::Tensor::from_vector(std::vector<std::int32_t>(at + per, at + 2 * per), {c.batch, c.seq});
      const double loss = m->train_on_batch(x, y).at("loss");
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g\n", loss);
      losses << buf;
      std::printf("step %lld loss %.6f\n", static_cast<long long>(step + 1), loss);
    }
    return 0;
  } catch (const mpt::Error& e) {
    std::fprintf(stderr, "gpt_replay_helper: %s\n", e.what());
    return 1;
  }
}

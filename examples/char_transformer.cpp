// A GPT-style character-level decoder trained on the `fortunes` Debian package (the plain text
// files of /usr/share/games/fortunes, `%` lines between fortunes), built with the functional API:
//
//   ids [T] int32 -> Embedding(V, d) + PositionEmbedding(T) (layers::Add)
//   N pre-norm blocks:  h += MultiHeadAttention(heads, d/heads, causal)(LayerNorm(h))
//                       h += Dense(d)(Dense(4d, gelu)(LayerNorm(h)))
//   -> LayerNormalization -> Dense(V) logits (float32 under every policy)
//
// Loss SparseCategoricalCrossentropy(from_logits) on [B, T, V] logits against the next
// characters [B, T], metric accuracy; AdamW whose weight decay skips biases, normalization
// weights and embeddings (exclude_from_weight_decay({"bias", "gamma", "beta", "embeddings"})).
// The vocabulary is the corpus's sorted distinct bytes; the first 90 % of the text trains, the
// last 10 % validates. An epoch is --steps-per-epoch steps on fresh windows x = text[i:i+T],
// y = text[i+1:i+T+1] (non-overlapping, from a random offset, shuffled; 0: every window of the
// training text once). After each epoch it prints the validation loss in bits per character
// (loss / ln 2) and the training throughput in tokens/s; at the end it writes the weights
// (--checkpoint, Keras 3's .weights.h5, and a .keras archive next to it) and prints text sampled
// from the trained model (temperature sampling, seeded) after --prompt, then
// `val_bits_per_char=<v>`.
//
// Training runs until --epochs epochs or --minutes of wall-clock time (training and validation)
// are done, whichever comes first; with neither given, for 10 minutes. The defaults train
// usefully in 10 minutes on 2 CPU cores (see --help); on a GPU (the default device where there is
// one; MPT_DEVICE=cpu|cuda:N chooses) give it more.
//
//   apt-get install fortunes
//   ./char_transformer [--policy mixed_bfloat16|mixed_float16|float32] [--minutes 10 | --epochs N]
//                      [--batch-size 32] [--seq-len 128] [--d-model 128] [--blocks 4] [--heads 4]
//                      [--seed 1] [--checkpoint char_transformer.weights.h5] [--sample-chars 400]
//   ./char_transformer --minutes 2 --d-model 64 --blocks 2 --seq-len 64     # a quick look
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <mpt/mpt.hpp>

#include "flags.hpp"

namespace layers = mpt::layers;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Every plain fortunes text file of `dir` (not the .dat indexes nor the .u8 links), in name
/// order, concatenated.
std::string read_fortunes(const std::string& dir, std::size_t& files) {
  namespace fs = std::filesystem;
  const std::string install = "; install the corpus with `apt-get install fortunes` (Debian package fortunes) "
                              "or pass --corpus DIR";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw mpt::Error("char_transformer: no fortunes corpus at " + dir + install);
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::string ext = e.path().extension().string();
    if (e.is_symlink() || !e.is_regular_file() || ext == ".dat" || ext == ".u8" || name.empty() || name[0] == '.')
      continue;
    paths.push_back(e.path());
  }
  if (ec) throw mpt::Error("char_transformer: cannot list " + dir + ": " + ec.message());
  std::sort(paths.begin(), paths.end());
  std::string text;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in && !in.eof()) throw mpt::Error("char_transformer: cannot read " + p.string());
    if (s.empty()) continue;
    if (s.back() != '\n') s.push_back('\n');
    text += s;
  }
  files = paths.size();
  if (text.empty()) throw mpt::Error("char_transformer: no fortunes text files in " + dir + install);
  return text;
}

/// The sorted distinct bytes of the text; id[byte] is a byte's index, -1 for bytes not in it.
struct Vocabulary {
  explicit Vocabulary(const std::string& text) {
    std::array<bool, 256> seen{};
    for (unsigned char c : text) seen[c] = true;
    id.fill(-1);
    for (int b = 0; b < 256; ++b)
      if (seen[b]) id[b] = static_cast<std::int32_t>(chars.size()), chars.push_back(static_cast<char>(b));
  }
  std::int64_t size() const { return static_cast<std::int64_t>(chars.size()); }
  std::vector<std::int32_t> encode(const std::string& s) const {
    std::vector<std::int32_t> out;
    out.reserve(s.size());
    for (unsigned char c : s) {
      if (id[c] < 0) throw mpt::Error("char_transformer: byte " + std::to_string(c) + " is not in the corpus's vocabulary");
      out.push_back(id[c]);
    }
    return out;
  }
  std::string chars;
  std::array<std::int32_t, 256> id{};
};

/// x [n, T] = ids[s:s+T] and y [n, T] = ids[s+1:s+T+1] for each start s, int32 on the CPU.
std::pair<mpt::Tensor, mpt::Tensor> windows(const std::vector<std::int32_t>& ids, const std::vector<std::int64_t>& starts,
                                            std::int64_t T) {
  std::vector<std::int32_t> x, y;
  x.reserve(starts.size() * static_cast<std::size_t>(T));
  y.reserve(x.capacity());
  for (std::int64_t s : starts) {
    x.insert(x.end(), ids.begin() + s, ids.begin() + s + T);
    y.insert(y.end(), ids.begin() + s + 1, ids.begin() + s + T + 1);
  }
  const mpt::Shape shape{static_cast<std::int64_t>(starts.size()), T};
  return {mpt::Tensor::from_vector(x, shape, mpt::Device::cpu()), mpt::Tensor::from_vector(y, shape, mpt::Device::cpu())};
}

/// The starts phase, phase + T, ... of every whole window (T + 1 characters) of n ids.
std::vector<std::int64_t> window_starts(std::int64_t n, std::int64_t T, std::int64_t phase) {
  std::vector<std::int64_t> s;
  for (std::int64_t i = phase; i + T + 1 <= n; i += T) s.push_back(i);
  return s;
}

struct ModelSize {
  std::int64_t vocab, seq_len, d_model, heads, blocks;
};

mpt::Model build(const ModelSize& m) {
  auto ids = mpt::Input({m.seq_len}, {.dtype = mpt::int32, .name = "ids"});
  auto tokens = layers::Embedding(m.vocab, m.d_model, {.name = "token_embedding"})(ids);
  auto positions = layers::PositionEmbedding(m.seq_len, {.name = "position_embedding"})(tokens);
  auto h = layers::Add()({tokens, positions});
  for (std::int64_t b = 0; b < m.blocks; ++b) {
    auto a = layers::LayerNormalization({.epsilon = 1e-5})(h);
    a = layers::MultiHeadAttention(m.heads, m.d_model / m.heads, {.use_causal_mask = true})({a, a});
    h = layers::Add()({h, a});
    auto f = layers::LayerNormalization({.epsilon = 1e-5})(h);
    f = layers::Dense(4 * m.d_model, {.activation = "gelu"})(f);
    f = layers::Dense(m.d_model)(f);
    h = layers::Add()({h, f});
  }
  h = layers::LayerNormalization({.epsilon = 1e-5})(h);
  // Logits in float32 (Keras's mixed-precision advice for the last layer): 16-bit logits would
  // round the loss and the sampling distribution.
  auto logits = layers::Dense(m.vocab, {.dtype = "float32", .name = "logits"})(h);
  return mpt::Model(ids, logits, "char_transformer");
}

/// `n` characters after `prompt`, each drawn from softmax(logits / temperature) at the last
/// position of the (at most T) characters so far; the window is padded on the right to T, which
/// the causal mask keeps from the positions read.
std::string sample(mpt::Model& model, const Vocabulary& vocab, const std::string& prompt, std::int64_t n,
                   std::int64_t T, double temperature, std::uint64_t seed) {
  mpt::NoGradGuard no_grad;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<std::int32_t> ids = vocab.encode(prompt);
  std::string out;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t L = std::min<std::int64_t>(T, static_cast<std::int64_t>(ids.size()));
    std::vector<std::int32_t> window(ids.end() - L, ids.end());
    window.resize(static_cast<std::size_t>(T), 0);
    const mpt::Tensor logits = model(mpt::Tensor::from_vector(window, {1, T}));
    const std::vector<double> row = mpt::ops::slice(logits, 1, L - 1, L).to_vector<double>();
    std::vector<double> p(row.size());
    const double top = *std::max_element(row.begin(), row.end());
    double z = 0;
    for (std::size_t k = 0; k < row.size(); ++k) z += p[k] = std::exp((row[k] - top) / temperature);
    double u = uniform(rng) * z;
    std::size_t k = 0;
    while (k + 1 < p.size() && (u -= p[k]) > 0) ++k;
    ids.push_back(static_cast<std::int32_t>(k));
    out.push_back(vocab.chars[k]);
  }
  return out;
}

/// "char_transformer.weights.h5" -> "char_transformer.keras".
std::string keras_path(const std::string& weights) {
  const std::string suffix = ".weights.h5";
  if (weights.size() > suffix.size() && weights.compare(weights.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weights.substr(0, weights.size() - suffix.size()) + ".keras";
  return std::filesystem::path(weights).replace_extension(".keras").string();
}

}  // namespace

int main(int argc, char** argv) {
  std::string policy = "mixed_bfloat16", checkpoint = "char_transformer.weights.h5", corpus = "/usr/share/games/fortunes",
              prompt = "The ";
  int epochs = 0;
  double minutes = 10.0, learning_rate = 2e-3, weight_decay = 0.1, temperature = 0.8;
  std::int64_t batch_size = 32, seq_len = 128, d_model = 128, blocks = 4, heads = 4, steps_per_epoch = 100,
               val_windows = 512, sample_chars = 400;
  std::uint64_t seed = 1;
  CLI::App app{"A GPT-style character-level transformer trained on the fortunes corpus under a global dtype policy"};
  examples::add_policy(app, policy, {"float32", "mixed_float16", "mixed_bfloat16"});
  auto* epochs_opt = app.add_option("--epochs", epochs, "epochs to train (default: until --minutes)")
                         ->check(examples::kPositive);
  auto* minutes_opt = app.add_option("--minutes", minutes,
                                     "wall-clock budget of training and validation, the last epoch shortened to fit by the "
                                     "previous one's step time (default 10 when --epochs is not given)")
                          ->check(CLI::PositiveNumber);
  app.add_option("--steps-per-epoch", steps_per_epoch,
                 "training steps per epoch (0: every window of the training text once)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--batch-size", batch_size, "windows per step")->check(examples::kPositive)->capture_default_str();
  app.add_option("--seq-len", seq_len, "characters per window (T)")->check(examples::kPositive)->capture_default_str();
  app.add_option("--d-model", d_model, "model width d")->check(examples::kPositive)->capture_default_str();
  app.add_option("--blocks", blocks, "transformer blocks")->check(examples::kPositive)->capture_default_str();
  app.add_option("--heads", heads, "attention heads (d-model must be a multiple)")
      ->check(examples::kPositive)
      ->capture_default_str();
  app.add_option("--learning-rate", learning_rate, "AdamW learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--weight-decay", weight_decay, "AdamW weight decay (not on biases, norms, embeddings)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--val-windows", val_windows, "validation windows, spread evenly over the held-out text (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--seed", seed, "random seed (weights, windows, sampling)")->capture_default_str();
  app.add_option("--checkpoint", checkpoint, "weights file written after training, plus a .keras next to it (\"\" for none)")
      ->capture_default_str();
  app.add_option("--sample-chars", sample_chars, "characters sampled after training (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--prompt", prompt, "text the sample starts from")->capture_default_str();
  app.add_option("--temperature", temperature, "sampling temperature")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--corpus", corpus, "directory of fortune files")->capture_default_str();
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  if (d_model % heads != 0) {
    std::cerr << "--d-model " << d_model << " is not a multiple of --heads " << heads << "\n";
    return 2;
  }
  const bool time_limited = minutes_opt->count() > 0 || epochs_opt->count() == 0;
  const double budget_s = minutes * 60.0;

  try {
    const auto t_start = Clock::now();
    mpt::set_random_seed(seed);
    mpt::mixed_precision::set_global_policy(policy);
    std::size_t files = 0;
    const std::string text = read_fortunes(corpus, files);
    const Vocabulary vocab(text);
    const std::vector<std::int32_t> ids = vocab.encode(text);
    const auto n_train = static_cast<std::int64_t>(ids.size() * 9 / 10);
    const std::vector<std::int32_t> train(ids.begin(), ids.begin() + n_train), val(ids.begin() + n_train, ids.end());
    std::vector<std::int64_t> val_starts = window_starts(static_cast<std::int64_t>(val.size()), seq_len, 0);
    if (val_starts.empty() || window_starts(n_train, seq_len, 0).size() < static_cast<std::size_t>(batch_size))
      throw mpt::Error("char_transformer: the corpus is too short for --seq-len " + std::to_string(seq_len) +
                       " and --batch-size " + std::to_string(batch_size));
    if (val_windows > 0 && static_cast<std::int64_t>(val_starts.size()) > val_windows) {  // evenly spread
      std::vector<std::int64_t> kept;
      for (std::int64_t i = 0; i < val_windows; ++i)
        kept.push_back(val_starts[static_cast<std::size_t>(i * static_cast<std::int64_t>(val_starts.size()) / val_windows)]);
      val_starts = kept;
    }
    const auto [vx, vy] = windows(val, val_starts, seq_len);
    std::printf("corpus: %zu files of %s, %zu characters, vocabulary %lld bytes; train %lld, validation %zu "
                "(%zu windows of %lld)\n",
                files, corpus.c_str(), text.size(), static_cast<long long>(vocab.size()), static_cast<long long>(n_train),
                val.size(), val_starts.size(), static_cast<long long>(seq_len));

    mpt::Model model = build({vocab.size(), seq_len, d_model, heads, blocks});
    auto adamw = mpt::optimizers::AdamW({.learning_rate = learning_rate, .weight_decay = weight_decay, .beta_2 = 0.99});
    adamw->exclude_from_weight_decay({"bias", "gamma", "beta", "embeddings"});
    model.compile({.optimizer = adamw,
                   .loss = mpt::losses::SparseCategoricalCrossentropy({.from_logits = true}),
                   .metrics = {"accuracy"}});
    model.summary();
    std::printf("policy %s on %s; AdamW lr %g, weight decay %g (not on bias, gamma, beta, embeddings)\n", policy.c_str(),
                mpt::default_device().str().c_str(), learning_rate, weight_decay);

    // A one-line step counter on a terminal (fit runs silent; the epoch line says the rest).
    const bool tty = isatty(fileno(stdout)) != 0;
    std::int64_t epoch_steps = 0;
    auto progress = std::make_shared<mpt::callbacks::LambdaCallback>();
    progress->batch_end = [&](std::int64_t step, const mpt::Logs&) {
      if (tty && ((step + 1) % 10 == 0 || step + 1 == epoch_steps))
        std::printf("\r  step %lld/%lld", static_cast<long long>(step + 1), static_cast<long long>(epoch_steps)),
            std::fflush(stdout);
    };

    std::mt19937_64 rng(seed);
    double step_s = 0, eval_s = 0, val_bits = 0;
    std::int64_t total_steps = 0;
    for (int epoch = 0; epochs == 0 || epoch < epochs; ++epoch) {
      std::vector<std::int64_t> starts = window_starts(n_train, seq_len, static_cast<std::int64_t>(rng() % seq_len));
      std::shuffle(starts.begin(), starts.end(), rng);
      std::int64_t steps = static_cast<std::int64_t>(starts.size()) / batch_size;
      if (steps_per_epoch > 0) steps = std::min(steps, steps_per_epoch);
      if (time_limited && epoch > 0) {  // the last epoch shortened to what the budget still holds
        const double left = budget_s - seconds_since(t_start) - eval_s;
        steps = std::min(steps, static_cast<std::int64_t>(left / step_s));
        if (steps < std::max<std::int64_t>(1, std::min<std::int64_t>(10, steps_per_epoch / 4))) break;
      }
      starts.resize(static_cast<std::size_t>(steps * batch_size));
      const auto [x, y] = windows(train, starts, seq_len);
      epoch_steps = steps;
      const auto t0 = Clock::now();
      mpt::History h = model.fit(x, y, {.batch_size = batch_size, .epochs = 1, .verbose = 0, .callbacks = {progress},
                                        .shuffle = false});
      const double train_s = seconds_since(t0);
      const auto t1 = Clock::now();
      auto scores = model.evaluate(vx, vy, {.batch_size = std::max<std::int64_t>(batch_size, 64)});
      eval_s = seconds_since(t1);
      step_s = train_s / static_cast<double>(steps);
      total_steps += steps;
      val_bits = scores["loss"] / std::log(2.0);
      if (tty) std::printf("\r");
      std::printf("epoch %d: %lld steps, train %.3f bits/char, val %.3f bits/char (accuracy %.3f), %.0f ms/step, "
                  "%.0f tokens/s, %.1f min\n",
                  epoch + 1, static_cast<long long>(steps), h.history["loss"].back() / std::log(2.0), val_bits,
                  scores["accuracy"], 1e3 * step_s, static_cast<double>(steps * batch_size * seq_len) / train_s,
                  seconds_since(t_start) / 60.0);
      std::fflush(stdout);
      if (time_limited && seconds_since(t_start) >= budget_s) break;
    }
    std::printf("trained %lld steps (%lld tokens) in %.1f min\n", static_cast<long long>(total_steps),
                static_cast<long long>(total_steps * batch_size * seq_len), seconds_since(t_start) / 60.0);

    if (!checkpoint.empty()) {
      model.save_weights(checkpoint);
      std::printf("checkpoint written: %s (load with model.load_weights(\"%s\"))\n", checkpoint.c_str(),
                  checkpoint.c_str());
      const std::string archive = keras_path(checkpoint);
      try {
        model.save(archive);
        std::printf("model written: %s (mpt::load_model(\"%s\"))\n", archive.c_str(), archive.c_str());
      } catch (const mpt::Error& e) {
        std::printf("no .keras archive: %s\n", e.what());
      }
    }
    if (sample_chars > 0) {
      const std::string s = sample(model, vocab, prompt, sample_chars, seq_len, temperature, seed);
      std::printf("--- sample (temperature %g, seed %llu) ---\n%s%s\n---\n", temperature,
                  static_cast<unsigned long long>(seed), prompt.c_str(), s.c_str());
    }
    std::printf("val_bits_per_char=%.4f\n", val_bits);
  } catch (const mpt::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

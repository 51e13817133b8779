#pragma once
// Helpers shared by the checkpoint tests: a scratch folder, small models and data, bitwise
// comparisons and raw file access.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace mpt::test {

/// A fresh folder under the system temp dir, removed with its contents at scope exit.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path() /
           ("mpt-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  /// Names of the files inside (sorted).
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

struct PolicyScope {
  explicit PolicyScope(const std::string& p) { mixed_precision::set_global_policy(p); }
  ~PolicyScope() { mixed_precision::set_global_policy("float32"); }
};

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A 4-class problem: class = quadrant of the first two of 8 features.
inline std::pair<Tensor, Tensor> quadrant_data(std::int64_t n, std::uint64_t seed) {
  Tensor x = Tensor::random_uniform({n, 8}, -1, 1, seed);
  auto xv = x.to_vector<float>();
  std::vector<std::int32_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) y[i] = (xv[i * 8] > 0 ? 1 : 0) + (xv[i * 8 + 1] > 0 ? 2 : 0);
  return {x, Tensor::from_vector(y, {n})};
}

/// Every core layer type once: Input, Reshape, Dense, ReLU, Dropout, Flatten, Activation, Softmax.
inline std::unique_ptr<Sequential> all_core_layers_model() {
  namespace layers = mpt::layers;
  return std::make_unique<Sequential>(std::vector<LayerRef>{
      layers::Input({8}), layers::Reshape({2, 4}), layers::Flatten(),
      layers::Dense(16, {.kernel_initializer = "he_uniform", .bias_initializer = "random_normal"}), layers::ReLU(),
      layers::Dropout(0.25), layers::Dense(12, {.activation = "tanh", .use_bias = false}),
      layers::Activation("gelu"), layers::Dense(4), layers::Softmax()});
}

/// The MLP the layout tests inspect: dense, dropout, dense_1, activation.
inline std::unique_ptr<Sequential> small_mlp() {
  namespace layers = mpt::layers;
  return std::make_unique<Sequential>(std::vector<LayerRef>{layers::Input({8}), layers::Dense(16, {.activation = "relu"}),
                                                            layers::Dropout(0.1), layers::Dense(4),
                                                            layers::Activation("softmax")});
}

inline std::vector<std::uint32_t> bits_of(const Tensor& t) {
  Tensor f = t.to(float32);
  auto v = f.to_vector<float>();
  std::vector<std::uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

/// Whether two models hold bit-identical weights.
inline bool same_weights(const Model& a, const Model& b) {
  auto wa = a.get_weights(), wb = b.get_weights();
  if (wa.size() != wb.size()) return false;
  for (std::size_t i = 0; i < wa.size(); ++i)
    if (wa[i].shape() != wb[i].shape() || wa[i].dtype() != wb[i].dtype() || bits_of(wa[i]) != bits_of(wb[i]))
      return false;
  return true;
}

/// Whether two optimizers hold bit-identical slots and the same iteration count.
inline bool same_optimizer_state(optimizers::Optimizer& a, optimizers::Optimizer& b) {
  if (a.iterations() != b.iterations()) return false;
  auto sa = a.slots_by_path(), sb = b.slots_by_path();
  if (sa.size() != sb.size()) return false;
  for (const auto& [path, slots] : sa) {
    auto it = sb.find(path);
    if (it == sb.end() || it->second.size() != slots.size()) return false;
    for (const auto& [name, t] : slots) {
      auto s = it->second.find(name);
      if (s == it->second.end() || bits_of(s->second) != bits_of(t)) return false;
    }
  }
  return true;
}

}  // namespace mpt::test

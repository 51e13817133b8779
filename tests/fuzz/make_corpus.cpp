// Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/): small valid files of
// every format each reader takes, mpt-stamped and plain (an HDF5 file without mpt's header reads
// as one written by Keras, so mutations reach HDF5 and mpt's parsers instead of failing the CRC).
//   make_corpus <corpus folder>   (built with MPT_FUZZ; run once, output committed)
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <mpt/mpt.hpp>

#include "io/model_config.hpp"

namespace fs = std::filesystem;
using namespace mpt;

namespace {
std::vector<char> read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write(const fs::path& p, const std::vector<char>& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}
/// A copy without mpt's userblock magic: read as a foreign (Keras) HDF5 file.
void unstamped(const fs::path& from, const fs::path& to) {
  auto b = read(from);
  std::fill(b.begin(), b.begin() + 16, '\0');
  write(to, b);
}
std::vector<char> idx(std::uint8_t type, const std::vector<std::uint32_t>& dims, std::size_t elem) {
  std::vector<char> b{0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  std::size_t n = 1;
  for (auto d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>(d >> s));
    n *= d;
  }
  for (std::size_t i = 0; i < n * elem; ++i) b.push_back(static_cast<char>(i * 7));
  return b;
}
std::vector<char> gzip(const std::vector<char>& raw) {
  uLongf n = compressBound(static_cast<uLong>(raw.size())) + 32;
  std::vector<char> out(n);
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  z.avail_in = static_cast<uInt>(raw.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const fs::path root = argv[1];
  for (const char* d : {"weights", "checkpoint", "idx", "cifar10", "json", "npy"}) fs::create_directories(root / d);
  set_random_seed(1);
  // The same architecture as fuzz_weights's model, trained a step so the optimizer has slots.
  Sequential m({layers::Input({8}), layers::Dense(16, {.activation = "relu"}), layers::Dense(4),
                layers::Activation("softmax")});
  m.compile({.optimizer = "adam", .loss = "sparse_categorical_crossentropy"});
  Tensor x = Tensor::random_uniform({8, 8}, 0, 1, 3, float32, Device::cpu());
  Tensor y = Tensor::from_vector(std::vector<std::int32_t>{0, 1, 2, 3, 0, 1, 2, 3}, {8}, Device::cpu());
  m.fit(x, y, {.batch_size = 4, .epochs = 1, .verbose = 0});
  const fs::path w = root / "weights";
  m.save_weights((w / "keras3.weights.h5").string());
  unstamped(w / "keras3.weights.h5", w / "keras3_plain.weights.h5");
  m.save_weights((w / "legacy.h5").string());
  unstamped(w / "legacy.h5", w / "legacy_plain.h5");
  m.save_weights((w / "bf16.weights.h5").string(), {.dtype = bfloat16});
  unstamped(w / "bf16.weights.h5", w / "bf16_plain.weights.h5");
  const fs::path c = root / "checkpoint";
  m.save((c / "full.h5").string());
  unstamped(c / "full.h5", c / "full_plain.h5");
  m.save((c / "model.keras").string());
  {
    mixed_precision::set_global_policy("mixed_float16");
    set_random_seed(2);
    Sequential s({layers::Input({6, 6, 1}), layers::Conv2D(2, {3, 3}), layers::BatchNormalization(),
                  layers::MaxPooling2D({2, 2}), layers::Flatten(), layers::Dropout(0.2), layers::Dense(3)});
    s.compile({.optimizer = "sgd", .loss = "mse"});
    s.save((c / "cnn_mixed.h5").string());
    unstamped(c / "cnn_mixed.h5", c / "cnn_mixed_plain.h5");
    write(root / "json" / "cnn.json", [&] {
      const std::string t = io::model_config_json(s).dump();
      return std::vector<char>(t.begin(), t.end());
    }());
    mixed_precision::set_global_policy("float32");
  }
  const std::string cfg = io::model_config_json(m).dump();
  write(root / "json" / "mlp.json", std::vector<char>(cfg.begin(), cfg.end()));
  const std::string small = R"({"a": [1, 2.5e-3, -0, true, null], "b": {"c": "\u00e9\n"}})";
  write(root / "json" / "small.json", std::vector<char>(small.begin(), small.end()));
  const fs::path i = root / "idx";
  write(i / "images.idx", idx(0x08, {3, 4, 4}, 1));
  write(i / "labels.idx", idx(0x08, {3}, 1));
  write(i / "images.idx.gz", gzip(idx(0x08, {2, 3, 3}, 1)));
  write(i / "floats.idx", idx(0x0D, {2, 3}, 4));
  write(i / "ints.idx", idx(0x0C, {4}, 4));
  std::vector<char> cifar(2 * 3073);
  for (std::size_t k = 0; k < cifar.size(); ++k) cifar[k] = static_cast<char>(k % 3073 == 0 ? k / 3073 : k * 13);
  write(root / "cifar10" / "two.bin", cifar);
  const fs::path n = root / "npy";
  io::save_npy((n / "f32.npy").string(), Tensor::random_uniform({2, 3}, -1, 1, 1, float32, Device::cpu()));
  io::save_npy((n / "i64.npy").string(), Tensor::arange(0, 5, 1, int64, Device::cpu()));
  io::save_npy((n / "f16_3d.npy").string(), Tensor::ones({2, 1, 2}, float16, Device::cpu()));
  io::save_npy((n / "bool0d.npy").string(), Tensor::scalar(1, bool_, Device::cpu()));
  io::save_npy((n / "u8_empty.npy").string(), Tensor::zeros({0, 3}, uint8, Device::cpu()));
  return 0;
}

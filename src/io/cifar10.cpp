#include <filesystem>
#include <fstream>
#include <vector>

#include "io/checked_file.hpp"
#include "mpt/data/data.hpp"
#include "mpt/ops.hpp"

namespace mpt::datasets::cifar10 {
namespace {
constexpr std::int64_t kSide = 32, kPixels = kSide * kSide, kRecord = 1 + 3 * kPixels;
}

std::pair<Tensor, Tensor> read_batch(const std::string& path) {
  io::check_regular_file("cifar10", path);  // a directory or a FIFO: an error, not a hang
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  MPT_CHECK(in.good(), "cifar10: cannot open '", path, "'");
  const auto size = static_cast<std::int64_t>(in.tellg());
  MPT_CHECK(size > 0 && size % kRecord == 0, "cifar10: '", path, "' has ", size,
            " bytes, not a whole number of ", kRecord, "-byte records (is it a CIFAR-10 binary batch?)");
  const std::int64_t n = size / kRecord;
  std::vector<unsigned char> bytes(static_cast<std::size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  MPT_CHECK(in.good(), "cifar10: read error in '", path, "'");
  Tensor x = Tensor::empty({n, kSide, kSide, 3}, float32, Device::cpu());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  float* px = x.data<float>();
  for (std::int64_t r = 0; r < n; ++r) {
    const unsigned char* rec = bytes.data() + r * kRecord;
    MPT_CHECK(rec[0] <= 9, "cifar10: '", path, "' record ", r, " has label ", static_cast<int>(rec[0]),
              " (expected 0..9)");
    labels[static_cast<std::size_t>(r)] = rec[0];
    float* img = px + r * kPixels * 3;
    for (std::int64_t c = 0; c < 3; ++c)  // planar RGB -> channels-last
      for (std::int64_t p = 0; p < kPixels; ++p) img[p * 3 + c] = static_cast<float>(rec[1 + c * kPixels + p]) / 255.0f;
  }
  Tensor y = Tensor::from_vector(labels, {n}, Device::cpu());
  return {x.to(default_device()), y.to(default_device())};
}

Dataset load(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<Tensor> xs, ys;
  for (int i = 1; i <= 5; ++i) {
    fs::path p = fs::path(dir) / ("data_batch_" + std::to_string(i) + ".bin");
    if (!fs::exists(p)) continue;
    auto [x, y] = read_batch(p.string());
    xs.push_back(x), ys.push_back(y);
  }
  MPT_CHECK(!xs.empty(), "cifar10: no data_batch_N.bin files in '", dir,
            "' (download the CIFAR-10 binary version and extract cifar-10-batches-bin)");
  auto [xt, yt] = read_batch((fs::path(dir) / "test_batch.bin").string());
  Dataset d;
  d.x_train = xs.size() == 1 ? xs[0] : ops::concat(xs, 0);
  d.y_train = ys.size() == 1 ? ys[0] : ops::concat(ys, 0);
  d.x_test = xt, d.y_test = yt;
  return d;
}

}  // namespace mpt::datasets::cifar10

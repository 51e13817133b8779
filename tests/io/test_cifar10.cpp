#include <filesystem>
#include <fstream>

#include "test_util.hpp"

using namespace mpt;
namespace fs = std::filesystem;

namespace {
/// Writes `n` records; pixel values follow (record, channel, position) so they can be checked.
void write_batch(const fs::path& p, int n, int first_label) {
  std::ofstream out(p, std::ios::binary);
  for (int r = 0; r < n; ++r) {
    out.put(static_cast<char>((first_label + r) % 10));
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 1024; ++i) out.put(static_cast<char>((r * 7 + c * 50 + i) % 256));
  }
}
}  // namespace

TEST_CASE("CIFAR-10 binary batches: layout, labels, channels-last") {
  fs::path dir = fs::temp_directory_path() / "mpt_test_cifar10";
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_batch(dir / "data_batch_1.bin", 3, 0);
  write_batch(dir / "data_batch_2.bin", 2, 5);
  write_batch(dir / "test_batch.bin", 4, 2);
  auto d = datasets::cifar10::load(dir.string());
  REQUIRE(d.x_train.shape() == Shape{5, 32, 32, 3});
  CHECK(d.x_train.dtype() == float32);
  CHECK(d.y_train.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 1, 2, 5, 6});
  CHECK(d.y_test.to_vector<std::int32_t>() == std::vector<std::int32_t>{2, 3, 4, 5});
  auto x = d.x_train.to_vector<float>();
  for (int r : {0, 4})
    for (int i : {0, 33, 1023})
      for (int c = 0; c < 3; ++c) {
        int rec = r < 3 ? r : r - 3;  // record index inside its batch file
        CHECK(x[(r * 1024 + i) * 3 + c] == doctest::Approx(((rec * 7 + c * 50 + i) % 256) / 255.0));
      }
  // Errors name the file.
  std::ofstream(dir / "bad.bin", std::ios::binary) << "short";
  CHECK_THROWS_WITH_AS(datasets::cifar10::read_batch((dir / "bad.bin").string()), doctest::Contains("bad.bin"), mpt::Error);
  {
    std::ofstream out(dir / "label.bin", std::ios::binary);
    out.put(static_cast<char>(12));
    for (int i = 0; i < 3072; ++i) out.put(0);
  }
  CHECK_THROWS_WITH_AS(datasets::cifar10::read_batch((dir / "label.bin").string()), doctest::Contains("label 12"), mpt::Error);
  CHECK_THROWS_AS(datasets::cifar10::load((dir / "missing").string()), mpt::Error);
  fs::remove_all(dir);
}

// Fashion-MNIST / MNIST loading: the real dataset from the Debian package dataset-fashion-mnist
// (scripts/install_deps.sh installs it; MPT_SKIP_DATASET_TESTS=1 skips that part), and small
// IDX directories written here for the layout, the scaling and every error.
#include <array>
#include <chrono>
#include <cstdlib>
#include <optional>

#include "io/idx_writer.hpp"
#include "test_util.hpp"

using namespace mpt;
using mpt::test::Bytes;

namespace {

bool skip_dataset_tests() {
  const char* v = std::getenv("MPT_SKIP_DATASET_TESTS");
  return v && std::string(v) == "1";
}

// Sets an environment variable for one scope, restoring the old value after.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const std::string& n, const std::optional<std::string>& value) : name(n) {
    if (const char* o = std::getenv(n.c_str())) old = o;
    value ? ::setenv(n.c_str(), value->c_str(), 1) : ::unsetenv(n.c_str());
  }
  ~ScopedEnv() { old ? ::setenv(name.c_str(), old->c_str(), 1) : ::unsetenv(name.c_str()); }
};

// Pixel p of image i: (i * 7 + p) % 256, so every byte value appears.
Bytes images(std::uint32_t n, std::uint32_t rows = 28, std::uint32_t cols = 28) {
  Bytes px(static_cast<std::size_t>(n) * rows * cols);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>((i / (rows * cols)) * 7 + i);
  return mpt::test::idx_bytes(0x08, {n, rows, cols}, px);
}
Bytes labels(std::uint32_t n, std::uint8_t first = 0) {
  Bytes l(n);
  for (std::uint32_t i = 0; i < n; ++i) l[i] = static_cast<std::uint8_t>((first + i) % 10);
  return mpt::test::idx_bytes(0x08, {n}, l);
}

// A directory with the four files: `gz` picks the compressed names.
void write_dataset(const mpt::test::TempDir& dir, std::uint32_t n_train, std::uint32_t n_test, bool gz) {
  auto put = [&](const std::string& name, const Bytes& b) {
    gz ? mpt::test::write_gz(dir.file(name + ".gz"), b) : mpt::test::write_plain(dir.file(name), b);
  };
  put("train-images-idx3-ubyte", images(n_train));
  put("train-labels-idx1-ubyte", labels(n_train));
  put("t10k-images-idx3-ubyte", images(n_test));
  put("t10k-labels-idx1-ubyte", labels(n_test, 3));
}

std::string load_error(const std::string& dir) {
  try {
    datasets::mnist::load(dir);
  } catch (const mpt::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("fashion_mnist::load: the real dataset (Debian package dataset-fashion-mnist)") {
  if (skip_dataset_tests()) {
    MESSAGE("skipped: MPT_SKIP_DATASET_TESTS=1");
    return;
  }
  datasets::Dataset d;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    d = datasets::fashion_mnist::load();
  } catch (const mpt::Error& e) {
    FAIL(std::string(e.what()));  // says: apt-get install dataset-fashion-mnist, or set MPT_FASHION_MNIST_DIR
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("fashion_mnist::load() from ", datasets::fashion_mnist::default_dir(), ": ", seconds, " s");

  CHECK(d.x_train.shape() == Shape{60000, 28, 28, 1});
  CHECK(d.y_train.shape() == Shape{60000});
  CHECK(d.x_test.shape() == Shape{10000, 28, 28, 1});
  CHECK(d.y_test.shape() == Shape{10000});
  CHECK(d.x_train.dtype() == float32);
  CHECK(d.y_train.dtype() == int32);
  CHECK(d.x_test.dtype() == float32);
  CHECK(d.y_test.dtype() == int32);

  for (const Tensor* x : {&d.x_train, &d.x_test}) {
    std::vector<float> v = x->to_vector<float>();
    float lo = 1, hi = 0;
    std::size_t not_a_byte = 0;
    for (float f : v) {
      lo = std::min(lo, f);
      hi = std::max(hi, f);
      const float k = std::round(f * 255.0f);
      not_a_byte += (f != k / 255.0f);
    }
    CHECK(lo == 0.0f);
    CHECK(hi == 1.0f);
    CHECK(not_a_byte == 0);  // every value is exactly byte / 255
  }
  for (auto [y, per_class] : {std::pair{&d.y_train, 6000}, std::pair{&d.y_test, 1000}}) {
    std::array<int, 10> hist{};
    int out_of_range = 0;
    for (std::int32_t c : y->to_vector<std::int32_t>()) {
      if (c < 0 || c > 9) ++out_of_range;
      else ++hist[static_cast<std::size_t>(c)];
    }
    CHECK(out_of_range == 0);
    for (int c = 0; c < 10; ++c) CHECK_MESSAGE(hist[static_cast<std::size_t>(c)] == per_class, "class ", c);
  }
}

TEST_CASE("mnist::load: layout, scaling, plain and .gz names") {
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    mpt::test::TempDir dir(gz ? "mnist_gz" : "mnist_plain");
    write_dataset(dir, 5, 3, gz);
    datasets::Dataset d = datasets::mnist::load(dir.path.string());
    CHECK(d.x_train.shape() == Shape{5, 28, 28, 1});
    CHECK(d.x_test.shape() == Shape{3, 28, 28, 1});
    CHECK(d.x_train.device() == default_device());
    CHECK(d.y_train.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 1, 2, 3, 4});
    CHECK(d.y_test.to_vector<std::int32_t>() == std::vector<std::int32_t>{3, 4, 5});
    std::vector<float> x = d.x_train.to_vector<float>();
    for (std::size_t i = 0; i < x.size(); ++i) {
      const auto byte = static_cast<std::uint8_t>((i / 784) * 7 + i);
      if (x[i] != static_cast<float>(byte) / 255.0f) {
        FAIL_CHECK("pixel ", i, ": ", x[i], " instead of ", int(byte), " / 255");
        break;
      }
    }
  }
}

TEST_CASE("mnist::load: a .gz file wins over the uncompressed one") {
  mpt::test::TempDir dir("mnist_both");
  write_dataset(dir, 4, 2, false);
  mpt::test::write_gz(dir.file("train-labels-idx1-ubyte.gz"), labels(4, 5));
  mpt::test::write_gz(dir.file("train-images-idx3-ubyte.gz"), images(4));
  CHECK(datasets::mnist::load(dir.path.string()).y_train.to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{5, 6, 7, 8});
}

TEST_CASE("fashion_mnist: default_dir and MPT_FASHION_MNIST_DIR") {
  {
    ScopedEnv env("MPT_FASHION_MNIST_DIR", std::nullopt);
    CHECK(datasets::fashion_mnist::default_dir() == "/usr/share/datasets/fashion-mnist");
  }
  mpt::test::TempDir dir("fmnist_env");
  write_dataset(dir, 2, 1, true);
  ScopedEnv env("MPT_FASHION_MNIST_DIR", dir.path.string());
  CHECK(datasets::fashion_mnist::default_dir() == dir.path.string());
  CHECK(datasets::fashion_mnist::load().x_train.shape() == Shape{2, 28, 28, 1});
}

TEST_CASE("fashion_mnist / mnist: a missing directory or file says how to get the data") {
  try {
    datasets::fashion_mnist::load("/nonexistent/fashion-mnist");
    FAIL(std::string("no error for a missing directory"));
  } catch (const mpt::Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("/nonexistent/fashion-mnist/train-images-idx3-ubyte.gz") != std::string::npos);
    CHECK(msg.find("apt-get install dataset-fashion-mnist") != std::string::npos);
    CHECK(msg.find("MPT_FASHION_MNIST_DIR") != std::string::npos);
  }
  mpt::test::TempDir dir("mnist_missing");
  write_dataset(dir, 2, 1, true);
  std::filesystem::remove(dir.file("t10k-labels-idx1-ubyte.gz"));
  const std::string msg = load_error(dir.path.string());
  CHECK(msg.find("t10k-labels-idx1-ubyte") != std::string::npos);
  CHECK(load_error("").find("directory") != std::string::npos);
}

TEST_CASE("mnist::load: bad contents are errors naming the file") {
  struct Case {
    const char* name;
    const char* file;
    Bytes bytes;
    const char* expect;
  };
  Bytes label_10 = labels(3);
  label_10.back() = 10;
  const std::vector<Case> cases{
      {"label > 9", "train-labels-idx1-ubyte", label_10, "label 10 at index 2"},
      {"count mismatch", "train-labels-idx1-ubyte", labels(4), "holds 3 images but"},
      {"not 28x28", "train-images-idx3-ubyte", images(3, 28, 27), "28 x 28"},
      {"labels not uint8", "train-labels-idx1-ubyte", mpt::test::idx_bytes(0x0C, {3}, Bytes(12, 0)), "uint8 labels"},
      {"images 2-d", "train-images-idx3-ubyte", mpt::test::idx_bytes(0x08, {3, 784}, Bytes(3 * 784, 0)), "uint8 images"},
      {"truncated", "t10k-images-idx3-ubyte", mpt::test::idx_bytes(0x08, {1, 28, 28}, Bytes(700, 0)), "truncated"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    mpt::test::TempDir dir("mnist_bad");
    write_dataset(dir, 3, 1, false);
    mpt::test::write_plain(dir.file(c.file), c.bytes);
    const std::string msg = load_error(dir.path.string());
    CHECK_MESSAGE(msg.find(c.expect) != std::string::npos, msg);
    CHECK_MESSAGE(msg.find(c.file) != std::string::npos, msg);
  }
}

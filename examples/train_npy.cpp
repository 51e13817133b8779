// Trains a classifier from NumPy .npy files, as Keras users keep their data: x [N, ...] (float32,
// float64, float16 or uint8; uint8 is scaled by 1/255) and y [N] or [N, 1] integer class labels
// (int32, int64 or uint8). The input shape comes from x, the number of classes from max(y) + 1.
// The model is model A (Flatten -> Dense 512 relu -> Dense 512 relu -> Dense C -> softmax),
// Adam 1e-3, under a global dtype policy.
//
//   ./train_npy --x train_x.npy --y train_y.npy [--x-test test_x.npy --y-test test_y.npy]
//               [--policy mixed_bfloat16] [--epochs 3] [--batch-size 128] [--seed 1] [--limit N]
//   ./train_npy --export-fashion-mnist DIR [--epochs 1 --limit 2048]
//   ./train_npy --x big_x.npy --y big_y.npy --stream [--workers 2]
//
// --export-fashion-mnist DIR first writes Fashion-MNIST as DIR/{train,test}_{x,y}.npy (x float32
// [N, 28, 28, 1] in [0, 1], y int64 [N]; np.load reads them) and trains from those files.
// scripts/make_npy.py writes the same files with NumPy itself. Prints `test_accuracy=<v>` (or
// `train_accuracy=<v>` when no test files are given).
//
// --stream trains on the training files memory-mapped (io::load_npy {.mmap = true}) through a
// data::Dataset whose batches --workers threads slice and convert while the model trains: the
// training set may be larger than memory (scripts/bounded_memory.sh runs it under a cgroup
// memory limit a third of the file's size). It prints the process's peak resident memory as
// `peak_rss_mb=<v>`.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>

#include <mpt/io/npy.hpp>
#include <mpt/mpt.hpp>

#include "flags.hpp"

namespace layers = mpt::layers;

namespace {

std::string shape_str(const mpt::Shape& s) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

struct BadData : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// x as float32 [N, ...] with at least one feature axis.
mpt::Tensor prepare_x(const mpt::Tensor& x, const std::string& path) {
  if (x.dim() < 2)
    throw BadData(path + ": x must be [N, features...] with one row per example, not shape " + shape_str(x.shape()));
  if (x.size(0) == 0) throw BadData(path + ": x has no rows (shape " + shape_str(x.shape()) + ")");
  switch (x.dtype()) {
    case mpt::float32: return x;
    case mpt::float64:
    case mpt::float16:
    case mpt::bfloat16: return x.to(mpt::float32);
    case mpt::uint8: return x.to(mpt::float32) / 255.0;
    default:
      throw BadData(path + ": x has dtype " + mpt::to_string(x.dtype()) +
                    "; expected float32, float64, float16 or uint8 (uint8 is scaled by 1/255)");
  }
}

// y as int32 [N]; checks the labels are >= 0 and returns max(y) in `max_label`.
mpt::Tensor prepare_y(const mpt::Tensor& y, const std::string& path, std::int64_t n, std::int64_t& max_label) {
  if (!(y.dtype() == mpt::int32 || y.dtype() == mpt::int64 || y.dtype() == mpt::uint8))
    throw BadData(path + ": y has dtype " + mpt::to_string(y.dtype()) +
                  "; expected integer class labels (int32, int64 or uint8), e.g. np.save(path, y.astype('int64'))");
  mpt::Tensor flat = y;
  if (y.dim() == 2 && y.size(1) == 1) flat = y.reshape({y.size(0)});
  if (flat.dim() != 1)
    throw BadData(path + ": y must be [N] or [N, 1] class labels, not shape " + shape_str(y.shape()) +
                  " (one-hot labels: save np.argmax(y, axis=1))");
  if (flat.size(0) != n)
    throw BadData(path + ": y has " + std::to_string(flat.size(0)) + " labels but x has " + std::to_string(n) + " rows");
  auto v = flat.to_vector<std::int64_t>();
  max_label = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0) throw BadData(path + ": label " + std::to_string(v[i]) + " at row " + std::to_string(i) + " is negative");
    max_label = std::max(max_label, v[i]);
  }
  return flat.to(mpt::int32);
}

void export_fashion_mnist(const std::string& dir) {
  auto data = mpt::datasets::fashion_mnist::load();
  std::filesystem::create_directories(dir);
  mpt::io::save_npy(dir + "/train_x.npy", data.x_train);
  mpt::io::save_npy(dir + "/train_y.npy", data.y_train.to(mpt::int64));
  mpt::io::save_npy(dir + "/test_x.npy", data.x_test);
  mpt::io::save_npy(dir + "/test_y.npy", data.y_test.to(mpt::int64));
  std::printf("wrote %s/{train,test}_{x,y}.npy: train_x %s float32, test_x %s float32, labels int64\n", dir.c_str(),
              shape_str(data.x_train.shape()).c_str(), shape_str(data.x_test.shape()).c_str());
}

/// The training rows of memory-mapped x and y, batch by batch, as prepare_x and prepare_y make
/// them (float32 x, uint8 scaled by 1/255; int32 labels).
class StreamedNpy : public mpt::data::Dataset {
 public:
  StreamedNpy(const std::string& x_path, const std::string& y_path, std::int64_t batch_size, std::int64_t limit)
      : x_(mpt::io::load_npy(x_path, mpt::io::NpyLoadOptions{.mmap = true})),
        y_(mpt::io::load_npy(y_path, mpt::io::NpyLoadOptions{.mmap = true})), x_path_(x_path), batch_size_(batch_size) {
    if (x_.dim() < 2 || x_.size(0) == 0) throw BadData(x_path + ": x must be [N, features...], not shape " + shape_str(x_.shape()));
    std::int64_t max_label = 0;
    y_ = prepare_y(y_, y_path, x_.size(0), max_label);  // the labels, read once (small)
    num_classes = std::max<std::int64_t>(max_label + 1, 2);
    rows = limit > 0 ? std::min(limit, x_.size(0)) : x_.size(0);
  }
  std::int64_t size() const override { return (rows + batch_size_ - 1) / batch_size_; }
  mpt::data::Batch get(std::int64_t index) override {
    const std::int64_t b = index * batch_size_, e = std::min(rows, b + batch_size_);
    // A copy of the rows (prepare_x converts other dtypes into a new tensor and returns float32
    // rows as they are), so the batch owns its memory and the mapped pages can be dropped again.
    mpt::Tensor x = prepare_x(x_.slice(b, e), x_path_);
    if (x_.dtype() == mpt::float32) x = x.copy();
    return {x, y_.slice(b, e), mpt::Tensor()};
  }
  std::int64_t num_classes = 2, rows = 0;
  mpt::Shape input_shape() const { return mpt::Shape(x_.shape().begin() + 1, x_.shape().end()); }

 private:
  mpt::Tensor x_, y_;
  std::string x_path_;
  std::int64_t batch_size_;
};

/// VmHWM of /proc/self/status in MiB (0 where it cannot be read).
double peak_rss_mb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lf kB", &kb) == 1) break;
  std::fclose(f);
  return kb / 1024.0;
}

/// The training (and optional test) arrays, checked against each other.
struct Dataset {
  mpt::Tensor x, y, x_test, y_test;
  std::int64_t num_classes = 2;
  mpt::Shape input_shape;  // per row
};

Dataset load_dataset(const std::string& x_path, const std::string& y_path, const std::string& x_test_path,
                     const std::string& y_test_path, std::int64_t limit) {
  Dataset d;
  d.x = prepare_x(mpt::io::load_npy(x_path), x_path);
  std::int64_t max_label = 0;
  d.y = prepare_y(mpt::io::load_npy(y_path), y_path, d.x.size(0), max_label);
  if (limit > 0 && limit < d.x.size(0)) {
    d.x = d.x.slice(0, limit);
    d.y = d.y.slice(0, limit);
    max_label = 0;
    for (auto v : d.y.to_vector<std::int64_t>()) max_label = std::max(max_label, v);
  }
  d.num_classes = std::max<std::int64_t>(max_label + 1, 2);
  d.input_shape = mpt::Shape(d.x.shape().begin() + 1, d.x.shape().end());
  if (x_test_path.empty()) return d;
  d.x_test = prepare_x(mpt::io::load_npy(x_test_path), x_test_path);
  mpt::Shape test_shape(d.x_test.shape().begin() + 1, d.x_test.shape().end());
  if (test_shape != d.input_shape)
    throw BadData(x_test_path + ": test rows have shape " + shape_str(test_shape) + " but training rows have " +
                  shape_str(d.input_shape));
  std::int64_t max_test = 0;
  d.y_test = prepare_y(mpt::io::load_npy(y_test_path), y_test_path, d.x_test.size(0), max_test);
  if (max_test >= d.num_classes)
    throw BadData(y_test_path + ": label " + std::to_string(max_test) + " is not among the " +
                  std::to_string(d.num_classes) + " classes seen in training (0.." + std::to_string(d.num_classes - 1) +
                  ")");
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  bool distributed = false, stream = false;
  int workers = 2;
  std::string policy = "mixed_bfloat16", x_path, y_path, x_test_path, y_test_path, export_dir;
  int epochs = 3;
  std::int64_t batch_size = 128, limit = 0;
  std::uint64_t seed = 1;
  CLI::App app{"Trains model A (an MLP classifier) from NumPy .npy files"};
  app.add_option("--x", x_path, "training inputs: .npy [N, ...] float32/float64/float16/uint8");
  app.add_option("--y", y_path, "training labels: .npy [N] or [N, 1] int32/int64/uint8");
  app.add_option("--x-test", x_test_path, "test inputs (.npy)");
  app.add_option("--y-test", y_test_path, "test labels (.npy)");
  app.add_option("--export-fashion-mnist", export_dir,
                 "write Fashion-MNIST as DIR/{train,test}_{x,y}.npy first and train from those files");
  examples::add_policy(app, policy);
  app.add_option("--epochs", epochs, "epochs to train")->check(examples::kPositive)->capture_default_str();
  app.add_option("--batch-size", batch_size, "batch size")->check(examples::kPositive)->capture_default_str();
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--limit", limit, "use only the first N training rows")->check(examples::kPositive);
  app.add_flag("--stream", stream,
               "train on the training files memory-mapped, batch by batch (data larger than memory)");
  app.add_option("--workers", workers, "with --stream: threads preparing batches ahead")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  examples::add_distributed(app, distributed);
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  examples::start_distributed(distributed);
  const bool chief = mpt::distributed::is_chief();  // rank 0 (or the only process) prints
  try {
    if (!export_dir.empty()) {
      if (!x_path.empty() || !y_path.empty() || !x_test_path.empty() || !y_test_path.empty())
        throw BadData("--export-fashion-mnist sets --x, --y, --x-test and --y-test itself; give either it or those");
      export_fashion_mnist(export_dir);
      x_path = export_dir + "/train_x.npy";
      y_path = export_dir + "/train_y.npy";
      x_test_path = export_dir + "/test_x.npy";
      y_test_path = export_dir + "/test_y.npy";
    }
    if (x_path.empty() || y_path.empty())
      throw BadData("--x and --y are required (or --export-fashion-mnist DIR); see --help");
    if (x_test_path.empty() != y_test_path.empty())
      throw BadData("--x-test and --y-test go together: give both or neither");

    mpt::set_random_seed(seed);
    mpt::mixed_precision::set_global_policy(policy);
    if (stream) {
      if (distributed) throw BadData("--stream does not run with --distributed yet");
      StreamedNpy train(x_path, y_path, batch_size, limit);
      std::printf("streaming %lld rows of shape %s (memory-mapped), %lld classes, policy %s, %d workers\n",
                  static_cast<long long>(train.rows), shape_str(train.input_shape()).c_str(),
                  static_cast<long long>(train.num_classes), policy.c_str(), workers);
      mpt::Sequential model({layers::Input(train.input_shape()), layers::Flatten(),
                             layers::Dense(512, {.activation = "relu"}), layers::Dense(512, {.activation = "relu"}),
                             layers::Dense(train.num_classes), layers::Activation("softmax")});
      model.compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-3}),
                     .loss = "sparse_categorical_crossentropy",
                     .metrics = {"accuracy"}});
      const auto h = model.fit(train, {.epochs = epochs, .workers = workers, .max_queue_size = 4});
      std::printf("train_accuracy=%.4f\npeak_rss_mb=%.1f\n", h.history.at("accuracy").back(), peak_rss_mb());
      return 0;
    }

    const Dataset d = load_dataset(x_path, y_path, x_test_path, y_test_path, limit);
    const mpt::Tensor &x = d.x, &y = d.y, &x_test = d.x_test, &y_test = d.y_test;
    const std::int64_t num_classes = d.num_classes;
    const mpt::Shape& input_shape = d.input_shape;
    if (chief) std::printf("training on %lld rows of shape %s, %lld classes, policy %s\n", static_cast<long long>(x.size(0)),
                shape_str(input_shape).c_str(), static_cast<long long>(num_classes), policy.c_str());

    mpt::Sequential model({
        layers::Input(input_shape),
        layers::Flatten(),
        layers::Dense(512, {.activation = "relu"}),
        layers::Dense(512, {.activation = "relu"}),
        layers::Dense(num_classes),
        layers::Activation("softmax"),
    });
    model.compile({.optimizer = mpt::optimizers::Adam({.learning_rate = 1e-3}),
                   .loss = "sparse_categorical_crossentropy",
                   .metrics = {"accuracy"}});
    model.fit(x, y, {.batch_size = batch_size, .epochs = epochs});
    if (x_test.defined()) {
      auto scores = model.evaluate(x_test, y_test, {.batch_size = 512});
      if (chief) std::printf("test loss %.4f\ntest_accuracy=%.4f\n", scores["loss"], scores["accuracy"]);
    } else {
      auto scores = model.evaluate(x, y, {.batch_size = 512});
      if (chief) std::printf("no --x-test/--y-test: accuracy on the training data\ntrain_accuracy=%.4f\n", scores["accuracy"]);
    }
  } catch (const BadData& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const mpt::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

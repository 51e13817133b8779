#pragma once
/// Data: the Fashion-MNIST / MNIST IDX readers and batching with a seeded shuffle.
///
///   auto data = mpt::datasets::fashion_mnist::load();   // x: float32 [N,28,28,1] in [0,1]
///   for (auto [x, y] : mpt::data::batches(data.x_train, data.y_train,
///                                         {.batch_size = 128, .shuffle = true, .seed = 1})) { ... }
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt {

namespace io {
/// Reads an IDX file (optionally gzip-compressed; detected from its bytes): uint8 images
/// [N, rows, cols] or labels [N], or any IDX type (uint8/int8/int16/int32/float32/float64),
/// returned as a CPU tensor of the matching dtype (int8/int16 widen to int32). 1 to 8
/// dimensions; a size-0 dimension gives an empty tensor. The file must hold exactly the
/// bytes its header declares: missing, unreadable, truncated, malformed or corrupt-gzip files
/// and trailing bytes after the data are an mpt::Error naming the file and what is wrong
/// (bytes after the end of a gzip stream are ignored, as zlib does). A corrupt header never
/// causes a large allocation: sizes are checked against what the file can hold first.
Tensor read_idx(const std::string& path);
}  // namespace io

namespace datasets {

struct Dataset {
  Tensor x_train, y_train, x_test, y_test;
};

namespace fashion_mnist {
/// Where load() looks: $MPT_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist (the
/// Debian package dataset-fashion-mnist).
std::string default_dir();
/// x_*: float32 [N, 28, 28, 1] scaled to [0, 1] (x / 255); y_*: int32 [N] in [0, 9]; on
/// default_device(). Reads train-images-idx3-ubyte, train-labels-idx1-ubyte,
/// t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each with or without ".gz" (an empty
/// `dir` means default_dir()). A missing file is an mpt::Error that says how to get it
/// (apt-get install dataset-fashion-mnist, or MPT_FASHION_MNIST_DIR); image/label count
/// mismatches, images that are not 28x28 and labels above 9 are errors too.
Dataset load(const std::string& dir = "");
}  // namespace fashion_mnist

namespace mnist {
/// The same IDX layout, files and checks as Fashion-MNIST, from `dir`
/// (train-images-idx3-ubyte[.gz], ...).
Dataset load(const std::string& dir);
}  // namespace mnist

namespace cifar10 {
/// One CIFAR-10 binary batch (records of 1 label byte + 3072 bytes: 32x32 R, G, B planes):
/// x float32 [N, 32, 32, 3] (channels-last) scaled to [0, 1], y int32 [N]. A missing file, a
/// size that is not a whole number of records, or a label > 9 is an mpt::Error naming the file.
std::pair<Tensor, Tensor> read_batch(const std::string& path);
/// data_batch_1.bin ... data_batch_5.bin and test_batch.bin from `dir` (the "CIFAR-10 binary
/// version"); the train batches present are concatenated in order.
Dataset load(const std::string& dir);
}  // namespace cifar10

}  // namespace datasets

namespace data {

/// Rows of x at `indices` along the first axis (a new tensor on x's device, of x's dtype,
/// shape [indices.size(), x.shape()[1:]...]; not recorded on a tape). Indices may repeat and
/// must lie in [0, x.shape()[0]) (mpt::Error otherwise). The gather fit and batches use.
Tensor take_rows(const Tensor& x, const std::vector<std::int64_t>& indices);

/// Rows [begin, end) of t: a view when `order` is empty, else the rows order[begin, end)
/// gathered into a copy (take_rows). Undefined for an undefined t.
Tensor rows_of(const Tensor& t, const std::vector<std::int64_t>& order, std::int64_t begin, std::int64_t end);

/// Batches of batch_size that cover n rows (the last one partial): ceil(n / batch_size).
std::int64_t batch_count(std::int64_t n, std::int64_t batch_size);

struct BatchOptions {
  std::int64_t batch_size = 32;  ///< must be positive
  bool shuffle = false;
  std::uint64_t seed = 0;   ///< shuffles reproduce for the same seed, on every machine
  bool drop_remainder = false;
  /// Where batches are delivered; unset: the device the data is on.
  std::optional<Device> device = std::nullopt;
  /// With integer labels y: the number of classes they must lie in ([0, num_classes)).
  std::optional<std::int64_t> num_classes = std::nullopt;
};

/// The data checks fit and evaluate run once per call, and Batches once at construction, so
/// that no training step reads labels or values back from a device: mpt::Error (naming
/// `where`, `what` and the first bad sample) when t holds inf or NaN ...
void check_finite(const char* where, const char* what, const Tensor& t);
/// ... or when integer labels y fall outside [0, num_classes) (num_classes < 0: only >= 0); with
/// num_classes >= 0, float labels too must be whole numbers in that range (Keras takes 3.0 for
/// class 3; 1.5 is an error rather than silently class 1) ...
void check_labels(const char* where, const Tensor& y, std::int64_t num_classes);
/// ... or when binary targets fall outside [0, 1].
void check_unit_interval(const char* where, const Tensor& y);

/// Iterable over (x, y) batches of the first axis; the last batch may be smaller unless
/// drop_remainder. The shuffle order is drawn once, at construction, from `seed` (iterating
/// twice gives the same batches: make a new Batches with another seed for the next epoch).
/// Unshuffled batches are views of the data (no copy); shuffled ones are gathered copies.
/// The data is checked once at construction (check_finite on x and y, check_labels on integer
/// y), so a custom loop needs no per-step check.
class Batches {
 public:
  Batches(Tensor x, Tensor y, BatchOptions options);
  struct Iterator {
    const Batches* owner;
    std::int64_t index;
    std::pair<Tensor, Tensor> operator*() const;
    Iterator& operator++() { ++index; return *this; }
    bool operator!=(const Iterator& o) const { return index != o.index; }
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size()}; }
  /// Number of batches.
  std::int64_t size() const;
  std::pair<Tensor, Tensor> batch(std::int64_t i) const;

 private:
  Tensor x_, y_;
  BatchOptions o_;
  std::vector<std::int64_t> order_;  // empty: in order
};

/// x and y must have the same first dimension (mpt::Error otherwise); y may be undefined.
Batches batches(const Tensor& x, const Tensor& y, BatchOptions options = {});

/// A permutation of [0, n) from `seed` (the same on every machine).
std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed);

}  // namespace data
}  // namespace mpt

#pragma once
/// Data larger than memory: Keras's PyDataset in C++, and the datasets mpt gives.
///
///   struct Shards : mpt::data::Dataset {                        // Keras: keras.utils.PyDataset
///     std::int64_t size() const override { return n_batches; }  // batches per epoch (-1: unknown)
///     mpt::data::Batch get(std::int64_t index) override;        // {x, y} or {x, y, sample_weight}
///     void on_epoch_end() override {}
///   };
///   Shards train;
///   model.fit(train, {.epochs = 3, .workers = 2, .max_queue_size = 8});
///
///   auto tokens = mpt::io::load_npy("tokens.npy", {.mmap = true});   // one long int32 array
///   mpt::data::TokenWindows windows(tokens, {.seq_len = 128, .batch_size = 32});
///   model.fit(windows, {.epochs = 10});
///
/// fit, evaluate and predict take a Dataset wherever they take tensors. Its batches are asked for
/// by index, in order (fit's shuffle permutes the indices of each epoch, from fit's seed), by
/// `workers` threads that prepare up to `max_queue_size` batches ahead while the current one
/// trains, and copy them to the model's device there; workers = 0 calls get() on the training
/// thread. An exception thrown by get() reaches the caller as an mpt::Error with its message and
/// the batch's index, at the next batch fit asks for; a fit that ends (or throws) stops and joins
/// its workers. Under data parallelism each rank takes every W-th batch of fit's order (rank r
/// positions r, r + W, ...): disjoint shares covering each epoch.
#include <cstdint>
#include <string>
#include <vector>

#include "mpt/tensor.hpp"
#include "mpt/tensors.hpp"

namespace mpt::data {

/// One batch: x, y (undefined for predict) and optional per-example weights. A model with
/// several inputs takes them in xs (x undefined), one with several outputs its targets in ys (y
/// undefined), in the model's order, every array with the same number of rows:
///   Batch{x, y}, Batch{x, y, w}, Batch{.xs = {a, b}, .ys = {y1, y2}}, Batch{.y = y, .xs = {a, b}}
/// One sample_weight weighs every output's loss (as Keras's single sample_weight array).
struct Batch {
  Tensor x, y, sample_weight;
  std::vector<Tensor> xs = {}, ys = {};
  /// xs when given, else {x} ({} when x is undefined too).
  std::vector<Tensor> inputs() const { return xs.empty() ? Tensors(x).list() : xs; }
  /// ys when given, else {y} ({} when y is undefined too).
  std::vector<Tensor> targets() const { return ys.empty() ? Tensors(y).list() : ys; }
};

/// Keras's PyDataset: batches by index.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Batches in one epoch (Keras's __len__); -1: unknown, an endless stream, for which fit needs
  /// steps_per_epoch and evaluate and predict need steps (the index then keeps growing across
  /// epochs).
  virtual std::int64_t size() const = 0;
  /// Batch `index`, in [0, size()) (Keras's __getitem__). With workers > 0 it is called from
  /// worker threads, several at once, so it must be safe to call concurrently (reading files,
  /// slicing tensors and making new ones are). x or xs (and y or ys for fit and evaluate) must be
  /// defined, one array per model input (output), all with the same number of rows.
  virtual Batch get(std::int64_t index) = 0;
  /// Called after each epoch of fit, and at the end of evaluate and predict, while no get() runs.
  virtual void on_epoch_end() {}
};

/// Batches of in-memory tensors, in order: rows [i·batch_size, (i+1)·batch_size) of x, y and
/// sample_weight (views, no copies); the last batch partial. fit on it takes the steps fit on
/// the tensors themselves takes (without shuffling). Several inputs or targets, as fit's:
/// TensorDataset({a, b}, {y1, y2}, 32) gives batches of xs and ys (one array: x and y).
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor x, Tensor y, std::int64_t batch_size, Tensor sample_weight = {});
  TensorDataset(Tensors x, Tensors y, std::int64_t batch_size, Tensor sample_weight = {});
  std::int64_t size() const override;
  Batch get(std::int64_t index) override;

 private:
  std::vector<Tensor> x_, y_;
  Tensor w_;
  std::int64_t batch_size_;
};

/// Rows of several .npy shards (x_files[i] with y_files[i], the same number of rows; y_files may
/// be empty) as one sequence, batched in order across shard boundaries; each shard memory-mapped
/// (io::load_npy {.mmap = true}), so the shards' total may exceed memory. Every shard must have
/// the same row shape and dtype (mpt::Error naming the file otherwise).
class NpyDataset : public Dataset {
 public:
  NpyDataset(const std::vector<std::string>& x_files, const std::vector<std::string>& y_files,
             std::int64_t batch_size);
  std::int64_t size() const override;
  Batch get(std::int64_t index) override;
  /// Rows in all shards.
  std::int64_t rows() const { return rows_; }

 private:
  Tensor rows_of(const std::vector<Tensor>& shards, std::int64_t begin, std::int64_t end) const;
  std::vector<Tensor> x_, y_;
  std::vector<std::int64_t> starts_;  // first row of each shard
  std::int64_t rows_ = 0, batch_size_;
};

struct TokenWindowsOptions {
  std::int64_t seq_len = 128;    ///< T: tokens per window
  std::int64_t batch_size = 32;  ///< windows per batch
  /// Tokens between the starts of consecutive windows (default: seq_len, windows that do not
  /// overlap).
  std::int64_t stride = 0;
  /// Each epoch's windows in a new order, drawn from seed and the epoch (a permutation of all
  /// windows, so batches mix windows from all over the array).
  bool shuffle = false;
  std::uint64_t seed = 0;
};

/// Fixed-length windows of one long token array (1-D, integer): window w starts at w·stride; x
/// holds its T tokens, y the T tokens after each (x shifted by one), both int32 [batch, T]. The
/// transformer case: `tokens` may be a memory-mapped array of billions of tokens.
class TokenWindows : public Dataset {
 public:
  TokenWindows(Tensor tokens, TokenWindowsOptions options = {});
  std::int64_t size() const override;
  Batch get(std::int64_t index) override;
  void on_epoch_end() override;
  /// Windows in one epoch.
  std::int64_t windows() const { return windows_; }

 private:
  Tensor tokens_;
  TokenWindowsOptions o_;
  std::int64_t windows_ = 0;
  std::uint64_t epoch_ = 0;
  std::vector<std::int64_t> order_;  // this epoch's window order (shuffle only)
};

}  // namespace mpt::data

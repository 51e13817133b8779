#pragma once
// Batches of (x, y, sample_weight) for fit, evaluate and predict, on the model's device; x and
// y are lists (one array per model input and output).
#include <cstdint>
#include <future>
#include <utility>
#include <vector>

#include "mpt/distributed.hpp"
#include "mpt/tensor.hpp"

namespace mpt::detail {

/// One batch: every input, the targets and the sample weights where given (empty / undefined
/// otherwise); all empty on a rank with no rows of the batch.
struct StagedBatch {
  std::vector<Tensor> x, y;
  Tensor w;
};

/// Batches of (x, y, sample_weight) on the model's device, in order or by a shuffled order. When the data
/// lives elsewhere (host data, a model on a GPU), the next batch is gathered and copied on a
/// background thread while the current one trains; data already on the device is sliced or
/// gathered in place, synchronously (a helper thread would only take a core from the kernels).
class BatchStager {
 public:
  /// Under a strategy each rank takes its share of every (global) batch. y may be empty and w
  /// undefined; w (sample weights) shards with x and y. Every array has x[0]'s rows, and the
  /// same rows of each go in a batch (one order for all).
  BatchStager(std::vector<Tensor> x, std::vector<Tensor> y, Tensor w, std::int64_t batch_size, std::vector<std::int64_t> order, Device device,
              const distributed::DataParallel* strategy = nullptr);

  /// Batch `step`; steps are asked for in order, up to `end` (exclusive; default: all batches),
  /// which bounds the batch staged ahead.
  StagedBatch get(std::int64_t step, std::int64_t end = -1);
  /// Rows of batch `step` over all ranks.
  std::int64_t global_rows(std::int64_t step) const;
  /// This rank's rows of batch `step`: [begin, end) of the (shuffled) order.
  std::pair<std::int64_t, std::int64_t> range(std::int64_t step) const;
  std::int64_t rows(std::int64_t step) const;

 private:
  StagedBatch make(std::int64_t step) const;

  std::vector<Tensor> x_, y_;
  Tensor w_;
  std::int64_t batch_size_;
  std::vector<std::int64_t> order_;
  Device device_;
  std::int64_t steps_;
  bool ahead_;
  std::future<StagedBatch> next_;
  std::int64_t next_step_ = -1;
  const distributed::DataParallel* strategy_;
};

}  // namespace mpt::detail

#pragma once
// Batches of a data::Dataset for fit, evaluate and predict, in order, prepared ahead by worker
// threads (Keras's OrderedEnqueuer, with threads).
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mpt/data/dataset.hpp"

namespace mpt::detail {

class DatasetFeeder {
 public:
  /// Feeds ds.get(indices[0]), ds.get(indices[1]), ... in that order, each passed through
  /// `prepare` (checks, the copy to the model's device) where it was made. workers > 0 threads
  /// prepare up to max_queue batches ahead of the one next() hands out; workers = 0: next()
  /// makes its batch itself. `where` names the caller in errors ("fit").
  DatasetFeeder(data::Dataset& ds, std::vector<std::int64_t> indices, int workers, std::int64_t max_queue,
                std::function<data::Batch(data::Batch)> prepare, std::string where);
  /// Stops the workers and waits for them: a worker inside get() finishes that call first.
  ~DatasetFeeder();
  DatasetFeeder(const DatasetFeeder&) = delete;
  DatasetFeeder& operator=(const DatasetFeeder&) = delete;

  /// The next batch. A get() or prepare that threw, for this batch or any later one a worker
  /// already tried, is an mpt::Error here: "<where>: batch <index> of the dataset failed: <its
  /// message>".
  data::Batch next();

 private:
  void work();
  void stop_workers();
  data::Batch make(std::int64_t pos);
  [[noreturn]] void raise(std::exception_ptr e, std::int64_t index) const;

  data::Dataset& ds_;
  std::vector<std::int64_t> indices_;
  std::int64_t max_queue_;
  std::function<data::Batch(data::Batch)> prepare_;
  std::string where_;

  std::mutex mutex_;
  std::condition_variable work_cv_, ready_cv_;
  std::int64_t claimed_ = 0;   // the next position a worker takes
  std::int64_t consumed_ = 0;  // the next position next() hands out
  std::map<std::int64_t, data::Batch> ready_;
  std::exception_ptr error_;
  std::int64_t error_index_ = -1;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace mpt::detail

#include "data/feeder.hpp"

#include <algorithm>

#include "mpt/error.hpp"

namespace mpt::detail {

DatasetFeeder::DatasetFeeder(data::Dataset& ds, std::vector<std::int64_t> indices, int workers, std::int64_t max_queue,
                             std::function<data::Batch(data::Batch)> prepare, std::string where)
    : ds_(ds), indices_(std::move(indices)), max_queue_(std::max<std::int64_t>(1, max_queue)),
      prepare_(std::move(prepare)), where_(std::move(where)) {
  MPT_CHECK(workers >= 0, where_, ": workers must be >= 0, got ", workers);
  MPT_CHECK(max_queue >= 1, where_, ": max_queue_size must be positive, got ", max_queue);
  const auto n = static_cast<std::int64_t>(indices_.size());
  const int threads = static_cast<int>(std::min<std::int64_t>(workers, n));
  try {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { work(); });
  } catch (...) {  // a thread that could not start: stop the ones that did
    stop_workers();
    throw;
  }
}

DatasetFeeder::~DatasetFeeder() { stop_workers(); }

void DatasetFeeder::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

data::Batch DatasetFeeder::make(std::int64_t pos) {
  return prepare_(ds_.get(indices_[static_cast<std::size_t>(pos)]));
}

void DatasetFeeder::work() {
  const auto n = static_cast<std::int64_t>(indices_.size());
  for (;;) {
    std::int64_t pos;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || error_ || claimed_ >= n || claimed_ < consumed_ + max_queue_; });
      if (stop_ || error_ || claimed_ >= n) return;
      pos = claimed_++;
    }
    try {
      data::Batch b = make(pos);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(pos, std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception(), error_index_ = indices_[static_cast<std::size_t>(pos)];
    }
    ready_cv_.notify_all();
    work_cv_.notify_all();  // an error stops the other workers too
  }
}

void DatasetFeeder::raise(std::exception_ptr e, std::int64_t index) const {
  std::string what = "unknown exception";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    what = x.what();
  } catch (...) {
  }
  throw Error(where_ + ": batch " + std::to_string(index) + " of the dataset failed: " + what);
}

data::Batch DatasetFeeder::next() {
  const auto n = static_cast<std::int64_t>(indices_.size());
  MPT_CHECK(consumed_ < n, where_, ": no batch left (", n, " were planned)");
  if (threads_.empty()) {  // workers = 0: on this thread
    const std::int64_t pos = consumed_++;
    try {
      return make(pos);
    } catch (...) {
      raise(std::current_exception(), indices_[static_cast<std::size_t>(pos)]);
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  ready_cv_.wait(lock, [&] { return error_ || ready_.count(consumed_) > 0; });
  if (error_) raise(error_, error_index_);
  data::Batch b = std::move(ready_.at(consumed_));
  ready_.erase(consumed_++);
  lock.unlock();
  work_cv_.notify_all();
  return b;
}

}  // namespace mpt::detail

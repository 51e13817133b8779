#include "model/batch_stager.hpp"

#include <algorithm>

#include "mpt/data/data.hpp"

namespace mpt::detail {

BatchStager::BatchStager(std::vector<Tensor> x, std::vector<Tensor> y, Tensor w, std::int64_t batch_size, std::vector<std::int64_t> order,
                         Device device, const distributed::DataParallel* strategy)
    : x_(std::move(x)),
      y_(std::move(y)),
      w_(std::move(w)),
      batch_size_(batch_size),
      order_(std::move(order)),
      device_(device),
      steps_(data::batch_count(x_.at(0).shape()[0], batch_size)),
      ahead_(x_[0].device() != device),
      strategy_(strategy) {}

StagedBatch BatchStager::get(std::int64_t step, std::int64_t end) {
  StagedBatch b = next_step_ == step ? next_.get() : make(step);
  if (ahead_ && step + 1 < (end < 0 ? steps_ : std::min(end, steps_))) {
    next_ = std::async(std::launch::async, [this, s = step + 1] { return make(s); });
    next_step_ = step + 1;
  }
  return b;
}

std::int64_t BatchStager::global_rows(std::int64_t step) const {
  const std::int64_t begin = step * batch_size_;  // step < steps_: no overflow
  return std::min(x_[0].shape()[0] - begin, batch_size_);
}

std::pair<std::int64_t, std::int64_t> BatchStager::range(std::int64_t step) const {
  const std::int64_t b = step * batch_size_;
  if (!strategy_) return {b, b + global_rows(step)};
  const auto [sb, se] = strategy_->shard(global_rows(step));
  return {b + sb, b + se};
}

std::int64_t BatchStager::rows(std::int64_t step) const {
  const auto r = range(step);
  return r.second - r.first;
}

StagedBatch BatchStager::make(std::int64_t step) const {
  const auto [begin, end] = range(step);
  if (begin == end) return {};
  const std::int64_t b = begin, e = end;  // clang 14 lambdas cannot capture structured bindings
  auto pick = [&](const Tensor& t) { return t.defined() ? data::rows_of(t, order_, b, e).to(device_) : Tensor(); };
  StagedBatch out;
  for (const auto& t : x_) out.x.push_back(pick(t));
  for (const auto& t : y_) out.y.push_back(pick(t));
  out.w = pick(w_);
  return out;
}

}  // namespace mpt::detail

#include "mpt/optimizers/schedules.hpp"

#include <algorithm>
#include <cmath>

#include "mpt/error.hpp"

namespace mpt::optimizers::schedules {

ExponentialDecay::ExponentialDecay(ExponentialDecayOptions o) : o_(o) {
  MPT_CHECK(o_.decay_steps > 0, "ExponentialDecay: decay_steps must be > 0, got ", o_.decay_steps);
}

double ExponentialDecay::operator()(std::int64_t step) const {
  double p = static_cast<double>(step) / static_cast<double>(o_.decay_steps);
  if (o_.staircase) p = std::floor(p);
  return o_.initial_learning_rate * std::pow(o_.decay_rate, p);
}

PiecewiseConstantDecay::PiecewiseConstantDecay(std::vector<std::int64_t> boundaries,
                                               std::vector<double> values)
    : boundaries_(std::move(boundaries)), values_(std::move(values)) {
  MPT_CHECK(values_.size() == boundaries_.size() + 1,
            "PiecewiseConstantDecay: needs one more value than boundaries, got ",
            boundaries_.size(), " boundaries and ", values_.size(), " values");
  for (std::size_t i = 1; i < boundaries_.size(); ++i)
    MPT_CHECK(boundaries_[i - 1] < boundaries_[i],
              "PiecewiseConstantDecay: boundaries must be strictly increasing, got ",
              boundaries_[i - 1], " then ", boundaries_[i]);
}

double PiecewiseConstantDecay::operator()(std::int64_t step) const {
  // values[i] for boundaries[i-1] < step <= boundaries[i].
  auto it = std::lower_bound(boundaries_.begin(), boundaries_.end(), step);
  return values_[static_cast<std::size_t>(it - boundaries_.begin())];
}

CosineDecay::CosineDecay(CosineDecayOptions o) : o_(o) {
  MPT_CHECK(o_.decay_steps > 0, "CosineDecay: decay_steps must be > 0, got ", o_.decay_steps);
  MPT_CHECK(o_.warmup_steps >= 0, "CosineDecay: warmup_steps must be >= 0, got ", o_.warmup_steps);
}

double CosineDecay::operator()(std::int64_t step_in) const {
  const double decay_steps = static_cast<double>(o_.decay_steps);
  auto decay = [&](double step, double from) {
    const double cosine = 0.5 * (1.0 + std::cos(M_PI * step / decay_steps));
    return from * ((1.0 - o_.alpha) * cosine + o_.alpha);
  };
  double step = static_cast<double>(step_in);
  if (o_.warmup_target < 0) return decay(std::min(step, decay_steps), o_.initial_learning_rate);
  const double warmup_steps = static_cast<double>(o_.warmup_steps);
  step = std::min(step, decay_steps + warmup_steps);
  if (step < warmup_steps)
    return (o_.warmup_target - o_.initial_learning_rate) * (step / warmup_steps) +
           o_.initial_learning_rate;
  return decay(step - warmup_steps, o_.warmup_target);
}

}  // namespace mpt::optimizers::schedules

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

PolynomialDecay::PolynomialDecay(PolynomialDecayOptions o) : o_(o) {
  MPT_CHECK(o_.decay_steps > 0, "PolynomialDecay: decay_steps must be > 0, got ", o_.decay_steps);
  MPT_CHECK(std::isfinite(o_.power) && o_.power >= 0, "PolynomialDecay: power must be a finite number >= 0, got ",
            o_.power);
}

double PolynomialDecay::operator()(std::int64_t step_in) const {
  // keras.optimizers.schedules.PolynomialDecay, step for step.
  double step = static_cast<double>(step_in), decay_steps = static_cast<double>(o_.decay_steps);
  if (o_.cycle) decay_steps *= step == 0 ? 1.0 : std::ceil(step / decay_steps);
  else step = std::min(step, decay_steps);
  const double p = step / decay_steps;
  return (o_.initial_learning_rate - o_.end_learning_rate) * std::pow(1.0 - p, o_.power) + o_.end_learning_rate;
}

InverseTimeDecay::InverseTimeDecay(InverseTimeDecayOptions o) : o_(o) {
  MPT_CHECK(o_.decay_steps > 0, "InverseTimeDecay: decay_steps must be > 0, got ", o_.decay_steps);
}

double InverseTimeDecay::operator()(std::int64_t step) const {
  double p = static_cast<double>(step) / static_cast<double>(o_.decay_steps);
  if (o_.staircase) p = std::floor(p);
  return o_.initial_learning_rate / (1.0 + o_.decay_rate * p);
}

CosineDecayRestarts::CosineDecayRestarts(CosineDecayRestartsOptions o) : o_(o) {
  MPT_CHECK(o_.first_decay_steps > 0, "CosineDecayRestarts: first_decay_steps must be > 0, got ",
            o_.first_decay_steps);
  MPT_CHECK(std::isfinite(o_.t_mul) && o_.t_mul > 0, "CosineDecayRestarts: t_mul must be a finite number > 0, got ",
            o_.t_mul);
  MPT_CHECK(std::isfinite(o_.m_mul) && o_.m_mul >= 0, "CosineDecayRestarts: m_mul must be a finite number >= 0, got ",
            o_.m_mul);
}

double CosineDecayRestarts::operator()(std::int64_t step) const {
  // keras.optimizers.schedules.CosineDecayRestarts: which period the step is in (a geometric
  // series of period lengths when t_mul != 1), and how far into it.
  double fraction = static_cast<double>(step) / static_cast<double>(o_.first_decay_steps);
  double restart;
  if (o_.t_mul == 1.0) {
    restart = std::floor(fraction);
    fraction -= restart;
  } else {
    // The period's index, rounded so that a step on a restart lands in the new period even
    // where the logarithms' quotient falls a rounding error short of the integer.
    const double exact = std::log(1.0 - fraction * (1.0 - o_.t_mul)) / std::log(o_.t_mul);
    restart = std::floor(exact + 1e-9);
    const double sum = (1.0 - std::pow(o_.t_mul, restart)) / (1.0 - o_.t_mul);
    fraction = std::max(0.0, (fraction - sum) / std::pow(o_.t_mul, restart));
  }
  const double cosine = 0.5 * std::pow(o_.m_mul, restart) * (1.0 + std::cos(M_PI * fraction));
  return o_.initial_learning_rate * ((1.0 - o_.alpha) * cosine + o_.alpha);
}

}  // namespace mpt::optimizers::schedules

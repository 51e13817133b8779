#pragma once
/// Learning-rate schedules (keras.optimizers.schedules), functions of the step.
///
///   auto lr = mpt::optimizers::schedules::ExponentialDecay({.initial_learning_rate = 0.1,
///                                                           .decay_steps = 1000, .decay_rate = 0.96});
///   auto opt = mpt::optimizers::SGD({.learning_rate = lr});
#include <cstdint>
#include <string>
#include <vector>

namespace mpt::optimizers::schedules {

class LearningRateSchedule {
 public:
  virtual ~LearningRateSchedule() = default;
  virtual double operator()(std::int64_t step) const = 0;
  virtual std::string name() const = 0;
};

struct ExponentialDecayOptions {
  double initial_learning_rate = 0.01;
  std::int64_t decay_steps = 1000;
  double decay_rate = 0.96;
  bool staircase = false;
};
class ExponentialDecay : public LearningRateSchedule {
 public:
  explicit ExponentialDecay(ExponentialDecayOptions o);
  double operator()(std::int64_t step) const override;
  std::string name() const override { return "ExponentialDecay"; }
  const ExponentialDecayOptions& options() const { return o_; }

 private:
  ExponentialDecayOptions o_;
};

class PiecewiseConstantDecay : public LearningRateSchedule {
 public:
  /// values.size() == boundaries.size() + 1; boundaries increasing. Step <= boundaries[0]
  /// gives values[0], as in Keras.
  PiecewiseConstantDecay(std::vector<std::int64_t> boundaries, std::vector<double> values);
  double operator()(std::int64_t step) const override;
  std::string name() const override { return "PiecewiseConstantDecay"; }
  const std::vector<std::int64_t>& boundaries() const { return boundaries_; }
  const std::vector<double>& values() const { return values_; }

 private:
  std::vector<std::int64_t> boundaries_;
  std::vector<double> values_;
};

struct CosineDecayOptions {
  double initial_learning_rate = 0.01;
  std::int64_t decay_steps = 1000;
  double alpha = 0.0;  ///< floor as a fraction of the initial rate
  std::int64_t warmup_steps = 0;
  double warmup_target = -1;  ///< < 0: no warmup target
};
class CosineDecay : public LearningRateSchedule {
 public:
  explicit CosineDecay(CosineDecayOptions o);
  double operator()(std::int64_t step) const override;
  std::string name() const override { return "CosineDecay"; }
  const CosineDecayOptions& options() const { return o_; }

 private:
  CosineDecayOptions o_;
};

}  // namespace mpt::optimizers::schedules

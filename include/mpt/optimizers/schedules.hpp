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

/// initial -> end over decay_steps along (1 - step / decay_steps)^power, then end; with cycle,
/// decay_steps grows to the first multiple of itself at or above the step.
struct PolynomialDecayOptions {
  double initial_learning_rate = 0.01;
  std::int64_t decay_steps = 1000;
  double end_learning_rate = 0.0001;
  double power = 1.0;
  bool cycle = false;
};
class PolynomialDecay : public LearningRateSchedule {
 public:
  explicit PolynomialDecay(PolynomialDecayOptions o);
  double operator()(std::int64_t step) const override;
  std::string name() const override { return "PolynomialDecay"; }
  const PolynomialDecayOptions& options() const { return o_; }

 private:
  PolynomialDecayOptions o_;
};

/// initial / (1 + decay_rate · step / decay_steps) (the quotient floored with staircase).
struct InverseTimeDecayOptions {
  double initial_learning_rate = 0.01;
  std::int64_t decay_steps = 1000;
  double decay_rate = 0.5;
  bool staircase = false;
};
class InverseTimeDecay : public LearningRateSchedule {
 public:
  explicit InverseTimeDecay(InverseTimeDecayOptions o);
  double operator()(std::int64_t step) const override;
  std::string name() const override { return "InverseTimeDecay"; }
  const InverseTimeDecayOptions& options() const { return o_; }

 private:
  InverseTimeDecayOptions o_;
};

/// SGDR: cosine decay to alpha·initial over first_decay_steps, then restarts, each period t_mul
/// times longer and its peak m_mul times lower.
struct CosineDecayRestartsOptions {
  double initial_learning_rate = 0.01;
  std::int64_t first_decay_steps = 1000;
  double t_mul = 2.0;
  double m_mul = 1.0;
  double alpha = 0.0;
};
class CosineDecayRestarts : public LearningRateSchedule {
 public:
  explicit CosineDecayRestarts(CosineDecayRestartsOptions o);
  double operator()(std::int64_t step) const override;
  std::string name() const override { return "CosineDecayRestarts"; }
  const CosineDecayRestartsOptions& options() const { return o_; }

 private:
  CosineDecayRestartsOptions o_;
};

}  // namespace mpt::optimizers::schedules

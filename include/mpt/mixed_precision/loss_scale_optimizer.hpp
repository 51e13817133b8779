#pragma once
/// LossScaleOptimizer: dynamic loss scaling around any optimizer, with Keras's defaults.
///
///   mpt::mixed_precision::LossScaleOptimizer opt(mpt::optimizers::SGD({.learning_rate = 0.01}));
///   mpt::GradientTape tape;
///   auto loss = loss_fn(y, model(x, {.training = true}));
///   auto grads = tape.gradient(opt.get_scaled_loss(loss), model.trainable_variables());
///   auto r = opt.apply_gradients(opt.get_unscaled_gradients(grads), model.trainable_variables());
///   // r.applied == false when a gradient overflowed: the step was skipped, the scale halved.
#include <memory>

#include "mpt/optimizers/optimizer.hpp"

namespace mpt::mixed_precision {

struct LossScaleOptions {
  double initial_scale = 32768.0;          ///< 2^15, as Keras
  std::int64_t dynamic_growth_steps = 2000;
  bool dynamic = true;                      ///< false: keep initial_scale fixed
  // mpt's own extras
  int hysteresis = 1;          ///< overflows tolerated (in a row) before backing off; 1 = Keras
  double min_scale = 1.0;      ///< the scale never drops below this
  double max_scale = 16777216.0;  ///< 2^24; the scale never grows above this
};

struct ApplyResult {
  bool applied = false;          ///< the step was taken
  bool found_nonfinite = false;  ///< some gradient held inf or NaN
  double loss_scale = 0;         ///< the scale after this step's update
};

class LossScaleOptimizer : public optimizers::Optimizer {
 public:
  LossScaleOptimizer(optimizers::OptimizerArg inner, LossScaleOptions options = {});

  /// loss * scale (float32).
  Tensor get_scaled_loss(const Tensor& loss);
  /// grads / scale in float32, with one fused pass that also checks all of them for inf/NaN.
  std::vector<Tensor> get_unscaled_gradients(const std::vector<Tensor>& grads);
  /// Applies unscaled gradients through the inner optimizer when all are finite; otherwise
  /// skips the step (weights, slots, iterations untouched) and lowers the scale.
  ApplyResult apply_gradients_checked(const std::vector<Tensor>& grads, const std::vector<Variable>& vars);
  void apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) override;

  double loss_scale() const { return scale_; }
  std::int64_t iterations() const override { return inner_->iterations(); }
  void set_iterations(std::int64_t n) override { inner_->set_iterations(n); }
  double learning_rate() const override { return inner_->learning_rate(); }
  std::int64_t step_counter() const { return good_steps_; }
  int overflow_count() const { return overflows_; }
  std::int64_t skipped_steps() const { return skipped_; }
  void set_state(double scale, std::int64_t good_steps, int overflows);
  optimizers::Optimizer& inner_optimizer() { return *inner_; }
  const LossScaleOptions& options() const { return o_; }
  std::shared_ptr<optimizers::Optimizer> clone() const override;

 protected:
  void update_step(const Tensor&, const Variable&, double) override;

 private:
  std::shared_ptr<optimizers::Optimizer> inner_;
  LossScaleOptions o_;
  double scale_;
  std::int64_t good_steps_ = 0, skipped_ = 0;
  int overflows_ = 0;
  bool loss_was_scaled_ = false, warned_unscaled_ = false;
  // The fused check of get_unscaled_gradients, reused by the apply that follows it.
  std::vector<std::uint64_t> checked_ids_;
  bool checked_nonfinite_ = false;
};

}  // namespace mpt::mixed_precision

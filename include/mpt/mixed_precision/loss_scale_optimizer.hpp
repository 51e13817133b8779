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

#include "mpt/optim_ops.hpp"
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

using ApplyResult = optimizers::ApplyResult;

/// Steps skipped by every LossScaleOptimizer of this process so far (BatchNormalization uses it
/// to keep a skipped step's statistics out even when a custom loop never calls finish_step).
std::uint64_t skipped_steps_total();

/// The scale, 1/scale and the counters live as tensors on the device of the gradients (the
/// variables' device) and are updated there by one op per step; the host reads one value per
/// step, the finite flag, because skipping a step is host work (the inner optimizer's iteration
/// count and schedule, BatchNormalization's commit). It keeps a copy of the state by running
/// the same rule on the flag it read, so loss_scale() and the counters read nothing back.
class LossScaleOptimizer : public optimizers::Optimizer {
 public:
  LossScaleOptimizer(optimizers::OptimizerArg inner, LossScaleOptions options = {});

  /// loss * scale (float32).
  Tensor get_scaled_loss(const Tensor& loss);
  /// grads / scale in float32, with one fused pass that also checks all of them for inf/NaN.
  std::vector<Tensor> get_unscaled_gradients(const std::vector<Tensor>& grads);
  /// Applies the gradients through the inner optimizer when all are finite; otherwise skips the
  /// step (weights, slots, iterations untouched) and lowers the scale. Gradients that did not
  /// come from get_unscaled_gradients are taken as gradients of the scaled loss when
  /// get_scaled_loss was called for this step, and unscaled first (as Keras 3's apply does):
  /// where the inner optimizer fuses_gradient_scale() (the built-ins without clipping), by its
  /// update itself (grad_scale = 1/scale) after a check that writes nothing, with the same bits.
  /// With an inner gradient_accumulation_steps k, the k calls of a window accumulate their
  /// unscaled gradients (inf and NaN included) without a decision, and the window's k-th call
  /// checks their mean once: one skip-or-apply decision and one loss-scale step per update.
  ApplyResult apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) override;
  ApplyResult apply_gradients_checked(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) {
    return apply_gradients(grads, vars);
  }

  double loss_scale() const { return host_.scale; }
  std::int64_t iterations() const override { return inner_->iterations(); }
  void build(const std::vector<Variable>& vars) override { inner_->build(vars); }
  void set_iterations(std::int64_t n) override { inner_->set_iterations(n); }
  std::int64_t raw_iterations() const override { return inner_->raw_iterations(); }
  void set_raw_iterations(std::int64_t n) override { inner_->set_raw_iterations(n); }
  void finalize_variable_values(const std::vector<Variable>& vars) override { inner_->finalize_variable_values(vars); }
  double learning_rate() const override { return inner_->learning_rate(); }
  void set_learning_rate(double lr) override { inner_->set_learning_rate(lr); }
  std::int64_t step_counter() const { return host_.good_steps; }
  int overflow_count() const { return static_cast<int>(host_.overflows); }
  std::int64_t skipped_steps() const { return skipped_; }
  void set_state(double scale, std::int64_t good_steps, int overflows);
  optimizers::Optimizer& inner_optimizer() { return *inner_; }
  const LossScaleOptions& options() const { return o_; }
  std::shared_ptr<optimizers::Optimizer> clone() const override;

 protected:
  void update_step(const Tensor&, const Variable&, double) override;

 private:
  /// The device state on `device` (moved there on first use on another device).
  void to_device(Device device);
  /// A skipped step's count and its overflow diagnostics (the variables flagged in `flags`).
  void note_skipped(const Tensor& flags, const std::vector<Variable>& vars, ApplyResult& r);
  /// The loss-scale rule's step on the device and its host mirror, from the step's flag.
  void step_scale(const Tensor& found, bool nonfinite, ApplyResult& r);
  /// apply_gradients under an inner optimizer that accumulates gradients.
  ApplyResult apply_accumulating(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, bool scaled);
  ops::LossScaleRule rule() const;

  std::shared_ptr<optimizers::Optimizer> inner_;
  LossScaleOptions o_;
  struct HostState {
    float scale = 0, inv_scale = 0;
    std::int64_t good_steps = 0, overflows = 0;
  } host_;
  Tensor scale_, inv_scale_, counters_;  // float32 [], float32 [], int64 [2] on the device
  std::int64_t skipped_ = 0;
  bool loss_was_scaled_ = false, warned_unscaled_ = false;
  // The fused check of get_unscaled_gradients, reused by the apply that follows it.
  std::vector<std::uint64_t> checked_ids_;
  Tensor checked_flag_;
  Tensor checked_flags_;  // per gradient, from the same fused check (overflow diagnostics)
};

}  // namespace mpt::mixed_precision

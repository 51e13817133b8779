#include "mpt/mixed_precision/loss_scale_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "mpt/autograd.hpp"
#include "mpt/ops.hpp"
#include "mpt/optim_ops.hpp"

namespace mpt::mixed_precision {

namespace {

std::vector<std::uint64_t> ids_of(const std::vector<Tensor>& grads) {
  std::vector<std::uint64_t> ids;
  ids.reserve(grads.size());
  for (const auto& g : grads) ids.push_back(g.defined() ? g.id() : 0);
  return ids;
}

}  // namespace

LossScaleOptimizer::LossScaleOptimizer(optimizers::OptimizerArg inner, LossScaleOptions options)
    : Optimizer("loss_scale_optimizer", optimizers::CommonOptions{0.0, {}, {}, {}}),
      inner_(inner.get()),
      o_(options),
      scale_(options.initial_scale) {
  MPT_CHECK(inner_ != nullptr, "LossScaleOptimizer: no inner optimizer given");
  MPT_CHECK(dynamic_cast<LossScaleOptimizer*>(inner_.get()) == nullptr,
            "LossScaleOptimizer: the inner optimizer is already a LossScaleOptimizer");
  MPT_CHECK(o_.min_scale > 0 && o_.min_scale <= o_.max_scale && std::isfinite(o_.max_scale),
            "LossScaleOptimizer: needs 0 < min_scale <= max_scale < inf, got min_scale=",
            o_.min_scale, ", max_scale=", o_.max_scale);
  MPT_CHECK(o_.initial_scale >= o_.min_scale && o_.initial_scale <= o_.max_scale,
            "LossScaleOptimizer: initial_scale ", o_.initial_scale, " is outside [min_scale=",
            o_.min_scale, ", max_scale=", o_.max_scale, "]");
  MPT_CHECK(o_.dynamic_growth_steps >= 1,
            "LossScaleOptimizer: dynamic_growth_steps must be >= 1, got ", o_.dynamic_growth_steps);
  MPT_CHECK(o_.hysteresis >= 1, "LossScaleOptimizer: hysteresis must be >= 1, got ",
            o_.hysteresis);
}

Tensor LossScaleOptimizer::get_scaled_loss(const Tensor& loss) {
  MPT_CHECK(loss.defined(), "LossScaleOptimizer::get_scaled_loss: the loss is undefined");
  MPT_CHECK(is_floating(loss.dtype()), "LossScaleOptimizer::get_scaled_loss: the loss must be ",
            "floating-point, got ", to_string(loss.dtype()));
  loss_was_scaled_ = true;
  Tensor l = loss.dtype() == float32 ? loss : ops::cast(loss, float32);
  return ops::mul(l, Tensor::scalar(scale_, float32, l.device()));
}

std::vector<Tensor> LossScaleOptimizer::get_unscaled_gradients(const std::vector<Tensor>& grads) {
  ops::UnscaleResult r = ops::unscale_and_check(grads, 1.0 / scale_);
  checked_ids_ = ids_of(r.grads);
  checked_nonfinite_ = r.found_nonfinite;
  return std::move(r.grads);
}

ApplyResult LossScaleOptimizer::apply_gradients_checked(const std::vector<Tensor>& grads,
                                                        const std::vector<Variable>& vars) {
  if (!loss_was_scaled_ && !warned_unscaled_) {
    warned_unscaled_ = true;
    std::cerr << "mpt: LossScaleOptimizer: apply_gradients called without get_scaled_loss since "
                 "the previous step; gradients of an unscaled loss may underflow in float16\n";
  }
  loss_was_scaled_ = false;

  bool nonfinite = false;
  if (!checked_ids_.empty() && checked_ids_ == ids_of(grads)) {
    nonfinite = checked_nonfinite_;
  } else {
    for (const auto& g : grads) nonfinite = nonfinite || (g.defined() && ops::has_nonfinite(g));
  }
  checked_ids_.clear();

  ApplyResult r;
  r.found_nonfinite = nonfinite;
  if (nonfinite) {
    ++skipped_;
    good_steps_ = 0;
    if (o_.dynamic && ++overflows_ >= o_.hysteresis) {
      scale_ = std::max(scale_ / 2, o_.min_scale);
      overflows_ = 0;
    }
  } else {
    inner_->apply_gradients(grads, vars);
    r.applied = true;
    overflows_ = 0;
    if (o_.dynamic && ++good_steps_ >= o_.dynamic_growth_steps) {
      scale_ = std::min(scale_ * 2, o_.max_scale);
      good_steps_ = 0;
    }
  }
  r.loss_scale = scale_;
  return r;
}

void LossScaleOptimizer::apply_gradients(const std::vector<Tensor>& grads,
                                         const std::vector<Variable>& vars) {
  apply_gradients_checked(grads, vars);
}

void LossScaleOptimizer::set_state(double scale, std::int64_t good_steps, int overflows) {
  MPT_CHECK(scale > 0 && std::isfinite(scale), "LossScaleOptimizer::set_state: bad scale ", scale);
  MPT_CHECK(good_steps >= 0 && overflows >= 0, "LossScaleOptimizer::set_state: negative counter (",
            good_steps, ", ", overflows, ")");
  scale_ = scale;
  good_steps_ = good_steps;
  overflows_ = overflows;
}

std::shared_ptr<optimizers::Optimizer> LossScaleOptimizer::clone() const {
  return std::make_shared<LossScaleOptimizer>(inner_->clone(), o_);
}

void LossScaleOptimizer::update_step(const Tensor&, const Variable&, double) {
  fail("LossScaleOptimizer::update_step: not used; the inner optimizer '", inner_->name(),
       "' updates the variables");
}

}  // namespace mpt::mixed_precision

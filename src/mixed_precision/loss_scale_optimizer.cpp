#include "mpt/mixed_precision/loss_scale_optimizer.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "backend/common/loss_scale.hpp"

#include "mpt/autograd.hpp"
#include "mpt/log.hpp"
#include "mpt/ops.hpp"
#include "mpt/optim_ops.hpp"

namespace mpt::mixed_precision {

namespace {

std::atomic<std::uint64_t> g_skipped_total{0};

/// The host copy of the state follows the device's by the same rule and the same flag.
void kernels_step(auto& h, bool nonfinite, const ops::LossScaleRule& r) {
  kernels::loss_scale_step(h.scale, h.inv_scale, h.good_steps, h.overflows, nonfinite, r.dynamic, r.growth_steps,
                           r.hysteresis, r.min_scale, r.max_scale);
}

std::vector<std::uint64_t> ids_of(const std::vector<Tensor>& grads) {
  std::vector<std::uint64_t> ids;
  ids.reserve(grads.size());
  for (const auto& g : grads) ids.push_back(g.defined() ? g.id() : 0);
  return ids;
}

}  // namespace

LossScaleOptimizer::LossScaleOptimizer(optimizers::OptimizerArg inner, LossScaleOptions options)
    : Optimizer("loss_scale_optimizer",
                [] {
                  optimizers::CommonOptions c;  // the inner optimizer's options are the ones used
                  c.learning_rate = 0.0;
                  return c;
                }()),
      inner_(inner.get()),
      o_(options) {
  MPT_CHECK(inner_ != nullptr, "LossScaleOptimizer: no inner optimizer given");
  MPT_CHECK(!inner_->common_options().loss_scale_factor, "LossScaleOptimizer: the inner optimizer '", inner_->name(),
            "' has loss_scale_factor ", inner_->common_options().loss_scale_factor.value_or(0.0),
            "; use either a fixed loss_scale_factor or a LossScaleOptimizer, not both");
  MPT_CHECK(dynamic_cast<LossScaleOptimizer*>(inner_.get()) == nullptr,
            "LossScaleOptimizer: the inner optimizer is already a LossScaleOptimizer");
  // The scale is a float32 (as Keras's): its bounds and 1/scale must be normal float32 values.
  MPT_CHECK(o_.min_scale >= std::numeric_limits<float>::min() && o_.min_scale <= o_.max_scale &&
                o_.max_scale <= 1.0 / std::numeric_limits<float>::min(),
            "LossScaleOptimizer: needs 2^-126 <= min_scale <= max_scale <= 2^126, got min_scale=",
            o_.min_scale, ", max_scale=", o_.max_scale);
  MPT_CHECK(o_.initial_scale >= o_.min_scale && o_.initial_scale <= o_.max_scale,
            "LossScaleOptimizer: initial_scale ", o_.initial_scale, " is outside [min_scale=",
            o_.min_scale, ", max_scale=", o_.max_scale, "]");
  MPT_CHECK(o_.dynamic_growth_steps >= 1,
            "LossScaleOptimizer: dynamic_growth_steps must be >= 1, got ", o_.dynamic_growth_steps);
  MPT_CHECK(o_.hysteresis >= 1, "LossScaleOptimizer: hysteresis must be >= 1, got ",
            o_.hysteresis);
  set_state(o_.initial_scale, 0, 0);
}

std::uint64_t skipped_steps_total() { return g_skipped_total.load(); }

ops::LossScaleRule LossScaleOptimizer::rule() const {
  return {o_.dynamic, o_.dynamic_growth_steps, o_.hysteresis, o_.min_scale, o_.max_scale};
}

void LossScaleOptimizer::to_device(Device device) {
  if (scale_.device() == device) return;
  scale_ = scale_.to(device), inv_scale_ = inv_scale_.to(device), counters_ = counters_.to(device);
}

Tensor LossScaleOptimizer::get_scaled_loss(const Tensor& loss) {
  MPT_CHECK(loss.defined(), "LossScaleOptimizer::get_scaled_loss: the loss is undefined");
  MPT_CHECK(is_floating(loss.dtype()), "LossScaleOptimizer::get_scaled_loss: the loss must be ",
            "floating-point, got ", to_string(loss.dtype()));
  loss_was_scaled_ = true;
  Tensor l = loss.dtype() == float32 ? loss : ops::cast(loss, float32);
  to_device(l.device());
  return ops::mul(l, scale_);
}

std::vector<Tensor> LossScaleOptimizer::get_unscaled_gradients(const std::vector<Tensor>& grads) {
  for (const auto& g : grads)
    if (g.defined()) to_device(g.device());
  ops::UnscaleResult r = ops::unscale_and_check(grads, inv_scale_);
  checked_ids_ = ids_of(r.grads);
  checked_flag_ = r.found_flag;
  checked_flags_ = r.nonfinite_flags;
  return std::move(r.grads);
}

ApplyResult LossScaleOptimizer::apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) {
  if (!loss_was_scaled_ && !warned_unscaled_) {
    warned_unscaled_ = true;
    mpt::log(LogLevel::warning,
        "LossScaleOptimizer: apply_gradients called without get_scaled_loss since the previous step; "
        "gradients of an unscaled loss may underflow in float16");
  }
  const bool scaled = loss_was_scaled_;
  loss_was_scaled_ = false;
  if (inner_->accumulation_steps() > 1) return apply_accumulating(grads, vars, scaled);

  Tensor flag = checked_flag_, flags = checked_flags_;
  std::vector<Tensor> unscaled;
  // Gradients of the scaled loss that the inner optimizer can unscale inside its update
  // (Optimizer::fuses_gradient_scale): checked here without writing the unscaled copies, then
  // applied with grad_scale = 1 / scale (host_ mirrors inv_scale_ bit for bit).
  bool fused = false;
  if (checked_ids_.empty() || checked_ids_ != ids_of(grads)) {  // not from get_unscaled_gradients
    for (const auto& g : grads)
      if (g.defined()) to_device(g.device());
    fused = scaled && inner_->fuses_gradient_scale();
    // Gradients of the scaled loss are unscaled here (one fused pass), never applied as they are.
    ops::UnscaleResult u =
        fused ? ops::check_unscaled(grads, inv_scale_)
              : ops::unscale_and_check(grads, scaled ? inv_scale_ : Tensor::scalar(1.0, float32, scale_.device()));
    flag = u.found_flag;
    flags = u.nonfinite_flags;
    if (scaled && !fused) unscaled = std::move(u.grads);
  }
  const std::vector<Tensor>& step_grads = unscaled.empty() ? grads : unscaled;
  checked_ids_.clear();
  checked_flag_ = Tensor();
  checked_flags_ = Tensor();
  // The one host read of a step: whether to skip it.
  const bool nonfinite = flag.item() != 0.0;

  ApplyResult r;
  r.found_nonfinite = nonfinite;
  r.applied = !nonfinite;
  if (nonfinite) {
    note_skipped(flags, vars, r);
  } else {
    if (fused) inner_->apply_scaled_gradients(grads, vars, host_.inv_scale);
    else inner_->apply_gradients(step_grads, vars);
  }
  step_scale(flag, nonfinite, r);
  return r;
}


void LossScaleOptimizer::note_skipped(const Tensor& flags, const std::vector<Variable>& vars, ApplyResult& r) {
  ++skipped_;
  ++g_skipped_total;
  // Overflow diagnostics: which gradients held inf/NaN, from the flags the same fused check
  // wrote; read (one more host read) only for a skipped step.
  const std::vector<float> per_tensor = flags.to_vector<float>();
  for (std::size_t i = 0; i < per_tensor.size() && i < vars.size(); ++i)
    if (per_tensor[i] != 0.0f) r.nonfinite_variables.push_back(vars[i].path().empty() ? vars[i].name() : vars[i].path());
}

void LossScaleOptimizer::step_scale(const Tensor& found, bool nonfinite, ApplyResult& r) {
  ops::update_loss_scale(scale_, inv_scale_, counters_, found, rule());
  kernels_step(host_, nonfinite, rule());
  r.loss_scale = host_.scale;
}

ApplyResult LossScaleOptimizer::apply_accumulating(const std::vector<Tensor>& grads, const std::vector<Variable>& vars,
                                                   bool scaled) {
  for (const auto& g : grads)
    if (g.defined()) to_device(g.device());
  std::vector<Tensor> unscaled = grads;
  if (checked_ids_.empty() || checked_ids_ != ids_of(grads))  // not from get_unscaled_gradients
    unscaled = ops::unscale_and_check(grads, scaled ? inv_scale_ : Tensor::scalar(1.0, float32, scale_.device())).grads;
  checked_ids_.clear();
  checked_flag_ = Tensor();
  checked_flags_ = Tensor();
  ApplyResult r;
  r.loss_scale = host_.scale;
  std::vector<Tensor> mean = inner_->accumulate_gradients(unscaled, vars);
  if (mean.empty()) {  // inside the window: accumulated, no decision, no host read
    r.accumulated = true;
    return r;
  }
  // The window's mean holds inf or NaN when any of its calls overflowed (they add up).
  ops::UnscaleResult u = ops::check_unscaled(mean, Tensor::scalar(1.0, float32, scale_.device()));
  const bool nonfinite = u.found_flag.item() != 0.0;
  r.found_nonfinite = nonfinite;
  r.applied = !nonfinite;
  if (nonfinite) {
    note_skipped(u.nonfinite_flags, vars, r);
    inner_->skip_accumulated_update();
  } else {
    inner_->apply_gradients_now(mean, vars);
  }
  step_scale(u.found_flag, nonfinite, r);
  return r;
}

void LossScaleOptimizer::set_state(double scale, std::int64_t good_steps, int overflows) {
  // Checkpoints restore through here: a scale outside the bounds would skip steps silently.
  MPT_CHECK(scale >= o_.min_scale && scale <= o_.max_scale, "LossScaleOptimizer: loss scale ", scale,
            " is outside [min_scale=", o_.min_scale, ", max_scale=", o_.max_scale, "]");
  MPT_CHECK(good_steps >= 0 && overflows >= 0, "LossScaleOptimizer::set_state: negative counter (",
            good_steps, ", ", overflows, ")");
  host_ = {static_cast<float>(scale), static_cast<float>(1.0 / scale), good_steps, overflows};
  const Device device = scale_.defined() ? scale_.device() : default_device();
  scale_ = Tensor::scalar(host_.scale, float32, device);
  inv_scale_ = Tensor::scalar(host_.inv_scale, float32, device);
  counters_ = Tensor::from_vector(std::vector<std::int64_t>{good_steps, overflows}, {2}, device);
}

std::shared_ptr<optimizers::Optimizer> LossScaleOptimizer::clone() const {
  return std::make_shared<LossScaleOptimizer>(inner_->clone(), o_);
}

void LossScaleOptimizer::update_step(const Tensor&, const Variable&, double) {
  fail("LossScaleOptimizer::update_step: not used; the inner optimizer '", inner_->name(),
       "' updates the variables");
}

}  // namespace mpt::mixed_precision

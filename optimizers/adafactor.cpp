// Adafactor (Keras's): the second moment of a matrix kept as its row and column means. Its step
// is mpt::ops::adafactor_update, fused on each backend (its reductions, the variable's RMS, the
// row and column means and the update's RMS, in a fixed order: the same bits on every device).
#include <cmath>

#include "mpt/autograd.hpp"
#include "mpt/ops.hpp"
#include "mpt/optim_ops.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::optimizers {

AdafactorOptimizer::AdafactorOptimizer(AdafactorOptions o) : BuiltinOptimizer("adafactor", std::move(o)) {
  MPT_CHECK(std::isfinite(o_.beta_2_decay), "Adafactor: beta_2_decay must be finite, got ", o_.beta_2_decay);
  MPT_CHECK(o_.epsilon_1 >= 0 && o_.epsilon_2 >= 0, "Adafactor: epsilon_1 and epsilon_2 must be >= 0, got ",
            o_.epsilon_1, " and ", o_.epsilon_2);
  MPT_CHECK(o_.clip_threshold > 0 && std::isfinite(o_.clip_threshold),
            "Adafactor: clip_threshold must be a finite number > 0, got ", o_.clip_threshold);
}

std::vector<std::string> AdafactorOptimizer::slot_names_for(const Variable& var) const {
  return var.shape().size() >= 2 ? std::vector<std::string>{"r", "c"} : std::vector<std::string>{"velocity"};
}

Shape AdafactorOptimizer::slot_shape(const Variable& var, const std::string& slot_name) const {
  Shape s = var.shape();
  if (s.size() >= 2 && slot_name == "r") s.pop_back();                   // shape[:-1]
  else if (s.size() >= 2 && slot_name == "c") s.erase(s.end() - 2);      // shape[:-2] + shape[-1:]
  return s;
}

void AdafactorOptimizer::update_step(const Tensor& grad, const Variable& var, double lr_in) {
  NoGradGuard no_grad;
  // Keras, in float32: t = iterations + 1; lr = min(lr, 1/sqrt(t)) when relative_step and no
  // schedule; rho_t = min(lr, 1/sqrt(t)); beta_2_t = 1 - t^beta_2_decay. The weight decay
  // (Keras's _apply_weight_decay, before the step) is the op's first operation.
  const float t = static_cast<float>(iterations() + 1);
  const float inv_sqrt_t = 1.0f / std::sqrt(t);
  float lr = static_cast<float>(lr_in);
  if (!common_options().learning_rate.is_schedule() && o_.relative_step) lr = std::min(lr, inv_sqrt_t);
  ops::AdafactorArgs args;
  args.rho_t = std::min(lr, inv_sqrt_t);
  args.beta_2_t = 1.0f - std::pow(t, static_cast<float>(o_.beta_2_decay));
  args.epsilon_1 = o_.epsilon_1, args.epsilon_2 = o_.epsilon_2, args.clip_threshold = o_.clip_threshold;
  args.decay = weight_decay_factor(var, lr_in);
  Tensor value = var.value();
  if (var.shape().size() >= 2) ops::adafactor_update(value, grad, &slot(var, "r"), &slot(var, "c"), nullptr, args);
  else ops::adafactor_update(value, grad, nullptr, nullptr, &slot(var, "velocity"), args);
  var.mark_modified();  // written in place: drop the cached casts
}

std::shared_ptr<AdafactorOptimizer> Adafactor(AdafactorOptions options) {
  return std::make_shared<AdafactorOptimizer>(std::move(options));
}

}  // namespace mpt::optimizers

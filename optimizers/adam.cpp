#include <cmath>

#include "mpt/optim_ops.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::optimizers {

AdamOptimizer::AdamOptimizer(AdamOptions o)
    : BuiltinOptimizer("adam", std::move(o)) {
  MPT_CHECK(o_.beta_1 >= 0 && o_.beta_1 < 1 && o_.beta_2 >= 0 && o_.beta_2 < 1,
            "Adam: beta_1 and beta_2 must be in [0, 1), got ", o_.beta_1, " and ", o_.beta_2);
  MPT_CHECK(o_.epsilon >= 0, "Adam: epsilon must be >= 0, got ", o_.epsilon);
}

double detail::adam_alpha(const Optimizer& opt, double lr, double beta_1, double beta_2) {
  // Keras: the bias corrections folded into the step size, alpha = lr sqrt(1 - b2^t) / (1 - b1^t)
  // with t counted from 1, all in float32 (the variable's dtype) as Keras computes it.
  const float t = static_cast<float>(opt.iterations() + 1);
  const float b1t = std::pow(static_cast<float>(beta_1), t), b2t = std::pow(static_cast<float>(beta_2), t);
  return static_cast<float>(lr) * std::sqrt(1.0f - b2t) / (1.0f - b1t);
}

void detail::adam_step(Optimizer& opt, const Tensor& grad, const Variable& var, double lr, double beta_1,
                       double beta_2, double epsilon, bool amsgrad, double decay) {
  const double alpha = adam_alpha(opt, lr, beta_1, beta_2);
  Tensor value = var.value();
  Tensor& m = opt.slot(var, "m");
  Tensor& v = opt.slot(var, "v");
  Tensor* vhat = amsgrad ? &opt.slot(var, "vhat") : nullptr;
  const std::vector<Variable> one{var};
  const UpdateCopies copy(one);
  ops::adam_update(value, grad, m, v, vhat, alpha, beta_1, beta_2, epsilon, decay, copy.ptrs[0],
                   opt.gradient_scale());
  copy.finish(one);
}

void detail::adam_steps(Optimizer& opt, const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr,
                        double beta_1, double beta_2, double epsilon, bool amsgrad, double decay) {
  if (!fits_one_list_op(vars)) {  // one after another, as the per-variable loop
    for (std::size_t i = 0; i < grads.size(); ++i)
      adam_step(opt, grads[i], vars[i], lr, beta_1, beta_2, epsilon, amsgrad, decay);
    return;
  }
  // adam_step's alpha: the same iteration count for every variable of the step.
  const double alpha = adam_alpha(opt, lr, beta_1, beta_2);
  std::vector<Tensor> values;
  std::vector<Tensor*> m, v, vhat;
  for (const auto& var : vars) {  // slots created in adam_step's order
    values.push_back(var.value());
    m.push_back(&opt.slot(var, "m"));
    v.push_back(&opt.slot(var, "v"));
    if (amsgrad) vhat.push_back(&opt.slot(var, "vhat"));
  }
  const UpdateCopies copies(vars);
  ops::adam_update_all(values, grads, m, v, vhat, alpha, beta_1, beta_2, epsilon, decay, copies.ptrs,
                       opt.gradient_scale());
  copies.finish(vars);
}

void AdamOptimizer::update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) {
  for_decay_groups(grads, vars, lr, [&](const std::vector<Tensor>& g, const std::vector<Variable>& v, double decay) {
    detail::adam_steps(*this, g, v, lr, o_.beta_1, o_.beta_2, o_.epsilon, o_.amsgrad, decay);
  });
}

void AdamOptimizer::update_step(const Tensor& grad, const Variable& var, double lr) {
  detail::adam_step(*this, grad, var, lr, o_.beta_1, o_.beta_2, o_.epsilon, o_.amsgrad, weight_decay_factor(var, lr));
}

std::shared_ptr<AdamOptimizer> Adam(AdamOptions options) { return std::make_shared<AdamOptimizer>(std::move(options)); }

}  // namespace mpt::optimizers

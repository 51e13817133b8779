#include "mpt/optim_ops.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::optimizers {

RMSpropOptimizer::RMSpropOptimizer(RMSpropOptions o)
    : BuiltinOptimizer("rmsprop", std::move(o)) {
  MPT_CHECK(o_.rho >= 0 && o_.rho <= 1, "RMSprop: rho must be in [0, 1], got ", o_.rho);
  MPT_CHECK(o_.momentum >= 0, "RMSprop: momentum must be >= 0, got ", o_.momentum);
  MPT_CHECK(o_.epsilon >= 0, "RMSprop: epsilon must be >= 0, got ", o_.epsilon);
}

void RMSpropOptimizer::update_step(const Tensor& grad, const Variable& var, double lr) {
  apply_weight_decay({var}, lr);  // Keras's _apply_weight_decay, its own pass here
  Tensor value = var.value();
  Tensor& velocity = slot(var, "velocity");
  Tensor* average = o_.centered ? &slot(var, "average_gradient") : nullptr;
  Tensor* momentum = o_.momentum > 0 ? &slot(var, "momentum") : nullptr;
  const std::vector<Variable> one{var};
  const detail::UpdateCopies copy(one);
  ops::rmsprop_update(value, grad, velocity, average, momentum, lr, o_.rho, o_.momentum, o_.epsilon, copy.ptrs[0],
                      gradient_scale());
  copy.finish(one);
}

void RMSpropOptimizer::update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars,
                                    double lr) {
  if (!detail::fits_one_list_op(vars)) {  // one after another, as the per-variable loop
    Optimizer::update_steps(grads, vars, lr);
    return;
  }
  apply_weight_decay(vars, lr);
  std::vector<Tensor> values;
  std::vector<Tensor*> velocity, average, momentum;
  for (const auto& var : vars) {  // slots created in update_step's order
    values.push_back(var.value());
    velocity.push_back(&slot(var, "velocity"));
    if (o_.centered) average.push_back(&slot(var, "average_gradient"));
    if (o_.momentum > 0) momentum.push_back(&slot(var, "momentum"));
  }
  const detail::UpdateCopies copies(vars);
  ops::rmsprop_update_all(values, grads, velocity, average, momentum, lr, o_.rho, o_.momentum, o_.epsilon,
                          copies.ptrs, gradient_scale());
  copies.finish(vars);
}

std::shared_ptr<RMSpropOptimizer> RMSprop(RMSpropOptions options) { return std::make_shared<RMSpropOptimizer>(std::move(options)); }

}  // namespace mpt::optimizers

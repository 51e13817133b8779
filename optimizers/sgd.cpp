#include "mpt/optim_ops.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::optimizers {

SGDOptimizer::SGDOptimizer(SGDOptions o)
    : BuiltinOptimizer("SGD", std::move(o)) {
  MPT_CHECK(o_.momentum >= 0 && o_.momentum <= 1, "SGD: momentum must be in [0, 1], got ",
            o_.momentum);
}

void SGDOptimizer::update_step(const Tensor& grad, const Variable& var, double lr) {
  apply_weight_decay({var}, lr);  // Keras's _apply_weight_decay, its own pass here
  Tensor value = var.value();
  Tensor* m = o_.momentum != 0 ? &slot(var, "momentum") : nullptr;
  const std::vector<Variable> one{var};
  const detail::UpdateCopies copy(one);
  ops::sgd_update(value, grad, m, lr, o_.momentum, o_.nesterov, copy.ptrs[0], gradient_scale());
  copy.finish(one);
}

void SGDOptimizer::update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) {
  if (!detail::fits_one_list_op(vars)) {  // one after another, as the per-variable loop
    Optimizer::update_steps(grads, vars, lr);
    return;
  }
  apply_weight_decay(vars, lr);
  std::vector<Tensor> values;
  std::vector<Tensor*> momenta;
  for (const auto& var : vars) {
    values.push_back(var.value());
    if (o_.momentum != 0) momenta.push_back(&slot(var, "momentum"));
  }
  const detail::UpdateCopies copies(vars);
  ops::sgd_update_all(values, grads, momenta, lr, o_.momentum, o_.nesterov, copies.ptrs, gradient_scale());
  copies.finish(vars);
}

std::shared_ptr<SGDOptimizer> SGD(SGDOptions options) { return std::make_shared<SGDOptimizer>(std::move(options)); }

}  // namespace mpt::optimizers

#include <cmath>

#include "mpt/optim_ops.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::optimizers {

AdamWOptimizer::AdamWOptimizer(AdamWOptions o)
    : BuiltinOptimizer("adamw", std::move(o)) {
  MPT_CHECK(o_.beta_1 >= 0 && o_.beta_1 < 1 && o_.beta_2 >= 0 && o_.beta_2 < 1,
            "AdamW: beta_1 and beta_2 must be in [0, 1), got ", o_.beta_1, " and ", o_.beta_2);
  MPT_CHECK(o_.epsilon >= 0, "AdamW: epsilon must be >= 0, got ", o_.epsilon);
}

// Decoupled decay, var -= var * weight_decay * lr, before the Adam step (fused into it), as
// Adam with weight_decay set: Keras's AdamW is exactly that.
void AdamWOptimizer::update_step(const Tensor& grad, const Variable& var, double lr) {
  detail::adam_step(*this, grad, var, lr, o_.beta_1, o_.beta_2, o_.epsilon, o_.amsgrad, weight_decay_factor(var, lr));
}

void AdamWOptimizer::update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) {
  for_decay_groups(grads, vars, lr, [&](const std::vector<Tensor>& g, const std::vector<Variable>& v, double decay) {
    detail::adam_steps(*this, g, v, lr, o_.beta_1, o_.beta_2, o_.epsilon, o_.amsgrad, decay);
  });
}

std::shared_ptr<AdamWOptimizer> AdamW(AdamWOptions options) { return std::make_shared<AdamWOptimizer>(std::move(options)); }

}  // namespace mpt::optimizers

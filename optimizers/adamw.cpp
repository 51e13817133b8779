#include <cmath>

#include "mpt/optim_ops.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::optimizers {

AdamWOptimizer::AdamWOptimizer(AdamWOptions o)
    : Optimizer("adamw", {o.learning_rate, o.clipnorm, o.clipvalue, o.global_clipnorm}), o_(o) {
  MPT_CHECK(o_.weight_decay >= 0, "AdamW: weight_decay must be >= 0, got ", o_.weight_decay);
  MPT_CHECK(o_.beta_1 >= 0 && o_.beta_1 < 1 && o_.beta_2 >= 0 && o_.beta_2 < 1,
            "AdamW: beta_1 and beta_2 must be in [0, 1), got ", o_.beta_1, " and ", o_.beta_2);
  MPT_CHECK(o_.epsilon >= 0, "AdamW: epsilon must be >= 0, got ", o_.epsilon);
}

std::shared_ptr<Optimizer> AdamWOptimizer::clone() const { return std::make_shared<AdamWOptimizer>(o_); }

void AdamWOptimizer::update_step(const Tensor& grad, const Variable& var, double lr) {
  const double t = static_cast<double>(iterations() + 1);
  const double alpha = lr * std::sqrt(1 - std::pow(o_.beta_2, t)) / (1 - std::pow(o_.beta_1, t));
  Tensor value = var.value();
  Tensor& m = slot(var, "m");
  Tensor& v = slot(var, "v");
  Tensor* vhat = o_.amsgrad ? &slot(var, "vhat") : nullptr;
  // Decoupled decay, var -= var * weight_decay * lr, before the Adam step (fused into it).
  ops::adam_update(value, grad, m, v, vhat, alpha, o_.beta_1, o_.beta_2, o_.epsilon,
                   o_.weight_decay * lr);
  var.mark_modified();
}

std::shared_ptr<AdamWOptimizer> AdamW(AdamWOptions options) { return std::make_shared<AdamWOptimizer>(std::move(options)); }

}  // namespace mpt::optimizers

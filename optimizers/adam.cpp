#include <cmath>

#include "mpt/optim_ops.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::optimizers {

AdamOptimizer::AdamOptimizer(AdamOptions o)
    : Optimizer("adam", {o.learning_rate, o.clipnorm, o.clipvalue, o.global_clipnorm}), o_(o) {
  MPT_CHECK(o_.beta_1 >= 0 && o_.beta_1 < 1 && o_.beta_2 >= 0 && o_.beta_2 < 1,
            "Adam: beta_1 and beta_2 must be in [0, 1), got ", o_.beta_1, " and ", o_.beta_2);
  MPT_CHECK(o_.epsilon >= 0, "Adam: epsilon must be >= 0, got ", o_.epsilon);
}

std::shared_ptr<Optimizer> AdamOptimizer::clone() const { return std::make_shared<AdamOptimizer>(o_); }

void AdamOptimizer::update_step(const Tensor& grad, const Variable& var, double lr) {
  // Keras: bias corrections folded into the step size; t counts from 1.
  const double t = static_cast<double>(iterations() + 1);
  const double alpha = lr * std::sqrt(1 - std::pow(o_.beta_2, t)) / (1 - std::pow(o_.beta_1, t));
  Tensor value = var.value();
  Tensor& m = slot(var, "m");
  Tensor& v = slot(var, "v");
  Tensor* vhat = o_.amsgrad ? &slot(var, "vhat") : nullptr;
  ops::adam_update(value, grad, m, v, vhat, alpha, o_.beta_1, o_.beta_2, o_.epsilon);
  var.mark_modified();
}

std::shared_ptr<AdamOptimizer> Adam(AdamOptions options) { return std::make_shared<AdamOptimizer>(std::move(options)); }

}  // namespace mpt::optimizers

#include "mpt/optim_ops.hpp"

#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

namespace {

void check_update(const char* op, const Tensor& var, const Tensor& grad) {
  check_defined(op, var, "variable");
  check_defined(op, grad, "gradient");
  MPT_CHECK(var.dtype() == float32 || is_half(var.dtype()), op,
            ": the variable must be float32, float16 or bfloat16, got ", describe(var));
  MPT_CHECK(is_floating(grad.dtype()), op, ": the gradient must be floating-point, got ",
            describe(grad));
  MPT_CHECK(grad.shape() == var.shape() && grad.device() == var.device(), op, ": gradient ",
            describe(grad), " does not match variable ", describe(var));
}

void check_slot(const char* op, const Tensor& var, const Tensor* slot, const char* name) {
  if (!slot) return;
  MPT_CHECK(slot->defined(), op, ": slot '", name, "' is an undefined tensor");
  MPT_CHECK(slot->dtype() == float32, op, ": slot '", name, "' must be float32, got ",
            describe(*slot));
  MPT_CHECK(slot->shape() == var.shape() && slot->device() == var.device(), op, ": slot '", name,
            "' ", describe(*slot), " does not match variable ", describe(var));
}

}  // namespace

void sgd_update(Tensor& var, const Tensor& grad, Tensor* momentum, double lr, double momentum_coef,
                bool nesterov) {
  check_update("sgd_update", var, grad);
  check_slot("sgd_update", var, momentum, "momentum");
  backend_of(var).sgd_update(var, grad, momentum, lr, momentum_coef, nesterov);
}

void adam_update(Tensor& var, const Tensor& grad, Tensor& m, Tensor& v, Tensor* vhat, double alpha,
                 double beta_1, double beta_2, double epsilon, double decay) {
  check_update("adam_update", var, grad);
  check_slot("adam_update", var, &m, "m");
  check_slot("adam_update", var, &v, "v");
  check_slot("adam_update", var, vhat, "vhat");
  backend_of(var).adam_update(var, grad, m, v, vhat, alpha, beta_1, beta_2, epsilon, decay);
}

void rmsprop_update(Tensor& var, const Tensor& grad, Tensor& velocity, Tensor* average_grad,
                    Tensor* momentum, double lr, double rho, double momentum_coef, double epsilon) {
  check_update("rmsprop_update", var, grad);
  check_slot("rmsprop_update", var, &velocity, "velocity");
  check_slot("rmsprop_update", var, average_grad, "average_gradient");
  check_slot("rmsprop_update", var, momentum, "momentum");
  backend_of(var).rmsprop_update(var, grad, velocity, average_grad, momentum, lr, rho,
                                 momentum_coef, epsilon);
}

UnscaleResult unscale_and_check(const std::vector<Tensor>& grads, double inv_scale) {
  UnscaleResult r;
  r.grads.resize(grads.size());
  const Tensor* first = nullptr;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    MPT_CHECK(is_floating(g.dtype()), "unscale_and_check: gradient ", i,
              " must be floating-point, got ", describe(g));
    if (!first) first = &g;
    MPT_CHECK(g.device() == first->device(), "unscale_and_check: gradients on different devices: ",
              describe(*first), " vs ", describe(g), " (gradient ", i, ")");
    r.grads[i] = Tensor::empty(g.shape(), float32, g.device());
  }
  if (first) r.found_nonfinite = backend_of(*first).unscale_and_check(grads, inv_scale, r.grads);
  return r;
}

}  // namespace mpt::ops

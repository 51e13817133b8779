// Adafactor (Keras's): the second moment of a matrix kept as its row and column means. Its step
// needs three reductions (the variable's RMS, the row and column means, the update's RMS), so it
// is written with mpt::ops rather than one element-wise pass; every op runs on the variable's
// device, in float32.
#include <cmath>

#include "mpt/autograd.hpp"
#include "mpt/ops.hpp"
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

namespace {
Tensor scalar_like(double v, const Tensor& like) { return Tensor::scalar(v, float32, like.device()); }
Tensor rms(const Tensor& x) { return ops::sqrt(ops::mean(ops::square(x))); }
}  // namespace

void AdafactorOptimizer::update_step(const Tensor& grad, const Variable& var, double lr_in) {
  NoGradGuard no_grad;
  apply_weight_decay({var}, lr_in);  // Keras's _apply_weight_decay, before the step
  const Tensor w = var.value().dtype() == float32 ? var.value() : var.value().to(float32);
  const Tensor g = grad.dtype() == float32 ? grad : grad.to(float32);
  // Keras, in float32: t = iterations + 1; lr = min(lr, 1/sqrt(t)) when relative_step and no
  // schedule; rho_t = min(lr, 1/sqrt(t)); alpha_t = max(epsilon_2, rms(var)) * rho_t.
  const float t = static_cast<float>(iterations() + 1);
  const float inv_sqrt_t = 1.0f / std::sqrt(t);
  float lr = static_cast<float>(lr_in);
  if (!common_options().learning_rate.is_schedule() && o_.relative_step) lr = std::min(lr, inv_sqrt_t);
  const float rho_t = std::min(lr, inv_sqrt_t);
  const Tensor alpha_t = ops::mul(ops::maximum(scalar_like(o_.epsilon_2, w), rms(w)), scalar_like(rho_t, w));
  const Tensor regulated = ops::add(ops::square(g), scalar_like(o_.epsilon_1, g));
  const float beta_2_t = 1.0f - std::pow(t, static_cast<float>(o_.beta_2_decay));
  const Tensor b = scalar_like(beta_2_t, g), one_minus_b = scalar_like(1.0f - beta_2_t, g);
  Tensor v;
  if (var.shape().size() >= 2) {
    Tensor& r = slot(var, "r");
    Tensor& c = slot(var, "c");
    r.assign(ops::add(ops::mul(b, r), ops::mul(one_minus_b, ops::mean(regulated, {-1}))));
    c.assign(ops::add(ops::mul(b, c), ops::mul(one_minus_b, ops::mean(regulated, {-2}))));
    // v = (r / mean(r, -1))[..., None] * c[..., None, :]
    Shape rs = r.shape(), cs = c.shape();
    rs.push_back(1);
    cs.insert(cs.end() - 1, 1);
    v = ops::mul(ops::reshape(ops::div(r, ops::mean(r, {-1}, true)), rs), ops::reshape(c, cs));
  } else {
    Tensor& vel = slot(var, "velocity");
    vel.assign(ops::add(ops::mul(b, vel), ops::mul(one_minus_b, regulated)));
    v = vel;
  }
  const Tensor u = ops::div(g, ops::sqrt(v));
  const Tensor u_hat =
      ops::div(u, ops::maximum(scalar_like(1.0, u), ops::div(rms(u), scalar_like(o_.clip_threshold, u))));
  var.assign(ops::sub(w, ops::mul(alpha_t, u_hat)));
}

std::shared_ptr<AdafactorOptimizer> Adafactor(AdafactorOptions options) {
  return std::make_shared<AdafactorOptimizer>(std::move(options));
}

}  // namespace mpt::optimizers

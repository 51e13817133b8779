// Nadam, Adamax, Adagrad and Lion: each a rule of mpt::ops::rule_update (one fused pass per
// variable, or a few launches for all variables on a GPU), with the step's arguments computed
// here as Keras computes them (in float32).
#include <cmath>

#include "mpt/optim_ops.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::optimizers {

namespace {

void check_beta(const char* who, const char* name, double b) {
  MPT_CHECK(b >= 0 && b < 1, who, ": ", name, " must be in [0, 1), got ", b);
}

void check_epsilon(const char* who, double e) { MPT_CHECK(e >= 0 && std::isfinite(e), who, ": epsilon must be a finite number >= 0, got ", e); }

/// Keras's ops.power(beta, t) in float32.
double powf32(double beta, std::int64_t t) {
  return static_cast<double>(std::pow(static_cast<float>(beta), static_cast<float>(t)));
}

}  // namespace

template <class Derived, class Options>
void detail::RuleOptimizer<Derived, Options>::update_step(const Tensor& grad, const Variable& var, double lr) {
  const ops::UpdateRule rule = Derived::kRule;
  ops::RuleArgs args = rule_args(lr);
  args.decay = this->weight_decay_factor(var, lr);
  std::vector<Tensor*> slots;
  for (const auto& n : this->slot_names()) slots.push_back(&this->slot(var, n));
  Tensor value = var.value();
  const std::vector<Variable> one{var};
  const UpdateCopies copy(one);
  ops::rule_update(rule, value, grad, slots, args, copy.ptrs[0], this->gradient_scale());
  copy.finish(one);
}

template <class Derived, class Options>
void detail::RuleOptimizer<Derived, Options>::update_steps(const std::vector<Tensor>& grads,
                                                           const std::vector<Variable>& vars, double lr) {
  if (!fits_one_list_op(vars)) {  // one after another, as the per-variable loop
    Optimizer::update_steps(grads, vars, lr);
    return;
  }
  const ops::RuleArgs base = rule_args(lr);
  const std::vector<std::string> names = this->slot_names();
  this->for_decay_groups(grads, vars, lr, [&](const std::vector<Tensor>& g, const std::vector<Variable>& v, double decay) {
    ops::RuleArgs args = base;
    args.decay = decay;
    std::vector<Tensor> values;
    std::vector<std::vector<Tensor*>> slots(names.size());
    for (const auto& var : v) {  // slots created in update_step's order
      values.push_back(var.value());
      for (std::size_t k = 0; k < names.size(); ++k) slots[k].push_back(&this->slot(var, names[k]));
    }
    const UpdateCopies copies(v);
    ops::rule_update_all(Derived::kRule, values, g, slots, args, copies.ptrs, this->gradient_scale());
    copies.finish(v);
  });
}

// ---- Nadam --------------------------------------------------------------------------------------

NadamOptimizer::NadamOptimizer(NadamOptions o) : RuleOptimizer("nadam", std::move(o)) {
  check_beta("Nadam", "beta_1", o_.beta_1);
  check_beta("Nadam", "beta_2", o_.beta_2);
  check_epsilon("Nadam", o_.epsilon);
}

namespace {
/// Keras's u_t = beta_1 * (1 - 0.5 * 0.96^t), in float32.
float nadam_u(double beta_1, std::int64_t t) {
  const float p = std::pow(0.96f, static_cast<float>(t));
  return static_cast<float>(beta_1) * (1.0f - 0.5f * p);
}
/// Keras's u_product update at step t: u_product * beta_1 * (1 - 0.5 * 0.96^t), in float32 and
/// in that order (not u_product * nadam_u(t): another rounding).
float nadam_product(float u_product, double beta_1, std::int64_t t) {
  return u_product * static_cast<float>(beta_1) * (1.0f - 0.5f * std::pow(0.96f, static_cast<float>(t)));
}
}  // namespace

float NadamOptimizer::u_product() const {
  // Keras keeps u_product as a float32 variable multiplied by u_t at every step; the same
  // product, recomputed from the start when the step count moved other than by one (a restore).
  const std::int64_t t = iterations();
  if (t < u_product_step_) u_product_step_ = 0, u_product_ = 1.0f;
  for (; u_product_step_ < t; ++u_product_step_)
    u_product_ = nadam_product(u_product_, o_.beta_1, u_product_step_ + 1);
  return u_product_;
}

ops::RuleArgs NadamOptimizer::rule_args(double lr) const {
  // Keras's _backend_update_step multiplies u_product by u_{t} before the update: the update of
  // step t (t = iterations + 1) sees u_product_t = u_1 .. u_t and u_product_{t+1} = that * u_{t+1}.
  const std::int64_t t = iterations() + 1;
  const float u_t = nadam_u(o_.beta_1, t), u_next = nadam_u(o_.beta_1, t + 1);
  const float product = nadam_product(u_product(), o_.beta_1, t);
  ops::RuleArgs a;
  a.lr = lr, a.beta_1 = o_.beta_1, a.beta_2 = o_.beta_2, a.epsilon = o_.epsilon;
  a.u_t = u_t, a.u_next = u_next, a.u_product = product, a.u_product_next = product * u_next;
  a.beta_2_power = powf32(o_.beta_2, t);
  return a;
}

std::shared_ptr<NadamOptimizer> Nadam(NadamOptions options) { return std::make_shared<NadamOptimizer>(std::move(options)); }

// ---- Adamax -------------------------------------------------------------------------------------

AdamaxOptimizer::AdamaxOptimizer(AdamaxOptions o) : RuleOptimizer("adamax", std::move(o)) {
  check_beta("Adamax", "beta_1", o_.beta_1);
  check_beta("Adamax", "beta_2", o_.beta_2);
  check_epsilon("Adamax", o_.epsilon);
}

ops::RuleArgs AdamaxOptimizer::rule_args(double lr) const {
  ops::RuleArgs a;
  a.lr = lr, a.beta_1 = o_.beta_1, a.beta_2 = o_.beta_2, a.epsilon = o_.epsilon;
  a.beta_1_power = powf32(o_.beta_1, iterations() + 1);
  return a;
}

std::shared_ptr<AdamaxOptimizer> Adamax(AdamaxOptions options) { return std::make_shared<AdamaxOptimizer>(std::move(options)); }

// ---- Adagrad ------------------------------------------------------------------------------------

AdagradOptimizer::AdagradOptimizer(AdagradOptions o) : RuleOptimizer("adagrad", std::move(o)) {
  MPT_CHECK(std::isfinite(o_.initial_accumulator_value) && o_.initial_accumulator_value >= 0,
            "Adagrad: initial_accumulator_value must be a finite number >= 0, got ", o_.initial_accumulator_value);
  check_epsilon("Adagrad", o_.epsilon);
}

ops::RuleArgs AdagradOptimizer::rule_args(double lr) const {
  ops::RuleArgs a;
  a.lr = lr, a.epsilon = o_.epsilon;
  return a;
}

std::shared_ptr<AdagradOptimizer> Adagrad(AdagradOptions options) { return std::make_shared<AdagradOptimizer>(std::move(options)); }

// ---- Lion ---------------------------------------------------------------------------------------

LionOptimizer::LionOptimizer(LionOptions o) : RuleOptimizer("lion", std::move(o)) {
  // Keras: beta_1 in (0, 1].
  MPT_CHECK(o_.beta_1 > 0 && o_.beta_1 <= 1, "Lion: beta_1 must be in (0, 1], got ", o_.beta_1);
  check_beta("Lion", "beta_2", o_.beta_2);
}

ops::RuleArgs LionOptimizer::rule_args(double lr) const {
  ops::RuleArgs a;
  a.lr = lr, a.beta_1 = o_.beta_1, a.beta_2 = o_.beta_2;
  return a;
}

std::shared_ptr<LionOptimizer> Lion(LionOptions options) { return std::make_shared<LionOptimizer>(std::move(options)); }

template class detail::RuleOptimizer<NadamOptimizer, NadamOptions>;
template class detail::RuleOptimizer<AdamaxOptimizer, AdamaxOptions>;
template class detail::RuleOptimizer<AdagradOptimizer, AdagradOptions>;
template class detail::RuleOptimizer<LionOptimizer, LionOptions>;

}  // namespace mpt::optimizers

#include "mpt/optim_ops.hpp"

#include <algorithm>
#include <cmath>
#include <ostream>

#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

namespace {

/// " (entry i)" after the op's name for the list ops; nothing for the single ones.
struct Entry {
  std::int64_t i = -1;
};
std::ostream& operator<<(std::ostream& os, Entry e) {
  if (e.i >= 0) os << " (entry " << e.i << ")";
  return os;
}

void check_update(const char* op, const Tensor& var, const Tensor& grad, Entry e = {}) {
  MPT_CHECK(var.defined(), op, e, ": variable is an undefined tensor");
  MPT_CHECK(grad.defined(), op, e, ": gradient is an undefined tensor");
  MPT_CHECK(var.dtype() == float32 || is_half(var.dtype()), op, e,
            ": the variable must be float32, float16 or bfloat16, got ", describe(var));
  MPT_CHECK(is_floating(grad.dtype()), op, e, ": the gradient must be floating-point, got ",
            describe(grad));
  MPT_CHECK(grad.shape() == var.shape() && grad.device() == var.device(), op, e, ": gradient ",
            describe(grad), " does not match variable ", describe(var));
}

void check_slot(const char* op, const Tensor& var, const Tensor* slot, const char* name, Entry e = {}) {
  if (!slot) return;
  MPT_CHECK(slot->defined(), op, e, ": slot '", name, "' is an undefined tensor");
  MPT_CHECK(slot->dtype() == float32, op, e, ": slot '", name, "' must be float32, got ",
            describe(*slot));
  MPT_CHECK(slot->shape() == var.shape() && slot->device() == var.device(), op, e, ": slot '", name,
            "' ", describe(*slot), " does not match variable ", describe(var));
}

/// The optional copy of the updated variable (optim_ops.hpp): float32 or 16-bit, the variable's
/// shape and device, and not the variable's own memory.
void check_copy(const char* op, const Tensor& var, const Tensor* copy, Entry e = {}) {
  if (!copy) return;
  MPT_CHECK(copy->defined(), op, e, ": copy is an undefined tensor");
  MPT_CHECK(copy->dtype() == float32 || is_half(copy->dtype()), op, e,
            ": the copy must be float32, float16 or bfloat16, got ", describe(*copy));
  MPT_CHECK(copy->shape() == var.shape() && copy->device() == var.device(), op, e, ": copy ", describe(*copy),
            " does not match variable ", describe(var));
  MPT_CHECK(var.numel() == 0 || copy->data_ptr() != var.data_ptr(), op, e,
            ": the copy is the variable's own memory");
}

/// grad_scale multiplies gradients in float32: a finite, positive number (an inverse loss scale).
void check_grad_scale(const char* op, double grad_scale) {
  MPT_CHECK(std::isfinite(grad_scale) && grad_scale > 0, op, ": grad_scale must be a finite number > 0, got ",
            grad_scale);
}

/// A slot list of the list ops: `required` ones have a non-null entry per variable, optional
/// ones are empty or have an entry per variable.
struct SlotList {
  const std::vector<Tensor*>& slots;
  const char* name;
  bool required;
};

/// Validates every entry of a list op as its single op does, plus one device for all and no
/// variable twice (the backend may update all entries at once).
void check_update_all(const char* op, const std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                      std::initializer_list<SlotList> slot_lists, const std::vector<Tensor*>& copies) {
  MPT_CHECK(grads.size() == vars.size(), op, ": ", grads.size(), " gradients for ", vars.size(), " variables");
  MPT_CHECK(copies.empty() || copies.size() == vars.size(), op, ": ", copies.size(), " copies for ", vars.size(),
            " variables (give none or one each)");
  for (const SlotList& l : slot_lists) {
    MPT_CHECK(l.slots.size() == vars.size() || (!l.required && l.slots.empty()), op, ": ", l.slots.size(),
              " '", l.name, "' slots for ", vars.size(), " variables", l.required ? "" : " (give none or one each)");
  }
  std::vector<const void*> storage;
  storage.reserve(vars.size());
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const Entry e{static_cast<std::int64_t>(i)};
    check_update(op, vars[i], grads[i], e);
    MPT_CHECK(vars[i].device() == vars[0].device(), op, e, ": variable ", describe(vars[i]),
              " is not on the first variable's device ", vars[0].device().str());
    for (const SlotList& l : slot_lists) {
      if (l.slots.empty()) continue;
      MPT_CHECK(l.slots[i] || !l.required, op, e, ": slot '", l.name, "' is missing (null)");
      check_slot(op, vars[i], l.slots[i], l.name, e);
    }
    if (!copies.empty()) check_copy(op, vars[i], copies[i], e);
    if (vars[i].numel() > 0) storage.push_back(vars[i].data_ptr());
  }
  std::vector<const void*> sorted = storage;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    const void* dup = *std::adjacent_find(sorted.begin(), sorted.end());
    std::vector<std::size_t> at;
    for (std::size_t i = 0; i < vars.size(); ++i)
      if (vars[i].numel() > 0 && vars[i].data_ptr() == dup) at.push_back(i);
    fail(op, ": entries ", at[0], " and ", at[1], " update the same variable");
  }
  // Every written tensor once: a copy may not be another entry's variable or copy.
  std::vector<std::pair<const void*, std::size_t>> written;  // (copy memory, entry), sorted
  for (std::size_t i = 0; i < copies.size(); ++i) {
    if (!copies[i] || copies[i]->numel() == 0) continue;
    const void* p = copies[i]->data_ptr();
    MPT_CHECK(!std::binary_search(sorted.begin(), sorted.end(), p), op, Entry{static_cast<std::int64_t>(i)},
              ": the copy is the memory of a variable of the list");
    written.emplace_back(p, i);
  }
  std::sort(written.begin(), written.end());
  for (std::size_t k = 1; k < written.size(); ++k)
    MPT_CHECK(written[k].first != written[k - 1].first, op, Entry{static_cast<std::int64_t>(written[k].second)},
              ": the copy is also entry ", written[k - 1].second, "'s copy");
}

}  // namespace

void sgd_update(Tensor& var, const Tensor& grad, Tensor* momentum, double lr, double momentum_coef,
                bool nesterov, Tensor* copy, double grad_scale) {
  check_update("sgd_update", var, grad);
  check_slot("sgd_update", var, momentum, "momentum");
  check_copy("sgd_update", var, copy);
  check_grad_scale("sgd_update", grad_scale);
  backend_of(var).sgd_update(var, grad, momentum, lr, momentum_coef, nesterov, copy, grad_scale);
}

void adam_update(Tensor& var, const Tensor& grad, Tensor& m, Tensor& v, Tensor* vhat, double alpha,
                 double beta_1, double beta_2, double epsilon, double decay, Tensor* copy, double grad_scale) {
  check_update("adam_update", var, grad);
  check_slot("adam_update", var, &m, "m");
  check_slot("adam_update", var, &v, "v");
  check_slot("adam_update", var, vhat, "vhat");
  check_copy("adam_update", var, copy);
  check_grad_scale("adam_update", grad_scale);
  backend_of(var).adam_update(var, grad, m, v, vhat, alpha, beta_1, beta_2, epsilon, decay, copy, grad_scale);
}

void rmsprop_update(Tensor& var, const Tensor& grad, Tensor& velocity, Tensor* average_grad,
                    Tensor* momentum, double lr, double rho, double momentum_coef, double epsilon,
                    Tensor* copy, double grad_scale) {
  check_update("rmsprop_update", var, grad);
  check_slot("rmsprop_update", var, &velocity, "velocity");
  check_slot("rmsprop_update", var, average_grad, "average_gradient");
  check_slot("rmsprop_update", var, momentum, "momentum");
  check_copy("rmsprop_update", var, copy);
  check_grad_scale("rmsprop_update", grad_scale);
  backend_of(var).rmsprop_update(var, grad, velocity, average_grad, momentum, lr, rho,
                                 momentum_coef, epsilon, copy, grad_scale);
}

void sgd_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                    const std::vector<Tensor*>& momenta, double lr, double momentum_coef, bool nesterov,
                    const std::vector<Tensor*>& copies, double grad_scale) {
  check_update_all("sgd_update_all", vars, grads, {{momenta, "momentum", false}}, copies);
  check_grad_scale("sgd_update_all", grad_scale);
  if (vars.empty()) return;
  backend_of(vars[0]).sgd_update_all(vars, grads, momenta, lr, momentum_coef, nesterov, copies, grad_scale);
}

void adam_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads, const std::vector<Tensor*>& m,
                     const std::vector<Tensor*>& v, const std::vector<Tensor*>& vhat, double alpha, double beta_1,
                     double beta_2, double epsilon, double decay, const std::vector<Tensor*>& copies,
                     double grad_scale) {
  check_update_all("adam_update_all", vars, grads, {{m, "m", true}, {v, "v", true}, {vhat, "vhat", false}},
                   copies);
  check_grad_scale("adam_update_all", grad_scale);
  if (vars.empty()) return;
  backend_of(vars[0]).adam_update_all(vars, grads, m, v, vhat, alpha, beta_1, beta_2, epsilon, decay, copies,
                                      grad_scale);
}

void rmsprop_update_all(std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                        const std::vector<Tensor*>& velocity, const std::vector<Tensor*>& average_grad,
                        const std::vector<Tensor*>& momentum, double lr, double rho, double momentum_coef,
                        double epsilon, const std::vector<Tensor*>& copies, double grad_scale) {
  check_update_all("rmsprop_update_all", vars, grads,
                   {{velocity, "velocity", true}, {average_grad, "average_gradient", false},
                    {momentum, "momentum", false}},
                   copies);
  check_grad_scale("rmsprop_update_all", grad_scale);
  if (vars.empty()) return;
  backend_of(vars[0]).rmsprop_update_all(vars, grads, velocity, average_grad, momentum, lr, rho, momentum_coef,
                                         epsilon, copies, grad_scale);
}

namespace {

common::RuleKind rule_kind(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::nadam: return common::RuleKind::Nadam;
    case UpdateRule::adamax: return common::RuleKind::Adamax;
    case UpdateRule::adagrad: return common::RuleKind::Adagrad;
    case UpdateRule::lion: return common::RuleKind::Lion;
  }
  fail("rule_update: unknown rule ", static_cast<int>(rule));
}

/// The float32 constants of one step, for either backend. Keras computes its scalars in the
/// variable's dtype (float32): 1 - beta in float32 where Keras casts beta first (Nadam, Lion),
/// in float64 where it subtracts the Python float (Adamax).
common::RuleHyper rule_hyper(UpdateRule rule, const RuleArgs& a) {
  common::RuleHyper h;
  const auto f = [](double x) { return static_cast<float>(x); };
  h.lr = f(a.lr), h.decay = f(a.decay), h.eps = f(a.epsilon);
  const float b1 = f(a.beta_1), b2 = f(a.beta_2);
  switch (rule) {
    case UpdateRule::nadam:
      h.c1 = 1.0f - b1, h.c2 = 1.0f - b2;
      h.k0 = f(a.u_next), h.k1 = 1.0f - f(a.u_product_next), h.k2 = 1.0f - f(a.u_t), h.k3 = 1.0f - f(a.u_product);
      h.k4 = 1.0f - f(a.beta_2_power);
      break;
    case UpdateRule::adamax: h.c1 = f(1 - a.beta_1), h.b2 = b2, h.k0 = 1.0f - f(a.beta_1_power); break;
    case UpdateRule::adagrad: break;
    case UpdateRule::lion: h.k0 = b1, h.c1 = 1.0f - b1, h.b2 = b2, h.c2 = 1.0f - b2; break;
  }
  return h;
}

const char* const kRuleSlotNames[4][2] = {
    {"momentum", "velocity"}, {"momentum", "norm"}, {"accumulator", ""}, {"momentum", ""}};

}  // namespace

const char* rule_name(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::nadam: return "nadam";
    case UpdateRule::adamax: return "adamax";
    case UpdateRule::adagrad: return "adagrad";
    case UpdateRule::lion: return "lion";
  }
  return "unknown";
}

int rule_slot_count(UpdateRule rule) { return common::rule_slots(rule_kind(rule)); }

void rule_update_all(UpdateRule rule, std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                     const std::vector<std::vector<Tensor*>>& slots, const RuleArgs& args,
                     const std::vector<Tensor*>& copies, double grad_scale) {
  const std::string op = std::string(rule_name(rule)) + "_update_all";
  const int n = rule_slot_count(rule);
  MPT_CHECK(static_cast<int>(slots.size()) == n, op, ": ", slots.size(), " slot lists, the rule has ", n);
  const auto& names = kRuleSlotNames[static_cast<int>(rule_kind(rule))];
  static const std::vector<Tensor*> none;
  check_update_all(op.c_str(), vars, grads,
                   {{slots[0], names[0], true}, {n > 1 ? slots[1] : none, n > 1 ? names[1] : "", n > 1}}, copies);
  check_grad_scale(op.c_str(), grad_scale);
  if (vars.empty()) return;
  backend_of(vars[0]).rule_update_all(rule_kind(rule), vars, grads, slots, rule_hyper(rule, args), copies, grad_scale);
}

void rule_update(UpdateRule rule, Tensor& var, const Tensor& grad, const std::vector<Tensor*>& slots,
                 const RuleArgs& args, Tensor* copy, double grad_scale) {
  const std::string op = std::string(rule_name(rule)) + "_update";
  const int n = rule_slot_count(rule);
  MPT_CHECK(static_cast<int>(slots.size()) == n, op, ": ", slots.size(), " slots, the rule has ", n);
  const auto& names = kRuleSlotNames[static_cast<int>(rule_kind(rule))];
  check_update(op.c_str(), var, grad);
  for (int k = 0; k < n; ++k) {
    MPT_CHECK(slots[k] != nullptr, op, ": slot '", names[k], "' is missing (null)");
    check_slot(op.c_str(), var, slots[k], names[k]);
  }
  check_copy(op.c_str(), var, copy);
  check_grad_scale(op.c_str(), grad_scale);
  std::vector<Tensor> vars{var};
  std::vector<std::vector<Tensor*>> lists;
  for (Tensor* t : slots) lists.push_back({t});
  backend_of(var).rule_update_all(rule_kind(rule), vars, {grad}, lists, rule_hyper(rule, args),
                                  copy ? std::vector<Tensor*>{copy} : std::vector<Tensor*>{}, grad_scale);
}

void adafactor_update(Tensor& var, const Tensor& grad, Tensor* r, Tensor* c, Tensor* v, const AdafactorArgs& a) {
  const char* op = "adafactor_update";
  check_update(op, var, grad);
  const Shape& shape = var.shape();
  const bool factored = shape.size() >= 2;
  common::AdafactorShape s;
  if (factored) {
    s.rows = shape[shape.size() - 2], s.cols = shape.back();
    s.blocks = s.rows * s.cols == 0 ? 0 : var.numel() / (s.rows * s.cols);
    Shape rs = shape, cs = shape;
    rs.pop_back();
    cs.erase(cs.end() - 2);
    MPT_CHECK(r && c && !v, op, ": a variable of rank ", shape.size(), " takes the slots r and c (and no v)");
    const auto check_factor = [&](const Tensor* slot, const char* name, const Shape& want) {
      MPT_CHECK(slot->defined() && slot->dtype() == float32 && slot->shape() == want && slot->device() == var.device(),
                op, ": slot '", name, "' must be float32 of shape ", to_string(want), " on ", var.device().str(), ", got ",
                describe(*slot));
    };
    check_factor(r, "r", rs);
    check_factor(c, "c", cs);
  } else {
    s.rows = var.numel();
    MPT_CHECK(v && !r && !c, op, ": a variable of rank ", shape.size(), " takes the slot v (and no r, c)");
    check_slot(op, var, v, "v");
  }
  s.factored = factored;
  MPT_CHECK(std::isfinite(a.clip_threshold) && a.clip_threshold > 0, op,
            ": clip_threshold must be a finite number > 0, got ", a.clip_threshold);
  if (var.numel() == 0) return;
  common::AdafactorHyper h;
  const auto f = [](double x) { return static_cast<float>(x); };
  h.b = f(a.beta_2_t), h.omb = 1.0f - h.b, h.eps1 = f(a.epsilon_1), h.eps2 = f(a.epsilon_2), h.rho = f(a.rho_t),
  h.clip = f(a.clip_threshold), h.decay = f(a.decay);
  // The backends take float32 variables and gradients: others go through float32 copies.
  Tensor w = var.dtype() == float32 ? var : var.to(float32);
  const Tensor g = grad.dtype() == float32 ? grad : grad.to(float32);
  backend_of(var).adafactor_update(w, g, r, c, v, s, h);
  if (w.data_ptr() != var.data_ptr()) var.assign(w);
}

namespace {
/// unscale_and_check, and check_unscaled when !write (the outputs stay undefined: the backend
/// only checks).
UnscaleResult unscale_or_check(const std::vector<Tensor>& grads, const Tensor& inv_scale, bool write) {
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
    if (write) r.grads[i] = Tensor::empty(g.shape(), float32, g.device());
  }
  check_defined("unscale_and_check", inv_scale, "inv_scale");
  MPT_CHECK(inv_scale.dtype() == float32 && inv_scale.numel() == 1, "unscale_and_check: inv_scale must be ",
            "one float32 value, got ", describe(inv_scale));
  const Device device = first ? first->device() : inv_scale.device();
  MPT_CHECK(inv_scale.device() == device, "unscale_and_check: inv_scale on ", inv_scale.device().str(),
            ", gradients on ", device.str());
  r.found_flag = Tensor::empty({}, float32, device);
  r.nonfinite_flags = Tensor::empty({static_cast<std::int64_t>(grads.size())}, float32, device);
  mpt::detail::backend(device).unscale_and_check(grads, inv_scale, r.grads, r.found_flag, r.nonfinite_flags);
  if (!write) r.grads.clear();
  return r;
}
}  // namespace

UnscaleResult unscale_and_check(const std::vector<Tensor>& grads, const Tensor& inv_scale) {
  return unscale_or_check(grads, inv_scale, true);
}

UnscaleResult check_unscaled(const std::vector<Tensor>& grads, const Tensor& inv_scale) {
  return unscale_or_check(grads, inv_scale, false);
}

UnscaleResult unscale_and_check(const std::vector<Tensor>& grads, double inv_scale) {
  Device device = default_device();
  for (const auto& g : grads)
    if (g.defined()) device = g.device();
  UnscaleResult r = unscale_and_check(grads, Tensor::scalar(inv_scale, float32, device));
  r.found_nonfinite = r.found_flag.item() != 0.0;
  return r;
}

void update_loss_scale(Tensor& scale, Tensor& inv_scale, Tensor& counters, const Tensor& found,
                       const LossScaleRule& rule) {
  const char* op = "update_loss_scale";
  for (const Tensor* t : std::initializer_list<const Tensor*>{&scale, &inv_scale, &found}) {
    check_defined(op, *t);
    MPT_CHECK(t->dtype() == float32 && t->numel() == 1, op, ": scale, inv_scale and the flag must be one ",
              "float32 value each, got ", describe(*t));
  }
  MPT_CHECK(counters.dtype() == int64 && counters.numel() == 2, op, ": counters must be int64 [2], got ",
            describe(counters));
  for (const Tensor* t : std::initializer_list<const Tensor*>{&inv_scale, &counters, &found})
    MPT_CHECK(t->device() == scale.device(), op, ": ", describe(*t), " is not on the scale's device ",
              scale.device().str());
  backend_of(scale).update_loss_scale(scale, inv_scale, counters, found, rule);
}

}  // namespace mpt::ops

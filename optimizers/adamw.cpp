#include <cmath>
#include <regex>

#include "mpt/optim_ops.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::optimizers {

struct AdamWOptimizer::ExcludePattern {
  std::regex re;
};

AdamWOptimizer::AdamWOptimizer(AdamWOptions o)
    : BuiltinOptimizer("adamw", std::move(o)) {
  MPT_CHECK(o_.weight_decay >= 0, "AdamW: weight_decay must be >= 0, got ", o_.weight_decay);
  MPT_CHECK(o_.beta_1 >= 0 && o_.beta_1 < 1 && o_.beta_2 >= 0 && o_.beta_2 < 1,
            "AdamW: beta_1 and beta_2 must be in [0, 1), got ", o_.beta_1, " and ", o_.beta_2);
  MPT_CHECK(o_.epsilon >= 0, "AdamW: epsilon must be >= 0, got ", o_.epsilon);
}

void AdamWOptimizer::exclude_from_weight_decay(const std::vector<std::string>& var_names) {
  // Keras: "can only be configured before the optimizer is built" (slots made or a step taken).
  MPT_CHECK(iterations() == 0 && slots_by_path().empty(), "optimizer '", name(),
            "': exclude_from_weight_decay() can only be configured before the optimizer is built "
            "(before compile/fit or its first apply_gradients)");
  std::shared_ptr<const ExcludePattern> pattern;
  if (!var_names.empty()) {  // Keras: re.compile("|".join(set(var_names)))
    std::string joined;
    for (const auto& n : var_names) {
      MPT_CHECK(!n.empty(), "optimizer '", name(), "': exclude_from_weight_decay: an empty name would match every variable");
      joined += (joined.empty() ? "" : "|") + n;
    }
    // std::regex compiles and matches recursively: a bound keeps a checkpoint's list (read
    // from a file) from exhausting the stack.
    MPT_CHECK(joined.size() <= 4096, "optimizer '", name(), "': exclude_from_weight_decay: the names are ",
              joined.size(), " characters together, more than 4096");
    try {
      pattern = std::make_shared<const ExcludePattern>(ExcludePattern{std::regex(joined, std::regex::ECMAScript)});
    } catch (const std::regex_error& e) {
      fail("optimizer '", name(), "': exclude_from_weight_decay: invalid pattern '", joined, "': ", e.what());
    }
  }
  exclude_names_ = var_names;
  exclude_pattern_ = std::move(pattern);
  use_decay_cache_.clear();
}

bool AdamWOptimizer::use_weight_decay(const Variable& var) const {
  if (!exclude_pattern_) return true;
  auto it = use_decay_cache_.find(var.id());
  if (it != use_decay_cache_.end() && it->second.first == var.name()) return it->second.second;
  const bool use = !std::regex_search(var.name(), exclude_pattern_->re);
  use_decay_cache_[var.id()] = {var.name(), use};
  return use;
}

std::shared_ptr<Optimizer> AdamWOptimizer::clone() const {
  auto c = std::make_shared<AdamWOptimizer>(o_);
  c->exclude_names_ = exclude_names_;
  c->exclude_pattern_ = exclude_pattern_;  // immutable, shared
  return c;
}

void AdamWOptimizer::update_step(const Tensor& grad, const Variable& var, double lr) {
  // Decoupled decay, var -= var * weight_decay * lr, before the Adam step (fused into it).
  const double decay = use_weight_decay(var) ? o_.weight_decay * lr : 0.0;
  detail::adam_step(*this, grad, var, lr, o_.beta_1, o_.beta_2, o_.epsilon, o_.amsgrad, decay);
}

void AdamWOptimizer::update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) {
  const double decay = o_.weight_decay * lr;
  if (!exclude_pattern_ || decay == 0.0) {
    detail::adam_steps(*this, grads, vars, lr, o_.beta_1, o_.beta_2, o_.epsilon, o_.amsgrad, decay);
    return;
  }
  // Two list ops: the decayed variables, then the excluded ones with decay 0. Entries are
  // independent and a variable given twice lands twice in the same group, in order, so the
  // results are the per-variable loop's.
  std::vector<Tensor> g_decay, g_plain;
  std::vector<Variable> v_decay, v_plain;
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const bool use = use_weight_decay(vars[i]);
    (use ? g_decay : g_plain).push_back(grads[i]);
    (use ? v_decay : v_plain).push_back(vars[i]);
  }
  if (!v_decay.empty())
    detail::adam_steps(*this, g_decay, v_decay, lr, o_.beta_1, o_.beta_2, o_.epsilon, o_.amsgrad, decay);
  if (!v_plain.empty())
    detail::adam_steps(*this, g_plain, v_plain, lr, o_.beta_1, o_.beta_2, o_.epsilon, o_.amsgrad, 0.0);
}

std::shared_ptr<AdamWOptimizer> AdamW(AdamWOptions options) { return std::make_shared<AdamWOptimizer>(std::move(options)); }

}  // namespace mpt::optimizers

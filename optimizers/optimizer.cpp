#include "mpt/optimizers/optimizer.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <mutex>
#include <regex>
#include <set>

#include "mpt/autograd.hpp"
#include "mpt/log.hpp"
#include "mpt/ops.hpp"
#include "mpt/optimizers/optimizers.hpp"

namespace mpt::optimizers {

namespace {

// Slot sets restored by set_slot before their variable was seen live under keys with this
// bit set (tensor ids never reach it); slot() adopts them by path.
constexpr std::uint64_t kPendingKey = std::uint64_t{1} << 63;

void check_clip(const std::string& name, const char* what, const std::optional<double>& v) {
  MPT_CHECK(!v || (*v > 0 && std::isfinite(*v)), "optimizer '", name, "': ", what,
            " must be a positive number, got ", v ? *v : 0.0);
}

Tensor clip_by_norm(const Tensor& g, double clipnorm) {
  Tensor c = Tensor::scalar(clipnorm, float32, g.device());
  Tensor norm = ops::sqrt(ops::sum(ops::square(g)));
  return ops::div(ops::mul(g, c), ops::maximum(norm, c));
}

void clip_by_global_norm(std::vector<Tensor>& grads, double clipnorm) {
  Tensor total;
  for (const auto& g : grads) {
    Tensor s = ops::sum(ops::square(g));
    total = total.defined() ? ops::add(total, s.to(total.device())) : s;
  }
  if (!total.defined()) return;
  // factor = clipnorm / max(norm, clipnorm), a device scalar (no host read). As Keras, a
  // non-finite norm turns every gradient into NaN: norm - norm is 0, or NaN for inf and NaN.
  Tensor c = Tensor::scalar(clipnorm, float32, total.device());
  Tensor norm = ops::sqrt(total);
  Tensor factor = ops::add(ops::div(c, ops::maximum(norm, c)), ops::sub(norm, norm));
  for (auto& g : grads) g = ops::mul(g, factor.to(g.device()));
}

Tensor clip_by_value(const Tensor& g, double v) {
  return ops::minimum(ops::maximum(g, Tensor::scalar(-v, float32, g.device())),
                      Tensor::scalar(v, float32, g.device()));
}

/// Warns once per optimizer name and variable path, as Keras does once per call site.
void warn_missing(const std::string& name, const std::vector<std::string>& paths) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::string list;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& p : paths)
      if (warned.insert(name + "\n" + p).second) list += (list.empty() ? "" : ", ") + p;
  }
  if (!list.empty())
    mpt::log(LogLevel::warning, "optimizer '", name, "': gradients do not exist for variables [", list,
        "]; they are left unchanged");
}

}  // namespace

Optimizer::Optimizer(std::string name, CommonOptions options)
    : name_(std::move(name)), options_(std::move(options)) {
  check_clip(name_, "clipnorm", options_.clipnorm);
  check_clip(name_, "clipvalue", options_.clipvalue);
  check_clip(name_, "global_clipnorm", options_.global_clipnorm);
  MPT_CHECK(!(options_.clipnorm && options_.global_clipnorm), "optimizer '", name_,
            "': only one of clipnorm and global_clipnorm can be set");
  const auto& wd = options_.weight_decay;
  MPT_CHECK(!wd || (std::isfinite(*wd) && *wd >= 0), "optimizer '", name_, "': weight_decay must be a finite number >= 0, got ",
            wd ? *wd : 0.0);
  MPT_CHECK(!options_.use_ema || (options_.ema_momentum >= 0 && options_.ema_momentum <= 1), "optimizer '", name_,
            "': ema_momentum must be in the range [0, 1], got ", options_.ema_momentum);
  const auto& f = options_.ema_overwrite_frequency;
  MPT_CHECK(!f || *f >= 1, "optimizer '", name_, "': ema_overwrite_frequency must be an integer >= 1 or none, got ",
            f ? *f : 0);
  const auto& lsf = options_.loss_scale_factor;
  MPT_CHECK(!lsf || (std::isfinite(*lsf) && *lsf > 0), "optimizer '", name_,
            "': loss_scale_factor must be a finite number > 0, got ", lsf ? *lsf : 0.0);
  const auto& k = options_.gradient_accumulation_steps;
  MPT_CHECK(!k || *k >= 2, "optimizer '", name_, "': gradient_accumulation_steps must be an integer >= 2 or none, got ",
            k ? *k : 0);
  if (!options_.learning_rate.is_schedule()) check_learning_rate(options_.learning_rate.at(0));
}

void Optimizer::set_learning_rate(double lr) {
  MPT_CHECK(!options_.learning_rate.is_schedule(), "optimizer '", name_, "': set_learning_rate(", lr,
            ") on an optimizer that follows the schedule ", options_.learning_rate.schedule()->name(),
            "; a schedule's rate cannot be set (as in Keras)");
  check_learning_rate(lr);
  options_.learning_rate = lr;
}

void Optimizer::check_learning_rate(double lr) const {
  // NaN, inf or a negative rate would train to a non-finite or diverging model without a word.
  MPT_CHECK(std::isfinite(lr) && lr >= 0, "optimizer '", name_, "': learning_rate must be a finite number >= 0, got ",
            lr);
}

Tensor Optimizer::scale_loss(const Tensor& loss) const {
  if (!options_.loss_scale_factor) return loss;
  return ops::mul(loss, Tensor::scalar(*options_.loss_scale_factor, loss.dtype(), loss.device()));
}

ApplyResult Optimizer::apply_gradients(const std::vector<Tensor>& in, const std::vector<Variable>& vars) {
  std::vector<Tensor> unscaled;
  if (options_.loss_scale_factor) {  // Keras: g / loss_scale_factor before anything else
    NoGradGuard no_grad;
    for (const auto& g : in)
      unscaled.push_back(g.defined() ? ops::div(g, Tensor::scalar(*options_.loss_scale_factor, g.dtype(), g.device()))
                                     : g);
  }
  const std::vector<Tensor>& grads = options_.loss_scale_factor ? unscaled : in;
  if (accumulation_steps() == 1) return apply_gradients_now(grads, vars);
  MPT_CHECK(grad_scale_ == 1.0, "optimizer '", name_, "': gradient accumulation takes unscaled gradients");
  std::vector<Tensor> mean = accumulate_gradients(grads, vars);
  if (mean.empty()) {
    ApplyResult r;
    r.accumulated = true;
    return r;
  }
  return apply_gradients_now(mean, vars);
}

std::vector<Tensor> Optimizer::accumulate_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) {
  MPT_CHECK(accumulation_steps() > 1, "optimizer '", name_, "': accumulate_gradients without gradient_accumulation_steps");
  MPT_CHECK(grads.size() == vars.size(), "optimizer '", name_, "': accumulate_gradients got ", grads.size(),
            " gradients for ", vars.size(), " variables");
  check_variables(vars);
  NoGradGuard no_grad;
  const bool update = next_call_updates();
  std::vector<Tensor> out(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;  // apply_gradients_now warns
    MPT_CHECK(grads[i].shape() == vars[i].shape(), "optimizer '", name_, "': gradient for '", vars[i].path(),
              "' has shape ", to_string(grads[i].shape()), ", expected ", to_string(vars[i].shape()));
    Tensor& acc = slot(vars[i], "gradient_accumulator");
    Tensor g = grads[i].dtype() == float32 ? grads[i] : grads[i].to(float32);
    if (update) {
      // Keras: (g + acc) / steps, then the accumulators restart from zero.
      out[i] = ops::div(ops::add(g, acc), Tensor::scalar(static_cast<double>(accumulation_steps()), float32, acc.device()));
      acc.assign(Tensor::zeros(acc.shape(), float32, acc.device()));
    } else {
      acc.assign(ops::add(g, acc));
    }
  }
  if (!update) {
    ++iterations_;
    if (options_.use_ema) update_ema(vars);  // Keras updates the averages at every call
    return {};
  }
  return out;
}

ApplyResult Optimizer::apply_gradients_now(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) {
  MPT_CHECK(grads.size() == vars.size(), "optimizer '", name_, "': apply_gradients got ",
            grads.size(), " gradients for ", vars.size(), " variables");
  if (grads.empty()) return {};
  check_variables(vars);
  NoGradGuard no_grad;
  std::vector<Tensor> g;
  std::vector<Variable> v;
  std::vector<std::string> missing;
  const bool pass_16bit = takes_16bit_gradients() && !clips() && accumulation_steps() == 1;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    MPT_CHECK(vars[i].defined(), "optimizer '", name_, "': variable ", i, " is undefined");
    const Variable& var = vars[i];
    if (!grads[i].defined()) {
      missing.push_back(var.path());
      continue;
    }
    const Tensor& gi = grads[i];
    MPT_CHECK(is_floating(var.dtype()), "optimizer '", name_, "': variable '", var.path(),
              "' is ", to_string(var.dtype()), "; only floating-point variables can be trained");
    MPT_CHECK(is_floating(gi.dtype()), "optimizer '", name_, "': gradient for '", var.path(),
              "' is ", to_string(gi.dtype()), "; expected a floating-point gradient");
    MPT_CHECK(gi.shape() == var.shape(), "optimizer '", name_, "': gradient for '", var.path(),
              "' has shape ", to_string(gi.shape()), ", expected ", to_string(var.shape()));
    MPT_CHECK(gi.device() == var.value().device(), "optimizer '", name_, "': gradient for '",
              var.path(), "' is on ", gi.device().str(), ", the variable on ",
              var.value().device().str());
    g.push_back(gi.dtype() == float32 || (pass_16bit && is_half(gi.dtype())) ? gi.detach() : gi.to(float32));
    v.push_back(var);
  }
  MPT_CHECK(!g.empty(), "optimizer '", name_, "': no gradients provided for any variable");
  if (!missing.empty()) warn_missing(name_, missing);

  // Keras's precedence: clipnorm, else global_clipnorm, else clipvalue.
  if (options_.clipnorm) {
    for (auto& gi : g) gi = clip_by_norm(gi, *options_.clipnorm);
  } else if (options_.global_clipnorm) {
    clip_by_global_norm(g, *options_.global_clipnorm);
  } else if (options_.clipvalue) {
    for (auto& gi : g) gi = clip_by_value(gi, *options_.clipvalue);
  }

  const double lr = learning_rate();
  check_learning_rate(lr);  // a schedule's value, step by step
  update_steps(g, v, lr);
  if (options_.use_ema) update_ema(v);
  ++iterations_;
  return {};
}

ApplyResult Optimizer::apply_scaled_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars,
                                              double grad_scale) {
  MPT_CHECK(fuses_gradient_scale(), "optimizer '", name_, "': apply_scaled_gradients needs an optimizer whose ",
            "updates apply gradient_scale() and no clipping");
  MPT_CHECK(std::isfinite(grad_scale) && grad_scale > 0, "optimizer '", name_,
            "': apply_scaled_gradients: grad_scale must be a finite number > 0, got ", grad_scale);
  struct Reset {
    double& scale;
    ~Reset() { scale = 1.0; }
  } reset{grad_scale_};
  grad_scale_ = grad_scale;
  return apply_gradients(grads, vars);
}

bool Optimizer::fuses_gradient_scale() const {
  return applies_gradient_scale() && !clips() && accumulation_steps() == 1 && !options_.loss_scale_factor;
}

bool detail::fits_one_list_op(const std::vector<Variable>& vars) {
  std::vector<const void*> p;
  p.reserve(vars.size());
  for (const auto& v : vars) {
    if (v.value().device() != vars[0].value().device()) return false;
    if (v.value().numel() > 0) p.push_back(v.value().data_ptr());
  }
  std::sort(p.begin(), p.end());
  return std::adjacent_find(p.begin(), p.end()) == p.end();
}

detail::UpdateCopies::UpdateCopies(const std::vector<Variable>& vars) : tensors(vars.size()), ptrs(vars.size()) {
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const DType d = vars[i].last_cast_dtype();
    if (d == vars[i].dtype() || !(d == float32 || is_half(d))) continue;
    tensors[i] = Tensor::empty(vars[i].shape(), d, vars[i].value().device());
    ptrs[i] = &tensors[i];
  }
}

void detail::UpdateCopies::finish(const std::vector<Variable>& vars) const {
  for (std::size_t i = 0; i < vars.size(); ++i) {
    if (ptrs[i]) vars[i].mark_modified(tensors[i]);
    else vars[i].mark_modified();
  }
}

void Optimizer::update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) {
  for (std::size_t i = 0; i < grads.size(); ++i) update_step(grads[i], vars[i], lr);
}

Tensor& Optimizer::slot(const Variable& var, const std::string& slot_name) {
  auto it = slots_.find(var.id());
  if (it == slots_.end()) {
    SlotSet set;
    set.path = var.path();
    for (auto p = slots_.begin(); p != slots_.end(); ++p) {
      if ((p->first & kPendingKey) && p->second.path == set.path) {
        for (auto& [n, t] : p->second.tensors) {
          MPT_CHECK(t.shape() == slot_shape(var, n), "optimizer '", name_, "': restored slot '", n,
                    "' of '", set.path, "' has shape ", to_string(t.shape()),
                    ", expected ", to_string(slot_shape(var, n)), " for the variable of shape ", to_string(var.shape()));
          set.tensors[n] = t.to(var.value().device());
        }
        slots_.erase(p);
        break;
      }
    }
    it = slots_.emplace(var.id(), std::move(set)).first;
  } else if (it->second.path != var.path()) {
    it->second.path = var.path();
  }
  auto& tensors = it->second.tensors;
  auto t = tensors.find(slot_name);
  if (t == tensors.end()) {
    NoGradGuard no_grad;
    const double init = slot_initial_value(slot_name);
    Tensor z = Tensor::zeros(slot_shape(var, slot_name), float32, var.value().device());
    if (init != 0.0) z = ops::add(z, Tensor::scalar(init, float32, z.device()));
    t = tensors.emplace(slot_name, z).first;
  }
  return t->second;
}

void Optimizer::check_variables(const std::vector<Variable>& vars) const {
  for (const Variable& v : vars)
    MPT_CHECK(v.dtype() == float32 || is_half(v.dtype()), "optimizer '", name_, "': variable '", v.path(), "' is ",
              to_string(v.dtype()), "; mpt's optimizers update float32 (and float16/bfloat16) variables: use the "
              "float32 or a mixed policy for the model, or dtype float32 for that layer");
}

void Optimizer::build(const std::vector<Variable>& vars) {
  check_variables(vars);
  std::vector<std::string> names;
  if (options_.use_ema) names.push_back("average");
  if (accumulation_steps() > 1) names.push_back("gradient_accumulator");
  for (const Variable& v : vars) {
    for (const std::string& n : names) (void)slot(v, n);
    for (const std::string& n : slot_names_for(v)) (void)slot(v, n);
  }
}

std::map<std::string, std::map<std::string, Tensor>> Optimizer::slots_by_path() const {
  std::map<std::string, std::map<std::string, Tensor>> out;
  for (const auto& [id, set] : slots_) out[set.path] = set.tensors;
  return out;
}

void Optimizer::set_slot(const std::string& var_path, const std::string& slot_name,
                         const Tensor& value) {
  MPT_CHECK(value.defined(), "optimizer '", name_, "': set_slot('", var_path, "', '", slot_name,
            "') got an undefined tensor");
  NoGradGuard no_grad;
  SlotSet* set = nullptr;
  for (auto& [id, s] : slots_)
    if (s.path == var_path) set = &s;
  if (!set) {
    std::uint64_t key = kPendingKey;
    while (slots_.count(key)) ++key;
    set = &slots_[key];
    set->path = var_path;
  }
  auto t = set->tensors.find(slot_name);
  if (t != set->tensors.end()) {
    MPT_CHECK(value.shape() == t->second.shape(), "optimizer '", name_, "': slot '", slot_name,
              "' of '", var_path, "' has shape ", to_string(t->second.shape()), ", got ",
              to_string(value.shape()));
    t->second.assign(value.to(t->second.device()));
  } else {
    Tensor copy = value.to(float32);
    set->tensors[slot_name] = copy.data_ptr() == value.data_ptr() ? copy.copy() : copy;
  }
}

struct Optimizer::ExcludePattern {
  std::regex re;
};

void Optimizer::exclude_from_weight_decay(const std::vector<std::string>& var_names) {
  // Keras: "can only be configured before the optimizer is built" (slots made or a step taken).
  MPT_CHECK(raw_iterations() == 0 && slots_.empty(), "optimizer '", name_,
            "': exclude_from_weight_decay() can only be configured before the optimizer is built "
            "(before compile/fit or its first apply_gradients)");
  std::shared_ptr<const ExcludePattern> pattern;
  if (!var_names.empty()) {  // Keras: re.compile("|".join(set(var_names)))
    std::string joined;
    for (const auto& n : var_names) {
      MPT_CHECK(!n.empty(), "optimizer '", name_, "': exclude_from_weight_decay: an empty name would match every variable");
      joined += (joined.empty() ? "" : "|") + n;
    }
    // std::regex compiles and matches recursively: a bound keeps a checkpoint's list (read
    // from a file) from exhausting the stack.
    MPT_CHECK(joined.size() <= 4096, "optimizer '", name_, "': exclude_from_weight_decay: the names are ",
              joined.size(), " characters together, more than 4096");
    try {
      pattern = std::make_shared<const ExcludePattern>(ExcludePattern{std::regex(joined, std::regex::ECMAScript)});
    } catch (const std::regex_error& e) {
      fail("optimizer '", name_, "': exclude_from_weight_decay: invalid pattern '", joined, "': ", e.what());
    }
  }
  exclude_names_ = var_names;
  exclude_pattern_ = std::move(pattern);
  use_decay_cache_.clear();
}

void Optimizer::copy_exclusions_to(Optimizer& other) const {
  other.exclude_names_ = exclude_names_;
  other.exclude_pattern_ = exclude_pattern_;  // immutable, shared
}

bool Optimizer::use_weight_decay(const Variable& var) const {
  if (!options_.weight_decay || *options_.weight_decay == 0.0) return false;
  if (!exclude_pattern_) return true;
  auto it = use_decay_cache_.find(var.id());
  if (it != use_decay_cache_.end() && it->second.first == var.name()) return it->second.second;
  const bool use = !std::regex_search(var.name(), exclude_pattern_->re);
  use_decay_cache_[var.id()] = {var.name(), use};
  return use;
}

double Optimizer::weight_decay_factor(const Variable& var, double lr) const {
  return use_weight_decay(var) ? *options_.weight_decay * lr : 0.0;
}

void Optimizer::for_decay_groups(
    const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr,
    const std::function<void(const std::vector<Tensor>&, const std::vector<Variable>&, double)>& f) const {
  const double decay = options_.weight_decay ? *options_.weight_decay * lr : 0.0;
  if (decay == 0.0 || !exclude_pattern_) {  // one group: no split, no copies on the step's path
    f(grads, vars, decay);
    return;
  }
  // Two groups at most: the decayed variables, then the excluded ones with decay 0. Entries are
  // independent and a variable given twice lands twice in the same group, in order, so the
  // results are the per-variable loop's.
  std::vector<Tensor> g_decay, g_plain;
  std::vector<Variable> v_decay, v_plain;
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const bool use = use_weight_decay(vars[i]);
    (use ? g_decay : g_plain).push_back(grads[i]);
    (use ? v_decay : v_plain).push_back(vars[i]);
  }
  if (!v_decay.empty()) f(g_decay, v_decay, decay);
  if (!v_plain.empty()) f(g_plain, v_plain, 0.0);
}

void Optimizer::apply_weight_decay(const std::vector<Variable>& vars, double lr) const {
  NoGradGuard no_grad;
  for (const Variable& v : vars) {
    const double d = weight_decay_factor(v, lr);
    if (d == 0.0) continue;
    const Tensor& w = v.value();
    v.assign(ops::sub(w, ops::mul(w, Tensor::scalar(d, w.dtype(), w.device()))));
  }
}

void Optimizer::update_ema(const std::vector<Variable>& vars) {
  // Keras: momentum 0 at the first step (the average starts as the variable), then
  // average = momentum * average + (1 - momentum) * var; every ema_overwrite_frequency steps
  // the variables take their averages. iterations() is still the count before this call.
  const double m = iterations() != 0 ? options_.ema_momentum : 0.0;
  for (const Variable& v : vars) {
    Tensor& avg = slot(v, "average");
    const Tensor w = v.value().dtype() == float32 ? v.value() : v.value().to(float32);
    avg.assign(ops::add(ops::mul(Tensor::scalar(m, float32, avg.device()), avg),
                        ops::mul(Tensor::scalar(1.0 - m, float32, avg.device()), w)));
  }
  const auto& f = options_.ema_overwrite_frequency;
  if (f && (iterations() + 1) % *f == 0) {
    for (const Variable& v : vars) v.assign(slot(v, "average"));
  }
}

Tensor* Optimizer::existing_slot(const Variable& var, const std::string& slot_name) {
  auto it = slots_.find(var.id());
  if (it == slots_.end()) return nullptr;
  auto t = it->second.tensors.find(slot_name);
  return t == it->second.tensors.end() ? nullptr : &t->second;
}

void Optimizer::swap_ema_weights(const std::vector<Variable>& vars) {
  MPT_CHECK(options_.use_ema, "optimizer '", name_, "': SwapEMAWeights needs use_ema=true on the optimizer");
  NoGradGuard no_grad;
  for (const Variable& v : vars) {
    Tensor* avg = existing_slot(v, "average");
    if (!avg) continue;
    const Tensor old = v.value().to(float32).copy();
    v.assign(*avg);
    avg->assign(old);
  }
}

void Optimizer::set_ema_from_variables(const std::vector<Variable>& vars) {
  NoGradGuard no_grad;
  for (const Variable& v : vars) {
    if (Tensor* avg = existing_slot(v, "average")) avg->assign(v.value().to(float32));
  }
}

void Optimizer::finalize_variable_values(const std::vector<Variable>& vars) {
  if (!options_.use_ema) return;
  NoGradGuard no_grad;
  for (const Variable& v : vars) {
    if (const Tensor* avg = existing_slot(v, "average")) v.assign(*avg);
  }
}

std::shared_ptr<Optimizer> OptimizerArg::get() const {
  if (ptr_) return ptr_;
  MPT_CHECK(!name_.empty(), "optimizer: none given (pass an optimizer or one of the names sgd, "
                            "adam, adamw, rmsprop, nadam, adamax, adagrad, lion, adafactor)");
  return optimizers::get(name_);
}

std::shared_ptr<Optimizer> get(const std::string& name) {
  std::string key = name;
  std::transform(key.begin(), key.end(), key.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (key == "sgd") return std::make_shared<SGDOptimizer>();
  if (key == "adam") return std::make_shared<AdamOptimizer>();
  if (key == "adamw") return std::make_shared<AdamWOptimizer>();
  if (key == "rmsprop") return std::make_shared<RMSpropOptimizer>();
  if (key == "nadam") return std::make_shared<NadamOptimizer>();
  if (key == "adamax") return std::make_shared<AdamaxOptimizer>();
  if (key == "adagrad") return std::make_shared<AdagradOptimizer>();
  if (key == "lion") return std::make_shared<LionOptimizer>();
  if (key == "adafactor") return std::make_shared<AdafactorOptimizer>();
  fail("optimizers::get: unknown optimizer '", name,
       "'; valid names: sgd, adam, adamw, rmsprop, nadam, adamax, adagrad, lion, adafactor");
}

}  // namespace mpt::optimizers

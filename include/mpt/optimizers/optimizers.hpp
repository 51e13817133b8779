#pragma once
/// The built-in optimizers. Options are declared in Keras's argument order, then the clip
/// options shared by all.
///
///   auto adam = mpt::optimizers::Adam({.learning_rate = 1e-3});    // std::shared_ptr<AdamOptimizer>
///   auto sgd = mpt::optimizers::SGD({.learning_rate = 0.01, .momentum = 0.9, .nesterov = true});
///   mpt::optimizers::AdamOptimizer direct({.learning_rate = 1e-3});  // the classes themselves
///
/// Adam(), SGD(), ... are functions (not the classes) so that API.md's
/// `LossScaleOptimizer opt(mpt::optimizers::Adam());` declares an object, not a function.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mpt/optimizers/optimizer.hpp"

namespace mpt::optimizers {

namespace detail {
/// What the built-in optimizers share: their options (Keras's arguments, then the clip options),
/// clone() (same type and options, no state), and the fused ops of mpt/optim_ops.hpp, which
/// take 16-bit gradients unconverted and the loss-scale unscale as grad_scale.
template <class Derived, class Options>
class BuiltinOptimizer : public Optimizer {
 public:
  std::shared_ptr<Optimizer> clone() const override { return std::make_shared<Derived>(o_); }
  const Options& options() const { return o_; }
  void set_learning_rate(double lr) override {
    Optimizer::set_learning_rate(lr);
    o_.learning_rate = lr;  // what checkpoints and clone() take
  }

 protected:
  BuiltinOptimizer(std::string name, Options o)
      : Optimizer(std::move(name), {o.learning_rate, o.clipnorm, o.clipvalue, o.global_clipnorm}), o_(std::move(o)) {}
  bool takes_16bit_gradients() const override { return true; }
  bool applies_gradient_scale() const override { return true; }

  Options o_;
};
}  // namespace detail

struct SGDOptions {
  LearningRate learning_rate = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  std::optional<double> clipnorm, clipvalue, global_clipnorm;
};
class SGDOptimizer : public detail::BuiltinOptimizer<SGDOptimizer, SGDOptions> {
 public:
  explicit SGDOptimizer(SGDOptions o = {});

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;
  void update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) override;
  std::vector<std::string> slot_names() const override {
    return o_.momentum != 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{};
  }
};
/// Keras's SGD, as an object to hand to compile() or a LossScaleOptimizer.
std::shared_ptr<SGDOptimizer> SGD(SGDOptions options = {});


struct AdamOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  bool amsgrad = false;
  std::optional<double> clipnorm, clipvalue, global_clipnorm;
};
class AdamOptimizer : public detail::BuiltinOptimizer<AdamOptimizer, AdamOptions> {
 public:
  explicit AdamOptimizer(AdamOptions o = {});

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;
  void update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) override;
  std::vector<std::string> slot_names() const override {
    return o_.amsgrad ? std::vector<std::string>{"m", "v", "vhat"} : std::vector<std::string>{"m", "v"};
  }
};
/// Keras's Adam, as an object to hand to compile() or a LossScaleOptimizer.
std::shared_ptr<AdamOptimizer> Adam(AdamOptions options = {});


namespace detail {
/// The Adam step shared by Adam and AdamW (decay: decoupled weight decay times lr, 0 for Adam).
void adam_step(Optimizer& opt, const Tensor& grad, const Variable& var, double lr, double beta_1, double beta_2,
               double epsilon, bool amsgrad, double decay);
/// The same step for all variables at once (one list op).
void adam_steps(Optimizer& opt, const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr,
                double beta_1, double beta_2, double epsilon, bool amsgrad, double decay);
/// True when one list op can update all of vars: one device, no variable twice. Otherwise the
/// optimizers update one variable after another, as the per-variable loop does.
bool fits_one_list_op(const std::vector<Variable>& vars);
/// The copies a fused update writes besides the variables (mpt/optim_ops.hpp's copy): for each
/// variable last read in a 16-bit or float32 dtype other than its own (Variable::last_cast_dtype,
/// a float32 master under a mixed policy), a new tensor of that dtype; ptrs[i] null for the others.
/// finish() marks every variable modified, handing it its copy, so that the next read() of that
/// dtype needs no cast.
struct UpdateCopies {
  explicit UpdateCopies(const std::vector<Variable>& vars);
  UpdateCopies(const UpdateCopies&) = delete;  // ptrs point into tensors
  UpdateCopies& operator=(const UpdateCopies&) = delete;
  void finish(const std::vector<Variable>& vars) const;
  std::vector<Tensor> tensors;
  std::vector<Tensor*> ptrs;
};
}  // namespace detail

struct AdamWOptions {
  LearningRate learning_rate = 0.001;
  double weight_decay = 0.004;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  bool amsgrad = false;
  std::optional<double> clipnorm, clipvalue, global_clipnorm;
};
class AdamWOptimizer : public detail::BuiltinOptimizer<AdamWOptimizer, AdamWOptions> {
 public:
  explicit AdamWOptimizer(AdamWOptions o = {});

  /// Keras's exclude_from_weight_decay(var_names=...): a variable whose name (Variable::name(),
  /// e.g. "bias", "gamma", "query/bias"; Keras 3 searches variable.name) matches any of
  /// `var_names` as a regular expression searched anywhere in it (plain words match as
  /// substrings) gets Adam's update without the decay. Replaces an earlier list; an empty
  /// list excludes nothing. As in Keras, only before the optimizer is built (no step taken, no
  /// slot created); otherwise, or for an invalid pattern, an mpt::Error.
  ///
  ///   auto opt = mpt::optimizers::AdamW({.learning_rate = 1e-3, .weight_decay = 0.1});
  ///   opt->exclude_from_weight_decay({"bias", "gamma", "beta", "embeddings"});
  void exclude_from_weight_decay(const std::vector<std::string>& var_names);
  /// The names given to exclude_from_weight_decay (empty: every variable decays).
  const std::vector<std::string>& excluded_from_weight_decay() const { return exclude_names_; }
  /// False where var is excluded from weight decay.
  bool use_weight_decay(const Variable& var) const;
  /// The same type, options and exclusions, without state.
  std::shared_ptr<Optimizer> clone() const override;

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;
  void update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) override;
  std::vector<std::string> slot_names() const override {
    return o_.amsgrad ? std::vector<std::string>{"m", "v", "vhat"} : std::vector<std::string>{"m", "v"};
  }

 private:
  std::vector<std::string> exclude_names_;
  struct ExcludePattern;  // the names joined by '|' as one std::regex (adamw.cpp)
  std::shared_ptr<const ExcludePattern> exclude_pattern_;  // null: nothing excluded
  /// use_weight_decay's answers by Variable::id() (Keras caches them too), with the name asked about.
  mutable std::unordered_map<std::uint64_t, std::pair<std::string, bool>> use_decay_cache_;
};
/// Keras's AdamW, as an object to hand to compile() or a LossScaleOptimizer.
std::shared_ptr<AdamWOptimizer> AdamW(AdamWOptions options = {});


struct RMSpropOptions {
  LearningRate learning_rate = 0.001;
  double rho = 0.9;
  double momentum = 0.0;
  double epsilon = 1e-7;
  bool centered = false;
  std::optional<double> clipnorm, clipvalue, global_clipnorm;
};
class RMSpropOptimizer : public detail::BuiltinOptimizer<RMSpropOptimizer, RMSpropOptions> {
 public:
  explicit RMSpropOptimizer(RMSpropOptions o = {});

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;
  void update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) override;
  std::vector<std::string> slot_names() const override {
    std::vector<std::string> n{"velocity"};
    if (o_.centered) n.push_back("average_gradient");
    if (o_.momentum > 0) n.push_back("momentum");
    return n;
  }
};
/// Keras's RMSprop, as an object to hand to compile() or a LossScaleOptimizer.
std::shared_ptr<RMSpropOptimizer> RMSprop(RMSpropOptions options = {});


}  // namespace mpt::optimizers

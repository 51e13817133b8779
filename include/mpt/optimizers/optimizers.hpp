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

#include "mpt/optim_ops.hpp"
#include "mpt/optimizers/optimizer.hpp"

namespace mpt::optimizers {

namespace detail {
/// What the built-in optimizers share: their options (Keras's arguments, then the clip options),
/// clone() (same type and options, no state), and the fused ops of mpt/optim_ops.hpp, which
/// take 16-bit gradients unconverted and the loss-scale unscale as grad_scale.
template <class Derived, class Options>
class BuiltinOptimizer : public Optimizer {
 public:
  std::shared_ptr<Optimizer> clone() const override {
    auto c = std::make_shared<Derived>(o_);
    copy_exclusions_to(*c);
    return c;
  }
  const Options& options() const { return o_; }
  void set_learning_rate(double lr) override {
    Optimizer::set_learning_rate(lr);
    o_.learning_rate = lr;  // what checkpoints and clone() take
  }

 protected:
  BuiltinOptimizer(std::string name, Options o)
      : Optimizer(std::move(name), {o.learning_rate, o.clipnorm, o.clipvalue, o.global_clipnorm, o.weight_decay,
                                    o.use_ema, o.ema_momentum, o.ema_overwrite_frequency,
                                    o.gradient_accumulation_steps, o.loss_scale_factor}),
        o_(std::move(o)) {}
  bool takes_16bit_gradients() const override { return true; }
  bool applies_gradient_scale() const override { return true; }

  Options o_;
};
}  // namespace detail

struct SGDOptions {
  LearningRate learning_rate = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  std::optional<double> weight_decay = std::nullopt;
  MPT_OPTIMIZER_BASE_OPTIONS
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
  std::optional<double> weight_decay = std::nullopt;
  MPT_OPTIMIZER_BASE_OPTIONS
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
/// Adam's step size at the coming step, Keras's float32 alpha = lr sqrt(1 - b2^t) / (1 - b1^t).
double adam_alpha(const Optimizer& opt, double lr, double beta_1, double beta_2);
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
  MPT_OPTIMIZER_BASE_OPTIONS
};
class AdamWOptimizer : public detail::BuiltinOptimizer<AdamWOptimizer, AdamWOptions> {
 public:
  /// Keras's AdamW: Adam with weight_decay (0.004 by default); exclude_from_weight_decay on the
  /// base class picks the variables that do not decay.
  explicit AdamWOptimizer(AdamWOptions o = {});

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;
  void update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) override;
  std::vector<std::string> slot_names() const override {
    return o_.amsgrad ? std::vector<std::string>{"m", "v", "vhat"} : std::vector<std::string>{"m", "v"};
  }
};
/// Keras's AdamW, as an object to hand to compile() or a LossScaleOptimizer.
std::shared_ptr<AdamWOptimizer> AdamW(AdamWOptions options = {});


struct RMSpropOptions {
  LearningRate learning_rate = 0.001;
  double rho = 0.9;
  double momentum = 0.0;
  double epsilon = 1e-7;
  bool centered = false;
  std::optional<double> weight_decay = std::nullopt;
  MPT_OPTIMIZER_BASE_OPTIONS
};
class RMSpropOptimizer : public detail::BuiltinOptimizer<RMSpropOptimizer, RMSpropOptions> {
 public:
  explicit RMSpropOptimizer(RMSpropOptions o = {});

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;
  void update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) override;
  std::vector<std::string> slot_names() const override {
    // (Not an initializer list and push_back: GCC 12 at -O3 warns falsely on that, PR 107852.)
    const bool centered = o_.centered, momentum = o_.momentum > 0;
    if (centered && momentum) return {"velocity", "average_gradient", "momentum"};
    if (centered) return {"velocity", "average_gradient"};
    if (momentum) return {"velocity", "momentum"};
    return {"velocity"};
  }
};
/// Keras's RMSprop, as an object to hand to compile() or a LossScaleOptimizer.
std::shared_ptr<RMSpropOptimizer> RMSprop(RMSpropOptions options = {});


namespace detail {
/// The optimizers updated by one of mpt::ops::rule_update's rules (Nadam, Adamax, Adagrad,
/// Lion): the step's arguments from rule_args, the decay fused per group (for_decay_groups).
template <class Derived, class Options>
class RuleOptimizer : public BuiltinOptimizer<Derived, Options> {
 protected:
  using BuiltinOptimizer<Derived, Options>::BuiltinOptimizer;
  /// The rule's arguments for the step about to be taken (iterations() not yet counted), lr given.
  virtual ops::RuleArgs rule_args(double lr) const = 0;
  void update_step(const Tensor& grad, const Variable& var, double lr) override;
  void update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr) override;
};
}  // namespace detail

struct NadamOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  std::optional<double> weight_decay = std::nullopt;
  MPT_OPTIMIZER_BASE_OPTIONS
};
/// Keras's Nadam (Adam with Nesterov momentum and Dozat's momentum schedule
/// u_t = beta_1 (1 - 0.5 * 0.96^t)); slots "momentum", "velocity".
class NadamOptimizer : public detail::RuleOptimizer<NadamOptimizer, NadamOptions> {
 public:
  static constexpr ops::UpdateRule kRule = ops::UpdateRule::nadam;
  explicit NadamOptimizer(NadamOptions o = {});
  /// Keras's u_product variable after iterations() steps: the float32 product of u_1 .. u_t.
  float u_product() const;

 protected:
  ops::RuleArgs rule_args(double lr) const override;
  std::vector<std::string> slot_names() const override { return {"momentum", "velocity"}; }

 private:
  mutable std::int64_t u_product_step_ = 0;  // u_product's cache: the product of u_1 .. u_step
  mutable float u_product_ = 1.0f;
};
std::shared_ptr<NadamOptimizer> Nadam(NadamOptions options = {});

struct AdamaxOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  std::optional<double> weight_decay = std::nullopt;
  MPT_OPTIMIZER_BASE_OPTIONS
};
/// Keras's Adamax (Adam on the infinity norm); slots "momentum", "norm".
class AdamaxOptimizer : public detail::RuleOptimizer<AdamaxOptimizer, AdamaxOptions> {
 public:
  static constexpr ops::UpdateRule kRule = ops::UpdateRule::adamax;
  explicit AdamaxOptimizer(AdamaxOptions o = {});

 protected:
  ops::RuleArgs rule_args(double lr) const override;
  std::vector<std::string> slot_names() const override { return {"momentum", "norm"}; }
};
std::shared_ptr<AdamaxOptimizer> Adamax(AdamaxOptions options = {});

struct AdagradOptions {
  LearningRate learning_rate = 0.001;
  double initial_accumulator_value = 0.1;
  double epsilon = 1e-7;
  std::optional<double> weight_decay = std::nullopt;
  MPT_OPTIMIZER_BASE_OPTIONS
};
/// Keras's Adagrad; slot "accumulator", starting at initial_accumulator_value.
class AdagradOptimizer : public detail::RuleOptimizer<AdagradOptimizer, AdagradOptions> {
 public:
  static constexpr ops::UpdateRule kRule = ops::UpdateRule::adagrad;
  explicit AdagradOptimizer(AdagradOptions o = {});

 protected:
  ops::RuleArgs rule_args(double lr) const override;
  std::vector<std::string> slot_names() const override { return {"accumulator"}; }
  double slot_initial_value(const std::string& slot_name) const override {
    return slot_name == "accumulator" ? o_.initial_accumulator_value : 0.0;
  }
};
std::shared_ptr<AdagradOptimizer> Adagrad(AdagradOptions options = {});

struct LionOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.99;
  std::optional<double> weight_decay = std::nullopt;
  MPT_OPTIMIZER_BASE_OPTIONS
};
/// Keras's Lion (the sign of an interpolated momentum); slot "momentum".
class LionOptimizer : public detail::RuleOptimizer<LionOptimizer, LionOptions> {
 public:
  static constexpr ops::UpdateRule kRule = ops::UpdateRule::lion;
  explicit LionOptimizer(LionOptions o = {});

 protected:
  ops::RuleArgs rule_args(double lr) const override;
  std::vector<std::string> slot_names() const override { return {"momentum"}; }
};
std::shared_ptr<LionOptimizer> Lion(LionOptions options = {});

struct AdafactorOptions {
  LearningRate learning_rate = 0.001;
  double beta_2_decay = -0.8;
  double epsilon_1 = 1e-30;
  double epsilon_2 = 1e-3;
  double clip_threshold = 1.0;
  bool relative_step = true;
  std::optional<double> weight_decay = std::nullopt;
  MPT_OPTIMIZER_BASE_OPTIONS
};
/// Keras's Adafactor: the second moment of a variable of rank >= 2 kept factored as a row
/// ("r", the shape without the last axis) and a column ("c", without the second last) mean, so
/// its state is O(rows + columns) instead of O(rows x columns); "velocity" holds the full second
/// moment of the smaller variables (and the factored product of the others, as Keras's).
/// State in float32.
class AdafactorOptimizer : public detail::BuiltinOptimizer<AdafactorOptimizer, AdafactorOptions> {
 public:
  explicit AdafactorOptimizer(AdafactorOptions o = {});

 protected:
  void update_step(const Tensor& grad, const Variable& var, double lr) override;
  bool applies_gradient_scale() const override { return false; }
  bool takes_16bit_gradients() const override { return false; }
  /// "r" and "c" for variables of rank >= 2, "velocity" for the others.
  std::vector<std::string> slot_names_for(const Variable& var) const override;
  Shape slot_shape(const Variable& var, const std::string& slot_name) const override;
};
std::shared_ptr<AdafactorOptimizer> Adafactor(AdafactorOptions options = {});

}  // namespace mpt::optimizers

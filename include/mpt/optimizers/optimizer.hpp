#pragma once
/// Optimizer base: float32 slots per variable, a learning rate or schedule, gradient
/// clipping, and `iterations`. Subclasses implement update_step for one variable, and may
/// override update_steps to update all variables of a step at once (the built-in ones do, with
/// the list ops of mpt/optim_ops.hpp: a few kernel launches for all variables on a GPU).
///
///   class MySGD : public mpt::optimizers::Optimizer {
///    public:
///     MySGD() : Optimizer("my_sgd", {.learning_rate = 0.1}) {}
///     void update_step(const mpt::Tensor& g, const mpt::Variable& v, double lr) override {
///       v.assign(mpt::ops::sub(v.value(), mpt::ops::mul(g, mpt::Tensor::scalar(lr))));
///     }
///   };
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "mpt/optimizers/schedules.hpp"
#include "mpt/variable.hpp"

namespace mpt::optimizers {

/// A constant learning rate or a schedule of the step.
class LearningRate {
 public:
  LearningRate(double value = 0.001) : value_(value) {}  // NOLINT
  LearningRate(float value) : value_(value) {}          // NOLINT
  template <class S>
    requires std::derived_from<std::decay_t<S>, schedules::LearningRateSchedule>
  LearningRate(S&& schedule)  // NOLINT
      : schedule_(std::make_shared<std::decay_t<S>>(std::forward<S>(schedule))) {}
  LearningRate(std::shared_ptr<schedules::LearningRateSchedule> s) : schedule_(std::move(s)) {}  // NOLINT
  double at(std::int64_t step) const { return schedule_ ? (*schedule_)(step) : value_; }
  bool is_schedule() const { return schedule_ != nullptr; }
  const schedules::LearningRateSchedule* schedule() const { return schedule_.get(); }

 private:
  double value_ = 0.001;
  std::shared_ptr<schedules::LearningRateSchedule> schedule_;
};

/// Options every optimizer shares (Keras's base arguments, after the optimizer's own).
struct CommonOptions {
  LearningRate learning_rate = 0.001;
  std::optional<double> clipnorm;         ///< clip each gradient to this L2 norm
  std::optional<double> clipvalue;        ///< clip each element to [-v, v]
  std::optional<double> global_clipnorm;  ///< clip all gradients jointly to this L2 norm
  /// Decoupled weight decay: before each update var -= var * weight_decay * lr (Keras's
  /// _apply_weight_decay), for every variable not excluded by exclude_from_weight_decay.
  std::optional<double> weight_decay;
  /// Keras's use_ema: after every step the optimizer keeps average = m * average + (1 - m) * var
  /// (m = ema_momentum, 0 at the first step); every ema_overwrite_frequency steps the variables
  /// take their averages; fit ends with the averages in the model (finalize_variable_values),
  /// and the SwapEMAWeights callback evaluates with them.
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency;
  /// Keras's gradient_accumulation_steps (>= 2): the gradients of k calls are summed into float32
  /// accumulators and one update with their mean is applied at every k-th call; iterations()
  /// counts updates (Keras's iterations = _iterations // k).
  std::optional<std::int64_t> gradient_accumulation_steps;
  /// Keras's loss_scale_factor: a fixed loss scale without a LossScaleOptimizer. scale_loss()
  /// multiplies the loss by it (Model's train_step does), apply_gradients divides the
  /// gradients by it first.
  std::optional<double> loss_scale_factor;
};

/// The base arguments in Keras's order, for an optimizer's options struct after its own
/// arguments and weight_decay (so that designated initializers take them in Keras's order).
#define MPT_OPTIMIZER_BASE_OPTIONS                                          \
  std::optional<double> clipnorm = std::nullopt, clipvalue = std::nullopt, \
                        global_clipnorm = std::nullopt;                     \
  bool use_ema = false;                                                     \
  double ema_momentum = 0.99;                                               \
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;       \
  std::optional<double> loss_scale_factor = std::nullopt;                   \
  std::optional<std::int64_t> gradient_accumulation_steps = std::nullopt;

/// What one apply_gradients did. A plain optimizer always applies; a LossScaleOptimizer skips
/// steps whose gradients held inf or NaN.
struct ApplyResult {
  bool applied = true;           ///< the step was taken (or its gradients accumulated)
  /// gradient_accumulation_steps: the call added its gradients to the accumulators and applied
  /// no update (the window's other calls); constraints still run, as in Keras.
  bool accumulated = false;
  bool found_nonfinite = false;  ///< some gradient held inf or NaN
  double loss_scale = 1.0;       ///< the loss scale after this step (1 without loss scaling)
  /// A LossScaleOptimizer's overflow diagnostics: the variables (their paths, e.g.
  /// "dense_1/kernel", else their names) whose
  /// gradients held inf or NaN, in order, when the step was skipped; empty otherwise.
  std::vector<std::string> nonfinite_variables;
};

class Optimizer {
 public:
  Optimizer(std::string name, CommonOptions options);
  virtual ~Optimizer() = default;

  /// Applies one step: clips, then update_steps (by default update_step per variable) with
  /// float32 gradients (or the 16-bit ones as given, where takes_16bit_gradients() and no
  /// clipping is set), then
  /// iterations += 1. Gradients must match the variables' shapes; undefined gradients are
  /// skipped (Keras warns and ignores them).
  virtual ApplyResult apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars);
  /// apply_gradients of grads * grad_scale with the multiply fused into the update (a
  /// LossScaleOptimizer's unscale, as PyTorch's fused Adam takes grad_scale): the bits of
  /// apply_gradients of unscale_and_check's float32 products, without writing them. Only where
  /// fuses_gradient_scale(); grad_scale finite and > 0.
  ApplyResult apply_scaled_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars,
                                     double grad_scale);
  /// True where the updates apply gradient_scale() (the built-in optimizers) and no clipping is
  /// set (clipping needs the unscaled gradients first).
  bool fuses_gradient_scale() const;
  /// The factor the running step multiplies gradients by: 1 outside apply_scaled_gradients.
  double gradient_scale() const { return grad_scale_; }

  /// Updates applied so far (a wrapper reports its inner optimizer's): Keras's `iterations`,
  /// raw_iterations() / gradient_accumulation_steps.
  virtual std::int64_t iterations() const { return raw_iterations() / accumulation_steps(); }
  /// Sets iterations() (the accumulation restarts at a window's start).
  virtual void set_iterations(std::int64_t n) { set_raw_iterations(n * accumulation_steps()); }
  /// Keras's `_iterations`: every apply_gradients call, accumulation calls included (what
  /// checkpoints store, as Keras's files).
  virtual std::int64_t raw_iterations() const { return iterations_; }
  virtual void set_raw_iterations(std::int64_t n) { iterations_ = n; }
  /// gradient_accumulation_steps, 1 without accumulation.
  std::int64_t accumulation_steps() const { return options_.gradient_accumulation_steps.value_or(1); }
  /// True when the next apply_gradients call applies an update (always without accumulation).
  bool next_call_updates() const { return (raw_iterations() + 1) % accumulation_steps() == 0; }
  /// The base options (weight decay, EMA, accumulation, clipping).
  const CommonOptions& common_options() const { return options_; }
  /// Keras's optimizer.scale_loss: loss * loss_scale_factor where one is set (a
  /// LossScaleOptimizer multiplies by its dynamic scale instead), else the loss itself.
  virtual Tensor scale_loss(const Tensor& loss) const;
  /// The learning rate the next step uses.
  virtual double learning_rate() const { return options_.learning_rate.at(iterations()); }
  /// Keras's `optimizer.learning_rate = lr` (ReduceLROnPlateau, LearningRateScheduler): a
  /// constant rate from the next step on. mpt::Error when the optimizer follows a schedule
  /// (as Keras refuses), or for a rate that is not finite and >= 0.
  virtual void set_learning_rate(double lr);
  const std::string& name() const { return name_; }

  /// Slot variables of one variable (created on first use), e.g. "m" and "v" for Adam.
  Tensor& slot(const Variable& var, const std::string& slot_name);
  /// Creates every slot of `vars` now (Keras's optimizer.build), so that the first step
  /// allocates no more than later ones: fit calls it before its first step. Slots restored
  /// from a checkpoint are taken as at the first step; existing slots stay.
  virtual void build(const std::vector<Variable>& vars);
  /// mpt::Error naming the first variable the fused updates cannot take (they update float32
  /// and 16-bit variables; float64 ones are refused here, at compile and at build, rather than
  /// inside a step).
  void check_variables(const std::vector<Variable>& vars) const;
  /// The slots update_step creates for every variable under these options ("m", "v", ...);
  /// none by default (a custom optimizer's slots are then created at its first step).
  virtual std::vector<std::string> slot_names() const { return {}; }
  /// The slots update_step creates for var: slot_names() by default (Adafactor's depend on the
  /// variable's rank).
  virtual std::vector<std::string> slot_names_for(const Variable& var) const { return slot_names(); }
  /// Every slot, keyed by variable path then slot name (checkpoints).
  std::map<std::string, std::map<std::string, Tensor>> slots_by_path() const;
  void set_slot(const std::string& var_path, const std::string& slot_name, const Tensor& value);

  /// Keras's exclude_from_weight_decay(var_names=...): a variable whose name (Variable::name(),
  /// e.g. "bias", "gamma", "query/bias"; Keras 3 searches variable.name) matches any of
  /// `var_names` as a regular expression searched anywhere in it (plain words match as
  /// substrings) is not decayed. Replaces an earlier list; an empty list excludes nothing. As in
  /// Keras, only before the optimizer is built (no step taken, no slot created); otherwise, or
  /// for an invalid pattern, an mpt::Error.
  ///
  ///   auto opt = mpt::optimizers::AdamW({.learning_rate = 1e-3, .weight_decay = 0.1});
  ///   opt->exclude_from_weight_decay({"bias", "gamma", "beta", "embeddings"});
  void exclude_from_weight_decay(const std::vector<std::string>& var_names);
  /// The names given to exclude_from_weight_decay (empty: every variable decays).
  const std::vector<std::string>& excluded_from_weight_decay() const { return exclude_names_; }
  /// False where var is excluded from weight decay (or no weight_decay is set).
  bool use_weight_decay(const Variable& var) const;
  /// The decoupled decay factor of var at learning rate lr: weight_decay * lr, 0 where none.
  double weight_decay_factor(const Variable& var, double lr) const;

  /// Gradient accumulation, the parts a LossScaleOptimizer drives itself (apply_gradients does
  /// all of it otherwise). accumulate_gradients: on a call that does not update, adds the
  /// float32 gradients to the accumulators, counts the call and returns nothing; on the k-th,
  /// returns (g + accumulated) / k for each variable and zeroes the accumulators, without
  /// counting the call: apply_gradients_now then applies them (clipping, decay, update, EMA), or
  /// skip_accumulated_update() discards the window (a skipped overflow: the counts return to the
  /// window's start, as a skipped step leaves iterations unchanged).
  std::vector<Tensor> accumulate_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars);
  ApplyResult apply_gradients_now(const std::vector<Tensor>& grads, const std::vector<Variable>& vars);
  void skip_accumulated_update() { set_raw_iterations(raw_iterations() - (accumulation_steps() - 1)); }

  /// EMA (use_ema): swaps each variable with its average (SwapEMAWeights); mpt::Error without
  /// use_ema. Variables never stepped have no average and stay.
  void swap_ema_weights(const std::vector<Variable>& vars);
  /// Keras's finalize_variable_values: with use_ema the variables take their averages (fit
  /// calls it at its end); nothing otherwise.
  virtual void finalize_variable_values(const std::vector<Variable>& vars);
  /// Keras's SwapEMAWeights' finalize: the averages take the variables' values.
  void set_ema_from_variables(const std::vector<Variable>& vars);

  /// A new optimizer of the same type and options, without state.
  virtual std::shared_ptr<Optimizer> clone() const = 0;

 protected:
  /// Updates one variable in place with its float32 gradient and the step's learning rate.
  virtual void update_step(const Tensor& grad, const Variable& var, double lr) = 0;
  /// Updates all variables of a step (grads[i] defined, float32, for vars[i]; one learning
  /// rate). The default calls update_step for each in order; an override must give the same
  /// results and slots.
  virtual void update_steps(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr);
  /// True where update_step and update_steps are written with the fused ops of
  /// mpt/optim_ops.hpp, which widen gradients of any floating dtype block by block: with no
  /// clipping set, apply_gradients then hands them float16/bfloat16 gradients unconverted (the
  /// same update, one pass over the gradients fewer). The built-in optimizers say yes.
  virtual bool takes_16bit_gradients() const { return false; }
  /// True where update_step and update_steps pass gradient_scale() to the fused ops as their
  /// grad_scale. The built-in optimizers say yes.
  virtual bool applies_gradient_scale() const { return false; }
  /// mpt::Error naming the optimizer unless lr is finite and >= 0.
  void check_learning_rate(double lr) const;
  /// True when clipnorm, global_clipnorm or clipvalue is set (clipping needs float32 gradients,
  /// unscaled).
  bool clips() const { return options_.clipnorm || options_.global_clipnorm || options_.clipvalue; }

 private:
  std::string name_;
  CommonOptions options_;
  std::int64_t iterations_ = 0;
  double grad_scale_ = 1.0;
  struct SlotSet {
    std::string path;
    std::map<std::string, Tensor> tensors;
  };
  std::map<std::uint64_t, SlotSet> slots_;  // by variable id
  std::vector<std::string> exclude_names_;
  struct ExcludePattern;  // the names joined by '|' as one std::regex (optimizer.cpp)
  std::shared_ptr<const ExcludePattern> exclude_pattern_;  // null: nothing excluded
  /// use_weight_decay's answers by Variable::id() (Keras caches them too), with the name asked about.
  mutable std::map<std::uint64_t, std::pair<std::string, bool>> use_decay_cache_;

  void update_ema(const std::vector<Variable>& vars);
  /// The slot if var has it already (never creates one: EMA's averages of variables not stepped).
  Tensor* existing_slot(const Variable& var, const std::string& slot_name);

 protected:
  /// Copies exclude_from_weight_decay's list into a clone.
  void copy_exclusions_to(Optimizer& other) const;
  /// A slot's shape: the variable's by default (Adafactor's factored ones are smaller).
  virtual Shape slot_shape(const Variable& var, const std::string& slot_name) const { return var.shape(); }
  /// A slot's value before the first step (Adagrad's initial_accumulator_value); 0 by default.
  virtual double slot_initial_value(const std::string& slot_name) const { return 0.0; }
  /// Calls f(grads, vars, decay) for the variables that decay (decay = weight_decay * lr) and for
  /// the others (decay 0), in one call when all share one factor: a fused update per group.
  void for_decay_groups(const std::vector<Tensor>& grads, const std::vector<Variable>& vars, double lr,
                        const std::function<void(const std::vector<Tensor>&, const std::vector<Variable>&, double)>& f) const;
  /// Applies the decoupled decay as its own pass (the optimizers whose update does not fuse it).
  void apply_weight_decay(const std::vector<Variable>& vars, double lr) const;
};

/// An optimizer argument: an optimizer object (moved in), a shared one, or a Keras name
/// ("sgd", "adam", "adamw", "rmsprop").
class OptimizerArg {
 public:
  OptimizerArg() = default;
  OptimizerArg(const char* name) : name_(name) {}           // NOLINT
  OptimizerArg(const std::string& name) : name_(name) {}    // NOLINT
  OptimizerArg(std::shared_ptr<Optimizer> o) : ptr_(std::move(o)) {}  // NOLINT
  template <class O>
    requires std::derived_from<O, Optimizer>
  OptimizerArg(std::shared_ptr<O> o) : ptr_(std::move(o)) {}  // NOLINT: shared_ptr<Adam> too
  template <class O>
    requires std::derived_from<std::decay_t<O>, Optimizer>
  OptimizerArg(O&& o) : ptr_(std::make_shared<std::decay_t<O>>(std::forward<O>(o))) {}  // NOLINT
  /// The optimizer (built from the name when given one); mpt::Error for unknown names.
  std::shared_ptr<Optimizer> get() const;
  bool empty() const { return !ptr_ && name_.empty(); }

 private:
  std::string name_;
  std::shared_ptr<Optimizer> ptr_;
};

/// "sgd", "adam", "adamw", "rmsprop" with default options; others: mpt::Error listing these.
std::shared_ptr<Optimizer> get(const std::string& name);

}  // namespace mpt::optimizers

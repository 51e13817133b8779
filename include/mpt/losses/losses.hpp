#pragma once
/// Losses (float32 inside whatever the prediction dtype), by object or by Keras name.
/// A loss reduces per-example values with "sum_over_batch_size" (the mean) unless told otherwise
/// (Keras's `reduction`: set_reduction).
///
///   mpt::losses::SparseCategoricalCrossentropy loss_fn;            // from_logits = false
///   mpt::Tensor loss = loss_fn(y_true, y_pred);                   // float32 scalar
///   auto bce = mpt::losses::get("binary_crossentropy");
///   mpt::losses::MeanSquaredError sse;
///   sse.set_reduction("sum");                                     // the sum over the batch
#include <concepts>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpt/tensor.hpp"

namespace mpt::losses {

/// How a loss reduces its per-example values, after sample weights and masks (Keras's
/// `reduction`, keras/src/losses/loss.py):
///   - sum_over_batch_size (the default) and mean: sum(values · w) / values.numel();
///   - sum: sum(values · w);
///   - mean_with_sample_weight: sum(values · w) / sum(w) (w broadcast to the values' shape; the
///     plain mean without weights or mask); 0 where the weights sum to 0;
///   - none: values · w themselves, one per example (or position). Such a loss compiles and
///     loads, but fit, evaluate and compute_loss need a scalar and refuse it by name.
/// A mask (SparseCategoricalCrossentropy's ignore_class) weighs the positions that count by
/// numel / count under sum_over_batch_size and mean (so those are the mean over the positions
/// that count), by 1 under the others; the others weigh 0.
enum class Reduction { sum_over_batch_size, mean, sum, mean_with_sample_weight, none };

/// Keras's names ("sum_over_batch_size", "mean", "sum", "mean_with_sample_weight", "none");
/// another is an mpt::Error listing them.
Reduction reduction_from_string(const std::string& name);
std::string to_string(Reduction r);
using mpt::to_string;  // the shapes' and dtypes' beside it

class Loss {
 public:
  explicit Loss(std::string name) : name_(std::move(name)) {}
  virtual ~Loss() = default;
  /// Per-example losses (float32), shape y_pred.shape()[:-1] (or y_pred's for elementwise losses
  /// averaged over the last axis). Positions a mask leaves out (ignore_class) hold 0.
  virtual Tensor call(const Tensor& y_true, const Tensor& y_pred) const = 0;
  /// call() reduced by reduction() (by default the mean over the batch): a float32 scalar
  /// (float64 for float64 predictions; call()'s values under Reduction::none).
  /// Validates batch sizes, shapes and label ranges; errors name the loss.
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred) const;
  /// Keras's sample_weight, then the reduction: by default sum(call() * w) / call().numel()
  /// ("sum_over_batch_size"). Weights [N] (or [N, 1]) scale each example, over all its
  /// positions where call() gives one value per position; weights of call()'s shape scale each
  /// position. Undefined: no weights.
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) const;
  const std::string& name() const { return name_; }
  Reduction reduction() const { return reduction_; }
  void set_reduction(Reduction r) { reduction_ = r; }
  void set_reduction(const std::string& name) { reduction_ = reduction_from_string(name); }

 protected:
  /// call() and, where the loss masks positions (ignore_class), `mask`: 1 where a position
  /// counts and 0 where not, in call()'s shape and dtype. The default: call(), no mask.
  virtual Tensor call_masked(const Tensor& y_true, const Tensor& y_pred, Tensor& mask) const {
    mask = Tensor();
    return call(y_true, y_pred);
  }

 private:
  std::string name_;
  Reduction reduction_ = Reduction::sum_over_batch_size;
};

struct CrossentropyOptions {
  bool from_logits = false;
  double label_smoothing = 0.0;  ///< categorical/binary only
  /// Sparse only (Keras's ignore_class): positions whose label is this class (padding) add
  /// nothing, and the batch mean runs over the other positions (Reduction: the mask).
  std::optional<std::int64_t> ignore_class = std::nullopt;
};

class SparseCategoricalCrossentropy : public Loss {
 public:
  explicit SparseCategoricalCrossentropy(CrossentropyOptions o = {});
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
  const CrossentropyOptions& options() const { return o_; }
  bool from_logits() const { return o_.from_logits; }

 protected:
  Tensor call_masked(const Tensor& y_true, const Tensor& y_pred, Tensor& mask) const override;

 private:
  CrossentropyOptions o_;
};

class CategoricalCrossentropy : public Loss {
 public:
  explicit CategoricalCrossentropy(CrossentropyOptions o = {});
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
  const CrossentropyOptions& options() const { return o_; }

 private:
  CrossentropyOptions o_;
};

class BinaryCrossentropy : public Loss {
 public:
  explicit BinaryCrossentropy(CrossentropyOptions o = {});
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
  const CrossentropyOptions& options() const { return o_; }

 private:
  CrossentropyOptions o_;
};

class MeanSquaredError : public Loss {
 public:
  MeanSquaredError();
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

class MeanAbsoluteError : public Loss {
 public:
  MeanAbsoluteError();
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

/// Keras's Huber: mean over the last axis of 0.5 x^2 where |x| <= delta, else
/// delta |x| - 0.5 delta^2, x = y_pred - y_true. delta must be positive and finite.
class Huber : public Loss {
 public:
  explicit Huber(double delta = 1.0);
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
  double delta() const { return delta_; }

 private:
  double delta_;
};

/// Keras's KLDivergence: sum over the last axis of t log(t / p), t and p clipped to [1e-7, 1].
class KLDivergence : public Loss {
 public:
  KLDivergence();
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

/// Keras's LogCosh: mean over the last axis of log(cosh(x)), computed as Keras does,
/// x + softplus(-2x) - log(2), x = y_pred - y_true.
class LogCosh : public Loss {
 public:
  LogCosh();
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

/// Keras's CosineSimilarity: -sum(l2_normalize(y_true) * l2_normalize(y_pred)) along `axis`
/// (Keras's normalize: x * min(1/||x||, 1e7), so a zero vector gives 0). The per-example
/// values drop `axis`; the scalar is their mean.
class CosineSimilarity : public Loss {
 public:
  explicit CosineSimilarity(std::int64_t axis = -1);
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
  std::int64_t axis() const { return axis_; }

 private:
  std::int64_t axis_;
};

/// Keras's Hinge: mean over the last axis of max(1 - t·p, 0). Labels that are all 0 or 1 (over
/// the whole batch, as Keras's convert_binary_labels_to_hinge decides) become -1 and 1.
class Hinge : public Loss {
 public:
  Hinge();
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

/// Keras's SquaredHinge: mean over the last axis of max(1 - t·p, 0)², labels as Hinge's.
class SquaredHinge : public Loss {
 public:
  SquaredHinge();
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

/// Keras's CategoricalHinge: max(max((1 - t)·p) - sum(t·p) + 1, 0) over the last axis.
class CategoricalHinge : public Loss {
 public:
  CategoricalHinge();
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

/// Keras's Poisson: mean over the last axis of p - t·log(p + 1e-7).
class Poisson : public Loss {
 public:
  Poisson();
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

/// Keras's MeanAbsolutePercentageError: 100 · mean over the last axis of |t - p| / max(|t|, 1e-7).
class MeanAbsolutePercentageError : public Loss {
 public:
  MeanAbsolutePercentageError();
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

/// Keras's MeanSquaredLogarithmicError: mean over the last axis of
/// (log(max(p, 1e-7) + 1) - log(max(t, 1e-7) + 1))².
class MeanSquaredLogarithmicError : public Loss {
 public:
  MeanSquaredLogarithmicError();
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

/// By Keras name (keras.losses.get's names: sparse_categorical_crossentropy,
/// categorical_crossentropy, binary_crossentropy / bce, mean_squared_error / mse,
/// mean_absolute_error / mae, huber, kl_divergence / kld, log_cosh, cosine_similarity, hinge,
/// squared_hinge, categorical_hinge, poisson, mean_absolute_percentage_error / mape,
/// mean_squared_logarithmic_error / msle, the class
/// names, and Keras 2's logcosh / kullback_leibler_divergence); others are an mpt::Error listing
/// the valid names. Options take Keras's defaults.
std::shared_ptr<Loss> get(const std::string& name);

/// A loss argument: an object (moved in), a shared one, or a name.
class LossArg {
 public:
  LossArg() = default;
  LossArg(const char* name) : name_(name) {}         // NOLINT
  LossArg(const std::string& name) : name_(name) {}  // NOLINT
  LossArg(std::shared_ptr<Loss> l) : ptr_(std::move(l)) {}  // NOLINT
  template <class L>
    requires std::derived_from<std::decay_t<L>, Loss>
  LossArg(L&& l) : ptr_(std::make_shared<std::decay_t<L>>(std::forward<L>(l))) {}  // NOLINT
  /// The object, or losses::get(name); null when empty().
  std::shared_ptr<Loss> get() const;
  bool empty() const { return !ptr_ && name_.empty(); }

 private:
  std::string name_;
  std::shared_ptr<Loss> ptr_;
};

/// compile's loss: one loss (for every output of the model, as Keras), or a braced list of one
/// per output, in the model's output order (Keras's loss=[...]):
///   .loss = "mse"   .loss = losses::Huber()   .loss = {"sparse_categorical_crossentropy", "mse"}
class LossArgs {
 public:
  LossArgs() = default;
  template <class T>
    requires std::constructible_from<LossArg, T&&> && (!std::same_as<std::decay_t<T>, LossArgs>)
  LossArgs(T&& one) : list_{LossArg(std::forward<T>(one))} {}  // NOLINT(google-explicit-constructor)
  LossArgs(std::initializer_list<LossArg> list) : list_(list), is_list_(true) {}
  LossArgs(std::vector<LossArg> list) : list_(std::move(list)), is_list_(true) {}  // NOLINT
  /// No loss given.
  bool empty() const { return list_.empty() || (!is_list_ && list_[0].empty()); }
  /// A list (one loss per output), even of one entry; false: one loss for every output.
  bool is_list() const { return is_list_; }
  const std::vector<LossArg>& list() const { return list_; }

 private:
  std::vector<LossArg> list_;
  bool is_list_ = false;
};

}  // namespace mpt::losses

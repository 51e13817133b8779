#pragma once
/// Metrics: running means over an epoch, computed in float32 (16-bit predictions are cast to
/// float32 first), accumulated in float64 on the predictions' device, results in double.
/// "accuracy" resolves as in Keras (sparse / categorical / binary from the loss and the label
/// shape). The classes and their arguments are Keras 3's (keras.metrics), checked against
/// results Keras recorded (tests/interop/record_keras_metrics.py).
///
///   mpt::metrics::SparseCategoricalAccuracy acc;
///   acc.update_state(y_true, y_pred);
///   acc.update_state(y_true, y_pred, sample_weight);  // weighted, as Keras's sample_weight
///   double a = acc.result();
///   acc.reset_state();
///
///   mpt::metrics::AUC auc({.curve = "PR", .multi_label = true});
///   mpt::metrics::Precision p({.thresholds = std::vector<double>{0.3, 0.5, 0.7}});
///   std::vector<double> per_threshold = p.results();  // one value per threshold
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpt/losses/losses.hpp"
#include "mpt/tensor.hpp"

namespace mpt::metrics {

class Metric {
 public:
  explicit Metric(std::string name) : name_(std::move(name)) {}
  virtual ~Metric() = default;
  /// Adds a batch: y_true and y_pred with a leading batch axis (y_pred of any float dtype).
  virtual void update_state(const Tensor& y_true, const Tensor& y_pred) = 0;
  /// Keras's update_state(y_true, y_pred, sample_weight=None). An undefined sample_weight is
  /// exactly the two-argument update. A defined one is a tensor of any float or integer dtype (on
  /// any device: it is moved to y_pred's) that weights each example, or each element, as Keras's
  /// metric of the same class does:
  ///  - the means (Mean, MeanMetricWrapper and the accuracies, the error metrics, the top-k
  ///    accuracies, RootMeanSquaredError) weight the per-example values: a weight of rank 0 is one
  ///    weight for the whole batch (its mean counts once, with that weight); [N] or [N, 1] one per
  ///    example; a weight of the values' full shape one per element (the example's weight is then
  ///    the mean of its elements' weights). The running result is sum(w * v) / sum(w) over every
  ///    batch (Keras's reduce_to_samplewise_values and Mean).
  ///  - Precision, Recall and AUC add each element's weight to its confusion counts: the weight is
  ///    broadcast to y_pred's shape after a trailing axis is added when its rank is below
  ///    y_true's (so [N] weighs every class of an example, [N, C] each one, rank 0 everything).
  ///  - F1Score takes [N]: one weight per example, over all its classes.
  /// Weights of zero drop examples; a shape Keras would not broadcast is an mpt::Error naming the
  /// metric. No host read: the weighted sums stay on the device. The base implementation takes
  /// an undefined weight only (a metric of your own must override this to take weights); a
  /// subclass of Mean or MeanMetricWrapper that overrides the two-argument form must override
  /// this one too, else a weighted update is refused (it would bypass its override).
  virtual void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight);
  /// The result as one number. A metric with several values (Precision or Recall with several
  /// thresholds, F1Score with average = None over several classes) refuses: use results().
  virtual double result() const = 0;
  /// Every value of Keras's result() in order (one per threshold, or one per class): a single
  /// value for most metrics.
  virtual std::vector<double> results() const { return {result()}; }
  virtual void reset_state() = 0;
  /// A fresh metric of the same class and arguments (its state empty).
  virtual std::shared_ptr<Metric> clone() const = 0;
  /// Data parallelism: the state as numbers that add up over the ranks, and the result of such
  /// a sum. By default {result, 1}: the mean of the ranks' results. Mean keeps {total, count};
  /// the confusion metrics their weighted counts per threshold (and class), so the result of
  /// the ranks' summed states is the result of one process that saw every batch.
  virtual std::vector<double> reduction_state() const { return {result(), 1.0}; }
  virtual double result_of_state(const std::vector<double>& sum) const { return sum[1] > 0 ? sum[0] / sum[1] : 0.0; }
  /// results() of a summed state (every value, as results()).
  virtual std::vector<double> results_of_state(const std::vector<double>& sum) const { return {result_of_state(sum)}; }
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

 private:
  std::string name_;
};

/// A running (weighted) mean of per-example values. The total accumulates in a float64 tensor
/// on the values' device (no host read per update); result() reads it back.
class Mean : public Metric {
 public:
  explicit Mean(std::string name = "mean") : Metric(std::move(name)) {}
  /// Adds every element of `values` (any float dtype) to the mean: one value per sample (the
  /// mean over the other axes), each counted once, as Keras.
  void update(const Tensor& values);
  /// Keras's Mean.update_state(values, sample_weight): see Metric::update_state for the
  /// weights' shapes. An undefined weight is update(values).
  void update(const Tensor& values, const Tensor& sample_weight);
  /// Adds a one-element tensor with a weight (the loss of a batch of `weight` samples).
  void update(const Tensor& value, double weight);
  void update(double value, double weight = 1.0);
  /// The values are y_pred (Keras's Mean.update_state(values, sample_weight)).
  void update_state(const Tensor&, const Tensor& y_pred) override { update(y_pred); }
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  /// Adds the elements of `values` where `valid` (same shape, 0 or 1) is 1, each counted once:
  /// sum(values · valid) / sum(valid) over every update, both sums kept on the device. `valid`
  /// may hold any non-negative weights: each element then counts with its weight.
  void update_where(const Tensor& values, const Tensor& valid);
  double result() const override;
  void reset_state() override { total_ = Tensor(), counted_ = Tensor(), count_ = 0; }
  std::shared_ptr<Metric> clone() const override { return std::make_shared<Mean>(name()); }
  /// {total, count}: a mean over every rank's samples.
  std::vector<double> reduction_state() const override { return {total_.defined() ? total_.item() : 0.0, count()}; }

 private:
  void add(const Tensor& total_of_update, double count);
  double count() const { return count_ + (counted_.defined() ? counted_.item() : 0.0); }
  Tensor total_;    // float64 scalar on the device of the values
  Tensor counted_;  // float64 scalar: update_where's and the weighted updates' counts, same device
  double count_ = 0;  // the other updates' counts (known on the host)
};

/// Mean of fn(y_true, y_pred) per example.
class MeanMetricWrapper : public Mean {
 public:
  using Fn = Tensor (*)(const Tensor& y_true, const Tensor& y_pred);
  MeanMetricWrapper(std::string name, Fn fn) : Mean(std::move(name)), fn_(fn) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override { update(fn_(y_true, y_pred)); }
  /// update(fn(y_true, y_pred), sample_weight).
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  std::shared_ptr<Metric> clone() const override { return std::make_shared<MeanMetricWrapper>(name(), fn_); }

 private:
  Fn fn_;
};

// Per-example functions (float32 results).
Tensor sparse_categorical_accuracy(const Tensor& y_true, const Tensor& y_pred);
Tensor categorical_accuracy(const Tensor& y_true, const Tensor& y_pred);
/// The mean over the last axis of (y_pred > threshold) == y_true.
Tensor binary_accuracy(const Tensor& y_true, const Tensor& y_pred, double threshold = 0.5);
Tensor mean_absolute_error(const Tensor& y_true, const Tensor& y_pred);
Tensor mean_squared_error(const Tensor& y_true, const Tensor& y_pred);
/// 1 where the class of one-hot y_true [..., C] is among the k highest scores of y_pred
/// [..., C], else 0 (shape y_true.shape[:-1]). Keras's in_top_k: the class's rank is 1 + the
/// number of classes scoring strictly higher, so a tie with the k-th score counts as in; a NaN
/// score at the class is never in.
Tensor top_k_categorical_accuracy(const Tensor& y_true, const Tensor& y_pred, std::int64_t k = 5);
/// As top_k_categorical_accuracy with integer class ids y_true ([N] or [N, 1]; float ids are
/// truncated; ids outside [0, C) are never in the top k). from_sorted_ids: y_pred [N, M] holds
/// class ids sorted by score, and a hit is y_true among its first k.
Tensor sparse_top_k_categorical_accuracy(const Tensor& y_true, const Tensor& y_pred, std::int64_t k = 5,
                                         bool from_sorted_ids = false);

/// With ignore_class, labels equal to it (padding tokens) count neither as right nor as
/// wrong: the accuracy over the other positions. compile gives an "accuracy" it resolves to
/// this class the ignore_class of a SparseCategoricalCrossentropy loss. With sample_weight and
/// ignore_class, a weight of a lower rank than the labels weighs each of its example's
/// positions, and the result is the weighted mean over the valid positions.
class SparseCategoricalAccuracy : public MeanMetricWrapper {
 public:
  explicit SparseCategoricalAccuracy(std::string name = "sparse_categorical_accuracy",
                                     std::optional<std::int64_t> ignore_class = std::nullopt)
      : MeanMetricWrapper(std::move(name), sparse_categorical_accuracy), ignore_class_(ignore_class) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override;
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  std::shared_ptr<Metric> clone() const override {
    return std::make_shared<SparseCategoricalAccuracy>(name(), ignore_class_);
  }
  const std::optional<std::int64_t>& ignore_class() const { return ignore_class_; }
  void set_ignore_class(std::optional<std::int64_t> c) { ignore_class_ = c; }

 private:
  std::optional<std::int64_t> ignore_class_;
};
class CategoricalAccuracy : public MeanMetricWrapper {
 public:
  explicit CategoricalAccuracy(std::string name = "categorical_accuracy")
      : MeanMetricWrapper(std::move(name), categorical_accuracy) {}
};
/// Keras's BinaryAccuracy(name, dtype, threshold): y_pred > threshold counts as 1. Each element
/// is one value (a weight of y_pred's shape weighs each one).
class BinaryAccuracy : public MeanMetricWrapper {
 public:
  explicit BinaryAccuracy(std::string name = "binary_accuracy", double threshold = 0.5)
      : MeanMetricWrapper(std::move(name), nullptr), threshold_(threshold) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override { update_state(y_true, y_pred, Tensor()); }
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  std::shared_ptr<Metric> clone() const override { return std::make_shared<BinaryAccuracy>(name(), threshold_); }
  double threshold() const { return threshold_; }

 private:
  double threshold_;
};
class MeanAbsoluteError : public MeanMetricWrapper {
 public:
  explicit MeanAbsoluteError(std::string name = "mean_absolute_error")
      : MeanMetricWrapper(std::move(name), mean_absolute_error) {}
};
class MeanSquaredError : public MeanMetricWrapper {
 public:
  explicit MeanSquaredError(std::string name = "mean_squared_error")
      : MeanMetricWrapper(std::move(name), mean_squared_error) {}
};

/// The (weighted) mean of a loss's per-example values (losses.hpp's `call`), times `sign`:
/// Keras's metrics of the losses that take arguments. Their loss is kept with its options.
class LossMean : public Mean {
 public:
  LossMean(std::string name, std::shared_ptr<const losses::Loss> loss, double sign = 1.0)
      : Mean(std::move(name)), loss_(std::move(loss)), sign_(sign) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override { update_state(y_true, y_pred, Tensor()); }
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  std::shared_ptr<Metric> clone() const override { return std::make_shared<LossMean>(name(), loss_, sign_); }
  const losses::Loss& loss() const { return *loss_; }

 private:
  std::shared_ptr<const losses::Loss> loss_;
  double sign_;
};

/// Keras's Hinge, SquaredHinge, CategoricalHinge, Poisson, MeanAbsolutePercentageError and
/// MeanSquaredLogarithmicError metrics: the (weighted) mean of the loss's per-example values.
#define MPT_LOSS_METRIC(Class, default_name)                                                              \
  class Class : public LossMean {                                                                         \
   public:                                                                                                \
    explicit Class(std::string name = default_name) : LossMean(std::move(name), std::make_shared<losses::Class>()) {} \
    std::shared_ptr<Metric> clone() const override { return std::make_shared<Class>(name()); }          \
  };
MPT_LOSS_METRIC(Hinge, "hinge")
MPT_LOSS_METRIC(SquaredHinge, "squared_hinge")
MPT_LOSS_METRIC(CategoricalHinge, "categorical_hinge")
MPT_LOSS_METRIC(Poisson, "poisson")
MPT_LOSS_METRIC(MeanAbsolutePercentageError, "mean_absolute_percentage_error")
MPT_LOSS_METRIC(MeanSquaredLogarithmicError, "mean_squared_logarithmic_error")
#undef MPT_LOSS_METRIC

/// Keras's KLDivergence metric: the mean of sum(t log(t / p)) over the last axis (clipped).
class KLDivergence : public LossMean {
 public:
  explicit KLDivergence(std::string name = "kl_divergence")
      : LossMean(std::move(name), std::make_shared<losses::KLDivergence>()) {}
  std::shared_ptr<Metric> clone() const override { return std::make_shared<KLDivergence>(name()); }
};

/// Keras's LogCoshError (default name "logcosh"): the mean of log(cosh(p - t)).
class LogCoshError : public LossMean {
 public:
  explicit LogCoshError(std::string name = "logcosh") : LossMean(std::move(name), std::make_shared<losses::LogCosh>()) {}
  std::shared_ptr<Metric> clone() const override { return std::make_shared<LogCoshError>(name()); }
};

/// Keras's CosineSimilarity metric: the mean cosine of t and p along `axis` (the loss's negative).
class CosineSimilarity : public LossMean {
 public:
  explicit CosineSimilarity(std::string name = "cosine_similarity", std::int64_t axis = -1)
      : LossMean(std::move(name), std::make_shared<losses::CosineSimilarity>(axis), -1.0), axis_(axis) {}
  std::shared_ptr<Metric> clone() const override { return std::make_shared<CosineSimilarity>(name(), axis_); }
  std::int64_t axis() const { return axis_; }

 private:
  std::int64_t axis_;
};

/// Keras's BinaryCrossentropy, CategoricalCrossentropy and SparseCategoricalCrossentropy metrics:
/// the mean crossentropy, with from_logits and (binary, categorical) label_smoothing. The sparse
/// one takes no ignore_class (Keras's counts the ignored positions unless weighted).
#define MPT_CROSSENTROPY_METRIC(Class, default_name)                                                         \
  class Class : public LossMean {                                                                             \
   public:                                                                                                    \
    explicit Class(std::string name = default_name, losses::CrossentropyOptions o = {})                      \
        : LossMean(std::move(name), std::make_shared<losses::Class>(o)), o_(o) {}                            \
    std::shared_ptr<Metric> clone() const override { return std::make_shared<Class>(name(), o_); }          \
    const losses::CrossentropyOptions& options() const { return o_; }                                         \
                                                                                                              \
   private:                                                                                                   \
    losses::CrossentropyOptions o_;                                                                           \
  };
MPT_CROSSENTROPY_METRIC(BinaryCrossentropy, "binary_crossentropy")
MPT_CROSSENTROPY_METRIC(CategoricalCrossentropy, "categorical_crossentropy")
MPT_CROSSENTROPY_METRIC(SparseCategoricalCrossentropy, "sparse_categorical_crossentropy")
#undef MPT_CROSSENTROPY_METRIC

/// Keras's RootMeanSquaredError: the square root of the (weighted) mean of the squared errors,
/// y_true and y_pred first brought to one rank as Keras's squeeze_or_expand_to_same_rank.
class RootMeanSquaredError : public Mean {
 public:
  explicit RootMeanSquaredError(std::string name = "root_mean_squared_error") : Mean(std::move(name)) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override { update_state(y_true, y_pred, Tensor()); }
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  double result() const override;
  double result_of_state(const std::vector<double>& sum) const override;
  std::shared_ptr<Metric> clone() const override { return std::make_shared<RootMeanSquaredError>(name()); }
};

/// Keras's TopKCategoricalAccuracy(k=5): how often the one-hot class is among the k highest
/// scores (top_k_categorical_accuracy).
class TopKCategoricalAccuracy : public Mean {
 public:
  explicit TopKCategoricalAccuracy(std::int64_t k = 5, std::string name = "top_k_categorical_accuracy");
  void update_state(const Tensor& y_true, const Tensor& y_pred) override { update_state(y_true, y_pred, Tensor()); }
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  std::shared_ptr<Metric> clone() const override { return std::make_shared<TopKCategoricalAccuracy>(k_, name()); }
  std::int64_t k() const { return k_; }

 private:
  std::int64_t k_;
};

/// Keras's SparseTopKCategoricalAccuracy(k=5, from_sorted_ids=False): integer class ids
/// (sparse_top_k_categorical_accuracy).
class SparseTopKCategoricalAccuracy : public Mean {
 public:
  explicit SparseTopKCategoricalAccuracy(std::int64_t k = 5, std::string name = "sparse_top_k_categorical_accuracy",
                                         bool from_sorted_ids = false);
  void update_state(const Tensor& y_true, const Tensor& y_pred) override { update_state(y_true, y_pred, Tensor()); }
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  std::shared_ptr<Metric> clone() const override {
    return std::make_shared<SparseTopKCategoricalAccuracy>(k_, name(), from_sorted_ids_);
  }
  std::int64_t k() const { return k_; }
  bool from_sorted_ids() const { return from_sorted_ids_; }

 private:
  std::int64_t k_;
  bool from_sorted_ids_;
};

namespace detail {
/// Weighted confusion counts per threshold (Keras's metrics_utils.update_confusion_matrix_
/// variables), float64 tensors on the predictions' device: tp and fp per threshold (and label,
/// for a multi-label AUC), and the weighted totals of positive and negative labels (fn = pos -
/// tp, tn = neg - fp). An element is predicted positive at threshold t when its score is > t;
/// thresholds spread evenly over [0, 1] (Keras's is_evenly_distributed_thresholds) take Keras's
/// bucket path (scores clipped to [0, 1], bucket ceil(p · (T - 1)) - 1), whose boundaries are
/// float32's p · (T - 1) > i.
struct ConfusionCounts {
  std::vector<double> thresholds;  // ascending as used (Keras's list, AUC's with its end points)
  bool evenly = false;             // the bucket path
  bool with_epsilon = false;       // evenly, with end points outside [0, 1] (AUC's)
  std::int64_t labels = 0;         // multi-label: the label count (0: not yet known)
  Tensor tp, fp, pos, neg;         // undefined until the first update
  Tensor keys;                     // the thresholds as compared, [T, 1, 1] float32 on the device
  void reset() { tp = fp = pos = neg = Tensor(); }
  bool empty() const { return !tp.defined(); }
};
}  // namespace detail

/// Keras's Precision(thresholds, top_k, class_id): tp / (tp + fp) over every element (the
/// classes flattened), per threshold. thresholds: each in [0, 1]; none: 0.5, or with top_k
/// every score kept (Keras's -1e10). top_k: only each row's k highest scores (the lower index
/// first among ties) can be positive. class_id: only that class (the last axis) counts.
struct PrecisionRecallOptions {
  std::optional<std::vector<double>> thresholds = std::nullopt;
  std::optional<std::int64_t> top_k = std::nullopt;
  std::optional<std::int64_t> class_id = std::nullopt;
  std::string name = "";  ///< empty: "precision" / "recall"
};

/// The shared part of Precision and Recall.
class ConfusionMetric : public Metric {
 public:
  ConfusionMetric(PrecisionRecallOptions o, const char* default_name);
  void update_state(const Tensor& y_true, const Tensor& y_pred) override { update_state(y_true, y_pred, Tensor()); }
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  /// The one value (several thresholds: refused, use results()).
  double result() const override;
  std::vector<double> results() const override { return results_of_state(reduction_state()); }
  void reset_state() override { counts_.reset(); }
  double result_of_state(const std::vector<double>& sum) const override;
  const PrecisionRecallOptions& options() const { return options_; }
  /// The thresholds in use (the default's one when none were given).
  const std::vector<double>& thresholds() const { return counts_.thresholds; }

 protected:
  /// tp per threshold, then fp (Precision) or fn (Recall).
  std::vector<double> counts_state(bool false_positives) const;

  PrecisionRecallOptions options_;
  detail::ConfusionCounts counts_;
};

class Precision : public ConfusionMetric {
 public:
  explicit Precision(PrecisionRecallOptions o = {}) : ConfusionMetric(std::move(o), "precision") {}
  std::shared_ptr<Metric> clone() const override;
  /// tp per threshold, then fp per threshold.
  std::vector<double> reduction_state() const override { return counts_state(true); }
  std::vector<double> results_of_state(const std::vector<double>& sum) const override;
};

/// Keras's Recall(thresholds, top_k, class_id): tp / (tp + fn), as Precision.
class Recall : public ConfusionMetric {
 public:
  explicit Recall(PrecisionRecallOptions o = {}) : ConfusionMetric(std::move(o), "recall") {}
  std::shared_ptr<Metric> clone() const override;
  /// tp per threshold, then fn per threshold.
  std::vector<double> reduction_state() const override { return counts_state(false); }
  std::vector<double> results_of_state(const std::vector<double>& sum) const override;
};

/// Keras's AUC arguments.
struct AUCOptions {
  std::int64_t num_thresholds = 200;  ///< > 1; ignored when `thresholds` are given
  std::string curve = "ROC";          ///< "ROC", "PR" or "PRGAIN" (or lower case)
  std::string summation_method = "interpolation";  ///< "interpolation", "minoring", "majoring"
  std::string name = "auc";
  /// The inner thresholds (sorted; 0 - 1e-7 and 1 + 1e-7 are added at the ends); none:
  /// num_thresholds - 2 spread evenly over (0, 1).
  std::optional<std::vector<double>> thresholds = std::nullopt;
  /// One curve per label (y_pred [N, L]), the result their mean (weighted by label_weights).
  bool multi_label = false;
  std::optional<std::int64_t> num_labels = std::nullopt;  ///< multi_label only; else taken from the first batch
  /// Per-label weights: in the counts (multi_label false, y_pred [N, L]) or in the mean of the
  /// labels' AUCs (multi_label true).
  std::optional<std::vector<double>> label_weights = std::nullopt;
  bool from_logits = false;  ///< y_pred are logits: sigmoid first
};

/// Keras's AUC: the area under the ROC, PR or PR-gain curve from confusion counts at
/// num_thresholds thresholds, by a Riemann sum (interpolation: the trapezoid, and for PR Davis &
/// Goadrich's interpolation of the precision; minoring / majoring: the lower / upper rectangle).
class AUC : public Metric {
 public:
  explicit AUC(AUCOptions o = {});
  void update_state(const Tensor& y_true, const Tensor& y_pred) override { update_state(y_true, y_pred, Tensor()); }
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  double result() const override { return result_of_state(reduction_state()); }
  void reset_state() override { counts_.reset(); }
  std::shared_ptr<Metric> clone() const override;
  /// tp, fp, tn, fn, each [thresholds] (multi-label: [thresholds, labels], row-major); empty
  /// before the first update of a multi-label AUC whose num_labels was not given.
  std::vector<double> reduction_state() const override;
  double result_of_state(const std::vector<double>& sum) const override;
  const AUCOptions& options() const { return options_; }
  /// Every threshold in use, the two end points included (Keras's AUC.thresholds).
  const std::vector<double>& thresholds() const { return counts_.thresholds; }

 private:
  AUCOptions options_;
  detail::ConfusionCounts counts_;
};

/// Keras's F1Score arguments.
struct F1ScoreOptions {
  /// none: one score per class; "micro": over every element; "macro": the mean of the classes'
  /// scores; "weighted": their mean weighted by each class's (weighted) count of true labels.
  std::optional<std::string> average = std::nullopt;
  /// none: each row's highest score(s) count as positive (a row of zeros none); else y_pred >
  /// threshold, in (0, 1].
  std::optional<double> threshold = std::nullopt;
  std::string name = "f1_score";
};

/// Keras's F1Score: 2 · precision · recall / (precision + recall), with Keras's epsilon (1e-7)
/// in each division. y_true and y_pred [N, C] (C fixed by the first batch).
class F1Score : public Metric {
 public:
  explicit F1Score(F1ScoreOptions o = {});
  void update_state(const Tensor& y_true, const Tensor& y_pred) override { update_state(y_true, y_pred, Tensor()); }
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
  /// The one value (average none over several classes: refused, use results()).
  double result() const override;
  std::vector<double> results() const override { return results_of_state(reduction_state()); }
  void reset_state() override { tp_ = fp_ = fn_ = weights_ = Tensor(); }
  std::shared_ptr<Metric> clone() const override { return std::make_shared<F1Score>(options_); }
  /// tp, fp, fn and the true labels' weights, each per class (micro: one each); empty before
  /// the first update.
  std::vector<double> reduction_state() const override;
  double result_of_state(const std::vector<double>& sum) const override;
  std::vector<double> results_of_state(const std::vector<double>& sum) const override;
  const F1ScoreOptions& options() const { return options_; }

 private:
  F1ScoreOptions options_;
  Tensor tp_, fp_, fn_, weights_;  // float64, [C] (micro: []), on the predictions' device
};

/// By Keras name: accuracy / acc (resolved with `loss_name` and the label/prediction shapes
/// like Keras: sparse when labels have one value per example, binary when the prediction has
/// one unit or the loss is binary_crossentropy, else categorical; with the shapes left empty the
/// loss alone decides, categorical by default), sparse_categorical_accuracy,
/// categorical_accuracy, binary_accuracy, mae / mean_absolute_error, mse / mean_squared_error,
/// top_k_categorical_accuracy, sparse_top_k_categorical_accuracy, precision, recall, auc,
/// f1_score, root_mean_squared_error, and the class names (SparseCategoricalAccuracy, ..., AUC,
/// F1Score): keras.metrics.get's names, each with its class's default arguments.
/// The metric keeps the name the user gave ("accuracy" stays "accuracy"). Unknown names: an
/// mpt::Error listing the valid ones.
std::shared_ptr<Metric> get(const std::string& name, const std::string& loss_name = "",
                            const Shape& y_true_shape = {}, const Shape& y_pred_shape = {});

/// A metric argument: a name or an object.
class MetricArg {
 public:
  MetricArg(const char* name) : name_(name) {}         // NOLINT
  MetricArg(const std::string& name) : name_(name) {}  // NOLINT
  MetricArg(std::shared_ptr<Metric> m) : ptr_(std::move(m)) {}  // NOLINT
  template <class M>
    requires std::derived_from<std::decay_t<M>, Metric>
  MetricArg(M&& m) : ptr_(std::make_shared<std::decay_t<M>>(std::forward<M>(m))) {}  // NOLINT
  const std::string& name() const { return name_; }
  const std::shared_ptr<Metric>& object() const { return ptr_; }

 private:
  std::string name_;
  std::shared_ptr<Metric> ptr_;
};

}  // namespace mpt::metrics

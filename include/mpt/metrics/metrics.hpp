#pragma once
/// Metrics: running means over an epoch, computed in float32. "accuracy" resolves as in Keras
/// (sparse / categorical / binary from the loss and the label shape).
///
///   mpt::metrics::SparseCategoricalAccuracy acc;
///   acc.update_state(y_true, y_pred);
///   double a = acc.result();
///   acc.reset_state();
#include <concepts>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "mpt/tensor.hpp"

namespace mpt::metrics {

class Metric {
 public:
  explicit Metric(std::string name) : name_(std::move(name)) {}
  virtual ~Metric() = default;
  virtual void update_state(const Tensor& y_true, const Tensor& y_pred) = 0;
  virtual double result() const = 0;
  virtual void reset_state() = 0;
  virtual std::shared_ptr<Metric> clone() const = 0;
  /// Data parallelism: the state as numbers that add up over the ranks, and the result of such
  /// a sum. By default {result, 1}: the mean of the ranks' results.
  virtual std::vector<double> reduction_state() const { return {result(), 1.0}; }
  virtual double result_of_state(const std::vector<double>& sum) const { return sum[1] > 0 ? sum[0] / sum[1] : 0.0; }
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
  /// Adds a one-element tensor with a weight (the loss of a batch of `weight` samples).
  void update(const Tensor& value, double weight);
  void update(double value, double weight = 1.0);
  void update_state(const Tensor&, const Tensor& y_pred) override { update(y_pred); }
  /// Adds the elements of `values` where `valid` (same shape, 0 or 1) is 1, each counted once:
  /// sum(values · valid) / sum(valid) over every update, both sums kept on the device.
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
  Tensor counted_;  // float64 scalar: update_where's counts, on the same device
  double count_ = 0;  // the other updates' counts (known on the host)
};

/// Mean of fn(y_true, y_pred) per example.
class MeanMetricWrapper : public Mean {
 public:
  using Fn = Tensor (*)(const Tensor& y_true, const Tensor& y_pred);
  MeanMetricWrapper(std::string name, Fn fn) : Mean(std::move(name)), fn_(fn) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override { update(fn_(y_true, y_pred)); }
  std::shared_ptr<Metric> clone() const override { return std::make_shared<MeanMetricWrapper>(name(), fn_); }

 private:
  Fn fn_;
};

// Per-example functions (float32 results).
Tensor sparse_categorical_accuracy(const Tensor& y_true, const Tensor& y_pred);
Tensor categorical_accuracy(const Tensor& y_true, const Tensor& y_pred);
Tensor binary_accuracy(const Tensor& y_true, const Tensor& y_pred);  ///< threshold 0.5
Tensor mean_absolute_error(const Tensor& y_true, const Tensor& y_pred);
Tensor mean_squared_error(const Tensor& y_true, const Tensor& y_pred);

/// With ignore_class, labels equal to it (padding tokens) count neither as right nor as
/// wrong: the accuracy over the other positions. compile gives an "accuracy" it resolves to
/// this class the ignore_class of a SparseCategoricalCrossentropy loss.
class SparseCategoricalAccuracy : public MeanMetricWrapper {
 public:
  explicit SparseCategoricalAccuracy(std::string name = "sparse_categorical_accuracy",
                                     std::optional<std::int64_t> ignore_class = std::nullopt)
      : MeanMetricWrapper(std::move(name), sparse_categorical_accuracy), ignore_class_(ignore_class) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override;
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
class BinaryAccuracy : public MeanMetricWrapper {
 public:
  explicit BinaryAccuracy(std::string name = "binary_accuracy")
      : MeanMetricWrapper(std::move(name), binary_accuracy) {}
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

/// By Keras name: accuracy / acc (resolved with `loss_name` and the label/prediction shapes
/// like Keras: sparse when labels have one value per example, binary when the prediction has
/// one unit or the loss is binary_crossentropy, else categorical; with the shapes left empty the
/// loss alone decides, categorical by default), sparse_categorical_accuracy,
/// categorical_accuracy, binary_accuracy, mae / mean_absolute_error, mse / mean_squared_error.
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

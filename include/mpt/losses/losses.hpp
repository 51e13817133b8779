#pragma once
/// Losses (float32 inside whatever the prediction dtype), by object or by Keras name.
/// A loss reduces per-example values with "sum_over_batch_size" (the mean), as Keras.
///
///   mpt::losses::SparseCategoricalCrossentropy loss_fn;            // from_logits = false
///   mpt::Tensor loss = loss_fn(y_true, y_pred);                   // float32 scalar
///   auto bce = mpt::losses::get("binary_crossentropy");
#include <concepts>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "mpt/tensor.hpp"

namespace mpt::losses {

class Loss {
 public:
  explicit Loss(std::string name) : name_(std::move(name)) {}
  virtual ~Loss() = default;
  /// Per-example losses (float32), shape y_pred.shape()[:-1] (or y_pred's for elementwise losses
  /// averaged over the last axis).
  virtual Tensor call(const Tensor& y_true, const Tensor& y_pred) const = 0;
  /// The mean of call() over the batch: a float32 scalar (float64 for float64 predictions).
  /// Validates batch sizes, shapes and label ranges; errors name the loss.
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

struct CrossentropyOptions {
  bool from_logits = false;
  double label_smoothing = 0.0;  ///< categorical/binary only
  /// Sparse only (Keras's ignore_class): positions whose label is this class (padding) add
  /// nothing, and the batch mean runs over the other positions.
  std::optional<std::int64_t> ignore_class = std::nullopt;
};

class SparseCategoricalCrossentropy : public Loss {
 public:
  explicit SparseCategoricalCrossentropy(CrossentropyOptions o = {});
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
  const CrossentropyOptions& options() const { return o_; }
  bool from_logits() const { return o_.from_logits; }

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

/// By Keras name (sparse_categorical_crossentropy, categorical_crossentropy,
/// binary_crossentropy, mean_squared_error / mse, mean_absolute_error / mae); others are an
/// mpt::Error listing the valid names.
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

}  // namespace mpt::losses

#include "mpt/losses/losses.hpp"

#include <functional>
#include <map>

#include "losses/loss_utils.hpp"

namespace mpt::losses {
using namespace detail;

Tensor Loss::operator()(const Tensor& y_true, const Tensor& y_pred) const {
  const std::string who = "loss " + name();
  MPT_CHECK(y_true.defined(), who, ": y_true is undefined");
  MPT_CHECK(y_pred.defined(), who, ": y_pred is undefined");
  MPT_CHECK(y_true.dim() >= 1 && y_pred.dim() >= 1, who, ": y_true ", to_string(y_true.shape()), " and y_pred ",
            to_string(y_pred.shape()), " need a batch axis");
  MPT_CHECK(y_true.shape()[0] == y_pred.shape()[0], who, ": y_true ", to_string(y_true.shape()), " and y_pred ",
            to_string(y_pred.shape()), " have different batch sizes (", y_true.shape()[0], " vs ",
            y_pred.shape()[0], ")");
  MPT_CHECK(y_pred.shape()[0] > 0, who, ": empty batch (y_pred ", to_string(y_pred.shape()), ")");
  return named_errors(who, [&] {
    Tensor values = call(y_true, y_pred);
    return ops::mean(values);  // "sum_over_batch_size"
  });
}

namespace {

/// mean(f(y_true - y_pred), axis=-1) in the compute dtype, after Keras's rank alignment.
Tensor elementwise_loss(const std::string& who, const Tensor& y_true, const Tensor& y_pred,
                        Tensor (*f)(const Tensor&)) {
  return named_errors(who, [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    const DType d = compute_dtype(y_pred);
    auto [t, p] = squeeze_or_expand_to_same_rank(cast_to(y_true, d), cast_to(y_pred, d));
    return ops::mean(f(ops::sub(p, t)), {-1});
  });
}

}  // namespace

MeanSquaredError::MeanSquaredError() : Loss("mean_squared_error") {}

Tensor MeanSquaredError::call(const Tensor& y_true, const Tensor& y_pred) const {
  return elementwise_loss("loss " + name(), y_true, y_pred, ops::square);
}

MeanAbsoluteError::MeanAbsoluteError() : Loss("mean_absolute_error") {}

Tensor MeanAbsoluteError::call(const Tensor& y_true, const Tensor& y_pred) const {
  return elementwise_loss("loss " + name(), y_true, y_pred, ops::abs);
}

std::shared_ptr<Loss> get(const std::string& name) {
  using Make = std::function<std::shared_ptr<Loss>()>;
  // Keras's function names, class names and short aliases (keras.losses.ALL_OBJECTS_DICT).
  static const std::map<std::string, Make> table = {
      {"sparse_categorical_crossentropy", [] { return std::make_shared<SparseCategoricalCrossentropy>(); }},
      {"SparseCategoricalCrossentropy", [] { return std::make_shared<SparseCategoricalCrossentropy>(); }},
      {"categorical_crossentropy", [] { return std::make_shared<CategoricalCrossentropy>(); }},
      {"CategoricalCrossentropy", [] { return std::make_shared<CategoricalCrossentropy>(); }},
      {"binary_crossentropy", [] { return std::make_shared<BinaryCrossentropy>(); }},
      {"BinaryCrossentropy", [] { return std::make_shared<BinaryCrossentropy>(); }},
      {"bce", [] { return std::make_shared<BinaryCrossentropy>(); }},
      {"BCE", [] { return std::make_shared<BinaryCrossentropy>(); }},
      {"mean_squared_error", [] { return std::make_shared<MeanSquaredError>(); }},
      {"MeanSquaredError", [] { return std::make_shared<MeanSquaredError>(); }},
      {"mse", [] { return std::make_shared<MeanSquaredError>(); }},
      {"MSE", [] { return std::make_shared<MeanSquaredError>(); }},
      {"mean_absolute_error", [] { return std::make_shared<MeanAbsoluteError>(); }},
      {"MeanAbsoluteError", [] { return std::make_shared<MeanAbsoluteError>(); }},
      {"mae", [] { return std::make_shared<MeanAbsoluteError>(); }},
      {"MAE", [] { return std::make_shared<MeanAbsoluteError>(); }},
  };
  auto it = table.find(name);
  if (it == table.end())
    fail("losses::get: unknown loss '", name,
         "'; valid names: sparse_categorical_crossentropy, categorical_crossentropy, binary_crossentropy (bce), "
         "mean_squared_error (mse), mean_absolute_error (mae), or the class names "
         "SparseCategoricalCrossentropy, CategoricalCrossentropy, BinaryCrossentropy, MeanSquaredError, "
         "MeanAbsoluteError");
  return it->second();
}

std::shared_ptr<Loss> LossArg::get() const {
  if (ptr_) return ptr_;
  if (name_.empty()) return nullptr;
  return losses::get(name_);
}

}  // namespace mpt::losses

#include "mpt/metrics/metrics.hpp"

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>

#include "losses/loss_utils.hpp"
#include "mpt/autograd.hpp"
#include "mpt/losses/losses.hpp"
#include "mpt/ops.hpp"

namespace mpt::metrics {
using losses::detail::named_errors;
using losses::detail::squeeze_or_expand_to_same_rank;

void Mean::add(const Tensor& total_of_update, double count) {
  total_ = total_.defined() ? ops::add(total_, total_of_update.to(total_.device())) : total_of_update;
  count_ += count;
}

void Mean::update(const Tensor& values) {
  MPT_CHECK(values.defined(), "metric ", name(), ": values are undefined");
  NoGradGuard no_grad;
  if (values.numel() == 0) return;
  Tensor total = ops::sum(ops::cast(values.detach(), float64));
  if (values.dim() == 0) return add(total, 1.0);
  const double samples = static_cast<double>(values.shape()[0]);
  const double per_sample = static_cast<double>(values.numel()) / samples;
  add(per_sample == 1.0 ? total : ops::div(total, Tensor::scalar(per_sample, float64, total.device())), samples);
}

void Mean::update(const Tensor& value, double weight) {
  MPT_CHECK(value.defined() && value.numel() == 1, "metric ", name(), ": expected one value, got ",
            value.defined() ? to_string(value.shape()) : std::string("an undefined tensor"));
  NoGradGuard no_grad;
  add(ops::mul(ops::cast(value.detach().reshape({}), float64), Tensor::scalar(weight, float64, value.device())),
      weight);
}

void Mean::update(double value, double weight) {
  add(Tensor::scalar(value * weight, float64, total_.defined() ? total_.device() : default_device()), weight);
}

void Mean::update_where(const Tensor& values, const Tensor& valid) {
  MPT_CHECK(values.defined() && valid.defined() && values.shape() == valid.shape(), "metric ", name(),
            ": values and their validity must have one shape, got ",
            values.defined() ? to_string(values.shape()) : std::string("undefined"), " and ",
            valid.defined() ? to_string(valid.shape()) : std::string("undefined"));
  NoGradGuard no_grad;
  if (values.numel() == 0) return;
  Tensor w = ops::cast(valid.detach(), float64);
  Tensor total = ops::sum(ops::mul(ops::cast(values.detach(), float64), w)), counted = ops::sum(w);
  total_ = total_.defined() ? ops::add(total_, total.to(total_.device())) : total;
  counted_ = counted_.defined() ? ops::add(counted_, counted.to(counted_.device())) : counted;
}

double Mean::result() const {
  const double n = count();
  return n > 0 ? total_.item() / n : 0.0;
}

void SparseCategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred) {
  Tensor correct = sparse_categorical_accuracy(y_true, y_pred);
  if (!ignore_class_) return update(correct);
  NoGradGuard no_grad;
  Tensor labels = y_true.detach().reshape(correct.shape());
  Tensor ignored = Tensor::scalar(static_cast<double>(*ignore_class_), labels.dtype(), labels.device());
  update_where(correct, ops::not_equal(labels, ignored));
}

namespace {

Tensor matches(const Tensor& a, const Tensor& b) { return ops::cast(ops::equal(a, b), float32); }

}  // namespace

Tensor sparse_categorical_accuracy(const Tensor& y_true, const Tensor& y_pred) {
  NoGradGuard no_grad;
  return named_errors("metric sparse_categorical_accuracy", [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    MPT_CHECK(y_pred.dim() >= 1, "y_pred ", to_string(y_pred.shape()), " needs a class axis");
    Tensor labels = y_true.detach();
    if (labels.dim() == y_pred.dim() && labels.dim() > 0 && labels.shape().back() == 1) {
      Shape s = labels.shape();
      s.pop_back();
      labels = labels.reshape(s);
    }
    Tensor pred = ops::argmax(y_pred.detach(), -1);
    MPT_CHECK(labels.shape() == pred.shape(), "labels ", to_string(y_true.shape()), " do not match y_pred ",
              to_string(y_pred.shape()), " (expected labels of shape ", to_string(pred.shape()), ")");
    // Float labels compare by value, as Keras casts both sides to one dtype.
    if (is_floating(labels.dtype())) return matches(labels.to(float64), pred.to(float64));
    return matches(labels.to(int64), pred);
  });
}

Tensor categorical_accuracy(const Tensor& y_true, const Tensor& y_pred) {
  NoGradGuard no_grad;
  return named_errors("metric categorical_accuracy", [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    MPT_CHECK(y_pred.dim() >= 1 && y_true.shape() == y_pred.shape(), "one-hot y_true ", to_string(y_true.shape()),
              " and y_pred ", to_string(y_pred.shape()), " must have the same shape");
    return matches(ops::argmax(y_true.detach(), -1), ops::argmax(y_pred.detach(), -1));
  });
}

Tensor binary_accuracy(const Tensor& y_true, const Tensor& y_pred) {
  NoGradGuard no_grad;
  return named_errors("metric binary_accuracy", [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    const DType d = losses::detail::compute_dtype(y_pred);
    auto [t, p] = squeeze_or_expand_to_same_rank(y_true.detach().to(d), y_pred.detach().to(d));
    Tensor predicted = ops::cast(ops::greater(p, Tensor::scalar(0.5, d, p.device())), d);
    return ops::mean(matches(t, predicted), {-1});
  });
}

Tensor mean_absolute_error(const Tensor& y_true, const Tensor& y_pred) {
  NoGradGuard no_grad;
  return named_errors("metric mean_absolute_error",
                      [&] { return losses::MeanAbsoluteError().call(y_true.detach(), y_pred.detach()); });
}

Tensor mean_squared_error(const Tensor& y_true, const Tensor& y_pred) {
  NoGradGuard no_grad;
  return named_errors("metric mean_squared_error",
                      [&] { return losses::MeanSquaredError().call(y_true.detach(), y_pred.detach()); });
}

namespace {

bool is_binary_loss(const std::string& loss) {
  return loss == "binary_crossentropy" || loss == "BinaryCrossentropy" || loss == "bce" || loss == "BCE";
}

std::shared_ptr<Metric> resolve_accuracy(const std::string& name, const std::string& loss_name,
                                         const Shape& y_true_shape, const Shape& y_pred_shape) {
  if (y_true_shape.empty() || y_pred_shape.empty()) {  // shapes unknown: go by the loss alone
    if (is_binary_loss(loss_name)) return std::make_shared<BinaryAccuracy>(name);
    if (loss_name == "sparse_categorical_crossentropy" || loss_name == "SparseCategoricalCrossentropy")
      return std::make_shared<SparseCategoricalAccuracy>(name);
    return std::make_shared<CategoricalAccuracy>(name);
  }
  // keras.src.trainers.compile_utils.is_binary_or_sparse_categorical, plus the binary loss.
  const bool is_binary = y_pred_shape.back() == 1 || is_binary_loss(loss_name);
  const bool is_sparse = y_true_shape.size() < y_pred_shape.size() ||
                         (y_true_shape.back() == 1 && y_pred_shape.back() > 1);
  if (is_binary) return std::make_shared<BinaryAccuracy>(name);
  if (is_sparse) return std::make_shared<SparseCategoricalAccuracy>(name);
  return std::make_shared<CategoricalAccuracy>(name);
}

}  // namespace

std::shared_ptr<Metric> get(const std::string& name, const std::string& loss_name, const Shape& y_true_shape,
                            const Shape& y_pred_shape) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "accuracy" || lower == "acc") return resolve_accuracy(name, loss_name, y_true_shape, y_pred_shape);

  using Make = std::function<std::shared_ptr<Metric>(const std::string&)>;
  auto make = [](auto tag) -> Make {
    using M = typename decltype(tag)::type;
    return [](const std::string& n) { return std::make_shared<M>(n); };
  };
  // Keras's snake_case and class names and short aliases (keras.metrics.ALL_OBJECTS_DICT).
  static const std::map<std::string, Make> table = {
      {"sparse_categorical_accuracy", make(std::type_identity<SparseCategoricalAccuracy>{})},
      {"SparseCategoricalAccuracy", make(std::type_identity<SparseCategoricalAccuracy>{})},
      {"categorical_accuracy", make(std::type_identity<CategoricalAccuracy>{})},
      {"CategoricalAccuracy", make(std::type_identity<CategoricalAccuracy>{})},
      {"binary_accuracy", make(std::type_identity<BinaryAccuracy>{})},
      {"BinaryAccuracy", make(std::type_identity<BinaryAccuracy>{})},
      {"mean_absolute_error", make(std::type_identity<MeanAbsoluteError>{})},
      {"MeanAbsoluteError", make(std::type_identity<MeanAbsoluteError>{})},
      {"mae", make(std::type_identity<MeanAbsoluteError>{})},
      {"MAE", make(std::type_identity<MeanAbsoluteError>{})},
      {"mean_squared_error", make(std::type_identity<MeanSquaredError>{})},
      {"MeanSquaredError", make(std::type_identity<MeanSquaredError>{})},
      {"mse", make(std::type_identity<MeanSquaredError>{})},
      {"MSE", make(std::type_identity<MeanSquaredError>{})},
  };
  auto it = table.find(name);
  if (it == table.end())
    fail("metrics::get: unknown metric '", name,
         "'; valid names: accuracy (acc), sparse_categorical_accuracy, categorical_accuracy, binary_accuracy, "
         "mean_absolute_error (mae), mean_squared_error (mse), or the class names SparseCategoricalAccuracy, "
         "CategoricalAccuracy, BinaryAccuracy, MeanAbsoluteError, MeanSquaredError");
  return it->second(name);  // the metric keeps the name the user gave, as in Keras
}

}  // namespace mpt::metrics

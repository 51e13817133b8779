#include "mpt/metrics/metrics.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <typeinfo>

#include "losses/loss_utils.hpp"
#include "mpt/autograd.hpp"
#include "mpt/losses/losses.hpp"
#include "mpt/ops.hpp"

namespace mpt::metrics {
using losses::detail::named_errors;
using losses::detail::squeeze_or_expand_to_same_rank;

namespace {

std::vector<std::int64_t> axes_from(std::int64_t first, std::int64_t end) {
  std::vector<std::int64_t> a;
  for (std::int64_t i = first; i < end; ++i) a.push_back(i);
  return a;
}

/// Whether `from` broadcasts to `to` (NumPy's rule, one way).
bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (std::size_t i = 0; i < from.size(); ++i) {
    const std::int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
    if (f != 1 && f != t) return false;
  }
  return true;
}

/// A sample weight as a weight per element of `values` (float64): brought to the values' rank
/// as Keras (squeeze_or_expand_to_same_rank), trailing axes added, broadcast.
Tensor element_weights(const Tensor& sample_weight, const Tensor& values) {
  Tensor v = values, w = ops::cast(sample_weight.detach().to(values.device()), float64);
  std::tie(v, w) = squeeze_or_expand_to_same_rank(v, w);
  Shape s = w.shape();
  while (s.size() < static_cast<std::size_t>(v.dim())) s.push_back(1);
  MPT_CHECK(broadcasts_to(s, v.shape()), "sample_weight ", to_string(sample_weight.shape()),
            " does not broadcast to the values ", to_string(values.shape()));
  return ops::broadcast_to(w.reshape(s), v.shape()).reshape(values.shape());
}

/// A weighted update of a subclass of a built-in mean that may override the two-argument
/// update_state (which the weighted path would bypass) is refused.
void check_known_class(const Metric& m, bool known) {
  MPT_CHECK(known, "metric '", m.name(), "': its class derives from a built-in metric but does not override ",
            "update_state(y_true, y_pred, sample_weight); override it to take sample weights");
}

}  // namespace

void Metric::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  if (!sample_weight.defined()) return update_state(y_true, y_pred);
  fail("metric '", name(), "' takes no sample_weight: override update_state(y_true, y_pred, sample_weight) ",
       "to weight it");
}

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

// Keras's reduce_to_samplewise_values and Mean.update_state: the weight and the values brought to
// one rank (squeeze_or_expand_to_same_rank), the values averaged down to the weight's rank, the
// weight broadcast to them; the total adds sum(values · weight) averaged per sample, the count
// the weights averaged per sample.
void Mean::update(const Tensor& values, const Tensor& sample_weight) {
  if (!sample_weight.defined()) return update(values);
  MPT_CHECK(values.defined(), "metric ", name(), ": values are undefined");
  NoGradGuard no_grad;
  if (values.numel() == 0) return;
  named_errors("metric " + name(), [&] {
    Tensor v = ops::cast(values.detach(), float64);
    Tensor w = ops::cast(sample_weight.detach().to(v.device()), float64);
    std::tie(v, w) = squeeze_or_expand_to_same_rank(v, w);
    const std::int64_t wr = w.dim();
    if (v.dim() > wr) v = ops::mean(v, axes_from(wr, v.dim()));
    MPT_CHECK(w.dim() <= v.dim() && broadcasts_to(w.shape(), v.shape()), "sample_weight ",
              to_string(sample_weight.shape()), " does not broadcast to the values ", to_string(values.shape()));
    w = ops::broadcast_to(w, v.shape());
    v = ops::mul(v, w);
    if (wr > 1) w = ops::mean(w, axes_from(1, wr));
    if (v.dim() > 1) v = ops::mean(v, axes_from(1, v.dim()));
    Tensor total = ops::sum(v), counted = ops::sum(w);
    total_ = total_.defined() ? ops::add(total_, total.to(total_.device())) : total;
    counted_ = counted_.defined() ? ops::add(counted_, counted.to(counted_.device())) : counted;
  });
}

void Mean::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  if (!sample_weight.defined()) return update_state(y_true, y_pred);  // a subclass's override
  check_known_class(*this, typeid(*this) == typeid(Mean));
  update(y_pred, sample_weight);
}

void MeanMetricWrapper::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  if (!sample_weight.defined()) return update_state(y_true, y_pred);
  const auto& t = typeid(*this);
  check_known_class(*this, t == typeid(MeanMetricWrapper) || t == typeid(CategoricalAccuracy) ||
                               t == typeid(MeanAbsoluteError) || t == typeid(MeanSquaredError));
  update(fn_(y_true, y_pred), sample_weight);
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
  update_state(y_true, y_pred, Tensor());
}

void SparseCategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  Tensor correct = sparse_categorical_accuracy(y_true, y_pred);
  if (!ignore_class_) return update(correct, sample_weight);
  NoGradGuard no_grad;
  Tensor labels = y_true.detach().reshape(correct.shape());
  Tensor ignored = Tensor::scalar(static_cast<double>(*ignore_class_), labels.dtype(), labels.device());
  Tensor valid = ops::not_equal(labels, ignored);
  if (!sample_weight.defined()) return update_where(correct, valid);
  named_errors("metric " + name(), [&] {
    update_where(correct, ops::mul(ops::cast(valid, float64), element_weights(sample_weight, correct)));
  });
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

namespace {

/// (y_pred > threshold) == y_true per element, y_true and y_pred brought to one rank.
Tensor binary_matches(const Tensor& y_true, const Tensor& y_pred, double threshold) {
  MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
  const DType d = losses::detail::compute_dtype(y_pred);
  auto [t, p] = squeeze_or_expand_to_same_rank(y_true.detach().to(d), y_pred.detach().to(d));
  Tensor predicted = ops::cast(ops::greater(p, Tensor::scalar(threshold, d, p.device())), d);
  return matches(t, predicted);
}

}  // namespace

Tensor binary_accuracy(const Tensor& y_true, const Tensor& y_pred, double threshold) {
  NoGradGuard no_grad;
  return named_errors("metric binary_accuracy",
                      [&] { return ops::mean(binary_matches(y_true, y_pred, threshold), {-1}); });
}

void BinaryAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  NoGradGuard no_grad;
  update(named_errors("metric " + name(), [&] { return binary_matches(y_true, y_pred, threshold_); }), sample_weight);
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

void LossMean::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  NoGradGuard no_grad;
  Tensor values = named_errors("metric " + name(), [&] { return loss_->call(y_true.detach(), y_pred.detach()); });
  if (sign_ != 1.0) values = ops::mul(values, Tensor::scalar(sign_, values.dtype(), values.device()));
  update(values, sample_weight);
}

// ---- root mean squared error and the top-k accuracies ------------------------------------

void RootMeanSquaredError::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  NoGradGuard no_grad;
  Tensor squared = named_errors("metric " + name(), [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    const DType d = losses::detail::compute_dtype(y_pred);
    auto [t, p] = squeeze_or_expand_to_same_rank(y_true.detach().to(d), y_pred.detach().to(d));
    return ops::square(ops::sub(p, t));
  });
  update(squared, sample_weight);
}

double RootMeanSquaredError::result() const { return std::sqrt(Mean::result()); }

double RootMeanSquaredError::result_of_state(const std::vector<double>& sum) const {
  return std::sqrt(Mean::result_of_state(sum));
}

namespace {

/// Keras's in_top_k: labels (integers) [R], scores [R, C]; 1 where 1 + the number of classes
/// scoring strictly higher than the label's is <= k. A label outside [0, C) or a NaN score at it
/// scores -inf (never in the top k while the other scores are finite and k < C).
Tensor in_top_k(const Tensor& labels, const Tensor& scores, std::int64_t k) {
  const std::int64_t classes = scores.shape().back();
  const Device dev = scores.device();
  const DType d = scores.dtype();
  Tensor neg_inf = Tensor::scalar(-std::numeric_limits<double>::infinity(), d, dev);
  Tensor at_label = ops::greater(ops::one_hot(labels, classes, float32), Tensor::scalar(0, float32, dev));
  Tensor score = ops::max(ops::where(at_label, scores, neg_inf), {-1}, true);
  score = ops::where(ops::equal(score, score), score, neg_inf);  // NaN: -inf
  Tensor higher = ops::sum(ops::cast(ops::greater(scores, score), float32), {-1});
  return ops::cast(ops::less(higher, Tensor::scalar(static_cast<double>(k), float32, dev)), float32);
}

/// float64 scores stay float64; the rest compute in float32.
Tensor scores_of(const Tensor& y_pred) { return y_pred.detach().to(losses::detail::compute_dtype(y_pred)); }

}  // namespace

Tensor top_k_categorical_accuracy(const Tensor& y_true, const Tensor& y_pred, std::int64_t k) {
  NoGradGuard no_grad;
  return named_errors("metric top_k_categorical_accuracy", [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    MPT_CHECK(y_pred.dim() >= 2 && y_true.shape() == y_pred.shape(), "one-hot y_true ", to_string(y_true.shape()),
              " and y_pred ", to_string(y_pred.shape()), " must have one shape (num_samples, ..., num_classes)");
    Tensor scores = scores_of(y_pred);
    Tensor labels = ops::argmax(y_true.detach().to(scores.dtype()), -1);
    const std::int64_t classes = scores.shape().back();
    return in_top_k(labels.reshape({-1}), scores.reshape({-1, classes}), k).reshape(labels.shape());
  });
}

Tensor sparse_top_k_categorical_accuracy(const Tensor& y_true, const Tensor& y_pred, std::int64_t k,
                                         bool from_sorted_ids) {
  NoGradGuard no_grad;
  return named_errors("metric sparse_top_k_categorical_accuracy", [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    MPT_CHECK(y_pred.dim() >= 2, "y_pred ", to_string(y_pred.shape()), " needs a class axis (num_samples, ",
              from_sorted_ids ? "num_ids)" : "num_classes)");
    const std::int64_t width = y_pred.shape().back(), rows = y_pred.numel() / std::max<std::int64_t>(width, 1);
    MPT_CHECK(y_true.numel() == rows, "labels ", to_string(y_true.shape()), " do not match y_pred ",
              to_string(y_pred.shape()), " (", rows, " labels expected)");
    Tensor labels = y_true.detach().reshape({rows});
    Tensor hits;
    if (from_sorted_ids) {  // y_true among the first k ids (counted once)
      Tensor ids = y_pred.detach().reshape({rows, width});
      const std::int64_t first = std::clamp<std::int64_t>(k, 0, width);
      if (first == 0) {
        hits = Tensor::zeros({rows}, float32, ids.device());
      } else {
        Tensor top = ops::slice(ids, 1, 0, first);
        Tensor same = ops::equal(top, ops::cast(labels, ids.dtype()).reshape({rows, 1}));
        hits = ops::max(ops::cast(same, float32), {1});
      }
    } else {
      MPT_CHECK(is_floating(y_pred.dtype()), "y_pred must hold scores (a float dtype), got ", to_string(y_pred.dtype()),
                "; with class ids sorted by score, use from_sorted_ids");
      if (is_floating(labels.dtype())) labels = ops::cast(labels, int32);  // Keras's cast: truncated
      hits = in_top_k(labels, scores_of(y_pred).reshape({rows, width}), k);
    }
    return hits.reshape(y_true.shape());
  });
}

TopKCategoricalAccuracy::TopKCategoricalAccuracy(std::int64_t k, std::string name) : Mean(std::move(name)), k_(k) {}

void TopKCategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  update(top_k_categorical_accuracy(y_true, y_pred, k_), sample_weight);
}

SparseTopKCategoricalAccuracy::SparseTopKCategoricalAccuracy(std::int64_t k, std::string name, bool from_sorted_ids)
    : Mean(std::move(name)), k_(k), from_sorted_ids_(from_sorted_ids) {}

void SparseTopKCategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred,
                                                 const Tensor& sample_weight) {
  update(sparse_top_k_categorical_accuracy(y_true, y_pred, k_, from_sorted_ids_), sample_weight);
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
  const Make top_k = [](const std::string& n) { return std::make_shared<TopKCategoricalAccuracy>(5, n); };
  const Make sparse_top_k = [](const std::string& n) {
    return std::make_shared<SparseTopKCategoricalAccuracy>(5, n);
  };
  const Make precision = [](const std::string& n) { return std::make_shared<Precision>(PrecisionRecallOptions{.name = n}); };
  const Make recall = [](const std::string& n) { return std::make_shared<Recall>(PrecisionRecallOptions{.name = n}); };
  const Make auc = [](const std::string& n) { return std::make_shared<AUC>(AUCOptions{.name = n}); };
  const Make f1 = [](const std::string& n) { return std::make_shared<F1Score>(F1ScoreOptions{.name = n}); };
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
      {"root_mean_squared_error", make(std::type_identity<RootMeanSquaredError>{})},
      {"RootMeanSquaredError", make(std::type_identity<RootMeanSquaredError>{})},
      {"top_k_categorical_accuracy", top_k},
      {"TopKCategoricalAccuracy", top_k},
      {"sparse_top_k_categorical_accuracy", sparse_top_k},
      {"SparseTopKCategoricalAccuracy", sparse_top_k},
      {"precision", precision},
      {"Precision", precision},
      {"recall", recall},
      {"Recall", recall},
      {"auc", auc},
      {"AUC", auc},
      {"f1_score", f1},
      {"F1Score", f1},
      {"hinge", make(std::type_identity<Hinge>{})},
      {"Hinge", make(std::type_identity<Hinge>{})},
      {"squared_hinge", make(std::type_identity<SquaredHinge>{})},
      {"SquaredHinge", make(std::type_identity<SquaredHinge>{})},
      {"categorical_hinge", make(std::type_identity<CategoricalHinge>{})},
      {"CategoricalHinge", make(std::type_identity<CategoricalHinge>{})},
      {"poisson", make(std::type_identity<Poisson>{})},
      {"Poisson", make(std::type_identity<Poisson>{})},
      {"mean_absolute_percentage_error", make(std::type_identity<MeanAbsolutePercentageError>{})},
      {"MeanAbsolutePercentageError", make(std::type_identity<MeanAbsolutePercentageError>{})},
      {"mape", make(std::type_identity<MeanAbsolutePercentageError>{})},
      {"MAPE", make(std::type_identity<MeanAbsolutePercentageError>{})},
      {"mean_squared_logarithmic_error", make(std::type_identity<MeanSquaredLogarithmicError>{})},
      {"MeanSquaredLogarithmicError", make(std::type_identity<MeanSquaredLogarithmicError>{})},
      {"msle", make(std::type_identity<MeanSquaredLogarithmicError>{})},
      {"MSLE", make(std::type_identity<MeanSquaredLogarithmicError>{})},
      {"kl_divergence", make(std::type_identity<KLDivergence>{})},
      {"KLDivergence", make(std::type_identity<KLDivergence>{})},
      {"log_cosh_error", make(std::type_identity<LogCoshError>{})},
      {"LogCoshError", make(std::type_identity<LogCoshError>{})},
      {"cosine_similarity", make(std::type_identity<CosineSimilarity>{})},
      {"CosineSimilarity", make(std::type_identity<CosineSimilarity>{})},
      {"binary_crossentropy", make(std::type_identity<BinaryCrossentropy>{})},
      {"BinaryCrossentropy", make(std::type_identity<BinaryCrossentropy>{})},
      {"bce", make(std::type_identity<BinaryCrossentropy>{})},
      {"BCE", make(std::type_identity<BinaryCrossentropy>{})},
      {"categorical_crossentropy", make(std::type_identity<CategoricalCrossentropy>{})},
      {"CategoricalCrossentropy", make(std::type_identity<CategoricalCrossentropy>{})},
      {"sparse_categorical_crossentropy", make(std::type_identity<SparseCategoricalCrossentropy>{})},
      {"SparseCategoricalCrossentropy", make(std::type_identity<SparseCategoricalCrossentropy>{})},
  };
  auto it = table.find(name);
  if (it == table.end())
    fail("metrics::get: unknown metric '", name,
         "'; valid names: accuracy (acc), sparse_categorical_accuracy, categorical_accuracy, binary_accuracy, "
         "mean_absolute_error (mae), mean_squared_error (mse), root_mean_squared_error, "
         "top_k_categorical_accuracy, sparse_top_k_categorical_accuracy, precision, recall, auc, f1_score, hinge, "
         "squared_hinge, categorical_hinge, poisson, mean_absolute_percentage_error (mape), "
         "mean_squared_logarithmic_error (msle), kl_divergence, log_cosh_error, cosine_similarity, "
         "binary_crossentropy (bce), categorical_crossentropy, sparse_categorical_crossentropy, or the class names "
         "SparseCategoricalAccuracy, CategoricalAccuracy, BinaryAccuracy, MeanAbsoluteError, MeanSquaredError, "
         "RootMeanSquaredError, TopKCategoricalAccuracy, SparseTopKCategoricalAccuracy, Precision, Recall, AUC, "
         "F1Score, Hinge, SquaredHinge, CategoricalHinge, Poisson, MeanAbsolutePercentageError, "
         "MeanSquaredLogarithmicError, KLDivergence, LogCoshError, CosineSimilarity, BinaryCrossentropy, "
         "CategoricalCrossentropy, SparseCategoricalCrossentropy");
  return it->second(name);  // the metric keeps the name the user gave, as in Keras
}

}  // namespace mpt::metrics

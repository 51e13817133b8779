#include "mpt/losses/losses.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "losses/loss_utils.hpp"

namespace mpt::losses {
using namespace detail;

namespace {
/// sample_weight aligned with the per-example values: [N, 1] squeezed (Keras's
/// squeeze_or_expand_to_same_rank), [N] widened over the trailing axes of per-position values.
Tensor weights_like(const Tensor& values, const Tensor& sample_weight) {
  Tensor w = sample_weight.detach();
  if (w.dim() == values.dim() + 1 && w.shape().back() == 1)
    w = w.reshape(Shape(w.shape().begin(), w.shape().end() - 1));
  if (w.dim() < values.dim()) {
    Shape s = w.shape();
    s.resize(values.shape().size(), 1);
    w = w.reshape(s);
  }
  bool fits = w.dim() == values.dim();
  for (std::size_t i = 0; fits && i < w.shape().size(); ++i)
    fits = w.shape()[i] == values.shape()[i] || w.shape()[i] == 1;
  MPT_CHECK(fits, "sample_weight of shape ", to_string(sample_weight.shape()),
            " does not fit the per-example losses of shape ", to_string(values.shape()));
  if (w.dtype() != values.dtype()) w = ops::cast(w, values.dtype());
  return w.device() == values.device() ? w : w.to(values.device());
}
}  // namespace

Tensor Loss::operator()(const Tensor& y_true, const Tensor& y_pred) const { return (*this)(y_true, y_pred, Tensor()); }

Tensor Loss::operator()(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) const {
  const std::string who = "loss " + name();
  MPT_CHECK(y_true.defined(), who, ": y_true is undefined");
  MPT_CHECK(y_pred.defined(), who, ": y_pred is undefined");
  MPT_CHECK(y_true.dim() >= 1 && y_pred.dim() >= 1, who, ": y_true ", to_string(y_true.shape()), " and y_pred ",
            to_string(y_pred.shape()), " need a batch axis");
  MPT_CHECK(y_true.shape()[0] == y_pred.shape()[0], who, ": y_true ", to_string(y_true.shape()), " and y_pred ",
            to_string(y_pred.shape()), " have different batch sizes (", y_true.shape()[0], " vs ",
            y_pred.shape()[0], ")");
  MPT_CHECK(y_pred.shape()[0] > 0, who, ": empty batch (y_pred ", to_string(y_pred.shape()), ")");
  MPT_CHECK(!sample_weight.defined() || (sample_weight.dim() >= 1 && sample_weight.shape()[0] == y_pred.shape()[0]),
            who, ": sample_weight ", sample_weight.defined() ? to_string(sample_weight.shape()) : "",
            " needs one row per example of y_pred ", to_string(y_pred.shape()));
  return named_errors(who, [&] {
    Tensor mask;
    Tensor values = call_masked(y_true, y_pred, mask);
    Tensor w = sample_weight.defined() ? weights_like(values, sample_weight) : Tensor();
    const Reduction r = reduction();
    const bool mean_like = r == Reduction::sum_over_batch_size || r == Reduction::mean;
    const DType d = values.dtype();
    const Device dev = values.device();
    // b / a, and 0 where a is 0 (Keras's divide_no_nan; a finite gradient either way).
    auto divide_no_nan = [&](const Tensor& b, const Tensor& a) {
      const Tensor zero = ops::equal(a, Tensor::scalar(0.0, d, dev));
      return ops::where(zero, Tensor::scalar(0.0, d, dev), ops::div(b, ops::where(zero, Tensor::scalar(1.0, d, dev), a)));
    };
    if (mask.defined()) {
      // Keras's apply_mask: under the means, the positions that count weigh numel / count.
      const Tensor m =
          mean_like ? ops::mul(mask, divide_no_nan(Tensor::scalar(static_cast<double>(mask.numel()), d, dev), ops::sum(mask)))
                    : mask;
      w = w.defined() ? ops::mul(w, m) : m;
    }
    if (w.defined()) values = ops::mul(values, w);
    switch (r) {
      case Reduction::none: return values;
      case Reduction::sum: return ops::sum(values);
      case Reduction::mean_with_sample_weight:
        if (w.defined()) {  // the weights' sum over the values' shape (w broadcasts along its 1s)
          const double spread = static_cast<double>(values.numel()) / static_cast<double>(std::max<std::int64_t>(w.numel(), 1));
          return divide_no_nan(ops::sum(values), ops::mul(ops::sum(w), Tensor::scalar(spread, d, dev)));
        }
        return ops::mean(values);
      case Reduction::sum_over_batch_size:
      case Reduction::mean: break;
    }
    return ops::mean(values);  // sum(values * w) / values.numel()
  });
}

Reduction reduction_from_string(const std::string& name) {
  for (Reduction r : {Reduction::sum_over_batch_size, Reduction::mean, Reduction::sum, Reduction::mean_with_sample_weight,
                      Reduction::none})
    if (name == to_string(r)) return r;
  fail("loss reduction '", name, "' is not one of sum_over_batch_size, mean, sum, mean_with_sample_weight, none");
}

std::string to_string(Reduction r) {
  switch (r) {
    case Reduction::sum_over_batch_size: return "sum_over_batch_size";
    case Reduction::mean: return "mean";
    case Reduction::sum: return "sum";
    case Reduction::mean_with_sample_weight: return "mean_with_sample_weight";
    case Reduction::none: return "none";
  }
  return "?";
}

namespace {

constexpr double kEpsilon = 1e-7;  // keras.backend.epsilon()

/// mean(f(y_true, y_pred), axis=-1) in the compute dtype, after Keras's rank alignment.
Tensor pairwise_loss(const std::string& who, const Tensor& y_true, const Tensor& y_pred,
                     const std::function<Tensor(const Tensor&, const Tensor&)>& f) {
  return named_errors(who, [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    const DType d = compute_dtype(y_pred);
    auto [t, p] = squeeze_or_expand_to_same_rank(cast_to(y_true, d), cast_to(y_pred, d));
    return ops::mean(f(t, p), {-1});
  });
}

/// mean(f(y_pred - y_true), axis=-1), as pairwise_loss.
Tensor elementwise_loss(const std::string& who, const Tensor& y_true, const Tensor& y_pred,
                        const std::function<Tensor(const Tensor&)>& f) {
  return pairwise_loss(who, y_true, y_pred, [&](const Tensor& t, const Tensor& p) { return f(ops::sub(p, t)); });
}

Tensor scalar_like(double v, const Tensor& x) { return Tensor::scalar(v, x.dtype(), x.device()); }

/// Keras's convert_binary_labels_to_hinge: labels all 0 or 1 become 2t - 1; otherwise as they
/// are (one decision for the whole batch, on the device).
Tensor hinge_labels(const Tensor& t) {
  const Tensor labels = t.detach();
  const Tensor neither = ops::mul(ops::cast(ops::not_equal(labels, scalar_like(0.0, labels)), labels.dtype()),
                                  ops::cast(ops::not_equal(labels, scalar_like(1.0, labels)), labels.dtype()));
  const Tensor binary = ops::equal(ops::sum(neither), scalar_like(0.0, labels));
  return ops::where(binary, ops::sub(ops::mul(labels, scalar_like(2.0, labels)), scalar_like(1.0, labels)), labels);
}

/// max(1 - t·p, 0) with hinge labels.
Tensor hinge_margin(const Tensor& t, const Tensor& p) {
  return ops::maximum(ops::sub(scalar_like(1.0, p), ops::mul(hinge_labels(t), p)), scalar_like(0.0, p));
}

/// log(1 + e) for e in [0, 1], accurate where 1 + e rounds (Goldberg's form of log1p:
/// log(u) * e / (u - 1), u = 1 + e; e itself where u rounds to 1). Both branches stay finite,
/// so the gradient is.
Tensor log1p_unit(const Tensor& e) {
  const Tensor one = Tensor::scalar(1.0, e.dtype(), e.device());
  const Tensor u = ops::add(one, e);
  const Tensor rounds_to_one = ops::equal(u, one);
  const Tensor safe = ops::where(rounds_to_one, one, ops::sub(u, one));
  return ops::where(rounds_to_one, e, ops::mul(ops::log(u), ops::div(e, safe)));
}

/// jax.nn.softplus, as Keras's JAX backend has it: max(x, 0) + log1p(exp(-|x|)), with the
/// branches picked by x >= 0 so that the slope at 0 is sigmoid(0) = 1/2.
Tensor softplus(const Tensor& x) {
  const Tensor zero = Tensor::scalar(0.0, x.dtype(), x.device());
  const Tensor pos = ops::greater_equal(x, zero);
  return ops::add(ops::where(pos, x, zero), log1p_unit(ops::exp(ops::where(pos, ops::neg(x), x))));
}

/// Keras's clip(x, epsilon, 1): minimum(maximum(x, epsilon), 1).
Tensor clip_unit(const Tensor& x) {
  return ops::minimum(ops::maximum(x, Tensor::scalar(kEpsilon, x.dtype(), x.device())),
                      Tensor::scalar(1.0, x.dtype(), x.device()));
}

/// Keras's normalize(x, axis) (order 2): x * min(rsqrt(sum(x^2, axis)), 1 / epsilon), written as
/// x / sqrt(max(sum(x^2), epsilon^2)), the same value without an infinite rsqrt (and so without
/// a NaN gradient) at a zero vector.
Tensor l2_normalize(const Tensor& x, std::int64_t axis) {
  const Tensor sq = ops::sum(ops::square(x), {axis}, true);
  const Tensor floor = Tensor::scalar(kEpsilon * kEpsilon, x.dtype(), x.device());
  return ops::div(x, ops::sqrt(ops::maximum(sq, floor)));
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

Huber::Huber(double delta) : Loss("huber_loss"), delta_(delta) {
  MPT_CHECK(std::isfinite(delta) && delta > 0, "loss ", name(), ": delta must be positive and finite, got ", delta);
}

Tensor Huber::call(const Tensor& y_true, const Tensor& y_pred) const {
  return elementwise_loss("loss " + name(), y_true, y_pred, [this](const Tensor& x) {
    // Keras's huber, op for op: delta and 0.5 in the compute dtype.
    const Tensor delta = Tensor::scalar(delta_, x.dtype(), x.device());
    const Tensor half = Tensor::scalar(0.5, x.dtype(), x.device());
    const Tensor a = ops::abs(x);
    return ops::where(ops::less_equal(a, delta), ops::mul(half, ops::square(x)),
                      ops::sub(ops::mul(delta, a), ops::mul(half, ops::square(delta))));
  });
}

KLDivergence::KLDivergence() : Loss("kl_divergence") {}

Tensor KLDivergence::call(const Tensor& y_true, const Tensor& y_pred) const {
  return named_errors("loss " + name(), [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    const DType d = compute_dtype(y_pred);
    auto [t, p] = squeeze_or_expand_to_same_rank(cast_to(y_true, d), cast_to(y_pred, d));
    t = clip_unit(t);
    p = clip_unit(p);
    return ops::sum(ops::mul(t, ops::log(ops::div(t, p))), {-1});
  });
}

LogCosh::LogCosh() : Loss("log_cosh") {}

Tensor LogCosh::call(const Tensor& y_true, const Tensor& y_pred) const {
  return elementwise_loss("loss " + name(), y_true, y_pred, [](const Tensor& x) {
    const Tensor log2 = Tensor::scalar(std::log(2.0), x.dtype(), x.device());
    return ops::sub(ops::add(x, softplus(x * -2.0)), log2);
  });
}

CosineSimilarity::CosineSimilarity(std::int64_t axis) : Loss("cosine_similarity"), axis_(axis) {}

Tensor CosineSimilarity::call(const Tensor& y_true, const Tensor& y_pred) const {
  return named_errors("loss " + name(), [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    const DType d = compute_dtype(y_pred);
    auto [t, p] = squeeze_or_expand_to_same_rank(cast_to(y_true, d), cast_to(y_pred, d));
    const std::int64_t rank = std::min(t.dim(), p.dim());
    MPT_CHECK(axis_ >= -rank && axis_ < rank, "axis ", axis_, " is out of range for y_true ",
              to_string(y_true.shape()), " and y_pred ", to_string(y_pred.shape()));
    return ops::neg(ops::sum(ops::mul(l2_normalize(t, axis_), l2_normalize(p, axis_)), {axis_}));
  });
}

Hinge::Hinge() : Loss("hinge") {}

Tensor Hinge::call(const Tensor& y_true, const Tensor& y_pred) const {
  return pairwise_loss("loss " + name(), y_true, y_pred, hinge_margin);
}

SquaredHinge::SquaredHinge() : Loss("squared_hinge") {}

Tensor SquaredHinge::call(const Tensor& y_true, const Tensor& y_pred) const {
  return pairwise_loss("loss " + name(), y_true, y_pred,
                       [](const Tensor& t, const Tensor& p) { return ops::square(hinge_margin(t, p)); });
}

CategoricalHinge::CategoricalHinge() : Loss("categorical_hinge") {}

Tensor CategoricalHinge::call(const Tensor& y_true, const Tensor& y_pred) const {
  return named_errors("loss " + name(), [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    const DType d = compute_dtype(y_pred);
    const Tensor t = cast_to(y_true, d).detach(), p = cast_to(y_pred, d);
    const Tensor pos = ops::sum(ops::mul(t, p), {-1});
    const Tensor neg = ops::max(ops::mul(ops::sub(scalar_like(1.0, t), t), p), {-1});
    return ops::maximum(ops::add(ops::sub(neg, pos), scalar_like(1.0, p)), scalar_like(0.0, p));
  });
}

Poisson::Poisson() : Loss("poisson") {}

Tensor Poisson::call(const Tensor& y_true, const Tensor& y_pred) const {
  return pairwise_loss("loss " + name(), y_true, y_pred, [](const Tensor& t, const Tensor& p) {
    return ops::sub(p, ops::mul(t, ops::log(ops::add(p, scalar_like(kEpsilon, p)))));
  });
}

MeanAbsolutePercentageError::MeanAbsolutePercentageError() : Loss("mean_absolute_percentage_error") {}

Tensor MeanAbsolutePercentageError::call(const Tensor& y_true, const Tensor& y_pred) const {
  const Tensor mean = pairwise_loss("loss " + name(), y_true, y_pred, [](const Tensor& t, const Tensor& p) {
    return ops::abs(ops::div(ops::sub(t, p), ops::maximum(ops::abs(t), scalar_like(kEpsilon, t))));
  });
  return ops::mul(mean, scalar_like(100.0, mean));
}

MeanSquaredLogarithmicError::MeanSquaredLogarithmicError() : Loss("mean_squared_logarithmic_error") {}

Tensor MeanSquaredLogarithmicError::call(const Tensor& y_true, const Tensor& y_pred) const {
  return pairwise_loss("loss " + name(), y_true, y_pred, [](const Tensor& t, const Tensor& p) {
    auto log1 = [](const Tensor& x) {
      return ops::log(ops::add(ops::maximum(x, scalar_like(kEpsilon, x)), scalar_like(1.0, x)));
    };
    return ops::square(ops::sub(log1(p), log1(t)));
  });
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
      {"huber", [] { return std::make_shared<Huber>(); }},
      {"Huber", [] { return std::make_shared<Huber>(); }},
      {"kl_divergence", [] { return std::make_shared<KLDivergence>(); }},
      {"KLDivergence", [] { return std::make_shared<KLDivergence>(); }},
      {"kld", [] { return std::make_shared<KLDivergence>(); }},
      {"KLD", [] { return std::make_shared<KLDivergence>(); }},
      {"kullback_leibler_divergence", [] { return std::make_shared<KLDivergence>(); }},  // Keras 2
      {"log_cosh", [] { return std::make_shared<LogCosh>(); }},
      {"LogCosh", [] { return std::make_shared<LogCosh>(); }},
      {"logcosh", [] { return std::make_shared<LogCosh>(); }},  // Keras 2
      {"cosine_similarity", [] { return std::make_shared<CosineSimilarity>(); }},
      {"CosineSimilarity", [] { return std::make_shared<CosineSimilarity>(); }},
      {"hinge", [] { return std::make_shared<Hinge>(); }},
      {"Hinge", [] { return std::make_shared<Hinge>(); }},
      {"squared_hinge", [] { return std::make_shared<SquaredHinge>(); }},
      {"SquaredHinge", [] { return std::make_shared<SquaredHinge>(); }},
      {"categorical_hinge", [] { return std::make_shared<CategoricalHinge>(); }},
      {"CategoricalHinge", [] { return std::make_shared<CategoricalHinge>(); }},
      {"poisson", [] { return std::make_shared<Poisson>(); }},
      {"Poisson", [] { return std::make_shared<Poisson>(); }},
      {"mean_absolute_percentage_error", [] { return std::make_shared<MeanAbsolutePercentageError>(); }},
      {"MeanAbsolutePercentageError", [] { return std::make_shared<MeanAbsolutePercentageError>(); }},
      {"mape", [] { return std::make_shared<MeanAbsolutePercentageError>(); }},
      {"MAPE", [] { return std::make_shared<MeanAbsolutePercentageError>(); }},
      {"mean_squared_logarithmic_error", [] { return std::make_shared<MeanSquaredLogarithmicError>(); }},
      {"MeanSquaredLogarithmicError", [] { return std::make_shared<MeanSquaredLogarithmicError>(); }},
      {"msle", [] { return std::make_shared<MeanSquaredLogarithmicError>(); }},
      {"MSLE", [] { return std::make_shared<MeanSquaredLogarithmicError>(); }},
  };
  auto it = table.find(name);
  if (it == table.end())
    fail("losses::get: unknown loss '", name,
         "'; valid names: sparse_categorical_crossentropy, categorical_crossentropy, binary_crossentropy (bce), "
         "mean_squared_error (mse), mean_absolute_error (mae), huber, kl_divergence (kld), log_cosh, "
         "cosine_similarity, hinge, squared_hinge, categorical_hinge, poisson, mean_absolute_percentage_error (mape), "
         "mean_squared_logarithmic_error (msle), or the class names SparseCategoricalCrossentropy, "
         "CategoricalCrossentropy, BinaryCrossentropy, MeanSquaredError, MeanAbsoluteError, Huber, KLDivergence, "
         "LogCosh, CosineSimilarity, Hinge, SquaredHinge, CategoricalHinge, Poisson, MeanAbsolutePercentageError, "
         "MeanSquaredLogarithmicError");
  return it->second();
}

std::shared_ptr<Loss> LossArg::get() const {
  if (ptr_) return ptr_;
  if (name_.empty()) return nullptr;
  return losses::get(name_);
}

}  // namespace mpt::losses

#include "losses/loss_utils.hpp"
#include "mpt/data/data.hpp"
#include "mpt/losses/losses.hpp"

namespace mpt::losses {
using namespace detail;

namespace {

constexpr double kEpsilon = 1e-7;  // keras.backend.epsilon()

std::string who(const Loss& l) { return "loss " + l.name(); }

void check_smoothing(const std::string& name, const CrossentropyOptions& o) {
  MPT_CHECK(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0, "loss ", name,
            ": label_smoothing must be in [0, 1], got ", o.label_smoothing);
  MPT_CHECK(!o.ignore_class, "loss ", name, ": ignore_class is for sparse labels (sparse_categorical_crossentropy)");
}

}  // namespace

SparseCategoricalCrossentropy::SparseCategoricalCrossentropy(CrossentropyOptions o)
    : Loss("sparse_categorical_crossentropy"), o_(o) {
  MPT_CHECK(!o.ignore_class || (*o.ignore_class >= -(std::int64_t{1} << 53) && *o.ignore_class < (std::int64_t{1} << 53)),
            "loss ", name(), ": ignore_class ", o.ignore_class.value_or(0), " is out of the range labels can hold");
  MPT_CHECK(o.label_smoothing == 0.0, "loss ", name(),
            ": label_smoothing is not supported for sparse labels (as in Keras), got ", o.label_smoothing);
}

Tensor SparseCategoricalCrossentropy::call(const Tensor& y_true, const Tensor& y_pred) const {
  Tensor mask;
  return call_masked(y_true, y_pred, mask);
}

Tensor SparseCategoricalCrossentropy::call_masked(const Tensor& y_true, const Tensor& y_pred, Tensor& mask) const {
  mask = Tensor();
  return named_errors(who(*this), [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    Tensor labels = y_true;
    // Keras casts float labels to int, so 3.0 means class 3; a fraction (1.5) or a value no
    // int holds (1e30) is an error where the labels are host memory, instead of a silent
    // truncation or an undefined cast (fit and data::batches check device labels up front).
    // Ignored labels (padding, often -1) are left to the class check below.
    if (is_floating(labels.dtype())) {
      if (labels.device().is_cpu() && !o_.ignore_class)
        data::check_labels("labels", labels.detach(), y_pred.shape().empty() ? -1 : y_pred.shape().back());
      labels = ops::cast(labels.detach(), int64);
    }
    Tensor x = cast_to(y_pred, compute_dtype(y_pred));
    if (!o_.ignore_class) return ops::softmax_cross_entropy(x, labels, {.from_logits = o_.from_logits});
    // Keras's ignore_class: ignored positions take class 0 and give 0, and the mask says which
    // count; Loss::operator() weighs them by the reduction (all on the device: no host read;
    // nothing here needs a gradient).
    const Tensor ignore = Tensor::scalar(static_cast<double>(*o_.ignore_class), labels.dtype(), labels.device());
    const Tensor valid = ops::not_equal(labels.detach(), ignore);
    const Tensor safe = ops::where(valid, labels.detach(), Tensor::zeros({}, labels.dtype(), labels.device()));
    Tensor per = ops::softmax_cross_entropy(x, safe, {.from_logits = o_.from_logits});
    const Tensor counts = valid.reshape(per.shape());
    mask = ops::cast(counts, per.dtype());
    return ops::where(counts, per, Tensor::zeros({}, per.dtype(), per.device()));
  });
}

CategoricalCrossentropy::CategoricalCrossentropy(CrossentropyOptions o)
    : Loss("categorical_crossentropy"), o_(o) {
  check_smoothing(name(), o);
}

Tensor CategoricalCrossentropy::call(const Tensor& y_true, const Tensor& y_pred) const {
  return named_errors(who(*this), [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    const DType d = compute_dtype(y_pred);
    auto [t, x] = squeeze_or_expand_to_same_rank(cast_to(y_true, d), cast_to(y_pred, d));
    MPT_CHECK(t.shape() == x.shape(), "y_true ", to_string(y_true.shape()), " and y_pred ",
              to_string(y_pred.shape()), " must have the same shape (one-hot labels)");
    if (o_.label_smoothing > 0) {
      const double classes = static_cast<double>(x.shape().back());
      t = t * (1.0 - o_.label_smoothing) + o_.label_smoothing / classes;
    }
    return ops::softmax_cross_entropy(x, t, {.from_logits = o_.from_logits});
  });
}

BinaryCrossentropy::BinaryCrossentropy(CrossentropyOptions o) : Loss("binary_crossentropy"), o_(o) {
  check_smoothing(name(), o);
}

Tensor BinaryCrossentropy::call(const Tensor& y_true, const Tensor& y_pred) const {
  return named_errors(who(*this), [&] {
    MPT_CHECK(y_true.defined() && y_pred.defined(), "y_true and y_pred must be defined");
    // Targets are probabilities: 5 or -3 would give a negative loss (PyTorch refuses them too).
    // Checked where they are host memory; fit and evaluate check device targets up front.
    if (y_true.device().is_cpu()) data::check_unit_interval("y_true", y_true.detach());
    const DType d = compute_dtype(y_pred);
    auto [z, x] = squeeze_or_expand_to_same_rank(cast_to(y_true, d), cast_to(y_pred, d));
    if (o_.label_smoothing > 0) z = z * (1.0 - o_.label_smoothing) + 0.5 * o_.label_smoothing;
    Tensor per_element;
    if (o_.from_logits) {
      // max(x, 0) - x z + log(1 + exp(-|x|)), with the branches picked by x >= 0 as TensorFlow
      // does so that the gradient at x = 0 is sigmoid(0) - z.
      Tensor zero = Tensor::scalar(0, d, x.device());
      Tensor pos = ops::greater_equal(x, zero);
      Tensor relu_x = ops::where(pos, x, zero);
      Tensor neg_abs_x = ops::where(pos, ops::neg(x), x);
      per_element = relu_x - x * z + ops::log(1.0 + ops::exp(neg_abs_x));
    } else {
      Tensor lo = Tensor::scalar(kEpsilon, d, x.device());
      Tensor hi = Tensor::scalar(1.0 - kEpsilon, d, x.device());
      Tensor p = ops::minimum(ops::maximum(x, lo), hi);
      per_element = ops::neg(z * ops::log(p) + (1.0 - z) * ops::log(1.0 - p));
    }
    return ops::mean(per_element, {-1});
  });
}

}  // namespace mpt::losses

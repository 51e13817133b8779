// Precision, Recall, AUC and F1Score: weighted confusion counts accumulated in float64 tensors on
// the predictions' device (no host read per update), as Keras's metrics_utils and
// confusion_metrics / f_score_metrics compute them in float32; results from the counts in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "losses/loss_utils.hpp"
#include "mpt/autograd.hpp"
#include "mpt/metrics/metrics.hpp"
#include "mpt/ops.hpp"

namespace mpt::metrics {
using losses::detail::named_errors;
using losses::detail::squeeze_or_expand_to_same_rank;

namespace {

constexpr double kEpsilon = 1e-7;  // Keras's backend.epsilon()
constexpr double kNegInf = -1e10;  // Keras's metrics_utils.NEG_INF
constexpr std::int64_t kChunk = std::int64_t{1} << 21;  // elements of one [thresholds, rows, labels] comparison

double divide_no_nan(double a, double b) { return b == 0 ? 0.0 : a / b; }

std::string shape_of(const Tensor& t) { return t.defined() ? to_string(t.shape()) : std::string("undefined"); }

/// Keras's is_evenly_distributed_thresholds: at least 3, each within np.allclose (atol 1e-7,
/// rtol 1e-5) of i / (n - 1) computed in float32.
bool evenly_distributed(const std::vector<double>& t) {
  const std::size_t n = t.size();
  if (n < 3) return false;
  for (std::size_t i = 0; i < n; ++i) {
    const double even = static_cast<double>(static_cast<float>(i) / static_cast<float>(n - 1));
    if (!(std::abs(t[i] - even) <= kEpsilon + 1e-5 * std::abs(even))) return false;
  }
  return true;
}

void add_to(Tensor& state, const Tensor& update) {
  Tensor u = ops::cast(update, float64);
  state = state.defined() ? ops::add(state, u.to(state.device())) : u;
}

std::vector<double> host(const Tensor& t, std::size_t n) {
  return t.defined() ? t.to_vector<double>() : std::vector<double>(n, 0.0);
}

/// Keras's _filter_top_k: each row's k highest scores kept, the others -1e10 (the lower index
/// first among ties, as jax.lax.top_k): k rounds of argmax, each taking the first maximum.
Tensor filter_top_k(const Tensor& x, std::int64_t k) {
  const std::int64_t classes = x.shape().back();
  MPT_CHECK(k <= classes, "top_k ", k, " exceeds the ", classes, " classes of y_pred ", to_string(x.shape()));
  const Device dev = x.device();
  const double inf = std::numeric_limits<double>::infinity();
  // float64 keys: -inf scores become -DBL_MAX, so the taken ones (-inf) rank below every other.
  Tensor key = ops::maximum(ops::cast(x, float64), Tensor::scalar(-std::numeric_limits<double>::max(), float64, dev));
  Tensor mask = Tensor::zeros(x.shape(), float32, dev);
  Tensor zero = Tensor::scalar(0, float32, dev), taken = Tensor::scalar(-inf, float64, dev);
  for (std::int64_t i = 0; i < k; ++i) {
    Tensor pick = ops::one_hot(ops::argmax(key, -1), classes, float32);
    mask = ops::add(mask, pick);
    key = ops::where(ops::greater(pick, zero), taken, key);
  }
  Tensor one = Tensor::scalar(1, float32, dev);
  return ops::add(ops::mul(x, mask), ops::mul(Tensor::scalar(kNegInf, float32, dev), ops::sub(one, mask)));
}

struct ConfusionInputs {
  std::optional<std::int64_t> top_k = std::nullopt, class_id = std::nullopt;
  bool multi_label = false;
  const std::optional<std::vector<double>>* label_weights = nullptr;  // counted in (not multi-label)
  bool from_logits = false;
};

/// Keras's update_confusion_matrix_variables into `c`: y_pred (squeezed or expanded to y_true's
/// rank), top_k, class_id, the weight brought to y_true's rank (a trailing axis added when the
/// ranks differ) and broadcast to y_pred's shape, label weights; then per threshold the weighted
/// sums of the positives and negatives predicted positive.
void accumulate(detail::ConfusionCounts& c, const Tensor& y_true_in, const Tensor& y_pred_in,
                const Tensor& sample_weight, const ConfusionInputs& in) {
  MPT_CHECK(y_true_in.defined() && y_pred_in.defined(), "y_true and y_pred must be defined");
  NoGradGuard no_grad;
  const Device dev = y_pred_in.device();
  Tensor y_pred = ops::cast(y_pred_in.detach(), float32);
  if (in.from_logits) y_pred = ops::sigmoid(y_pred);
  Tensor y_true = ops::cast(y_true_in.detach().to(dev), float32);
  std::tie(y_pred, y_true) = squeeze_or_expand_to_same_rank(y_pred, y_true);
  MPT_CHECK(y_true.shape() == y_pred.shape(), "y_true ", shape_of(y_true_in), " and y_pred ", shape_of(y_pred_in),
            " must have the same shape");
  Tensor w;
  if (sample_weight.defined()) {
    w = ops::cast(sample_weight.detach().to(dev), float32);
    if (w.dim() != y_true.dim()) {
      Shape s = w.shape();
      s.push_back(1);
      w = w.reshape(s);
    }
  }
  if (in.top_k) y_pred = filter_top_k(y_pred, *in.top_k);
  if (in.class_id) {
    MPT_CHECK(y_pred.dim() >= 2, "with class_id, y_pred must have shape (num_samples, num_classes), got ",
              to_string(y_pred.shape()));
    const std::int64_t id = *in.class_id, classes = y_pred.shape().back();
    MPT_CHECK(id < classes, "class_id ", id, " is out of range for the ", classes, " classes of y_pred ",
              to_string(y_pred.shape()));
    y_true = ops::slice(y_true, -1, id, id + 1);
    y_pred = ops::slice(y_pred, -1, id, id + 1);
  }
  if (w.defined()) {
    Shape ws = w.shape();
    const Shape& ps = y_pred.shape();
    bool ok = ws.size() <= ps.size();
    for (std::size_t i = 0; ok && i < ws.size(); ++i) {
      const std::int64_t a = ws[ws.size() - 1 - i], b = ps[ps.size() - 1 - i];
      ok = a == 1 || a == b;
    }
    MPT_CHECK(ok, "sample_weight ", shape_of(sample_weight), " does not broadcast to y_pred ", to_string(ps));
    w = ops::broadcast_to(w, ps);
  }
  if (in.label_weights && *in.label_weights && !in.multi_label) {
    const auto& lw = **in.label_weights;
    MPT_CHECK(y_pred.dim() >= 1 && y_pred.shape().back() == static_cast<std::int64_t>(lw.size()),
              "label_weights has ", lw.size(), " values for y_pred ", to_string(y_pred.shape()));
    Tensor l = Tensor::from_vector(std::vector<float>(lw.begin(), lw.end()), {}, dev);
    l = ops::broadcast_to(l, y_pred.shape());
    w = w.defined() ? ops::mul(w, l) : l;
  }
  const std::int64_t t_count = static_cast<std::int64_t>(c.thresholds.size());
  Tensor one = Tensor::scalar(1, float32, dev), zero = Tensor::scalar(0, float32, dev);
  Tensor label = ops::cast(ops::not_equal(y_true, zero), float32);
  Tensor score = y_pred;
  if (c.evenly)  // Keras's bucket path: bucket ceil(p (T - 1)) - 1 counts at threshold i when > i - 1
    score = ops::mul(ops::minimum(ops::maximum(y_pred, zero), one),
                     Tensor::scalar(static_cast<double>(t_count - 1), float32, dev));
  std::int64_t rows = score.numel(), labels = 1;
  if (in.multi_label) {
    MPT_CHECK(y_pred.dim() == 2, "with multi_label, y_pred must have rank 2 (num_samples, num_labels), got ",
              to_string(y_pred.shape()));
    rows = y_pred.shape()[0];
    labels = y_pred.shape()[1];
    MPT_CHECK(c.labels == 0 || c.labels == labels, "y_pred ", to_string(y_pred.shape()), " has ", labels,
              " labels, the metric ", c.labels);
    c.labels = labels;
  }
  score = score.reshape({rows, labels});
  Tensor pos = label.reshape({rows, labels});
  Tensor neg = ops::sub(one, pos);
  if (w.defined()) {
    Tensor wr = w.reshape({rows, labels});
    pos = ops::mul(pos, wr);
    neg = ops::mul(neg, wr);
  }
  if (!c.keys.defined() || c.keys.device() != dev) {
    std::vector<float> keys(c.thresholds.size());
    for (std::size_t i = 0; i < keys.size(); ++i)
      keys[i] = c.evenly ? static_cast<float>(i) : static_cast<float>(c.thresholds[i]);
    if (c.evenly && c.with_epsilon) keys[0] = -std::numeric_limits<float>::infinity();  // Keras's relu
    c.keys = Tensor::from_vector(keys, {t_count, 1, 1}, dev);
  }
  Tensor tp, fp;
  const std::int64_t step = std::max<std::int64_t>(1, kChunk / std::max<std::int64_t>(1, t_count * labels));
  for (std::int64_t r0 = 0; r0 < rows; r0 += step) {
    const std::int64_t r1 = std::min(rows, r0 + step);
    auto part = [&](const Tensor& x) { return (r0 == 0 && r1 == rows ? x : x.slice(r0, r1)).reshape({1, r1 - r0, labels}); };
    Tensor above = ops::greater(part(score), c.keys);  // [T, rows, labels]
    Tensor tp_part = ops::sum(ops::where(above, part(pos), zero), {1});
    Tensor fp_part = ops::sum(ops::where(above, part(neg), zero), {1});
    tp = tp.defined() ? ops::add(tp, tp_part) : tp_part;
    fp = fp.defined() ? ops::add(fp, fp_part) : fp_part;
  }
  Tensor pos_total = ops::sum(pos, {0}), neg_total = ops::sum(neg, {0});
  if (!in.multi_label) {
    tp = tp.reshape({t_count});
    fp = fp.reshape({t_count});
    pos_total = pos_total.reshape({});
    neg_total = neg_total.reshape({});
  }
  add_to(c.tp, tp);
  add_to(c.fp, fp);
  add_to(c.pos, pos_total);
  add_to(c.neg, neg_total);
}

}  // namespace

// ---- Precision and Recall ------------------------------------------------------------------

ConfusionMetric::ConfusionMetric(PrecisionRecallOptions o, const char* default_name)
    : Metric(o.name.empty() ? default_name : o.name), options_(std::move(o)) {
  options_.name = name();
  const std::string who = "metric " + name();
  if (options_.thresholds) {
    MPT_CHECK(!options_.thresholds->empty(), who, ": thresholds must not be empty");
    for (double t : *options_.thresholds)
      MPT_CHECK(t >= 0 && t <= 1, who, ": thresholds must be in [0, 1], got ", t);
    counts_.thresholds = *options_.thresholds;
  } else {
    counts_.thresholds = {options_.top_k ? kNegInf : 0.5};
  }
  MPT_CHECK(!options_.top_k || *options_.top_k >= 1, who, ": top_k must be at least 1, got ", *options_.top_k);
  MPT_CHECK(!options_.class_id || *options_.class_id >= 0, who, ": class_id must be >= 0, got ", *options_.class_id);
  counts_.evenly = evenly_distributed(counts_.thresholds);
  counts_.with_epsilon = counts_.thresholds.front() < 0 || counts_.thresholds.back() > 1;
}

void ConfusionMetric::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  named_errors("metric " + name(), [&] {
    accumulate(counts_, y_true, y_pred, sample_weight, {.top_k = options_.top_k, .class_id = options_.class_id});
  });
}

std::vector<double> ConfusionMetric::counts_state(bool false_positives) const {
  const std::size_t n = counts_.thresholds.size();
  std::vector<double> out = host(counts_.tp, n);
  if (false_positives) {
    auto fp = host(counts_.fp, n);
    out.insert(out.end(), fp.begin(), fp.end());
  } else {
    const double pos = counts_.pos.defined() ? counts_.pos.item() : 0.0;
    for (std::size_t i = 0; i < n; ++i) out.push_back(pos - out[i]);
  }
  return out;
}

double ConfusionMetric::result_of_state(const std::vector<double>& sum) const {
  auto r = results_of_state(sum);
  MPT_CHECK(r.size() == 1, "metric ", name(), " has ", r.size(), " values (one per threshold); result() gives ",
            "one number: use results()");
  return r[0];
}

double ConfusionMetric::result() const { return result_of_state(reduction_state()); }

namespace {
/// tp / (tp + other) per threshold, from {tp..., other...}.
std::vector<double> ratios(const std::vector<double>& sum, std::size_t n) {
  std::vector<double> r(n, 0.0);
  if (sum.size() < 2 * n) return r;
  for (std::size_t i = 0; i < n; ++i) r[i] = divide_no_nan(sum[i], sum[i] + sum[n + i]);
  return r;
}
}  // namespace

std::vector<double> Precision::results_of_state(const std::vector<double>& sum) const {
  return ratios(sum, counts_.thresholds.size());
}
std::vector<double> Recall::results_of_state(const std::vector<double>& sum) const {
  return ratios(sum, counts_.thresholds.size());
}
std::shared_ptr<Metric> Precision::clone() const { return std::make_shared<Precision>(options_); }
std::shared_ptr<Metric> Recall::clone() const { return std::make_shared<Recall>(options_); }

// ---- AUC -------------------------------------------------------------------------------------

AUC::AUC(AUCOptions o) : Metric(o.name), options_(std::move(o)) {
  const std::string who = "metric " + name();
  const std::string& c = options_.curve;
  if (c == "ROC" || c == "roc") options_.curve = "ROC";
  else if (c == "PR" || c == "pr") options_.curve = "PR";
  else if (c == "PRGAIN" || c == "prgain") options_.curve = "PRGAIN";
  else fail(who, ": invalid curve '", c, "'; expected ROC, PR or PRGAIN");
  const std::string& m = options_.summation_method;
  if (m == "interpolation" || m == "Interpolation") options_.summation_method = "interpolation";
  else if (m == "majoring" || m == "Majoring") options_.summation_method = "majoring";
  else if (m == "minoring" || m == "Minoring") options_.summation_method = "minoring";
  else fail(who, ": invalid summation_method '", m, "'; expected interpolation, majoring or minoring");
  std::vector<double> inner;
  if (options_.thresholds) {
    inner = *options_.thresholds;
    std::sort(inner.begin(), inner.end());
    options_.thresholds = inner;
    options_.num_thresholds = static_cast<std::int64_t>(inner.size()) + 2;
    std::vector<double> with_ends{0.0};
    with_ends.insert(with_ends.end(), inner.begin(), inner.end());
    with_ends.push_back(1.0);
    counts_.evenly = evenly_distributed(with_ends);
  } else {
    MPT_CHECK(options_.num_thresholds > 1, who, ": num_thresholds must be an integer > 1, got ",
              options_.num_thresholds);
    for (std::int64_t i = 0; i < options_.num_thresholds - 2; ++i)
      inner.push_back(static_cast<double>(i + 1) / static_cast<double>(options_.num_thresholds - 1));
    counts_.evenly = true;
  }
  counts_.thresholds = {0.0 - kEpsilon};
  counts_.thresholds.insert(counts_.thresholds.end(), inner.begin(), inner.end());
  counts_.thresholds.push_back(1.0 + kEpsilon);
  counts_.with_epsilon = true;
  if (options_.multi_label) {
    MPT_CHECK(!options_.num_labels || *options_.num_labels >= 1, who, ": num_labels must be positive, got ",
              *options_.num_labels);
    counts_.labels = options_.num_labels.value_or(0);
  } else {
    MPT_CHECK(!options_.num_labels, who, ": num_labels is needed only when multi_label is true");
  }
  if (options_.multi_label && options_.label_weights && options_.num_labels)
    MPT_CHECK(static_cast<std::int64_t>(options_.label_weights->size()) == *options_.num_labels, who,
              ": label_weights has ", options_.label_weights->size(), " values for num_labels ", *options_.num_labels);
}

std::shared_ptr<Metric> AUC::clone() const { return std::make_shared<AUC>(options_); }

void AUC::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  named_errors("metric " + name(), [&] {
    accumulate(counts_, y_true, y_pred, sample_weight,
               {.multi_label = options_.multi_label, .label_weights = &options_.label_weights,
                .from_logits = options_.from_logits});
  });
}

std::vector<double> AUC::reduction_state() const {
  const std::size_t t = counts_.thresholds.size();
  const std::size_t l = options_.multi_label ? static_cast<std::size_t>(counts_.labels) : 1;
  const std::size_t n = t * l;
  if (n == 0) return {};
  std::vector<double> tp = host(counts_.tp, n), fp = host(counts_.fp, n);
  std::vector<double> pos = host(counts_.pos, l), neg = host(counts_.neg, l);
  std::vector<double> out = tp;
  out.insert(out.end(), fp.begin(), fp.end());
  for (std::size_t i = 0; i < n; ++i) out.push_back(neg[i % l] - fp[i]);  // tn
  for (std::size_t i = 0; i < n; ++i) out.push_back(pos[i % l] - tp[i]);  // fn
  return out;
}

double AUC::result_of_state(const std::vector<double>& sum) const {
  const std::size_t t = counts_.thresholds.size();
  if (sum.empty() || sum.size() % (4 * t) != 0) return 0.0;
  const std::size_t l = sum.size() / (4 * t), n = t * l;
  const double* tp = sum.data();
  const double* fp = tp + n;
  const double* tn = fp + n;
  const double* fn = tn + n;
  const bool pr = options_.curve == "PR", gain = options_.curve == "PRGAIN";
  const std::string& how = options_.summation_method;
  std::vector<double> by_label(l, 0.0);
  for (std::size_t j = 0; j < l; ++j) {
    auto at = [&](const double* v, std::size_t i) { return v[i * l + j]; };
    double area = 0;
    if (pr && how == "interpolation") {  // Davis & Goadrich: interpolate the positives, not the precision
      for (std::size_t i = 0; i + 1 < t; ++i) {
        const double dtp = at(tp, i) - at(tp, i + 1);
        const double p0 = at(tp, i) + at(fp, i), p1 = at(tp, i + 1) + at(fp, i + 1);
        const double slope = divide_no_nan(dtp, std::max(p0 - p1, 0.0));
        const double intercept = at(tp, i + 1) - slope * p1;
        const double ratio = p0 > 0 && p1 > 0 ? divide_no_nan(p0, std::max(p1, 0.0)) : 1.0;
        area += divide_no_nan(slope * (dtp + intercept * std::log(ratio)),
                              std::max(at(tp, i + 1) + at(fn, i + 1), 0.0));
      }
    } else {
      std::vector<double> x(t), y(t);
      for (std::size_t i = 0; i < t; ++i) {
        const double tpi = at(tp, i), fpi = at(fp, i), tni = at(tn, i), fni = at(fn, i);
        const double recall = divide_no_nan(tpi, tpi + fni);
        if (pr) {
          x[i] = recall, y[i] = divide_no_nan(tpi, tpi + fpi);
        } else if (gain) {
          const double scale = divide_no_nan(tpi + fni, tni + fpi);
          double recall_gain = 1.0 - scale * divide_no_nan(fni, tpi);
          double precision_gain = 1.0 - scale * divide_no_nan(fpi, tpi);
          if (tpi == 0) recall_gain = 0.0, precision_gain = 1.0;
          x[i] = std::max(recall_gain, 0.0), y[i] = precision_gain;
        } else {
          x[i] = divide_no_nan(fpi, fpi + tni), y[i] = recall;
        }
      }
      for (std::size_t i = 0; i + 1 < t; ++i) {
        const double h = how == "interpolation" ? (y[i] + y[i + 1]) / 2.0
                         : how == "minoring"    ? std::min(y[i], y[i + 1])
                                                : std::max(y[i], y[i + 1]);
        area += (x[i] - x[i + 1]) * h;
      }
    }
    by_label[j] = area;
  }
  if (!options_.multi_label) return by_label[0];
  if (!options_.label_weights) {
    double s = 0;
    for (double a : by_label) s += a;
    return s / static_cast<double>(l);
  }
  const auto& lw = *options_.label_weights;
  MPT_CHECK(lw.size() == l, "metric ", name(), ": label_weights has ", lw.size(), " values for ", l, " labels");
  double num = 0, den = 0;
  for (std::size_t j = 0; j < l; ++j) num += by_label[j] * lw[j], den += lw[j];
  return divide_no_nan(num, den);
}

// ---- F1Score ---------------------------------------------------------------------------------

F1Score::F1Score(F1ScoreOptions o) : Metric(o.name), options_(std::move(o)) {
  const std::string who = "metric " + name();
  if (options_.average) {
    const std::string& a = *options_.average;
    MPT_CHECK(a == "micro" || a == "macro" || a == "weighted", who, ": invalid average '", a,
              "'; expected none, micro, macro or weighted");
  }
  if (options_.threshold)
    MPT_CHECK(*options_.threshold > 0 && *options_.threshold <= 1, who,
              ": threshold must satisfy 0 < threshold <= 1, got ", *options_.threshold);
}

void F1Score::update_state(const Tensor& y_true_in, const Tensor& y_pred_in, const Tensor& sample_weight) {
  named_errors("metric " + name(), [&] {
    MPT_CHECK(y_true_in.defined() && y_pred_in.defined(), "y_true and y_pred must be defined");
    MPT_CHECK(y_pred_in.dim() == 2 && y_true_in.dim() == 2 && y_true_in.shape() == y_pred_in.shape(),
              "expects y_true and y_pred of one shape (batch_size, output_dim), got y_true ",
              to_string(y_true_in.shape()), " and y_pred ", to_string(y_pred_in.shape()));
    NoGradGuard no_grad;
    const Device dev = y_pred_in.device();
    const std::int64_t classes = y_pred_in.shape()[1];
    MPT_CHECK(!tp_.defined() || options_.average == "micro" || tp_.shape()[0] == classes, "y_pred ",
              to_string(y_pred_in.shape()), " has ", classes, " classes, earlier batches ", tp_.shape()[0]);
    Tensor y_pred = ops::cast(y_pred_in.detach(), float32);
    Tensor y_true = ops::cast(y_true_in.detach().to(dev), float32);
    Tensor positive;
    if (options_.threshold) {
      positive = ops::greater(y_pred, Tensor::scalar(*options_.threshold, float32, dev));
    } else {  // each row's maximum, unless it is 0 (|p| > 1e-9)
      Tensor top = ops::greater_equal(y_pred, ops::max(y_pred, {-1}, true));
      Tensor nonzero = ops::greater(ops::abs(y_pred), Tensor::scalar(1e-9, float32, dev));
      positive = ops::mul(ops::cast(top, float32), ops::cast(nonzero, float32));
    }
    Tensor p = ops::cast(positive, float32);
    Tensor one = Tensor::scalar(1, float32, dev);
    Tensor w;
    if (sample_weight.defined()) {
      w = ops::cast(sample_weight.detach().to(dev), float32);
      MPT_CHECK(w.dim() == 1 && (w.shape()[0] == y_pred.shape()[0] || w.shape()[0] == 1), "sample_weight ",
                to_string(sample_weight.shape()), " must have shape (batch_size,) = (", y_pred.shape()[0], ",)");
      w = w.reshape({w.shape()[0], 1});
    }
    const bool micro = options_.average == "micro";
    auto weighted_sum = [&](const Tensor& v) {
      Tensor x = w.defined() ? ops::mul(v, w) : v;
      return micro ? ops::sum(x) : ops::sum(x, {0});
    };
    add_to(tp_, weighted_sum(ops::mul(p, y_true)));
    add_to(fp_, weighted_sum(ops::mul(p, ops::sub(one, y_true))));
    add_to(fn_, weighted_sum(ops::mul(ops::sub(one, p), y_true)));
    add_to(weights_, weighted_sum(y_true));
  });
}

std::vector<double> F1Score::reduction_state() const {
  if (!tp_.defined()) return {};
  std::vector<double> out;
  for (const Tensor* t : {&tp_, &fp_, &fn_, &weights_}) {
    auto v = t->to_vector<double>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<double> F1Score::results_of_state(const std::vector<double>& sum) const {
  if (sum.empty() || sum.size() % 4 != 0) return {0.0};
  const std::size_t n = sum.size() / 4;
  const double* tp = sum.data();
  const double* fp = tp + n;
  const double* fn = fp + n;
  const double* iw = fn + n;
  std::vector<double> f(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double precision = tp[i] / (tp[i] + fp[i] + kEpsilon), recall = tp[i] / (tp[i] + fn[i] + kEpsilon);
    f[i] = precision * recall / (precision + recall + kEpsilon) * 2.0;
  }
  if (!options_.average) return f;
  double s = 0;
  if (*options_.average == "weighted") {
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) total += iw[i];
    for (std::size_t i = 0; i < n; ++i) s += f[i] * (iw[i] / (total + kEpsilon));
    return {s};
  }
  for (double v : f) s += v;
  return {s / static_cast<double>(n)};
}

double F1Score::result_of_state(const std::vector<double>& sum) const {
  auto r = results_of_state(sum);
  MPT_CHECK(r.size() == 1, "metric ", name(), " has ", r.size(), " values (one per class, average none); result() ",
            "gives one number: use results(), or average micro, macro or weighted");
  return r[0];
}

double F1Score::result() const { return result_of_state(reduction_state()); }

}  // namespace mpt::metrics

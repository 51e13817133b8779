#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "mpt/data/data.hpp"
#include "mpt/ops.hpp"

namespace mpt::data {
namespace {

// splitmix64: a fixed generator, so a seed gives the same shuffle with every compiler and
// standard library (std::uniform_int_distribution does not promise that).
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, bound) without modulo bias: reject the 2^64 mod bound lowest values.
  std::uint64_t below(std::uint64_t bound) {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  std::uint64_t state_;
};

}  // namespace

std::int64_t batch_count(std::int64_t n, std::int64_t batch_size) {
  MPT_CHECK(n >= 0 && batch_size > 0, "batch_count: needs n >= 0 and batch_size > 0, got n=", n, ", batch_size=",
            batch_size);
  return n / batch_size + (n % batch_size != 0);  // (n + batch_size - 1) / batch_size overflows
}

std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed) {
  MPT_CHECK(n >= 0, "permutation: n must be non-negative, got ", n);
  // More indices than the machine's memory holds: a clear message, not std::bad_alloc.
  const double bytes = static_cast<double>(n) * sizeof(std::int64_t), physical = mpt::detail::host_memory_bytes();
  MPT_CHECK(bytes <= physical, "permutation: ", n, " indices need ", static_cast<std::uint64_t>(bytes),
            " bytes, more than this machine's ", static_cast<std::uint64_t>(physical), " bytes of memory");
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), std::int64_t{0});
  SplitMix64 rng(seed);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(i) + 1));
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

Tensor take_rows(const Tensor& x, const std::vector<std::int64_t>& indices) {
  MPT_CHECK(x.defined(), "take_rows: x is an undefined tensor");
  MPT_CHECK(x.dim() >= 1, "take_rows: x needs at least one dimension, got shape ", to_string(x.shape()));
  const std::int64_t n = x.size(0);
  for (std::size_t k = 0; k < indices.size(); ++k)
    MPT_CHECK(indices[k] >= 0 && indices[k] < n, "take_rows: index ", indices[k], " (position ", k,
              ") is out of range for the ", n, " rows of shape ", to_string(x.shape()));
  const Tensor idx = Tensor::from_vector(indices, {static_cast<std::int64_t>(indices.size())}, x.device());
  return ops::gather_rows(x.detach(), idx);
}

void check_finite(const char* where, const char* what, const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype()) || !ops::has_nonfinite(t)) return;
  auto v = t.to_vector<double>();
  std::size_t i = 0;
  while (i < v.size() && std::isfinite(v[i])) ++i;
  const std::int64_t row_size = t.dim() > 0 && t.shape()[0] > 0 ? t.numel() / t.shape()[0] : 1;
  fail(where, ": ", what, " contains ", std::isnan(v[i]) ? "NaN" : "inf", " (element ", i, ", sample ",
       static_cast<std::int64_t>(i) / row_size, "); clean the data before training");
}

void check_labels(const char* where, const Tensor& y, std::int64_t num_classes) {
  if (!y.defined() || y.dtype() == bool_ || y.numel() == 0) return;
  // Float class ids (Keras takes 3.0 for class 3) only where they are known to be class ids.
  if (!is_integer(y.dtype()) && (!is_floating(y.dtype()) || num_classes < 0)) return;
  const std::int64_t per_sample = std::max<std::int64_t>(1, y.numel() / std::max<std::int64_t>(y.shape()[0], 1));
  if (is_integer(y.dtype())) {  // compared and printed exactly, whatever their size
    const auto ids = y.to_vector<std::int64_t>();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::int64_t l = ids[i], sample = static_cast<std::int64_t>(i) / per_sample;
      if (l >= 0 && (num_classes < 0 || l < num_classes)) continue;
      if (num_classes < 0) fail(where, ": label ", l, " of sample ", sample, " is negative; class labels are 0, 1, ...");
      fail(where, ": label ", l, " of sample ", sample, " is out of range [0, ", num_classes, ") for ", num_classes,
           " classes");
    }
    return;
  }
  const auto labels = y.to_vector<double>();  // float class ids: says 1e+30 as it is
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const double l = labels[i];
    const std::int64_t sample = static_cast<std::int64_t>(i) / per_sample;
    if (l >= 0 && (num_classes < 0 || l < static_cast<double>(num_classes)) && l == std::floor(l)) continue;
    MPT_CHECK(l == std::floor(l), where, ": label ", l, " of sample ", sample, " is not a whole number (a class id)");
    if (num_classes < 0) fail(where, ": label ", l, " of sample ", sample, " is negative; class labels are 0, 1, ...");
    fail(where, ": label ", l, " of sample ", sample, " is out of range [0, ", num_classes, ") for ", num_classes,
         " classes");
  }
}

void check_unit_interval(const char* where, const Tensor& y) {
  if (!y.defined() || y.numel() == 0 || y.dtype() == bool_) return;
  const auto v = y.to_vector<double>();
  const std::int64_t per_sample = std::max<std::int64_t>(1, y.numel() / std::max<std::int64_t>(y.shape()[0], 1));
  for (std::size_t i = 0; i < v.size(); ++i)
    MPT_CHECK(v[i] >= 0 && v[i] <= 1, where, ": target ", v[i], " of sample ", static_cast<std::int64_t>(i) / per_sample,
              " is outside [0, 1] (binary crossentropy takes probabilities of the positive class)");
}

Tensor rows_of(const Tensor& t, const std::vector<std::int64_t>& order, std::int64_t begin, std::int64_t end) {
  if (!t.defined()) return {};
  if (order.empty()) return t.detach().slice(begin, end);
  return take_rows(t, std::vector<std::int64_t>(order.begin() + begin, order.begin() + end));
}

Batches::Batches(Tensor x, Tensor y, BatchOptions options)
    : x_(std::move(x)), y_(std::move(y)), o_(options) {
  MPT_CHECK(o_.batch_size > 0, "batches: batch_size must be positive, got ", o_.batch_size);
  MPT_CHECK(x_.defined(), "batches: x is an undefined tensor");
  MPT_CHECK(x_.dim() >= 1, "batches: x needs at least one dimension (the rows), got shape ",
            to_string(x_.shape()));
  if (y_.defined())
    MPT_CHECK(y_.dim() >= 1 && y_.size(0) == x_.size(0),
              "batches: x and y must have the same first dimension (one row per example), got x ",
              to_string(x_.shape()), " and y ", to_string(y_.shape()));
  MPT_CHECK(!o_.num_classes || *o_.num_classes > 0, "batches: num_classes must be positive, got ",
            o_.num_classes.value_or(0));
  check_finite("batches", "x", x_);
  check_finite("batches", "y", y_);
  check_labels("batches", y_, o_.num_classes.value_or(-1));
  if (o_.shuffle) order_ = permutation(x_.size(0), o_.seed);
}

std::int64_t Batches::size() const {
  const std::int64_t n = x_.size(0);
  return o_.drop_remainder ? n / o_.batch_size : batch_count(n, o_.batch_size);
}

std::pair<Tensor, Tensor> Batches::batch(std::int64_t i) const {
  MPT_CHECK(i >= 0 && i < size(), "batches: batch ", i, " out of range (", size(), " batches)");
  const std::int64_t begin = i * o_.batch_size;
  const std::int64_t end = begin + std::min(x_.size(0) - begin, o_.batch_size);
  auto pick = [&](const Tensor& t) -> Tensor {
    Tensor b = rows_of(t, order_, begin, end);
    return b.defined() && o_.device ? b.to(*o_.device) : b;
  };
  return {pick(x_), pick(y_)};
}

std::pair<Tensor, Tensor> Batches::Iterator::operator*() const { return owner->batch(index); }

Batches batches(const Tensor& x, const Tensor& y, BatchOptions options) { return Batches(x, y, options); }

}  // namespace mpt::data

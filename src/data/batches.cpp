#include <algorithm>
#include <cstring>
#include <numeric>

#include "mpt/data/data.hpp"

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

std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed) {
  MPT_CHECK(n >= 0, "permutation: n must be non-negative, got ", n);
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
  Shape shape = x.shape();
  shape[0] = static_cast<std::int64_t>(indices.size());
  const Device device = x.device();
  Tensor out = Tensor::empty(shape, x.dtype(), device);
  const std::size_t row = n > 0 ? x.nbytes() / static_cast<std::size_t>(n) : 0;
  if (row == 0 || indices.empty()) return out;
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const auto count = static_cast<std::int64_t>(indices.size());
  if (device.is_cpu()) {
// Scattered rows are memory-latency bound: both threads help from a few hundred KB on (a
    // helper thread overlapping the step would steal a core from the compute threads instead).
#pragma omp parallel for schedule(static) if (count * static_cast<std::int64_t>(row) > (std::int64_t{1} << 17))
    for (std::int64_t k = 0; k < count; ++k)
      std::memcpy(dst + static_cast<std::size_t>(k) * row,
                  src + static_cast<std::size_t>(indices[static_cast<std::size_t>(k)]) * row, row);
    return out;
  }
  // No gather kernel on the GPU yet: each run of consecutive rows is one device-to-device copy
  // (one copy per row for a shuffled batch; a kernel would make it one launch).
  for (std::int64_t k = 0; k < count;) {
    std::int64_t len = 1;
    while (k + len < count && indices[static_cast<std::size_t>(k + len)] == indices[static_cast<std::size_t>(k)] + len)
      ++len;
    detail::copy_bytes(dst + static_cast<std::size_t>(k) * row, device,
                       src + static_cast<std::size_t>(indices[static_cast<std::size_t>(k)]) * row, device,
                       static_cast<std::size_t>(len) * row);
    k += len;
  }
  return out;
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
  if (o_.shuffle) order_ = permutation(x_.size(0), o_.seed);
}

std::int64_t Batches::size() const {
  const std::int64_t n = x_.size(0);
  return o_.drop_remainder ? n / o_.batch_size : (n + o_.batch_size - 1) / o_.batch_size;
}

std::pair<Tensor, Tensor> Batches::batch(std::int64_t i) const {
  MPT_CHECK(i >= 0 && i < size(), "batches: batch ", i, " out of range (", size(), " batches)");
  const std::int64_t begin = i * o_.batch_size;
  const std::int64_t end = std::min(x_.size(0), begin + o_.batch_size);
  auto pick = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return {};
    Tensor b = order_.empty()
                   ? t.detach().slice(begin, end)
                   : take_rows(t, std::vector<std::int64_t>(order_.begin() + begin, order_.begin() + end));
    if (o_.device && b.device() != *o_.device) b = b.to(*o_.device);
    return b;
  };
  return {pick(x_), pick(y_)};
}

std::pair<Tensor, Tensor> Batches::Iterator::operator*() const { return owner->batch(index); }

Batches batches(const Tensor& x, const Tensor& y, BatchOptions options) { return Batches(x, y, options); }

}  // namespace mpt::data

// The datasets mpt gives (data/dataset.hpp): in-memory tensors, .npy shards, token windows.
#include <algorithm>
#include <cstring>
#include <limits>

#include "mpt/data/data.hpp"
#include "mpt/data/dataset.hpp"
#include "mpt/io/npy.hpp"
#include "mpt/ops.hpp"

namespace mpt::data {

// ---- TensorDataset ----------------------------------------------------------------------------

TensorDataset::TensorDataset(Tensor x, Tensor y, std::int64_t batch_size, Tensor sample_weight)
    : TensorDataset(Tensors(x), Tensors(y), batch_size, std::move(sample_weight)) {
  MPT_CHECK(x.defined(), "TensorDataset: x must be defined and have a batch dimension");
}

TensorDataset::TensorDataset(Tensors x, Tensors y, std::int64_t batch_size, Tensor sample_weight)
    : x_(x.list()), y_(y.list()), w_(std::move(sample_weight)), batch_size_(batch_size) {
  MPT_CHECK(!x_.empty(), "TensorDataset: x must be defined and have a batch dimension");
  for (std::size_t i = 0; i < x_.size(); ++i)
    MPT_CHECK(x_[i].defined() && x_[i].dim() >= 1, "TensorDataset: x", x_.size() > 1 ? "[" + std::to_string(i) + "]" : "",
              " must be defined and have a batch dimension");
  MPT_CHECK(batch_size_ > 0, "TensorDataset: batch_size must be positive, got ", batch_size_);
  const Tensor& x0 = x_[0];
  auto check_rows = [&](const Tensor& t, const std::string& what) {
    MPT_CHECK(t.defined() && t.dim() >= 1 && t.shape()[0] == x0.shape()[0], "TensorDataset: x ", to_string(x0.shape()),
              " and ", what, " ", t.defined() ? to_string(t.shape()) : std::string("(undefined)"),
              " have different numbers of rows");
  };
  for (std::size_t i = 1; i < x_.size(); ++i) check_rows(x_[i], "x[" + std::to_string(i) + "]");
  for (std::size_t i = 0; i < y_.size(); ++i) check_rows(y_[i], y_.size() > 1 ? "y[" + std::to_string(i) + "]" : "y");
  if (w_.defined()) check_rows(w_, "sample_weight");
}

std::int64_t TensorDataset::size() const { return batch_count(x_[0].shape()[0], batch_size_); }

Batch TensorDataset::get(std::int64_t index) {
  MPT_CHECK(index >= 0 && index < size(), "TensorDataset: batch ", index, " out of [0, ", size(), ")");
  const std::int64_t b = index * batch_size_, e = std::min(b + batch_size_, x_[0].shape()[0]);
  auto part = [&](const Tensor& t) { return t.defined() ? t.slice(b, e) : Tensor(); };
  Batch out;
  out.sample_weight = part(w_);
  if (x_.size() == 1) out.x = part(x_[0]);
  else for (const auto& t : x_) out.xs.push_back(part(t));
  if (y_.size() == 1) out.y = part(y_[0]);
  else for (const auto& t : y_) out.ys.push_back(part(t));
  return out;
}

// ---- NpyDataset -------------------------------------------------------------------------------

namespace {
void check_like(const char* what, const std::string& file, const Tensor& t, const Tensor& first,
                const std::string& first_file) {
  MPT_CHECK(t.dim() >= 1, "NpyDataset: ", what, " shard '", file, "' has no rows (a 0-d array)");
  MPT_CHECK(t.dtype() == first.dtype() && Shape(t.shape().begin() + 1, t.shape().end()) ==
                                              Shape(first.shape().begin() + 1, first.shape().end()),
            "NpyDataset: ", what, " shard '", file, "' holds rows of shape ",
            to_string(Shape(t.shape().begin() + 1, t.shape().end())), " ", to_string(t.dtype()), ", but '", first_file,
            "' rows of ", to_string(Shape(first.shape().begin() + 1, first.shape().end())), " ",
            to_string(first.dtype()));
}
}  // namespace

NpyDataset::NpyDataset(const std::vector<std::string>& x_files, const std::vector<std::string>& y_files,
                       std::int64_t batch_size)
    : batch_size_(batch_size) {
  MPT_CHECK(!x_files.empty(), "NpyDataset: no x files");
  MPT_CHECK(y_files.empty() || y_files.size() == x_files.size(), "NpyDataset: ", x_files.size(), " x files but ",
            y_files.size(), " y files");
  MPT_CHECK(batch_size > 0, "NpyDataset: batch_size must be positive, got ", batch_size);
  for (std::size_t i = 0; i < x_files.size(); ++i) {
    x_.push_back(io::load_npy(x_files[i], io::NpyLoadOptions{.mmap = true}));
    check_like("x", x_files[i], x_.back(), x_.front(), x_files.front());
    if (!y_files.empty()) {
      y_.push_back(io::load_npy(y_files[i], io::NpyLoadOptions{.mmap = true}));
      check_like("y", y_files[i], y_.back(), y_.front(), y_files.front());
      MPT_CHECK(y_.back().shape()[0] == x_.back().shape()[0], "NpyDataset: '", x_files[i], "' has ",
                x_.back().shape()[0], " rows but '", y_files[i], "' ", y_.back().shape()[0]);
    }
    starts_.push_back(rows_);
    rows_ += x_.back().shape()[0];
  }
}

std::int64_t NpyDataset::size() const { return batch_count(rows_, batch_size_); }

Tensor NpyDataset::rows_of(const std::vector<Tensor>& shards, std::int64_t begin, std::int64_t end) const {
  std::vector<Tensor> parts;
  // The shard holding row `begin`, then the next ones up to `end`.
  auto s = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1);
  for (; begin < end; ++s) {
    const std::int64_t first = begin - starts_[s], last = std::min(end - starts_[s], shards[s].shape()[0]);
    if (last > first) parts.push_back(shards[s].slice(first, last));
    begin = starts_[s] + last;
  }
  // A copy in any case: the batch then owns its rows (the mapped pages may be dropped).
  return parts.size() == 1 ? parts[0].copy() : ops::concat(parts, 0);
}

Batch NpyDataset::get(std::int64_t index) {
  MPT_CHECK(index >= 0 && index < size(), "NpyDataset: batch ", index, " out of [0, ", size(), ")");
  const std::int64_t b = index * batch_size_, e = std::min(b + batch_size_, rows_);
  return {rows_of(x_, b, e), y_.empty() ? Tensor() : rows_of(y_, b, e), Tensor()};
}

// ---- TokenWindows -----------------------------------------------------------------------------

TokenWindows::TokenWindows(Tensor tokens, TokenWindowsOptions options) : tokens_(std::move(tokens)), o_(options) {
  MPT_CHECK(tokens_.defined() && tokens_.dim() == 1, "TokenWindows: tokens must be a 1-D array, got ",
            tokens_.defined() ? to_string(tokens_.shape()) : std::string("an undefined tensor"));
  const DType d = tokens_.dtype();
  MPT_CHECK(d == int32 || d == int64 || d == uint8, "TokenWindows: tokens must be int32, int64 or uint8, got ",
            to_string(d));
  MPT_CHECK(tokens_.device().is_cpu(), "TokenWindows: tokens must be on the CPU (a loaded or memory-mapped array), got ",
            tokens_.device().str());
  MPT_CHECK(o_.seq_len > 0 && o_.batch_size > 0, "TokenWindows: seq_len and batch_size must be positive, got ",
            o_.seq_len, " and ", o_.batch_size);
  if (o_.stride == 0) o_.stride = o_.seq_len;
  MPT_CHECK(o_.stride > 0, "TokenWindows: stride must be positive, got ", o_.stride);
  const std::int64_t n = tokens_.shape()[0];
  MPT_CHECK(n >= o_.seq_len + 1, "TokenWindows: ", n, " tokens hold no window of ", o_.seq_len,
            " tokens and their ", o_.seq_len, " next ones (", o_.seq_len + 1, " tokens)");
  windows_ = (n - o_.seq_len - 1) / o_.stride + 1;
  if (o_.shuffle) order_ = permutation(windows_, o_.seed);
}

std::int64_t TokenWindows::size() const { return batch_count(windows_, o_.batch_size); }

void TokenWindows::on_epoch_end() {
  ++epoch_;
  if (o_.shuffle) order_ = permutation(windows_, o_.seed + epoch_);
}

Batch TokenWindows::get(std::int64_t index) {
  MPT_CHECK(index >= 0 && index < size(), "TokenWindows: batch ", index, " out of [0, ", size(), ")");
  const std::int64_t first = index * o_.batch_size, rows = std::min(o_.batch_size, windows_ - first);
  const std::int64_t T = o_.seq_len;
  std::vector<std::int32_t> x(static_cast<std::size_t>(rows * T)), y(x.size());
  const auto* base = static_cast<const unsigned char*>(tokens_.data_ptr());
  const DType d = tokens_.dtype();
  auto token = [&](std::int64_t i) -> std::int64_t {
    if (d == int32) return reinterpret_cast<const std::int32_t*>(base)[i];
    if (d == int64) return reinterpret_cast<const std::int64_t*>(base)[i];
    return base[i];
  };
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t w = o_.shuffle ? order_[static_cast<std::size_t>(first + r)] : first + r;
    const std::int64_t start = w * o_.stride;
    for (std::int64_t t = 0; t <= T; ++t) {
      const std::int64_t v = token(start + t);
      MPT_CHECK(v >= 0 && v <= std::numeric_limits<std::int32_t>::max(), "TokenWindows: token ", start + t, " is ", v,
                "; token ids must lie in [0, 2^31)");
      if (t < T) x[static_cast<std::size_t>(r * T + t)] = static_cast<std::int32_t>(v);
      if (t > 0) y[static_cast<std::size_t>(r * T + t - 1)] = static_cast<std::int32_t>(v);
    }
  }
  return {Tensor::from_vector(x, {rows, T}, Device::cpu()), Tensor::from_vector(y, {rows, T}, Device::cpu()), Tensor()};
}

}  // namespace mpt::data

#include "mpt/tensor.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>
#include <thread>

#include "backend/backend.hpp"
#include "core/convert.hpp"
#include "core/tensor_view.hpp"

namespace mpt {
namespace {

std::atomic<std::uint64_t> g_next_id{1};

std::shared_ptr<TensorImpl> new_impl(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape) MPT_CHECK(d >= 0, "Tensor: negative dimension in shape ", to_string(shape));
  // Checked here too because zero-sized tensors never reach the allocator.
  MPT_CHECK(!device.is_test() || is_available(device),
            "Tensor: the test device is not registered (only mpt's test suite registers it)");
  MPT_CHECK(!device.is_cuda() || (device.index >= 0 && device.index < cuda::device_count()),
            "Tensor: device ", device.str(), " does not exist (", cuda::device_count(), " GPUs",
            cuda::device_count() == 0 ? "; " + cuda::unavailable_reason() : std::string(), ")");
  const std::int64_t numel = numel_of(shape);
  MPT_CHECK(numel <= std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(itemsize(dtype)),
            "Tensor: shape ", to_string(shape), " of ", to_string(dtype), " needs more than 2^63 bytes");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<std::size_t>(numel) * itemsize(dtype), device);
  impl->shape = shape;
  impl->dtype = dtype;
  impl->id = g_next_id++;
  return impl;
}

std::shared_ptr<TensorImpl> view_impl(const TensorImpl& src, const Shape& shape, std::size_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = src.storage;
  impl->offset = offset;
  impl->shape = shape;
  impl->dtype = src.dtype;
  impl->id = g_next_id++;
  return impl;
}

}  // namespace

std::uint64_t detail::next_tensor_id() { return g_next_id++; }

std::string to_string(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::int64_t numel_of(const Shape& shape) {
  for (auto d : shape) {
    MPT_CHECK(d >= 0, "shape ", to_string(shape), " has a negative dimension");
    if (d == 0) return 0;
  }
  std::int64_t n = 1;
  for (auto d : shape)
    MPT_CHECK(!__builtin_mul_overflow(n, d, &n), "shape ", to_string(shape), " has more than 2^63 elements");
  return n;
}

// ---- factories ----------------------------------------------------------------------------
Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return Tensor(new_impl(shape, dtype, device));
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  detail::backend(device).fill(t, value);
  return t;
}
Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor Tensor::scalar(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

Tensor Tensor::arange(double start, double stop, double step, DType dtype, Device device) {
  MPT_CHECK(step != 0.0 && std::isfinite(start) && std::isfinite(stop) && std::isfinite(step),
            "arange: invalid range start=", start, " stop=", stop, " step=", step);
  const double count = std::max(0.0, std::ceil((stop - start) / step));
  MPT_CHECK(count < 9.2e18, "arange: [", start, ", ", stop, ") by step ", step, " has ", count,
            " elements, more than 2^63");
  auto n = static_cast<std::int64_t>(count);
  Tensor t = empty({n}, dtype, device);
  detail::backend(device).arange(t, start, step);
  return t;
}

Tensor Tensor::random_uniform(const Shape& shape, double minval, double maxval, std::uint64_t seed,
                              DType dtype, Device device, std::uint64_t offset) {
  MPT_CHECK(std::isfinite(minval) && std::isfinite(maxval) && maxval >= minval, "random_uniform: needs finite ",
            "minval <= maxval, got minval=", minval, ", maxval=", maxval);
  MPT_CHECK(is_floating(dtype), "random_uniform: dtype must be floating (as Keras's random.uniform), got ",
            to_string(dtype), ": draw floats and cast them for integers");
  Tensor t = empty(shape, dtype, device);
  if (t.numel() > 0) detail::backend(device).random(Backend::Distribution::Uniform, minval, maxval, seed, offset, t);
  return t;
}

Tensor Tensor::random_normal(const Shape& shape, double mean, double stddev, std::uint64_t seed,
                             DType dtype, Device device, std::uint64_t offset) {
  MPT_CHECK(std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0, "random_normal: needs a finite mean ",
            "and stddev >= 0, got mean=", mean, ", stddev=", stddev);
  MPT_CHECK(is_floating(dtype), "random_normal: dtype must be floating (as Keras's random.normal), got ",
            to_string(dtype), " (its values would be truncated)");
  Tensor t = empty(shape, dtype, device);
  if (t.numel() > 0) detail::backend(device).random(Backend::Distribution::Normal, mean, stddev, seed, offset, t);
  return t;
}

Tensor Tensor::from_host(const void* data, std::size_t count, DType dtype, const Shape& shape,
                         Device device) {
  MPT_CHECK(data != nullptr || count == 0, "Tensor::from_host: null data pointer for ", count, " values");
  Shape s = shape.empty() ? Shape{static_cast<std::int64_t>(count)} : shape;
  MPT_CHECK(static_cast<std::size_t>(numel_of(s)) == count, "Tensor::from_vector: ", count,
            " values do not fill shape ", to_string(s), " (", numel_of(s), " elements)");
  Tensor t = empty(s, dtype, device);
  detail::copy_bytes(t.data_ptr(), device, data, Device::cpu(), t.nbytes());
  return t;
}

// ---- properties ---------------------------------------------------------------------------
const TensorImpl& Tensor::checked() const {
  MPT_CHECK(impl_ != nullptr, "Tensor: use of an undefined tensor");
  return *impl_;
}
const Shape& Tensor::shape() const { return checked().shape; }
std::int64_t Tensor::numel() const { return numel_of(checked().shape); }
DType Tensor::dtype() const { return checked().dtype; }
Device Tensor::device() const { return checked().storage->device(); }
std::int64_t Tensor::size(std::int64_t axis) const {
  const std::int64_t n = dim();
  MPT_CHECK(axis >= -n && axis < n, "Tensor::size: axis ", axis, " out of range for shape ",
            to_string(shape()));
  return shape()[axis < 0 ? axis + n : axis];
}
void* Tensor::data_ptr() const {
  const TensorImpl& t = checked();
  return static_cast<char*>(t.storage->data()) + t.offset;
}
bool Tensor::requires_grad() const { return checked().requires_grad || checked().grad_fn != nullptr; }
Tensor& Tensor::set_requires_grad(bool on) {
  checked();
  impl_->requires_grad = on;
  return *this;
}
std::uint64_t Tensor::id() const { return checked().id; }

Tensor Tensor::detach() const {
  const TensorImpl& t = checked();
  return Tensor(view_impl(t, t.shape, t.offset));
}

// ---- views and copies ---------------------------------------------------------------------
Tensor detail::row_view(const Tensor& x, std::int64_t begin, std::int64_t end) {
  MPT_CHECK(x.defined(), "Tensor::slice: undefined tensor");
  const TensorImpl& t = *x.impl();
  MPT_CHECK(x.dim() >= 1, "Tensor::slice: needs at least 1 dimension, got shape ", to_string(t.shape));
  const std::int64_t n = t.shape[0];
  MPT_CHECK(0 <= begin && begin <= end && end <= n, "Tensor::slice: rows [", begin, ", ", end,
            ") out of range for shape ", to_string(t.shape));
  Shape s = t.shape;
  s[0] = end - begin;
  const std::size_t row_bytes = static_cast<std::size_t>(numel_of(t.shape) / std::max<std::int64_t>(n, 1)) *
                                itemsize(t.dtype);
  return Tensor(view_impl(t, s, t.offset + static_cast<std::size_t>(begin) * row_bytes));
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor out = empty(shape(), dtype(), device);
  detail::copy_bytes(out.data_ptr(), device, data_ptr(), this->device(), nbytes());
  return out;
}

Tensor Tensor::copy() const {
  Tensor out = empty(shape(), dtype(), device());
  detail::copy_bytes(out.data_ptr(), device(), data_ptr(), device(), nbytes());
  return out;
}

void Tensor::copy_to_host(void* dst, DType dtype) const {
  MPT_CHECK(dst != nullptr || numel() == 0, "Tensor::copy_to_host: the destination is a null pointer (copying ",
            numel(), " elements of shape ", to_string(shape()), ")");
  Tensor host = to(Device::cpu());
  detail::convert(host.data_ptr(), host.dtype(), dst, dtype, static_cast<std::size_t>(numel()));
}

double Tensor::item() const {
  MPT_CHECK(numel() == 1, "Tensor::item: needs exactly one element, shape is ", to_string(shape()));
  double v;
  copy_to_host(&v, float64);
  return v;
}

void Tensor::assign(const Tensor& src) {
  MPT_CHECK(src.shape() == shape(), "Tensor::assign: shape ", to_string(src.shape()),
            " does not match ", to_string(shape()));
  MPT_CHECK(src.device() == device(), "Tensor::assign: source on ", src.device().str(),
            ", target on ", device().str());
  detail::backend(device()).cast(src, *this);
}

// ---- printing -----------------------------------------------------------------------------
namespace {
void print_values(std::ostream& os, const std::vector<double>& v, const Shape& s, std::size_t dim,
                  std::size_t offset, std::size_t stride_elems, DType dtype) {
  const std::int64_t n = s[dim];
  const std::size_t inner = stride_elems / static_cast<std::size_t>(std::max<std::int64_t>(n, 1));
  const bool abbreviate = n > 6;
  os << "[";
  for (std::int64_t i = 0; i < n; ++i) {
    if (abbreviate && i == 3) {
      os << (dim + 1 == s.size() ? "..., " : "...,\n" + std::string(dim + 1, ' '));
      i = n - 3;
    }
    if (dim + 1 == s.size()) {
      double x = v[offset + i];
      if (is_integer(dtype)) os << static_cast<long long>(x);
      else os << std::setprecision(dtype == float64 ? 8 : 5) << x;
    } else {
      print_values(os, v, s, dim + 1, offset + i * inner, inner, dtype);
    }
    if (i + 1 < n) os << (dim + 1 == s.size() ? ", " : ",\n" + std::string(dim + 1, ' '));
  }
  os << "]";
}
}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  std::vector<double> v = to_vector<double>();
  os << "Tensor(";
  if (dim() == 0) os << v[0];
  else if (numel() == 0) os << "[]";
  else print_values(os, v, shape(), 0, 0, v.size(), dtype());
  os << ", shape=" << to_string(shape()) << ", dtype=" << to_string(dtype());
  if (!device().is_cpu()) os << ", device=" << device().str();
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }
std::ostream& operator<<(std::ostream& os, DType dtype) { return os << to_string(dtype); }
std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.str(); }

int max_threads() {
  return std::max(256, 16 * static_cast<int>(std::thread::hardware_concurrency()));
}

void set_num_threads(int n) {
  MPT_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got ", n);
  // libgomp crashes or exits the process when asked for tens of thousands of threads.
  MPT_CHECK(n <= max_threads(), "set_num_threads: ", n, " threads is more than mpt allows (", max_threads(),
            ": 16 per hardware thread, at least 256; this machine has ", std::thread::hardware_concurrency(), ")");
  omp_set_num_threads(n);
}
int num_threads() { return omp_get_max_threads(); }

}  // namespace mpt

#pragma once
/// mpt::Tensor: a cheap, shared handle to a row-major, contiguous n-d array on one device.
///
///   auto x = mpt::Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
///   auto h = x.to(mpt::bfloat16);          // cast (a new tensor)
///   auto row = x.slice(1, 2);              // rows [1, 2): shares storage
///   std::vector<float> v = row.to_vector<float>();
///   std::cout << x << "\n";                // numpy-like printing
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "mpt/device.hpp"
#include "mpt/dtype.hpp"
#include "mpt/error.hpp"
#include "mpt/half.hpp"
#include "mpt/memory.hpp"

namespace mpt {

using Shape = std::vector<std::int64_t>;
std::string to_string(const Shape& shape);  // "(2, 3)"
std::int64_t numel_of(const Shape& shape);

namespace autograd {
struct Node;
}

/// The state behind a Tensor handle. Users never touch it directly.
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::size_t offset = 0;  ///< in bytes
  Shape shape;
  DType dtype = float32;
  // autograd
  bool requires_grad = false;               ///< a leaf that gradients are taken for (variable, watched)
  std::shared_ptr<autograd::Node> grad_fn;  ///< the op that produced it, when recorded on a tape
  std::uint32_t output_nr = 0;
  std::uint64_t id = 0;  ///< unique, identifies leaves on the tape
};

namespace detail {
/// A fresh tensor identity (ids tell tensors apart on the tape).
std::uint64_t next_tensor_id();
}  // namespace detail

/// Host element type of a dtype (mpt::half for float16, mpt::bfloat16_t for bfloat16).
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return float32; }
template <> constexpr DType dtype_of<double>() { return float64; }
template <> constexpr DType dtype_of<half>() { return float16; }
template <> constexpr DType dtype_of<bfloat16_t>() { return bfloat16; }
template <> constexpr DType dtype_of<std::int32_t>() { return int32; }
template <> constexpr DType dtype_of<std::int64_t>() { return int64; }
template <> constexpr DType dtype_of<std::uint8_t>() { return uint8; }
template <> constexpr DType dtype_of<bool>() { return bool_; }

class Tensor {
 public:
  Tensor() = default;  ///< undefined tensor (defined() == false)
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories --------------------------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = float32, Device device = default_device());
  static Tensor zeros(const Shape& shape, DType dtype = float32, Device device = default_device());
  static Tensor ones(const Shape& shape, DType dtype = float32, Device device = default_device());
  static Tensor full(const Shape& shape, double value, DType dtype = float32,
                     Device device = default_device());
  /// A 0-d tensor.
  static Tensor scalar(double value, DType dtype = float32, Device device = default_device());
  /// [start, stop) by step, like numpy.arange.
  static Tensor arange(double start, double stop, double step = 1.0, DType dtype = float32,
                       Device device = default_device());
  /// Normal / uniform samples drawn on `device` from the Philox-4x32-10 stream (seed, offset):
  /// the same seed and offset give the same values on every run, thread count and device.
  static Tensor random_normal(const Shape& shape, double mean = 0.0, double stddev = 1.0,
                              std::uint64_t seed = 0, DType dtype = float32,
                              Device device = default_device(), std::uint64_t offset = 0);
  static Tensor random_uniform(const Shape& shape, double minval = 0.0, double maxval = 1.0,
                               std::uint64_t seed = 0, DType dtype = float32,
                               Device device = default_device(), std::uint64_t offset = 0);
  /// From host values of element type T (float, double, int32_t, int64_t, uint8_t, bool,
  /// mpt::half, mpt::bfloat16_t); an empty shape means a 1-d tensor of values.size().
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape = {},
                            Device device = default_device()) {
    if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> is packed: widen to bytes
      std::vector<std::uint8_t> bytes(values.begin(), values.end());
      return from_host(bytes.data(), bytes.size(), bool_, shape, device);
    } else {
      return from_host(values.data(), values.size(), dtype_of<T>(), shape, device);
    }
  }
  template <class T>
  static Tensor from_vector(std::initializer_list<T> values, const Shape& shape = {},
                            Device device = default_device()) {
    return from_host(values.begin(), values.size(), dtype_of<T>(), shape, device);
  }
  static Tensor from_host(const void* data, std::size_t count, DType dtype, const Shape& shape,
                          Device device = default_device());

  // ---- properties -------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  std::int64_t dim() const { return static_cast<std::int64_t>(shape().size()); }
  /// Size of one axis; negative axes count from the end.
  std::int64_t size(std::int64_t axis) const;
  std::int64_t numel() const;
  DType dtype() const;
  Device device() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * itemsize(dtype()); }

  // ---- views and copies -------------------------------------------------------------------
  /// Same storage, new shape (one axis may be -1). Recorded on an active tape.
  Tensor reshape(const Shape& shape) const;
  /// Rows [begin, end) along the first axis; shares storage. Recorded on an active tape.
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  /// Cast to another dtype (a new tensor; the same handle if the dtype already matches).
  Tensor to(DType dtype) const;
  /// Copy to another device (the same handle if already there).
  Tensor to(Device device) const;
  /// A deep copy with its own storage.
  Tensor copy() const;
  /// Host values converted to T (copied back from a GPU when needed).
  template <class T>
  std::vector<T> to_vector() const {
    if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> is packed: read bytes
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(numel()));
      copy_to_host(bytes.data(), bool_);
      return std::vector<bool>(bytes.begin(), bytes.end());
    } else {
      std::vector<T> out(static_cast<std::size_t>(numel()));
      copy_to_host(out.data(), dtype_of<T>());
      return out;
    }
  }
  void copy_to_host(void* dst, DType dtype) const;
  /// The single value of a one-element tensor.
  double item() const;
  /// Overwrites this tensor's values with src's (same shape; dtype converted). Not recorded.
  void assign(const Tensor& src);

  /// Raw pointer to the first element (device memory for GPU tensors).
  void* data_ptr() const;
  template <class T> T* data() const {
    MPT_CHECK(dtype_of<T>() == dtype(), "Tensor::data: requested ", to_string(dtype_of<T>()),
              " but the tensor is ", to_string(dtype()));
    return static_cast<T*>(data_ptr());
  }

  // ---- autograd ---------------------------------------------------------------------------
  bool requires_grad() const;
  /// Marks this tensor as a leaf that gradients are taken for (variables do this).
  Tensor& set_requires_grad(bool on);
  /// A handle to the same data that is not connected to any recorded op.
  Tensor detach() const;
  /// Identity of the underlying tensor (stable across copies of the handle).
  std::uint64_t id() const;

  /// numpy-like text: values (abbreviated when large), shape, dtype, device.
  std::string str() const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  const TensorImpl& checked() const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::ostream& operator<<(std::ostream& os, DType dtype);
std::ostream& operator<<(std::ostream& os, const Device& device);

// Arithmetic operators (broadcasting; a scalar takes the tensor's dtype). See mpt/ops.hpp.
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

/// Threads used by mpt's CPU kernels and oneDNN (default: all cores): 1 to max_threads(), else an
/// mpt::Error. An OMP_NUM_THREADS above max_threads() is lowered to it when the library loads,
/// with a warning.
void set_num_threads(int n);
/// The most threads set_num_threads accepts: 16 per hardware thread, at least 256.
int max_threads();
int num_threads();

}  // namespace mpt

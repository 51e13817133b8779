#include "ops/ops_common.hpp"

namespace mpt::ops::detail {

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  return to_string(t.dtype()) + " " + to_string(t.shape()) + " on " + t.device().str();
}

void check_defined(const char* op, const Tensor& t, const char* what) {
  MPT_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

void check_compatible(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(op, a, "first input");
  check_defined(op, b, "second input");
  MPT_CHECK(a.device() == b.device(), op, ": inputs on different devices: ", describe(a), " vs ",
            describe(b));
  MPT_CHECK(a.dtype() == b.dtype(), op, ": mismatched dtypes: ", describe(a), " vs ", describe(b),
            " (cast one with .to(dtype))");
}

void check_floating(const char* op, const Tensor& t) {
  check_defined(op, t);
  MPT_CHECK(is_floating(t.dtype()), op, ": needs a floating-point tensor, got ", describe(t));
}

Shape broadcast_shape(const char* op, const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MPT_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", to_string(a), " and ", to_string(b),
              " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::int64_t normalize_axis(const char* op, std::int64_t axis, std::int64_t ndim) {
  MPT_CHECK(axis >= -ndim && axis < ndim, op, ": axis ", axis, " out of range for a tensor of rank ",
            ndim);
  return axis < 0 ? axis + ndim : axis;
}

Activation activation_from_name(const char* op, const std::string& name) {
  // "" is no name (Keras's activations.get("") fails too); "linear" is the identity.
  MPT_CHECK(!name.empty(), op, ": empty activation name; valid: linear, relu, sigmoid, tanh, softmax, gelu, silu");
  if (name == "linear") return Activation::Linear;
  if (name == "relu") return Activation::Relu;
  if (name == "sigmoid") return Activation::Sigmoid;
  if (name == "tanh") return Activation::Tanh;
  if (name == "gelu") return Activation::Gelu;
  if (name == "silu" || name == "swish") return Activation::Silu;
  fail(op, ": unknown activation '", name, "'; valid: linear, relu, sigmoid, tanh, softmax, gelu, silu");
}

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::Linear: return "linear";
    case Activation::Relu: return "relu";
    case Activation::Sigmoid: return "sigmoid";
    case Activation::Tanh: return "tanh";
    case Activation::Gelu: return "gelu";
    case Activation::Silu: return "silu";
  }
  return "?";
}

UnaryOp unary_of(Activation act) {
  switch (act) {
    case Activation::Relu: return UnaryOp::Relu;
    case Activation::Sigmoid: return UnaryOp::Sigmoid;
    case Activation::Tanh: return UnaryOp::Tanh;
    case Activation::Gelu: return UnaryOp::Gelu;
    case Activation::Silu: return UnaryOp::Silu;
    case Activation::Linear: break;
  }
  fail("activation: linear has no elementwise op");
}

}  // namespace mpt::ops::detail

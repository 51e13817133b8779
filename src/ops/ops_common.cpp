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
  MPT_CHECK(!name.empty(), op, ": empty activation name; valid: ", common::activation_names(), ", softmax");
  Activation act = Activation::Linear;
  MPT_CHECK(common::activation_of_name(name, act), op, ": unknown activation '", name,
            "'; valid: ", common::activation_names(), ", softmax");
  return act;
}

void apply_activation(Activation act, const Tensor& z, Tensor& out) {
  backend_of(z).unary(act, z, out, common::unary_default_param(act));
}

void activation_backward(Activation act, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  backend_of(dy).unary_backward(act, x, y, dy, dx, common::unary_default_param(act));
}

}  // namespace mpt::ops::detail

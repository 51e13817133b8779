#include <algorithm>

#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

namespace {

std::vector<std::int64_t> normalize_axes(const char* name, std::vector<std::int64_t> axes, std::int64_t nd) {
  if (axes.empty())
    for (std::int64_t i = 0; i < nd; ++i) axes.push_back(i);
  for (auto& a : axes) a = normalize_axis(name, a, nd);
  std::sort(axes.begin(), axes.end());
  MPT_CHECK(std::adjacent_find(axes.begin(), axes.end()) == axes.end(), name, ": repeated axis");
  return axes;
}

Shape dropped_shape(const Shape& s, const std::vector<std::int64_t>& axes) {
  Shape out;
  for (std::size_t i = 0; i < s.size(); ++i)
    if (!std::binary_search(axes.begin(), axes.end(), static_cast<std::int64_t>(i))) out.push_back(s[i]);
  return out;
}

/// Reduces `axes` one at a time; intermediate results stay in the compute type.
Tensor reduce_forward(const char* name, ReduceOp op, const Tensor& x, const std::vector<std::int64_t>& axes) {
  MPT_CHECK(x.dtype() != bool_ || op == ReduceOp::Max || op == ReduceOp::Min, name,
            ": not defined for bool; cast first");
  const DType inter = x.dtype() == float64 ? float64 : is_integer(x.dtype()) ? int64 : float32;
  Tensor t = x;
  if (axes.empty()) return x.copy();
  for (std::size_t i = axes.size(); i-- > 0;) {
    MPT_CHECK(t.shape()[axes[i]] > 0 || op == ReduceOp::Sum, name, ": reducing an empty axis of ",
              describe(x));
    Shape s = t.shape();
    s[axes[i]] = 1;
    Tensor out = Tensor::empty(s, i == 0 ? x.dtype() : inter, x.device());
    backend_of(x).reduce(op, t, axes[i], out);
    t = out;
  }
  return t;
}

Tensor reduce(const char* name, ReduceOp op, const Tensor& x, std::vector<std::int64_t> axes_in, bool keepdims) {
  check_defined(name, x);
  auto axes = normalize_axes(name, std::move(axes_in), x.dim());
  Tensor kept = reduce_forward(name, op, x, axes);
  Tensor out = keepdims ? kept : Tensor(kept.impl_ptr()).reshape(dropped_shape(x.shape(), axes));
  if (!is_floating(x.dtype())) return out;
  const Shape keep_shape = kept.shape();
  std::int64_t count = 1;
  for (auto a : axes) count *= x.shape()[a];
  autograd::record(name, {x}, {&out},
                   [op, x, keep_shape, count, y = kept.detach()](const std::vector<Tensor>& g) {
                     Tensor gk = broadcast_to(g[0].reshape(keep_shape), x.shape());
                     switch (op) {
                       case ReduceOp::Sum: return std::vector<Tensor>{gk};
                       case ReduceOp::Mean: return std::vector<Tensor>{gk / static_cast<double>(count)};
                       default: break;
                     }
                     // Max/min: split evenly among the elements equal to the extremum.
                     Tensor mask = equal(x, broadcast_to(y, x.shape())).to(x.dtype());
                     std::vector<std::int64_t> axes;
                     for (std::size_t i = 0; i < keep_shape.size(); ++i)
                       if (keep_shape[i] == 1 && x.shape()[i] != 1) axes.push_back(static_cast<std::int64_t>(i));
                     Tensor ties = broadcast_to(sum(mask, axes, true), x.shape());
                     return std::vector<Tensor>{mul(gk, div(mask, ties))};
                   });
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, std::vector<std::int64_t> axes, bool keepdims) {
  return reduce("sum", ReduceOp::Sum, x, std::move(axes), keepdims);
}
Tensor mean(const Tensor& x, std::vector<std::int64_t> axes, bool keepdims) {
  return reduce("mean", ReduceOp::Mean, x, std::move(axes), keepdims);
}
Tensor max(const Tensor& x, std::vector<std::int64_t> axes, bool keepdims) {
  return reduce("max", ReduceOp::Max, x, std::move(axes), keepdims);
}
Tensor min(const Tensor& x, std::vector<std::int64_t> axes, bool keepdims) {
  return reduce("min", ReduceOp::Min, x, std::move(axes), keepdims);
}

Tensor argmax(const Tensor& x, std::int64_t axis) {
  check_defined("argmax", x);
  axis = normalize_axis("argmax", axis, x.dim());
  MPT_CHECK(x.shape()[axis] > 0, "argmax: empty axis ", axis, " of ", describe(x));
  Shape s = x.shape();
  s[axis] = 1;
  Tensor out = Tensor::empty(s, int64, x.device());
  backend_of(x).argmax(x, axis, out);
  return out.reshape(dropped_shape(x.shape(), {axis}));
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  check_defined("sum_to", x);
  if (x.shape() == shape) return x;
  const std::int64_t lead = x.dim() - static_cast<std::int64_t>(shape.size());
  MPT_CHECK(lead >= 0, "sum_to: cannot sum ", describe(x), " to shape ", to_string(shape));
  std::vector<std::int64_t> axes;
  for (std::int64_t i = 0; i < x.dim(); ++i) {
    if (i < lead) axes.push_back(i);
    else if (shape[i - lead] == 1 && x.shape()[i] != 1) axes.push_back(i);
    else MPT_CHECK(shape[i - lead] == x.shape()[i], "sum_to: cannot sum ", describe(x), " to shape ",
                   to_string(shape));
  }
  return sum(x, axes, true).reshape(shape);
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  check_defined("broadcast_to", x);
  if (x.shape() == shape) return x;
  MPT_CHECK(broadcast_shape("broadcast_to", x.shape(), shape) == shape, "broadcast_to: cannot broadcast ",
            describe(x), " to ", to_string(shape));
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  backend_of(x).binary(BinaryOp::Add, x, Tensor::scalar(0, x.dtype(), x.device()), out);
  autograd::record("broadcast_to", {x}, {&out}, [s = x.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(g[0], s)};
  });
  return out;
}

}  // namespace mpt::ops

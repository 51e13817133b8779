#include <numeric>

#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

Tensor reshape(const Tensor& x, const Shape& shape_in) {
  check_defined("reshape", x);
  Shape shape = shape_in, known_dims;
  std::int64_t infer = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MPT_CHECK(infer < 0, "reshape: more than one -1 in ", to_string(shape_in));
      infer = static_cast<std::int64_t>(i);
    } else {
      MPT_CHECK(shape[i] >= 0, "reshape: invalid dimension in ", to_string(shape_in));
      known_dims.push_back(shape[i]);
    }
  }
  const std::int64_t known = numel_of(known_dims);  // an mpt::Error when the product overflows
  if (infer >= 0) {
    MPT_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot reshape ", describe(x), " to ",
              to_string(shape_in));
    shape[infer] = x.numel() / known;
  }
  MPT_CHECK(numel_of(shape) == x.numel(), "reshape: cannot reshape ", describe(x), " (", x.numel(),
            " elements) to ", to_string(shape_in));
  auto impl = std::make_shared<TensorImpl>(*x.impl());  // same storage and offset
  impl->shape = shape;
  impl->grad_fn = nullptr;
  impl->requires_grad = false;
  impl->id = mpt::detail::next_tensor_id();
  Tensor out(impl);
  autograd::record("reshape", {x}, {&out}, [s = x.shape()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].reshape(s)};
  });
  return out;
}

Tensor transpose(const Tensor& x, std::vector<std::int64_t> perm) {
  check_defined("transpose", x);
  const std::int64_t nd = x.dim();
  if (perm.empty()) {
    perm.resize(nd);
    std::iota(perm.rbegin(), perm.rend(), 0);
  }
  MPT_CHECK(static_cast<std::int64_t>(perm.size()) == nd, "transpose: permutation of length ", perm.size(),
            " for ", describe(x));
  std::vector<bool> seen(nd, false);
  Shape s(nd);
  for (std::int64_t i = 0; i < nd; ++i) {
    perm[i] = normalize_axis("transpose", perm[i], nd);
    MPT_CHECK(!seen[perm[i]], "transpose: axis ", perm[i], " repeated in the permutation");
    seen[perm[i]] = true;
    s[i] = x.shape()[perm[i]];
  }
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  backend_of(x).transpose(x, perm, out);
  autograd::record("transpose", {x}, {&out}, [perm](const std::vector<Tensor>& g) {
    std::vector<std::int64_t> inv(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<std::int64_t>(i);
    return std::vector<Tensor>{transpose(g[0], inv)};
  });
  return out;
}

namespace {
/// Copies src into dst at offset `at` along `axis` (or the reverse when `into_src`).
void copy_along(const Tensor& small, Tensor& big, std::int64_t axis, std::int64_t at, bool to_big) {
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t i = 0; i < axis; ++i) outer *= big.shape()[i];
  for (std::int64_t i = axis + 1; i < big.dim(); ++i) inner *= big.shape()[i];
  const std::size_t es = itemsize(big.dtype());
  const std::size_t big_pitch = static_cast<std::size_t>(big.shape()[axis] * inner) * es;
  const std::size_t small_pitch = static_cast<std::size_t>(small.shape()[axis] * inner) * es;
  char* big_ptr = static_cast<char*>(big.data_ptr()) + static_cast<std::size_t>(at * inner) * es;
  char* small_ptr = static_cast<char*>(small.data_ptr());
  if (to_big)
    backend_of(big).copy2d(big.device(), big_ptr, big_pitch, small_ptr, small_pitch, small_pitch, outer);
  else
    backend_of(big).copy2d(big.device(), small_ptr, small_pitch, big_ptr, big_pitch, small_pitch, outer);
}
}  // namespace

Tensor gather_rows(const Tensor& x, const Tensor& indices) {
  const char* name = "gather_rows";
  check_defined(name, x);
  check_defined(name, indices, "indices");
  MPT_CHECK(x.dim() >= 1, name, ": x needs at least one dimension, got ", describe(x));
  MPT_CHECK(indices.dtype() == int64 && indices.dim() == 1, name, ": indices must be int64 [K], got ",
            describe(indices));
  MPT_CHECK(indices.device() == x.device(), name, ": indices on ", indices.device().str(), ", x on ",
            x.device().str());
  Shape s = x.shape();
  s[0] = indices.shape()[0];
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  if (out.numel() > 0) backend_of(x).gather_rows(x, indices, out);
  return out;
}

Tensor concat(const std::vector<Tensor>& xs, std::int64_t axis) {
  MPT_CHECK(!xs.empty(), "concat: no tensors given");
  const Tensor& first = xs[0];
  check_defined("concat", first);
  MPT_CHECK(first.dim() > 0, "concat: cannot concatenate 0-d tensors");
  axis = normalize_axis("concat", axis, first.dim());
  Shape s = first.shape();
  s[axis] = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    check_compatible("concat", first, xs[i]);
    bool same = xs[i].dim() == first.dim();
    for (std::int64_t d = 0; same && d < first.dim(); ++d)
      same = d == axis || xs[i].shape()[d] == first.shape()[d];
    MPT_CHECK(same, "concat: input ", i, " is ", describe(xs[i]), ", incompatible with ", describe(first),
              " along axis ", axis);
    s[axis] += xs[i].shape()[axis];
  }
  Tensor out = Tensor::empty(s, first.dtype(), first.device());
  std::vector<std::int64_t> starts;
  std::int64_t at = 0;
  for (const Tensor& x : xs) {
    starts.push_back(at);
    copy_along(x, out, axis, at, true);
    at += x.shape()[axis];
  }
  std::vector<std::int64_t> sizes;
  for (const Tensor& x : xs) sizes.push_back(x.shape()[axis]);
  autograd::record("concat", xs, {&out}, [axis, starts, sizes](const std::vector<Tensor>& g) {
    std::vector<Tensor> gs;
    for (std::size_t i = 0; i < starts.size(); ++i) gs.push_back(slice(g[0], axis, starts[i], starts[i] + sizes[i]));
    return gs;
  });
  return out;
}

Tensor slice(const Tensor& x, std::int64_t axis, std::int64_t begin, std::int64_t end) {
  check_defined("slice", x);
  axis = normalize_axis("slice", axis, x.dim());
  const std::int64_t n = x.shape()[axis];
  MPT_CHECK(0 <= begin && begin <= end && end <= n, "slice: range [", begin, ", ", end, ") out of bounds for axis ",
            axis, " of ", describe(x));
  Shape s = x.shape();
  s[axis] = end - begin;
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  copy_along(out, const_cast<Tensor&>(x), axis, begin, false);
  autograd::record("slice", {x}, {&out}, [axis, begin, full = x.shape()](const std::vector<Tensor>& g) {
    Tensor dx = Tensor::zeros(full, g[0].dtype(), g[0].device());
    copy_along(g[0], dx, axis, begin, true);
    return std::vector<Tensor>{dx};
  });
  return out;
}

Tensor one_hot(const Tensor& indices, std::int64_t depth, DType dtype) {
  check_defined("one_hot", indices);
  MPT_CHECK(is_integer(indices.dtype()) && indices.dtype() != bool_, "one_hot: indices must be integers, got ",
            describe(indices));
  MPT_CHECK(depth > 0, "one_hot: depth must be positive, got ", depth);
  Shape s = indices.shape();
  s.push_back(depth);
  Tensor out = Tensor::empty(s, dtype, indices.device());
  backend_of(indices).one_hot(indices, out);
  return out;
}

}  // namespace mpt::ops

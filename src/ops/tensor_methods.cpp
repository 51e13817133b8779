// The Tensor methods and operators that are ops (recorded on the tape), defined with the ops so
// that core (tensor.cpp) depends on neither the ops nor the tape.
#include "core/tensor_view.hpp"
#include "mpt/autograd.hpp"
#include "mpt/ops.hpp"

namespace mpt {

Tensor Tensor::reshape(const Shape& shape) const { return ops::reshape(*this, shape); }

Tensor Tensor::to(DType dtype) const { return dtype == this->dtype() ? *this : ops::cast(*this, dtype); }

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  Tensor out = detail::row_view(*this, begin, end);
  const Shape full = shape();
  autograd::record("slice", {*this}, {&out}, [full, begin, end](const std::vector<Tensor>& g) {
    // The gradient is the incoming one placed at rows [begin, end) of zeros.
    Tensor dx = Tensor::zeros(full, g[0].dtype(), g[0].device());
    Tensor rows = dx.slice(begin, end);
    rows.assign(g[0]);
    return std::vector<Tensor>{dx};
  });
  return out;
}

// ---- operators ----------------------------------------------------------------------------
namespace {
Tensor like(const Tensor& t, double v) { return Tensor::scalar(v, t.dtype(), t.device()); }
}  // namespace
Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
Tensor operator-(const Tensor& a) { return ops::neg(a); }
Tensor operator+(const Tensor& a, double b) { return ops::add(a, like(a, b)); }
Tensor operator-(const Tensor& a, double b) { return ops::sub(a, like(a, b)); }
Tensor operator*(const Tensor& a, double b) { return ops::mul(a, like(a, b)); }
Tensor operator/(const Tensor& a, double b) { return ops::div(a, like(a, b)); }
Tensor operator+(double a, const Tensor& b) { return ops::add(like(b, a), b); }
Tensor operator-(double a, const Tensor& b) { return ops::sub(like(b, a), b); }
Tensor operator*(double a, const Tensor& b) { return ops::mul(like(b, a), b); }
Tensor operator/(double a, const Tensor& b) { return ops::div(like(b, a), b); }


}  // namespace mpt

#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

namespace {
Tensor softmax_impl(const char* name, const Tensor& x, std::int64_t axis, bool log) {
  check_floating(name, x);
  MPT_CHECK(x.dim() >= 1, name, ": needs rank >= 1, got ", describe(x));
  axis = normalize_axis(name, axis, x.dim());
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) backend_of(x).softmax(x, axis, log, out);
  autograd::record(name, {x}, {&out}, [axis, log, y = out.detach()](const std::vector<Tensor>& g) {
    Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
    if (y.numel() > 0) backend_of(y).softmax_backward(y, g[0], axis, log, dx);
    return std::vector<Tensor>{dx};
  });
  return out;
}
}  // namespace

Tensor softmax(const Tensor& x, std::int64_t axis) { return softmax_impl("softmax", x, axis, false); }
Tensor log_softmax(const Tensor& x, std::int64_t axis) { return softmax_impl("log_softmax", x, axis, true); }

Tensor softmax_cross_entropy(const Tensor& x, const Tensor& labels, CrossEntropyOptions options) {
  const char* name = "softmax_cross_entropy";
  check_floating(name, x);
  check_defined(name, labels, "labels");
  MPT_CHECK(x.dim() >= 1 && x.shape().back() > 0, name, ": predictions need a class axis, got ", describe(x));
  MPT_CHECK(labels.device() == x.device(), name, ": labels on ", labels.device().str(), ", predictions on ",
            x.device().str());
  const std::int64_t classes = x.shape().back();
  const std::int64_t rows = x.numel() / classes;
  Shape loss_shape(x.shape().begin(), x.shape().end() - 1);
  const bool sparse = is_integer(labels.dtype());
  Tensor lab;
  if (sparse) {
    MPT_CHECK(labels.dtype() != bool_, name, ": bool labels; use int32/int64 class ids");
    MPT_CHECK(labels.shape() == loss_shape || (labels.numel() == rows && labels.dim() == x.dim() &&
                                               labels.shape().back() == 1),
              name, ": sparse labels ", describe(labels), " do not match predictions ", describe(x),
              " (expected shape ", to_string(loss_shape), ")");
    lab = labels.reshape({rows});
    // Free on the CPU; on other devices this would be a host read per step, so the data checks
    // of fit/evaluate/batches cover it and the kernel gives NaN for a label out of range.
    if (rows > 0 && mpt::detail::host_addressable(lab.device())) {
      auto ids = lab.to_vector<std::int64_t>();
      for (std::int64_t i = 0; i < rows; ++i)
        MPT_CHECK(ids[i] >= 0 && ids[i] < classes, name, ": label ", ids[i], " at index ", i,
                  " is out of range [0, ", classes, ")");
    }
  } else {
    MPT_CHECK(labels.shape() == x.shape(), name, ": one-hot labels ", describe(labels),
              " do not match predictions ", describe(x));
    lab = labels.to(x.dtype() == float64 ? float64 : float32).detach().reshape({rows, classes});
  }
  const DType loss_dtype = x.dtype() == float64 ? float64 : float32;
  Tensor x2 = x.detach().reshape({rows, classes});
  Tensor loss = Tensor::empty({rows}, loss_dtype, x.device());
  if (rows > 0) backend_of(x).cross_entropy(x2, lab, options.from_logits, loss);
  Tensor out = loss.reshape(loss_shape);
  autograd::record(name, {x, sparse ? Tensor() : labels}, {&out},
                   [x2, lab, from_logits = options.from_logits, xs = x.shape(), sparse](const std::vector<Tensor>& g) {
                     Tensor dx = Tensor::empty(x2.shape(), x2.dtype(), x2.device());
                     if (x2.numel() > 0)
                       backend_of(x2).cross_entropy_backward(x2, lab, from_logits, g[0].reshape({x2.shape()[0]}), dx);
                     Tensor dlab;
                     if (!sparse && from_logits) {  // d/dt = -log_softmax(x) * g
                       Tensor ls = log_softmax(x2.to(lab.dtype()));
                       dlab = mul(neg(ls), g[0].reshape({x2.shape()[0], 1}).to(lab.dtype())).reshape(xs);
                     }
                     return std::vector<Tensor>{dx.reshape(xs), dlab};
                   });
  return out;
}

}  // namespace mpt::ops

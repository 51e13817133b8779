#include "mpt/nn_ops.hpp"
#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

namespace {

/// A [n] parameter of x's op in the statistics dtype (cast, and so differentiable, when needed).
Tensor param(const char* op, const char* what, const Tensor& t, const Tensor& x, std::int64_t n, DType dtype) {
  if (!t.defined()) return t;
  MPT_CHECK(t.device() == x.device(), op, ": ", what, " on ", t.device().str(), ", input on ", x.device().str());
  MPT_CHECK(is_floating(t.dtype()), op, ": ", what, " must be floating-point, got ", describe(t));
  MPT_CHECK(t.dim() == 1 && t.shape()[0] == n, op, ": ", what, " ", describe(t), " does not match the ", n,
            " channels (last axis) of input ", describe(x));
  return t.dtype() == dtype ? t : cast(t, dtype);
}

DType stats_dtype(const Tensor& x) { return x.dtype() == float64 ? float64 : float32; }

}  // namespace

BatchNormResult batch_norm(const Tensor& x, const Tensor& gamma_in, const Tensor& beta_in, const Tensor& mean_in,
                           const Tensor& var_in, BatchNormOptions o) {
  const char* name = "batch_norm";
  check_floating(name, x);
  MPT_CHECK(x.dim() >= 2, name, ": input needs a batch axis and a channel axis (last), got ", describe(x));
  MPT_CHECK(o.epsilon > 0, name, ": epsilon must be positive, got ", o.epsilon);
  const Activation act = activation_from_name(name, o.activation);
  MPT_CHECK(act == Activation::Linear || act == Activation::Relu, name, ": the fused activation must be linear or relu, got '",
            o.activation, "'");
  const std::int64_t ch = x.shape().back(), rows = x.numel() / std::max<std::int64_t>(ch, 1);
  const DType pd = stats_dtype(x);
  Tensor gamma = param(name, "gamma", gamma_in, x, ch, pd), beta = param(name, "beta", beta_in, x, ch, pd);
  Tensor x2 = x.detach().reshape({rows, ch});
  Tensor mean, var;
  Backend& be = backend_of(x);
  if (o.training) {
    MPT_CHECK(rows > 0, name, ": training needs at least one example per channel, got ", describe(x));
    mean = Tensor::empty({ch}, pd, x.device());
    var = Tensor::empty({ch}, pd, x.device());
    be.batch_norm_stats(x2, mean, var);
  } else {
    MPT_CHECK(mean_in.defined() && var_in.defined(), name, ": inference needs the mean and variance to normalize with");
    NoGradGuard no_grad;  // moving statistics get no gradient
    mean = param(name, "mean", mean_in, x, ch, pd).detach();
    var = param(name, "variance", var_in, x, ch, pd).detach();
  }
  Tensor y2 = Tensor::empty({rows, ch}, x.dtype(), x.device());
  be.batch_norm(x2, mean, var, gamma, beta, o.epsilon, act, y2);
  Tensor y = y2.reshape(x.shape());
  autograd::record(name, {x, gamma, beta}, {&y},
                   [x2, mean, var, g = gamma.defined() ? gamma.detach() : Tensor(),
                    b = beta.defined() ? beta.detach() : Tensor(), eps = o.epsilon, training = o.training, act,
                    xs = x.shape(), need_x = x.requires_grad(), need_g = gamma.defined() && gamma.requires_grad(),
                    need_b = beta.defined() && beta.requires_grad()](const std::vector<Tensor>& grads) {
                     const std::int64_t ch = x2.shape()[1];
                     Tensor dx = need_x ? Tensor::empty(x2.shape(), x2.dtype(), x2.device()) : Tensor();
                     Tensor dg = need_g ? Tensor::empty({ch}, g.dtype(), g.device()) : Tensor();
                     Tensor db = need_b ? Tensor::empty({ch}, b.dtype(), b.device()) : Tensor();
                     backend_of(x2).batch_norm_backward(x2, grads[0].reshape(x2.shape()), mean, var, g, b, eps, training,
                                                        act, dx, dg, db);
                     return std::vector<Tensor>{dx.defined() ? dx.reshape(xs) : dx, dg, db};
                   });
  return {y, mean, var};
}

Tensor layer_norm(const Tensor& x, const Tensor& gamma_in, const Tensor& beta_in, double epsilon) {
  const char* name = "layer_norm";
  check_floating(name, x);
  MPT_CHECK(x.dim() >= 1, name, ": needs rank >= 1, got ", describe(x));
  MPT_CHECK(epsilon > 0, name, ": epsilon must be positive, got ", epsilon);
  const std::int64_t d = x.shape().back(), rows = d > 0 ? x.numel() / d : 0;
  const DType pd = stats_dtype(x);
  Tensor gamma = param(name, "gamma", gamma_in, x, d, pd), beta = param(name, "beta", beta_in, x, d, pd);
  Tensor x2 = x.detach().reshape({rows, d});
  Tensor y2 = Tensor::empty({rows, d}, x.dtype(), x.device());
  Tensor mean = Tensor::empty({rows}, pd, x.device()), rstd = Tensor::empty({rows}, pd, x.device());
  backend_of(x).layer_norm(x2, gamma, beta, epsilon, y2, mean, rstd);
  Tensor y = y2.reshape(x.shape());
  autograd::record(name, {x, gamma, beta}, {&y},
                   [x2, mean, rstd, g = gamma.defined() ? gamma.detach() : Tensor(), xs = x.shape(),
                    need_x = x.requires_grad(), need_g = gamma.defined() && gamma.requires_grad(),
                    need_b = beta.defined() && beta.requires_grad(), pd](const std::vector<Tensor>& grads) {
                     const std::int64_t d = x2.shape()[1];
                     Tensor dx = need_x ? Tensor::empty(x2.shape(), x2.dtype(), x2.device()) : Tensor();
                     Tensor dg = need_g ? Tensor::empty({d}, pd, x2.device()) : Tensor();
                     Tensor db = need_b ? Tensor::empty({d}, pd, x2.device()) : Tensor();
                     backend_of(x2).layer_norm_backward(x2, grads[0].reshape(x2.shape()), mean, rstd, g, dx, dg, db);
                     return std::vector<Tensor>{dx.defined() ? dx.reshape(xs) : dx, dg, db};
                   });
  return y;
}

}  // namespace mpt::ops

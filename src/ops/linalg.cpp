#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

namespace {

struct MatmulDims {
  std::int64_t m, k, n;
  Shape out;
};

MatmulDims check_matmul(const char* name, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check_compatible(name, a, b);
  check_floating(name, a);
  MPT_CHECK(a.dim() >= 2 && b.dim() >= 2, name, ": needs tensors of rank >= 2, got ", describe(a), " and ",
            describe(b));
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  MatmulDims d;
  d.m = ta ? sa.back() : sa[sa.size() - 2];
  d.k = ta ? sa[sa.size() - 2] : sa.back();
  const std::int64_t kb = tb ? sb.back() : sb[sb.size() - 2];
  d.n = tb ? sb[sb.size() - 2] : sb.back();
  MPT_CHECK(d.k == kb, name, ": inner dimensions differ: ", describe(a), (ta ? " (transposed)" : ""), " x ",
            describe(b), (tb ? " (transposed)" : ""), " (", d.k, " vs ", kb, ")");
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  MPT_CHECK(ba.empty() || bb.empty() || ba == bb, name, ": batch dimensions ", to_string(ba), " and ",
            to_string(bb), " differ (", describe(a), " x ", describe(b), ")");
  d.out = ba.empty() ? bb : ba;
  d.out.push_back(d.m);
  d.out.push_back(d.n);
  return d;
}

/// Gradients of c = op_a(a) . op_b(b) for the four transpose cases; batched b broadcast over
/// a's batch is summed back.
/// a's (b's) gradient only when need_a (need_b): undefined otherwise.
std::vector<Tensor> matmul_grads(const Tensor& g, const Tensor& a, const Tensor& b, bool ta, bool tb, bool need_a,
                                 bool need_b) {
  Tensor da, db;
  if (need_a) {
    da = ta ? matmul(b, g, tb, true) : matmul(g, b, false, !tb);
    if (da.shape() != a.shape()) da = sum_to(da, a.shape());
  }
  if (need_b) {
    db = tb ? matmul(g, a, true, ta) : matmul(a, g, !ta, false);
    if (db.shape() != b.shape()) db = sum_to(db, b.shape());  // 2-d b, batched a
  }
  return {da, db};
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  MatmulDims d = check_matmul("matmul", a, b, ta, tb);
  Tensor out = Tensor::empty(d.out, a.dtype(), a.device());
  if (d.k == 0) backend_of(a).fill(out, 0.0);
  else backend_of(a).matmul(a, b, ta, tb, Tensor(), Activation::Linear, out);
  autograd::record("matmul", {a, b}, {&out},
                   [a, b, ta, tb, need_a = a.requires_grad(), need_b = b.requires_grad()](const std::vector<Tensor>& g) {
                     return matmul_grads(g[0], a, b, ta, tb, need_a, need_b);
                   });
  return out;
}

Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b, const std::string& activation) {
  check_compatible("dense", x, w);
  check_floating("dense", x);
  const Activation act = activation_from_name("dense", activation);
  MPT_CHECK(w.dim() == 2, "dense: kernel must be 2-d [in, units], got ", describe(w));
  MPT_CHECK(x.dim() >= 1 && x.shape().back() == w.shape()[0], "dense: input ", describe(x),
            " does not match kernel ", describe(w), " (last dimension must be ", w.shape()[0], ")");
  if (b.defined()) {
    check_compatible("dense", x, b);
    MPT_CHECK(b.dim() == 1 && b.shape()[0] == w.shape()[1], "dense: bias ", describe(b),
              " does not match kernel ", describe(w));
  }
  const std::int64_t in = w.shape()[0], units = w.shape()[1];
  Shape out_shape = x.shape();
  out_shape.back() = units;
  Tensor x2 = Tensor(x.impl_ptr()).detach().reshape({x.numel() / std::max<std::int64_t>(in, 1), in});
  // Activations whose gradient reads only the output fuse into the GEMM epilogue and
  // differentiate from it; the others (GELU, SiLU) need the pre-activation and run unfused.
  const bool fuse = common::unary_grad_from_output(act);
  Tensor z = Tensor::empty({x2.shape()[0], units}, x.dtype(), x.device());
  if (in == 0) {
    backend_of(x).fill(z, 0.0);
    if (b.defined()) z = add(z, b.detach());
    if (fuse && act != Activation::Linear) apply_activation(act, z, z);  // elementwise, in place
  } else {
    backend_of(x).matmul(x2, w, false, false, b, fuse ? act : Activation::Linear, z);
  }
  Tensor y = z;
  if (!fuse) {
    y = Tensor::empty(z.shape(), z.dtype(), z.device());
    apply_activation(act, z, y);
  }
  Tensor out = Tensor(y.impl_ptr()).reshape(out_shape);
  autograd::record("dense", {x, w, b}, {&out},
                   [x2, w, act, fuse, z = z.detach(), y = y.detach(), xs = x.shape(),
                    // As conv2d: only the gradients that flow somewhere (a model's input needs no dx).
                    need_x = x.requires_grad(), need_w = w.requires_grad(),
                    need_b = b.defined() && b.requires_grad()](const std::vector<Tensor>& g) {
                     Tensor dy = g[0].reshape(y.shape());
                     Tensor dz = dy;
                     if (act != Activation::Linear) {
                       dz = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
                       // Fused activations are differentiated from y (x unused); the rest from z.
                       activation_backward(act, fuse ? y : z, y, dy, dz);
                     }
                     Tensor dx = need_x ? matmul(dz, w, false, true).reshape(xs) : Tensor();
                     Tensor dw = need_w ? matmul(x2, dz, true, false) : Tensor();
                     Tensor db = need_b ? sum(dz, {0}) : Tensor();
                     return std::vector<Tensor>{dx, dw, db};
                   });
  return out;
}

}  // namespace mpt::ops

// ops::dot_product_attention: Keras's keras.ops.dot_product_attention (PyTorch's
// scaled_dot_product_attention) in the [B, T, H, D] layout, with its own backward. 16-bit inputs
// compute in float32 (softmax statistics included) and return 16-bit; memory stays linear in T.
#include <cmath>

#include "mpt/nn_ops.hpp"
#include "ops/ops_common.hpp"

namespace mpt::ops {
using namespace detail;

namespace {

/// The mask as a contiguous uint8 [B, 1 or H, Tq, Tk] (true attends); undefined for none.
Tensor attention_mask(const char* name, const Tensor& mask, const Tensor& q, std::int64_t tk, std::int64_t& heads) {
  heads = 0;
  if (!mask.defined()) return Tensor();
  const std::int64_t b = q.shape()[0], tq = q.shape()[1], h = q.shape()[2];
  MPT_CHECK(mask.device() == q.device(), name, ": mask on ", mask.device().str(), ", query on ", q.device().str());
  MPT_CHECK(mask.dtype() == bool_ || is_integer(mask.dtype()), name, ": mask must be bool (true attends), got ",
            describe(mask));
  // Keras's mask broadcasts to [B, H, Tq, Tk]: a [Tq, Tk], [B, Tq, Tk] or [B, 1 or H, Tq, Tk] mask.
  Shape s = mask.shape();
  MPT_CHECK(s.size() >= 2 && s.size() <= 4, name, ": mask of rank ", s.size(), "; expected [Tq, Tk], [B, Tq, Tk] or [B, H, Tq, Tk], got ",
            describe(mask));
  if (s.size() == 3) s.insert(s.begin() + 1, 1);
  if (s.size() == 2) s.insert(s.begin(), {1, 1});
  heads = s[1] == h ? h : 1;
  const Shape want{b, heads, tq, tk};
  for (std::size_t d = 0; d < 4; ++d)
    MPT_CHECK(s[d] == want[d] || s[d] == 1, name, ": mask ", describe(mask), " does not broadcast to ",
              to_string(Shape{b, h, tq, tk}));
  Tensor m = Tensor(mask.impl_ptr()).detach().reshape(s);
  if (m.dtype() != bool_) m = ops::not_equal(m, Tensor::zeros({}, m.dtype(), m.device()));
  return ops::broadcast_to(m, want);  // contiguous bytes, 0 or 1
}

}  // namespace

Tensor dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value, AttentionOptions o) {
  const char* name = "dot_product_attention";
  check_floating(name, query);
  check_compatible(name, query, key);
  check_compatible(name, query, value);
  MPT_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, name,
            ": query, key and value must be [batch, length, heads, dim], got ", describe(query), ", ", describe(key),
            ", ", describe(value));
  const Shape &qs = query.shape(), &ks = key.shape(), &vs = value.shape();
  MPT_CHECK(ks[0] == qs[0] && vs[0] == qs[0] && ks[2] == qs[2] && vs[2] == qs[2] && ks[3] == qs[3] && vs[1] == ks[1],
            name, ": shapes do not match: query ", to_string(qs), " [B, Tq, H, D], key ", to_string(ks),
            " [B, Tk, H, D], value ", to_string(vs), " [B, Tk, H, Dv]");
  AttentionGeometry g;
  g.batch = qs[0], g.q_len = qs[1], g.heads = qs[2], g.head_dim = qs[3], g.kv_len = ks[1], g.value_dim = vs[3];
  g.scale = o.scale.value_or(g.head_dim > 0 ? 1.0 / std::sqrt(static_cast<double>(g.head_dim)) : 1.0);
  MPT_CHECK(std::isfinite(g.scale), name, ": scale must be finite, got ", g.scale);
  g.causal = o.is_causal;
  const Tensor mask = attention_mask(name, o.mask, query, g.kv_len, g.mask_heads);

  Backend& be = backend_of(query);
  // 16-bit inputs on a backend with a fused engine (cuDNN's flash attention; the CPU's tiles,
  // which widen while packing): 16-bit in and out, the softmax statistics in float32; the
  // backward through the fused engine too where it has one, else in float32 from the engine's
  // lse.
  if (is_half(query.dtype()) && key.dtype() == query.dtype() && value.dtype() == query.dtype()) {
    Tensor out = Tensor::empty({g.batch, g.q_len, g.heads, g.value_dim}, query.dtype(), query.device());
    Tensor lse = Tensor::empty({g.batch, g.heads, g.q_len}, float32, query.device());
    if (be.fused_attention(query.detach(), key.detach(), value.detach(), mask, g, out, lse)) {
      autograd::record(name, {query, key, value}, {&out},
                       [q = query.detach(), k = key.detach(), v = value.detach(), mask, g, o = out.detach(),
                        lse](const std::vector<Tensor>& grads) {
                         const Tensor dout = grads[0].dtype() == q.dtype() ? grads[0] : grads[0].to(q.dtype());
                         Tensor dq16 = Tensor::empty(q.shape(), q.dtype(), q.device());
                         Tensor dk16 = Tensor::empty(k.shape(), k.dtype(), k.device());
                         Tensor dv16 = Tensor::empty(v.shape(), v.dtype(), v.device());
                         if (backend_of(q).fused_attention_backward(q, k, v, mask, o, lse, dout, g, dq16, dk16, dv16))
                           return std::vector<Tensor>{dq16, dk16, dv16};
                         auto f32 = [](const Tensor& t) { return t.to(float32); };
                         const Tensor qf = f32(q), kf = f32(k), vf = f32(v);
                         Tensor dq = Tensor::empty(q.shape(), float32, q.device());
                         Tensor dk = Tensor::empty(k.shape(), float32, k.device());
                         Tensor dv = Tensor::empty(v.shape(), float32, v.device());
                         backend_of(q).attention_backward(qf, kf, vf, mask, f32(o), lse, f32(grads[0]), g, dq, dk, dv);
                         return std::vector<Tensor>{dq.to(q.dtype()), dk.to(k.dtype()), dv.to(v.dtype())};
                       });
      return out;
    }
  }
  // Everything in float32 (float64 for float64): the casts carry the gradients back.
  const DType c = query.dtype() == float64 ? float64 : float32;
  auto to_c = [&](const Tensor& t) { return t.dtype() == c ? t : ops::cast(t, c); };
  const Tensor q = to_c(query), k = to_c(key), v = to_c(value);
  Tensor out = Tensor::empty({g.batch, g.q_len, g.heads, g.value_dim}, c, query.device());
  Tensor lse = Tensor::empty({g.batch, g.heads, g.q_len}, c, query.device());
  be.attention(q.detach(), k.detach(), v.detach(), mask, g, out, lse);
  autograd::record(name, {q, k, v}, {&out},
                   [q = q.detach(), k = k.detach(), v = v.detach(), mask, g, o = out.detach(),
                    lse](const std::vector<Tensor>& grads) {
                     Tensor dq = Tensor::empty(q.shape(), q.dtype(), q.device());
                     Tensor dk = Tensor::empty(k.shape(), k.dtype(), k.device());
                     Tensor dv = Tensor::empty(v.shape(), v.dtype(), v.device());
                     Tensor dout = grads[0].dtype() == o.dtype() ? grads[0] : grads[0].to(o.dtype());
                     backend_of(q).attention_backward(q, k, v, mask, o, lse, dout, g, dq, dk, dv);
                     return std::vector<Tensor>{dq, dk, dv};
                   });
  return out.dtype() == query.dtype() ? out : ops::cast(out, query.dtype());
}

}  // namespace mpt::ops

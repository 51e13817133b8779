#pragma once
// Scaled dot-product attention, one row at a time, for both backends: the CPU runs these bodies
// per row on its threads, the CUDA kernels per row on theirs, so both give the same bits.
// Layout as Keras's: q [B, Tq, H, D], k [B, Tk, H, D], v [B, Tk, H, Dv], out [B, Tq, H, Dv];
// computed in C (float for float32 and 16-bit inputs, which ops casts first; double for
// float64). Memory never grows with Tq·Tk: the forward pass keeps each row's log-sum-exp
// [B, H, Tq] (an online softmax over the keys, as FlashAttention), and the backward pass
// recomputes the probabilities from it:
//   forward          o_i = Σ_j p_ij v_j,  p_ij = exp(s_ij - lse_i),  s_ij = scale · q_i·k_j
//   delta            δ_i = do_i · o_i
//   dq (per query)   dq_i = scale · Σ_j p_ij (do_i·v_j - δ_i) k_j
//   dk, dv (per key) dk_j = scale · Σ_i p_ij (do_i·v_j - δ_i) q_i,  dv_j = Σ_i p_ij do_i
// Masked pairs (causal: j > i; a mask entry false) are skipped: their probability is exactly 0.
// A query row that attends to nothing gives zeros and no gradient (lse = -inf).
#include <cstdint>
#include <cmath>

#include "backend/common/unary_ops.hpp"  // exact::, fn::

namespace mpt {

/// Sizes and options of one attention call.
struct AttentionGeometry {
  std::int64_t batch = 0, q_len = 0, kv_len = 0, heads = 0, head_dim = 0, value_dim = 0;
  double scale = 1.0;
  bool causal = false;
  /// 0: no mask; 1 or heads: a uint8/bool mask [batch, mask_heads, q_len, kv_len] (true attends).
  std::int64_t mask_heads = 0;
};

}  // namespace mpt

namespace mpt::common {

/// Whether query i of (b, h) attends to key j.
MPT_HOST_DEVICE inline bool attends(const AttentionGeometry& g, const std::uint8_t* mask, std::int64_t b,
                                    std::int64_t h, std::int64_t i, std::int64_t j) {
  if (g.causal && j > i) return false;
  if (!mask) return true;
  const std::int64_t mh = g.mask_heads == 1 ? 0 : h;
  return mask[((b * g.mask_heads + mh) * g.q_len + i) * g.kv_len + j] != 0;
}

/// Σ_d a[d] b[d], in order (the same rounding everywhere).
template <class C>
MPT_HOST_DEVICE inline C dot(const C* a, const C* b, std::int64_t n) {
  C s = C(0);
  for (std::int64_t d = 0; d < n; ++d) s = exact::add(s, exact::mul(a[d], b[d]));
  return s;
}

/// Forward pass of query row `row` = (b·H + h)·Tq + i: its output row and log-sum-exp.
template <class C>
MPT_HOST_DEVICE void attention_forward_row(const AttentionGeometry& g, const C* q, const C* k, const C* v,
                                           const std::uint8_t* mask, C* out, C* lse, std::int64_t row) {
  const std::int64_t i = row % g.q_len, bh = row / g.q_len, h = bh % g.heads, b = bh / g.heads;
  const C* qi = q + ((b * g.q_len + i) * g.heads + h) * g.head_dim;
  C* oi = out + ((b * g.q_len + i) * g.heads + h) * g.value_dim;
  const C scale = C(g.scale);
  C m = -C(INFINITY), l = C(0);
  for (std::int64_t d = 0; d < g.value_dim; ++d) oi[d] = C(0);
  for (std::int64_t j = 0; j < g.kv_len; ++j) {
    if (!attends(g, mask, b, h, i, j)) continue;
    const C s = exact::mul(dot(qi, k + ((b * g.kv_len + j) * g.heads + h) * g.head_dim, g.head_dim), scale);
    if (s > m) {  // a new maximum: rescale what was summed so far
      const C correction = fn::exp(exact::sub(m, s));
      l = exact::mul(l, correction);
      for (std::int64_t d = 0; d < g.value_dim; ++d) oi[d] = exact::mul(oi[d], correction);
      m = s;
    }
    const C p = fn::exp(exact::sub(s, m));
    l = exact::add(l, p);
    const C* vj = v + ((b * g.kv_len + j) * g.heads + h) * g.value_dim;
    for (std::int64_t d = 0; d < g.value_dim; ++d) oi[d] = exact::add(oi[d], exact::mul(p, vj[d]));
  }
  if (!(l > C(0))) {  // attends to nothing
    for (std::int64_t d = 0; d < g.value_dim; ++d) oi[d] = C(0);
    lse[row] = -C(INFINITY);
    return;
  }
  for (std::int64_t d = 0; d < g.value_dim; ++d) oi[d] = exact::div(oi[d], l);
  lse[row] = exact::add(m, fn::log(l));
}

/// δ of query row `row`: do_i · o_i.
template <class C>
MPT_HOST_DEVICE void attention_delta_row(const AttentionGeometry& g, const C* out, const C* dout, C* delta,
                                         std::int64_t row) {
  const std::int64_t i = row % g.q_len, bh = row / g.q_len, h = bh % g.heads, b = bh / g.heads;
  const std::int64_t o = ((b * g.q_len + i) * g.heads + h) * g.value_dim;
  delta[row] = dot(dout + o, out + o, g.value_dim);
}

/// The probability p_ij and ds_ij = p_ij (do_i·v_j - δ_i) of one attended pair.
template <class C>
MPT_HOST_DEVICE inline void attention_pair_grad(const AttentionGeometry& g, const C* qi, const C* kj, const C* vj,
                                                const C* doi, C lse_i, C delta_i, C& p, C& ds) {
  const C s = exact::mul(dot(qi, kj, g.head_dim), C(g.scale));
  p = fn::exp(exact::sub(s, lse_i));
  ds = exact::mul(p, exact::sub(dot(doi, vj, g.value_dim), delta_i));
}

/// dq of query row `row` (overwritten).
template <class C>
MPT_HOST_DEVICE void attention_dq_row(const AttentionGeometry& g, const C* q, const C* k, const C* v,
                                      const std::uint8_t* mask, const C* lse, const C* delta, const C* dout, C* dq,
                                      std::int64_t row) {
  const std::int64_t i = row % g.q_len, bh = row / g.q_len, h = bh % g.heads, b = bh / g.heads;
  const std::int64_t qo = ((b * g.q_len + i) * g.heads + h) * g.head_dim;
  const C* doi = dout + ((b * g.q_len + i) * g.heads + h) * g.value_dim;
  C* dqi = dq + qo;
  for (std::int64_t d = 0; d < g.head_dim; ++d) dqi[d] = C(0);
  if (!(lse[row] > -C(INFINITY))) return;
  for (std::int64_t j = 0; j < g.kv_len; ++j) {
    if (!attends(g, mask, b, h, i, j)) continue;
    const C* kj = k + ((b * g.kv_len + j) * g.heads + h) * g.head_dim;
    C p, ds;
    attention_pair_grad(g, q + qo, kj, v + ((b * g.kv_len + j) * g.heads + h) * g.value_dim, doi, lse[row],
                        delta[row], p, ds);
    for (std::int64_t d = 0; d < g.head_dim; ++d) dqi[d] = exact::add(dqi[d], exact::mul(ds, kj[d]));
  }
  for (std::int64_t d = 0; d < g.head_dim; ++d) dqi[d] = exact::mul(dqi[d], C(g.scale));
}

/// dk and dv of key row `row` = (b·H + h)·Tk + j (overwritten).
template <class C>
MPT_HOST_DEVICE void attention_dkv_row(const AttentionGeometry& g, const C* q, const C* k, const C* v,
                                       const std::uint8_t* mask, const C* lse, const C* delta, const C* dout, C* dk,
                                       C* dv, std::int64_t row) {
  const std::int64_t j = row % g.kv_len, bh = row / g.kv_len, h = bh % g.heads, b = bh / g.heads;
  const std::int64_t ko = ((b * g.kv_len + j) * g.heads + h) * g.head_dim;
  const std::int64_t vo = ((b * g.kv_len + j) * g.heads + h) * g.value_dim;
  C* dkj = dk + ko;
  C* dvj = dv + vo;
  for (std::int64_t d = 0; d < g.head_dim; ++d) dkj[d] = C(0);
  for (std::int64_t d = 0; d < g.value_dim; ++d) dvj[d] = C(0);
  for (std::int64_t i = 0; i < g.q_len; ++i) {
    if (!attends(g, mask, b, h, i, j)) continue;
    const std::int64_t r = bh * g.q_len + i;
    const C* qi = q + ((b * g.q_len + i) * g.heads + h) * g.head_dim;
    const C* doi = dout + ((b * g.q_len + i) * g.heads + h) * g.value_dim;
    C p, ds;
    attention_pair_grad(g, qi, k + ko, v + vo, doi, lse[r], delta[r], p, ds);
    for (std::int64_t d = 0; d < g.head_dim; ++d) dkj[d] = exact::add(dkj[d], exact::mul(ds, qi[d]));
    for (std::int64_t d = 0; d < g.value_dim; ++d) dvj[d] = exact::add(dvj[d], exact::mul(p, doi[d]));
  }
  for (std::int64_t d = 0; d < g.head_dim; ++d) dkj[d] = exact::mul(dkj[d], C(g.scale));
}

}  // namespace mpt::common

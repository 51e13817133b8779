#pragma once
// Scaled dot-product attention, one row at a time: the bodies of the CUDA backend's own kernels
// (float32, float64 and explicit masks; cuDNN's fused graphs take 16-bit inputs), which the tests
// run on the host against the CPU backend's tiled attention.
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
//
// The row's own vectors (its q or k, do, and the accumulators) are `RowVec<N, C>`: with N > 0
// (head and value dims ≤ N) a local array whose every loop runs to N under a bound check, so a
// GPU thread keeps it in registers; with N = 0 (any dim) the row's place in memory, the output
// serving as the accumulator. Both run the same operations in the same order: the same bits.
// On a GPU, the threads of a warp take consecutive rows of one (batch, head), so they read the
// same key (or query) row at once.
#include <cstdint>
#include <cmath>
#include <type_traits>

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

/// f(d) for d = 0 .. n-1, in order: unrolled to N (n ≤ N) when N > 0.
template <int N, class F>
MPT_HOST_DEVICE inline void for_lanes(std::int64_t n, F&& f) {
  if constexpr (N == 0) {
    for (std::int64_t d = 0; d < n; ++d) f(d);
  } else {
    MPT_UNROLL
    for (int d = 0; d < N; ++d)
      if (d < n) f(d);
  }
}

/// A row's vector: N > 0, a local array of N (n ≤ N used); N = 0, a view of the row in memory.
template <int N, class C>
struct RowVec {
  std::remove_const_t<C> v[N];
  MPT_HOST_DEVICE RowVec(C* mem, std::int64_t n, bool load) {
    if (load) for_lanes<N>(n, [&](std::int64_t d) { v[d] = mem[d]; });
  }
  MPT_HOST_DEVICE C& operator[](std::int64_t d) { return v[d]; }
  MPT_HOST_DEVICE const C& operator[](std::int64_t d) const { return v[d]; }
  MPT_HOST_DEVICE void store(C* mem, std::int64_t n) const {
    for_lanes<N>(n, [&](std::int64_t d) { mem[d] = v[d]; });
  }
};
template <class C>
struct RowVec<0, C> {
  C* p;
  MPT_HOST_DEVICE RowVec(C* mem, std::int64_t, bool) : p(mem) {}
  MPT_HOST_DEVICE C& operator[](std::int64_t d) { return p[d]; }
  MPT_HOST_DEVICE const C& operator[](std::int64_t d) const { return p[d]; }
  MPT_HOST_DEVICE void store(C*, std::int64_t) const {}  // it is the memory
};

/// Σ_d a[d] b[d], in order (the same rounding everywhere).
template <int N, class C, class A, class B>
MPT_HOST_DEVICE inline C dot(const A& a, const B& b, std::int64_t n) {
  C s = C(0);
  for_lanes<N>(n, [&](std::int64_t d) { s = exact::add(s, exact::mul(a[d], b[d])); });
  return s;
}

/// The keys query i may attend to lie in [0, end): causal attention stops at the diagonal.
MPT_HOST_DEVICE inline std::int64_t keys_end(const AttentionGeometry& g, std::int64_t i) {
  return g.causal && i + 1 < g.kv_len ? i + 1 : g.kv_len;
}

/// Forward pass of query row `row` = (b·H + h)·Tq + i: its output row and log-sum-exp.
template <int N, class C>
MPT_HOST_DEVICE void attention_forward_row(const AttentionGeometry& g, const C* q, const C* k, const C* v,
                                           const std::uint8_t* mask, C* out, C* lse, std::int64_t row) {
  const std::int64_t i = row % g.q_len, bh = row / g.q_len, h = bh % g.heads, b = bh / g.heads;
  const std::int64_t D = g.head_dim, Dv = g.value_dim;
  const RowVec<N, const C> qi(q + ((b * g.q_len + i) * g.heads + h) * D, D, true);
  C* const orow = out + ((b * g.q_len + i) * g.heads + h) * Dv;
  RowVec<N, C> oi(orow, Dv, false);
  const C scale = C(g.scale);
  C m = -C(INFINITY), l = C(0);
  for_lanes<N>(Dv, [&](std::int64_t d) { oi[d] = C(0); });
  const std::int64_t end = keys_end(g, i);
  for (std::int64_t j = 0; j < end; ++j) {
    if (!attends(g, mask, b, h, i, j)) continue;
    const C s = exact::mul(dot<N, C>(qi, k + ((b * g.kv_len + j) * g.heads + h) * D, D), scale);
    if (s > m) {  // a new maximum: rescale what was summed so far
      const C correction = fn::exp(exact::sub(m, s));
      l = exact::mul(l, correction);
      for_lanes<N>(Dv, [&](std::int64_t d) { oi[d] = exact::mul(oi[d], correction); });
      m = s;
    }
    const C p = fn::exp(exact::sub(s, m));
    l = exact::add(l, p);
    const C* vj = v + ((b * g.kv_len + j) * g.heads + h) * Dv;
    for_lanes<N>(Dv, [&](std::int64_t d) { oi[d] = exact::add(oi[d], exact::mul(p, vj[d])); });
  }
  if (!(l > C(0))) {  // attends to nothing
    for_lanes<N>(Dv, [&](std::int64_t d) { orow[d] = C(0); });
    lse[row] = -C(INFINITY);
    return;
  }
  for_lanes<N>(Dv, [&](std::int64_t d) { oi[d] = exact::div(oi[d], l); });
  oi.store(orow, Dv);
  lse[row] = exact::add(m, fn::log(l));
}

/// δ of query row `row`: do_i · o_i.
template <int N, class C>
MPT_HOST_DEVICE void attention_delta_row(const AttentionGeometry& g, const C* out, const C* dout, C* delta,
                                         std::int64_t row) {
  const std::int64_t i = row % g.q_len, bh = row / g.q_len, h = bh % g.heads, b = bh / g.heads;
  const std::int64_t o = ((b * g.q_len + i) * g.heads + h) * g.value_dim;
  delta[row] = dot<N, C>(dout + o, out + o, g.value_dim);
}

/// The probability p_ij of an attended pair.
template <int N, class C, class Q, class K>
MPT_HOST_DEVICE inline C attention_pair_p(const AttentionGeometry& g, const Q& qi, const K& kj, C lse_i) {
  const C s = exact::mul(dot<N, C>(qi, kj, g.head_dim), C(g.scale));
  return fn::exp(exact::sub(s, lse_i));
}

/// The probability p_ij and ds_ij = p_ij (do_i·v_j - δ_i) of one attended pair.
template <int N, class C, class Q, class K, class V, class DO>
MPT_HOST_DEVICE inline void attention_pair_grad(const AttentionGeometry& g, const Q& qi, const K& kj, const V& vj,
                                                const DO& doi, C lse_i, C delta_i, C& p, C& ds) {
  p = attention_pair_p<N>(g, qi, kj, lse_i);
  ds = exact::mul(p, exact::sub(dot<N, C>(doi, vj, g.value_dim), delta_i));
}

/// dq of query row `row` (overwritten).
template <int N, class C>
MPT_HOST_DEVICE void attention_dq_row(const AttentionGeometry& g, const C* q, const C* k, const C* v,
                                      const std::uint8_t* mask, const C* lse, const C* delta, const C* dout, C* dq,
                                      std::int64_t row) {
  const std::int64_t i = row % g.q_len, bh = row / g.q_len, h = bh % g.heads, b = bh / g.heads;
  const std::int64_t D = g.head_dim, Dv = g.value_dim;
  const std::int64_t qo = ((b * g.q_len + i) * g.heads + h) * D;
  C* const dqrow = dq + qo;
  RowVec<N, C> dqi(dqrow, D, false);
  for_lanes<N>(D, [&](std::int64_t d) { dqi[d] = C(0); });
  if (!(lse[row] > -C(INFINITY))) {
    dqi.store(dqrow, D);
    return;
  }
  const RowVec<N, const C> qi(q + qo, D, true);
  const RowVec<N, const C> doi(dout + ((b * g.q_len + i) * g.heads + h) * Dv, Dv, true);
  const C lse_i = lse[row], delta_i = delta[row];
  const std::int64_t end = keys_end(g, i);
  for (std::int64_t j = 0; j < end; ++j) {
    if (!attends(g, mask, b, h, i, j)) continue;
    const C* kj = k + ((b * g.kv_len + j) * g.heads + h) * D;
    C p, ds;
    attention_pair_grad<N>(g, qi, kj, v + ((b * g.kv_len + j) * g.heads + h) * Dv, doi, lse_i, delta_i, p, ds);
    for_lanes<N>(D, [&](std::int64_t d) { dqi[d] = exact::add(dqi[d], exact::mul(ds, kj[d])); });
  }
  for_lanes<N>(D, [&](std::int64_t d) { dqi[d] = exact::mul(dqi[d], C(g.scale)); });
  dqi.store(dqrow, D);
}

/// dk and dv of key row `row` = (b·H + h)·Tk + j (overwritten), or only one of them (kDk,
/// kDv): with registers for the row vectors, the GPU computes them in two kernels, each holding
/// what it needs (dv: k and the dv sum; dk: k, v and the dk sum), the same p and ds in both.
template <int N, class C, bool kDk = true, bool kDv = true>
MPT_HOST_DEVICE void attention_dkv_row(const AttentionGeometry& g, const C* q, const C* k, const C* v,
                                       const std::uint8_t* mask, const C* lse, const C* delta, const C* dout, C* dk,
                                       C* dv, std::int64_t row) {
  constexpr int NK = kDk ? N : 0, NV = kDv ? N : 0;  // the sums not computed: views, never touched
  const std::int64_t j = row % g.kv_len, bh = row / g.kv_len, h = bh % g.heads, b = bh / g.heads;
  const std::int64_t D = g.head_dim, Dv = g.value_dim;
  const std::int64_t ko = ((b * g.kv_len + j) * g.heads + h) * D;
  const std::int64_t vo = ((b * g.kv_len + j) * g.heads + h) * Dv;
  const RowVec<N, const C> kj(k + ko, D, true);
  const RowVec<NK, const C> vj(v + vo, Dv, kDk);
  RowVec<NK, C> dkj(dk + ko, D, false);
  RowVec<NV, C> dvj(dv + vo, Dv, false);
  if constexpr (kDk) for_lanes<N>(D, [&](std::int64_t d) { dkj[d] = C(0); });
  if constexpr (kDv) for_lanes<N>(Dv, [&](std::int64_t d) { dvj[d] = C(0); });
  // Causal: only queries i >= j see key j. The loop starts at j rounded down to a multiple of
  // 32 rather than at j, so that the 32 threads of a GPU warp (keys j0 .. j0+31) step through the
  // same query rows together (one read of each for the warp); attends() skips i < j.
  for (std::int64_t i = g.causal ? j - j % 32 : 0; i < g.q_len; ++i) {
    if (!attends(g, mask, b, h, i, j)) continue;
    const std::int64_t r = bh * g.q_len + i;
    const C* qi = q + ((b * g.q_len + i) * g.heads + h) * D;
    const C* doi = dout + ((b * g.q_len + i) * g.heads + h) * Dv;
    C p, ds;
    if constexpr (kDk) {
      attention_pair_grad<N>(g, qi, kj, vj, doi, lse[r], delta[r], p, ds);
      for_lanes<N>(D, [&](std::int64_t d) { dkj[d] = exact::add(dkj[d], exact::mul(ds, qi[d])); });
    } else {
      p = attention_pair_p<N>(g, qi, kj, lse[r]);
    }
    if constexpr (kDv) for_lanes<N>(Dv, [&](std::int64_t d) { dvj[d] = exact::add(dvj[d], exact::mul(p, doi[d])); });
  }
  if constexpr (kDk) {
    for_lanes<N>(D, [&](std::int64_t d) { dkj[d] = exact::mul(dkj[d], C(g.scale)); });
    dkj.store(dk + ko, D);
  }
  if constexpr (kDv) dvj.store(dv + vo, Dv);
}

}  // namespace mpt::common

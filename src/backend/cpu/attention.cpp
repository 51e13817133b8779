// Scaled dot-product attention on the CPU, tiled as FlashAttention-2: blocks of kBq query rows
// against blocks of kBk keys, the products of each pair of blocks as small register-blocked GEMMs
// on vector lanes, the softmax online (a running maximum and sum per query row), and nothing of
// size Tq·Tk ever stored: the forward keeps the output and each row's log-sum-exp [B, H, Tq]; the
// backward recomputes each block of probabilities from it. The arithmetic is that of
// backend/common/attention.hpp's row bodies (the CUDA kernels'), summed in another order:
//   forward      s_ij = (scale·q_i)·k_j,  p_ij = exp(s_ij - lse_i),  o_i = Σ_j p_ij v_j
//   backward     δ_i = do_i·o_i,  ds_ij = p_ij (do_i·v_j - δ_i)
//                dq_i = scale · Σ_j ds_ij k_j,  dk_j = Σ_i ds_ij (scale·q_i),  dv_j = Σ_i p_ij do_i
// Masked pairs (causal j > i, a mask entry false) have probability exactly 0; a query row that
// attends to nothing gives zeros, lse = -inf and no gradient. float32 (16-bit inputs are cast by
// ops first) and float64, one template; the forward runs its (batch, head, query block) items on
// the threads, the backward its (batch, head) pairs, each owning its rows of dq, dk and dv, so
// the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/common/attention.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/vector_types.hpp"

namespace mpt::cpu {
namespace {

constexpr std::int64_t kBq = 64;  // query rows per tile
constexpr std::int64_t kBk = 64;  // keys per tile

// ---- lanes ------------------------------------------------------------------------------------

/// 64 bytes of lanes of C (one AVX-512 register in the avx512f clone) and its comparison mask.
template <class C> struct Simd;
template <> struct Simd<float> {
  using V = float __attribute__((vector_size(64)));
  using M = std::int32_t __attribute__((vector_size(64)));
  static constexpr std::int64_t W = 16;
};
template <> struct Simd<double> {
  using V = double __attribute__((vector_size(64)));
  using M = std::int64_t __attribute__((vector_size(64)));
  static constexpr std::int64_t W = 8;
};
template <class C> using V = typename Simd<C>::V;
template <class C> using M = typename Simd<C>::M;

template <class C>
[[gnu::always_inline]] inline V<C> vload(const C* p) {
  return load_lanes<V<C>>(p);
}
template <class C>
[[gnu::always_inline]] inline void vstore(C* p, const V<C>& v) {
  store_lanes(p, v);
}
/// x in every lane (a vector-scalar operation broadcasts: one instruction, not one per lane).
template <class C>
[[gnu::always_inline]] inline V<C> vsplat(C x) {
  return V<C>{} + x;
}
/// Lanewise m ? a : b.
template <class C>
[[gnu::always_inline]] inline V<C> vselect(const M<C>& m, const V<C>& a, const V<C>& b) {
  M<C> ai, bi;
  __builtin_memcpy(&ai, &a, sizeof ai);
  __builtin_memcpy(&bi, &b, sizeof bi);
  const M<C> r = (ai & m) | (bi & ~m);
  V<C> out;
  __builtin_memcpy(&out, &r, sizeof out);
  return out;
}
template <class C>
[[gnu::always_inline]] inline C hmax(const V<C>& v) {
  C m = v[0];
  for (std::int64_t i = 1; i < Simd<C>::W; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
template <class C>
[[gnu::always_inline]] inline C hsum(const V<C>& v) {
  C s = C(0);
  for (std::int64_t i = 0; i < Simd<C>::W; ++i) s += v[i];
  return s;
}

/// e^x on float lanes: common/float_math.hpp's exp (0 for -inf; within 2 ulp).
[[gnu::always_inline]] inline V<float> vexp(const V<float>& x) { return common::exp_f32<LaneOps>(x); }
/// float64: libm's exp lane by lane (float64 attention is the reference, not a speed path).
[[gnu::always_inline]] inline V<double> vexp(const V<double>& x) {
  V<double> r;
  for (std::int64_t i = 0; i < Simd<double>::W; ++i) r[i] = std::exp(x[i]);
  return r;
}

// ---- small GEMMs ------------------------------------------------------------------------------

/// R rows by NV vectors of c (= or +=) a · b over k: a(r, p) = a[r·lda + p] (TransA: a[p·lda + r]),
/// b rows of ldb, c rows of ldc.
template <class C, bool Acc, bool TransA, int R, int NV>
[[gnu::always_inline]] inline void micro(std::int64_t k, const C* __restrict a, std::int64_t lda,
                                         const C* __restrict b, std::int64_t ldb, C* __restrict c, std::int64_t ldc) {
  constexpr std::int64_t W = Simd<C>::W;
  V<C> acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = Acc ? vload(c + r * ldc + v * W) : V<C>{};
  for (std::int64_t p = 0; p < k; ++p) {
    V<C> bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = vload(b + p * ldb + v * W);
    for (int r = 0; r < R; ++r) {
      const V<C> av = vsplat<C>(TransA ? a[p * lda + r] : a[r * lda + p]);
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) vstore(c + r * ldc + v * W, acc[r][v]);
}

/// Rows [i, i + R) of gemm's c (every helper is inlined into its caller's clone).
template <class C, bool Acc, bool TransA, int R>
[[gnu::always_inline]] inline void gemm_rows(std::int64_t i, std::int64_t n, std::int64_t k, const C* a,
                                             std::int64_t lda, const C* b, std::int64_t ldb, C* c, std::int64_t ldc) {
  constexpr std::int64_t W = Simd<C>::W;
  const C* ai = TransA ? a + i : a + i * lda;
  std::int64_t j = 0;
  for (; j + 2 * W <= n; j += 2 * W) micro<C, Acc, TransA, R, 2>(k, ai, lda, b + j, ldb, c + i * ldc + j, ldc);
  for (; j < n; j += W) micro<C, Acc, TransA, R, 1>(k, ai, lda, b + j, ldb, c + i * ldc + j, ldc);
}

/// c[m × n] (= or +=) a[m × k] · b[k × n] (a transposed: TransA), n a multiple of the lanes.
template <class C, bool Acc, bool TransA>
[[gnu::always_inline]] inline void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const C* a, std::int64_t lda,
                                        const C* b, std::int64_t ldb, C* c, std::int64_t ldc) {
  std::int64_t i = 0;
  for (; i + 4 <= m; i += 4) gemm_rows<C, Acc, TransA, 4>(i, n, k, a, lda, b, ldb, c, ldc);
  for (; i < m; ++i) gemm_rows<C, Acc, TransA, 1>(i, n, k, a, lda, b, ldb, c, ldc);
}

// ---- tiles ------------------------------------------------------------------------------------

/// Where (b, h)'s rows are and how wide the padded tiles are.
template <class C>
struct Tiles {
  const AttentionGeometry& g;
  const std::uint8_t* mask;
  std::int64_t dp, dvp;  // head_dim and value_dim rounded up to whole vectors

  explicit Tiles(const AttentionGeometry& geometry, const std::uint8_t* m)
      : g(geometry), mask(m), dp(round_up(geometry.head_dim)), dvp(round_up(geometry.value_dim)) {}
  static std::int64_t round_up(std::int64_t n) { return (n + Simd<C>::W - 1) / Simd<C>::W * Simd<C>::W; }

  std::int64_t q_at(std::int64_t b, std::int64_t h, std::int64_t i) const { return ((b * g.q_len + i) * g.heads + h); }
  std::int64_t k_at(std::int64_t b, std::int64_t h, std::int64_t j) const { return ((b * g.kv_len + j) * g.heads + h); }

  /// n rows of `width` values (row i at src + at(i) · width) into kRows rows of ld, zero beyond
  /// (and beyond width), times `mul`.
  template <class At>
  static void gather(const C* src, At at, std::int64_t n, std::int64_t width, std::int64_t rows, std::int64_t ld,
                     C* dst, C mul = C(1)) {
    for (std::int64_t r = 0; r < rows; ++r) {
      C* d = dst + r * ld;
      if (r < n) {
        const C* s = src + at(r) * width;
        for (std::int64_t c = 0; c < width; ++c) d[c] = s[c] * mul;
        std::fill(d + width, d + ld, C(0));
      } else {
        std::fill(d, d + ld, C(0));
      }
    }
  }
  /// Rows [j0, j0 + nk) of k or v, transposed: dst[d · kBk + c] = src row j0 + c, column d; zero
  /// for c >= nk.
  void gather_t(const C* src, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t nk, std::int64_t width,
                C* dst) const {
    for (std::int64_t d = 0; d < width; ++d) std::fill(dst + d * kBk + nk, dst + (d + 1) * kBk, C(0));
    for (std::int64_t c = 0; c < nk; ++c) {
      const C* s = src + k_at(b, h, j0 + c) * width;
      for (std::int64_t d = 0; d < width; ++d) dst[d * kBk + c] = s[d];
    }
  }
  /// Whether the block of queries [i0, i0 + nq) and keys [j0, j0 + nk) has masked pairs.
  bool partly_masked(std::int64_t i0, std::int64_t j0, std::int64_t nk) const {
    return mask || (g.causal && j0 + nk - 1 > i0);
  }
  /// s[r · kBk + c] = -inf where query i0 + r does not attend to key j0 + c, or c >= nk.
  void mask_tile(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq, std::int64_t j0, std::int64_t nk,
                 C* s) const {
    const bool inner = partly_masked(i0, j0, nk);
    for (std::int64_t r = 0; r < nq; ++r) {
      C* sr = s + r * kBk;
      if (inner)
        for (std::int64_t c = 0; c < nk; ++c)
          if (!common::attends(g, mask, b, h, i0 + r, j0 + c)) sr[c] = -std::numeric_limits<C>::infinity();
      for (std::int64_t c = nk; c < kBk; ++c) sr[c] = -std::numeric_limits<C>::infinity();
    }
  }
  /// The keys a block of queries [i0, i0 + nq) can attend to: [0, key_end).
  std::int64_t key_end(std::int64_t i0, std::int64_t nq) const {
    return g.causal ? std::min(g.kv_len, i0 + nq) : g.kv_len;
  }
};

/// Scratch of one thread: tiles of the padded widths.
template <class C>
struct Scratch {
  std::vector<C> q, kt, vt, kb, vb, s, dp, o, dout, dk, dv, dq, m, l, lse, delta;
};

/// Forward of query rows [i0, i0 + nq) of (b, h).
template <class C>
MPT_KERNEL void forward_tile(const Tiles<C>& t, const C* q, const C* k, const C* v, C* out, C* lse,
                                    std::int64_t b, std::int64_t h, std::int64_t i0, Scratch<C>& w) {
  constexpr std::int64_t W = Simd<C>::W;
  const AttentionGeometry& g = t.g;
  const std::int64_t nq = std::min(kBq, g.q_len - i0), D = g.head_dim, Dv = g.value_dim;
  const C inf = std::numeric_limits<C>::infinity();
  Tiles<C>::gather(q, [&](std::int64_t r) { return t.q_at(b, h, i0 + r); }, nq, D, kBq, t.dp, w.q.data(), C(g.scale));
  std::fill(w.o.begin(), w.o.end(), C(0));
  std::fill(w.m.begin(), w.m.end(), -inf);
  std::fill(w.l.begin(), w.l.end(), C(0));
  const std::int64_t end = t.key_end(i0, nq);
  for (std::int64_t j0 = 0; j0 < end; j0 += kBk) {
    const std::int64_t nk = std::min(kBk, end - j0);
    t.gather_t(k, b, h, j0, nk, D, w.kt.data());
    Tiles<C>::gather(v, [&](std::int64_t c) { return t.k_at(b, h, j0 + c); }, nk, Dv, nk, t.dvp, w.vb.data());
    C* s = w.s.data();
    gemm<C, false, false>(nq, kBk, D, w.q.data(), t.dp, w.kt.data(), kBk, s, kBk);
    if (nk < kBk || t.partly_masked(i0, j0, nk)) t.mask_tile(b, h, i0, nq, j0, nk, s);
    for (std::int64_t r = 0; r < nq; ++r) {
      C* sr = s + r * kBk;
      V<C> mx = vload(sr);
      for (std::int64_t c = W; c < kBk; c += W) {
        const V<C> x = vload(sr + c);
        mx = vselect<C>(x > mx, x, mx);
      }
      const C m_new = std::max(w.m[r], hmax<C>(mx));
      if (m_new == -inf) {  // nothing attended yet: this block's probabilities are 0
        std::fill(sr, sr + kBk, C(0));
        continue;
      }
      const V<C> mv = vsplat(m_new);
      V<C> sum{};
      for (std::int64_t c = 0; c < kBk; c += W) {
        const V<C> p = vexp(vload(sr + c) - mv);
        vstore(sr + c, p);
        sum += p;
      }
      if (w.m[r] != m_new) {  // a new maximum: rescale what was summed so far
        const C corr = std::exp(w.m[r] - m_new);
        w.l[r] *= corr;
        const V<C> cv = vsplat(corr);
        for (std::int64_t d = 0; d < t.dvp; d += W) vstore(&w.o[r * t.dvp + d], vload(&w.o[r * t.dvp + d]) * cv);
        w.m[r] = m_new;
      }
      w.l[r] += hsum<C>(sum);
    }
    gemm<C, true, false>(nq, t.dvp, nk, s, kBk, w.vb.data(), t.dvp, w.o.data(), t.dvp);
  }
  for (std::int64_t r = 0; r < nq; ++r) {
    C* o = out + t.q_at(b, h, i0 + r) * Dv;
    C& l = lse[(b * g.heads + h) * g.q_len + i0 + r];
    if (!(w.l[r] > C(0))) {  // attends to nothing
      std::fill(o, o + Dv, C(0));
      l = -inf;
      continue;
    }
    const C inv = C(1) / w.l[r];
    for (std::int64_t d = 0; d < Dv; ++d) o[d] = w.o[r * t.dvp + d] * inv;
    l = w.m[r] + std::log(w.l[r]);
  }
}

/// Backward of (b, h): its rows of dq, dk and dv (overwritten).
template <class C>
MPT_KERNEL void backward_pair(const Tiles<C>& t, const C* q, const C* k, const C* v, const C* out,
                                     const C* lse, const C* dout, C* dq, C* dk, C* dv, std::int64_t b, std::int64_t h,
                                     Scratch<C>& w) {
  constexpr std::int64_t W = Simd<C>::W;
  const AttentionGeometry& g = t.g;
  const std::int64_t D = g.head_dim, Dv = g.value_dim, dp = t.dp, dvp = t.dvp;
  const C scale = C(g.scale), inf = std::numeric_limits<C>::infinity();
  const C* lse_bh = lse + (b * g.heads + h) * g.q_len;
  w.delta.resize(static_cast<std::size_t>(g.q_len));
  for (std::int64_t i = 0; i < g.q_len; ++i) {
    const C *o = out + t.q_at(b, h, i) * Dv, *d = dout + t.q_at(b, h, i) * Dv;
    C s = C(0);
    for (std::int64_t c = 0; c < Dv; ++c) s += d[c] * o[c];
    w.delta[static_cast<std::size_t>(i)] = s;
    std::fill(dq + t.q_at(b, h, i) * D, dq + t.q_at(b, h, i) * D + D, C(0));
  }
  for (std::int64_t j0 = 0; j0 < g.kv_len; j0 += kBk) {
    const std::int64_t nk = std::min(kBk, g.kv_len - j0);
    auto key = [&](std::int64_t c) { return t.k_at(b, h, j0 + c); };
    Tiles<C>::gather(k, key, nk, D, kBk, dp, w.kb.data());
    t.gather_t(k, b, h, j0, nk, D, w.kt.data());
    t.gather_t(v, b, h, j0, nk, Dv, w.vt.data());
    std::fill(w.dk.begin(), w.dk.end(), C(0));
    std::fill(w.dv.begin(), w.dv.end(), C(0));
    // Causal: queries before j0 attend to none of these keys.
    for (std::int64_t i0 = g.causal ? j0 / kBq * kBq : 0; i0 < g.q_len; i0 += kBq) {
      const std::int64_t nq = std::min(kBq, g.q_len - i0);
      auto query = [&](std::int64_t r) { return t.q_at(b, h, i0 + r); };
      Tiles<C>::gather(q, query, nq, D, nq, dp, w.q.data(), scale);
      Tiles<C>::gather(dout, query, nq, Dv, nq, dvp, w.dout.data());
      C *s = w.s.data(), *dpr = w.dp.data();
      gemm<C, false, false>(nq, kBk, D, w.q.data(), dp, w.kt.data(), kBk, s, kBk);        // s = (scale q) kᵀ
      gemm<C, false, false>(nq, kBk, Dv, w.dout.data(), dvp, w.vt.data(), kBk, dpr, kBk);  // dp = do vᵀ
      if (nk < kBk || t.partly_masked(i0, j0, nk)) t.mask_tile(b, h, i0, nq, j0, nk, s);
      for (std::int64_t r = 0; r < nq; ++r) {
        C *sr = s + r * kBk, *dr = dpr + r * kBk;
        const C l = lse_bh[i0 + r];
        if (l == -inf) {  // attends to nothing: no gradient
          std::fill(sr, sr + kBk, C(0));
          std::fill(dr, dr + kBk, C(0));
          continue;
        }
        const V<C> lv = vsplat(l), dv_ = vsplat(w.delta[static_cast<std::size_t>(i0 + r)]);
        for (std::int64_t c = 0; c < kBk; c += W) {
          const V<C> p = vexp(vload(sr + c) - lv);
          vstore(sr + c, p);                          // p
          vstore(dr + c, p * (vload(dr + c) - dv_));  // ds
        }
      }
      gemm<C, true, true>(nk, dvp, nq, s, kBk, w.dout.data(), dvp, w.dv.data(), dvp);   // dv += pᵀ do
      gemm<C, true, true>(nk, dp, nq, dpr, kBk, w.q.data(), dp, w.dk.data(), dp);       // dk += dsᵀ (scale q)
      gemm<C, false, false>(nq, dp, nk, dpr, kBk, w.kb.data(), dp, w.dq.data(), dp);     // dq part = ds k
      for (std::int64_t r = 0; r < nq; ++r) {
        C* d = dq + query(r) * D;
        for (std::int64_t c = 0; c < D; ++c) d[c] += w.dq[r * dp + c] * scale;
      }
    }
    for (std::int64_t c = 0; c < nk; ++c) {
      std::copy_n(&w.dk[c * dp], D, dk + key(c) * D);
      std::copy_n(&w.dv[c * dvp], Dv, dv + key(c) * Dv);
    }
  }
}

template <class C>
Scratch<C> scratch_for(const Tiles<C>& t) {
  Scratch<C> w;
  const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  w.q.resize(n(kBq * t.dp)), w.kt.resize(n(std::max(t.dp, t.dvp) * kBk)), w.vt.resize(n(t.dvp * kBk));
  w.kb.resize(n(kBk * t.dp)), w.vb.resize(n(kBk * t.dvp)), w.s.resize(n(kBq * kBk)), w.dp.resize(n(kBq * kBk));
  w.o.resize(n(kBq * t.dvp)), w.dout.resize(n(kBq * t.dvp)), w.dk.resize(n(kBk * t.dp)), w.dv.resize(n(kBk * t.dvp));
  w.dq.resize(n(kBq * t.dp)), w.m.resize(n(kBq)), w.l.resize(n(kBq));
  return w;
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                           const AttentionGeometry& g, Tensor& out, Tensor& lse) {
  auto run = [&](auto c) {
    using C = decltype(c);
    const Tiles<C> t(g, mask.defined() ? static_cast<const std::uint8_t*>(mask.data_ptr()) : nullptr);
    const C *pq = q.data<C>(), *pk = k.data<C>(), *pv = v.data<C>();
    C *po = out.data<C>(), *pl = lse.data<C>();
    const std::int64_t blocks = (g.q_len + kBq - 1) / kBq;
    parallel_for(g.batch * g.heads * blocks, 1, [&](std::int64_t lo, std::int64_t hi) {
      Scratch<C> w = scratch_for(t);
      for (std::int64_t item = lo; item < hi; ++item) {
        const std::int64_t bh = item / blocks;
        isa_call<forward_tile<C>>(t, pq, pk, pv, po, pl, bh / g.heads, bh % g.heads, item % blocks * kBq, w);
      }
    });
  };
  // float32 or float64 operands: ops casts 16-bit inputs first.
  if (q.dtype() == float64) run(double{});
  else run(float{});
}

void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout,
                                    const AttentionGeometry& g, Tensor& dq, Tensor& dk, Tensor& dv) {
  auto run = [&](auto c) {
    using C = decltype(c);
    const Tiles<C> t(g, mask.defined() ? static_cast<const std::uint8_t*>(mask.data_ptr()) : nullptr);
    const C *pq = q.data<C>(), *pk = k.data<C>(), *pv = v.data<C>(), *po = out.data<C>(), *pl = lse.data<C>(),
            *pd = dout.data<C>();
    C *pdq = dq.data<C>(), *pdk = dk.data<C>(), *pdv = dv.data<C>();
    parallel_for(g.batch * g.heads, 1, [&](std::int64_t lo, std::int64_t hi) {
      Scratch<C> w = scratch_for(t);
      for (std::int64_t bh = lo; bh < hi; ++bh)
        isa_call<backward_pair<C>>(t, pq, pk, pv, po, pl, pd, pdq, pdk, pdv, bh / g.heads, bh % g.heads, w);
    });
  };
  if (q.dtype() == float64) run(double{});
  else run(float{});
}

}  // namespace mpt::cpu

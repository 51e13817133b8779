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
// attends to nothing gives zeros, lse = -inf and no gradient. One template for float32, float64
// and 16-bit inputs (bfloat16, float16: fused_attention), which are widened to float32 as they are
// packed and rounded once at the end, so 16-bit attention costs no separate casts and gives the
// bits of the float32 computation on the widened inputs, rounded. Each thread packs one
// (batch, head)'s operands once, whole: k transposed and v for the forward's query blocks, and
// q (times scale), do, k, kᵀ and vᵀ for the backward (memory linear in T, never T²). The forward
// runs its (batch, head, query block) items on the threads, the backward its (batch, head) pairs,
// each owning its rows of dq, dk and dv, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/common/attention.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/micro_gemm.hpp"
#include "backend/cpu/vector_types.hpp"

namespace mpt::cpu {
namespace {

constexpr std::int64_t kBq = 64;  // query rows per tile
constexpr std::int64_t kBk = 64;  // keys per tile
// A causal tile on the diagonal (keys j0.. = queries i0..) is computed in groups of kDiag query
// rows (keys likewise), each only as far as its last row attends: 10 of 16 column blocks instead
// of all, the rest being masked to -inf (probability exactly 0) either way. The sums skip only
// zero terms, in the same order.
constexpr std::int64_t kDiag = 16;
static_assert(kBq == kBk && kBq % kDiag == 0, "diagonal tiles need square tiles of whole groups");

// The GEMM bodies handed to row_groups and key_groups are MPT_INLINE_LAMBDA (isa_dispatch.hpp).

/// Calls f(r0, m, reach) for the nq query rows of a tile: rows [r0, r0 + m) attend at most its
/// keys [0, reach). A causal tile on the diagonal gives groups of kDiag rows reaching r0 + kDiag;
/// any other tile one group of all its rows, reaching the whole tile.
template <class F>
[[gnu::always_inline]] inline void row_groups(bool diagonal, std::int64_t nq, F&& f) {
  if (!diagonal) return f(std::int64_t{0}, nq, kBk);
  for (std::int64_t r0 = 0; r0 < nq; r0 += kDiag) f(r0, std::min(kDiag, nq - r0), std::min(kBk, r0 + kDiag));
}
/// Calls f(c0, m) for the nk keys of a tile with nq query rows: keys [c0, c0 + m) are attended
/// by queries c0 and after only on a causal diagonal tile (groups of kDiag keys, none past the
/// last query); any other tile gives one group of all its keys, from query 0.
template <class F>
[[gnu::always_inline]] inline void key_groups(bool diagonal, std::int64_t nk, std::int64_t nq, F&& f) {
  if (!diagonal) return f(std::int64_t{0}, nk);
  for (std::int64_t c0 = 0; c0 < std::min(nk, nq); c0 += kDiag) f(c0, std::min(kDiag, nk - c0));
}

// ---- lanes ------------------------------------------------------------------------------------

/// B bytes of lanes of C: vector_types.hpp's Lanes.
template <class C, int B> using Simd = Lanes<C, B>;
template <class C, int B> using V = typename Simd<C, B>::V;
template <class C, int B> using M = typename Simd<C, B>::M;

template <int B, class C>
[[gnu::always_inline]] inline V<C, B> vload(const C* p) {
  return load_lanes<V<C, B>>(p);
}
template <int B, class C>
[[gnu::always_inline]] inline void vstore(C* p, const V<C, B>& v) {
  store_lanes(p, v);
}
/// x in every lane.
template <int B, class C>
[[gnu::always_inline]] inline V<C, B> vsplat(C x) {
  return V<C, B>{} + x;
}
/// Lanewise m ? a : b.
template <class C, int B>
[[gnu::always_inline]] inline V<C, B> vselect(const M<C, B>& m, const V<C, B>& a, const V<C, B>& b) {
  M<C, B> ai, bi;
  __builtin_memcpy(&ai, &a, sizeof ai);
  __builtin_memcpy(&bi, &b, sizeof bi);
  const M<C, B> r = (ai & m) | (bi & ~m);
  V<C, B> out;
  __builtin_memcpy(&out, &r, sizeof out);
  return out;
}
/// The lanes of v folded pairwise, halves first (a tree: log2 W dependent steps, not W - 1 in
/// a chain; the forward folds two per row of every tile), down to 16 bytes, then in order.
template <class C, int B, class F>
[[gnu::always_inline]] inline C fold(const V<C, B>& v, F f) {
  if constexpr (B > 16) {
    V<C, B / 2> lo, hi;
    __builtin_memcpy(&lo, &v, sizeof lo);
    __builtin_memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    return fold<C, B / 2>(f(lo, hi), f);
  } else {
    C r = v[0];
    for (std::int64_t i = 1; i < Simd<C, B>::W; ++i) r = f(r, v[i]);
    return r;
  }
}
template <class C, int B>
[[gnu::always_inline]] inline C hmax(const V<C, B>& v) {
  return fold<C, B>(v, [](auto a, auto b) MPT_INLINE_LAMBDA { return b > a ? b : a; });
}
template <class C, int B>
[[gnu::always_inline]] inline C hsum(const V<C, B>& v) {
  return fold<C, B>(v, [](auto a, auto b) MPT_INLINE_LAMBDA { return a + b; });
}

/// e^x on float lanes: common/float_math.hpp's exp (0 for -inf; within 2 ulp).
template <int B>
[[gnu::always_inline]] inline V<float, B> vexp(const V<float, B>& x) {
  return common::exp_f32<LaneOpsN<B>>(x);
}
/// float64: libm's exp lane by lane (float64 attention is the reference, not a speed path).
template <int B>
[[gnu::always_inline]] inline V<double, B> vexp(const V<double, B>& x) {
  V<double, B> r;
  for (std::int64_t i = 0; i < Simd<double, B>::W; ++i) r[i] = std::exp(x[i]);
  return r;
}

// ---- small GEMMs (micro_gemm.hpp's tiles) ----------------------------------------------------

/// Rows [i, i + R) of gemm's c (every helper is inlined into its caller's clone).
template <class C, int B, bool Acc, bool TransA, int R>
[[gnu::always_inline]] inline void gemm_rows(std::int64_t i, std::int64_t n, std::int64_t k, const C* a,
                                             std::int64_t lda, const C* b, std::int64_t ldb, C* c, std::int64_t ldc) {
  constexpr std::int64_t W = Simd<C, B>::W;
  const C* ai = TransA ? a + i : a + i * lda;
  std::int64_t j = 0;
  for (; j + 2 * W <= n; j += 2 * W) micro_tile<C, B, Acc, TransA, R, 2>(k, ai, lda, b + j, ldb, c + i * ldc + j, ldc);
  for (; j < n; j += W) micro_tile<C, B, Acc, TransA, R, 1>(k, ai, lda, b + j, ldb, c + i * ldc + j, ldc);
}

/// c[m × n] (= or +=) a[m × k] · b[k × n] (a transposed: TransA), n a multiple of the lanes.
template <class C, int B, bool Acc, bool TransA>
[[gnu::always_inline]] inline void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const C* a, std::int64_t lda,
                                        const C* b, std::int64_t ldb, C* c, std::int64_t ldc) {
  std::int64_t i = 0;
  // 8 rows by 2 vectors: 16 accumulators, for the 32 registers of AVX-512 (measured 10-20 %
  // faster than 4 rows there); the 16 of AVX2 and SSE take 4 rows.
  if constexpr (B == 64)
    for (; i + 8 <= m; i += 8) gemm_rows<C, B, Acc, TransA, 8>(i, n, k, a, lda, b, ldb, c, ldc);
  for (; i + 4 <= m; i += 4) gemm_rows<C, B, Acc, TransA, 4>(i, n, k, a, lda, b, ldb, c, ldc);
  for (; i < m; ++i) gemm_rows<C, B, Acc, TransA, 1>(i, n, k, a, lda, b, ldb, c, ldc);
}

// ---- element types ---------------------------------------------------------------------------

/// bfloat16 and float16 bits in a tensor (tags for the templates; same size and layout).
struct Bf16 { std::uint16_t bits; };
struct F16 { std::uint16_t bits; };

/// How n values of T become compute values C (times mul) and back, inside a kernel of B-byte
/// lanes: float32 and float64 as they are; bfloat16 and float16 widened and rounded on the
/// kernel's own lanes (Io16: the bulk conversions' bits, without a call per packed row: they had
/// been 7 % of a bfloat16 transformer step).
template <class T> struct Io {
  using C = T;
  template <int B>
  [[gnu::always_inline]] static void in(const T* s, C* d, std::int64_t n, C mul) {
    for (std::int64_t i = 0; i < n; ++i) d[i] = s[i] * mul;
  }
  template <int B>
  [[gnu::always_inline]] static void out(const C* s, T* d, std::int64_t n) { std::copy_n(s, n, d); }
};
/// The 16-bit tags: load_widened in, narrow_n out (the bulk conversion's bits; the product by mul,
/// 1 where there is no scale, also quiets a signalling NaN as the bulk conversion does).
template <Widen S>
struct Io16 {
  using C = float;
  template <int B>
  [[gnu::always_inline]] static void in(const void* s, C* d, std::int64_t n, C mul) {
    using F = typename Lanes<float, B>::V;
    constexpr std::int64_t W = Lanes<float, B>::W;
    const auto* p = static_cast<const char*>(s);
    const F mv = LaneOpsN<B>::splat(mul);
    std::int64_t i = 0;
    for (; i + W <= n; i += W) store_lanes(d + i, load_widened<S, B>(p + i * 2) * mv);
    for (; i < n; ++i) d[i] = widen_one<S>(p + i * 2) * mul;
  }
  template <int B>
  [[gnu::always_inline]] static void out(const C* s, void* d, std::int64_t n) { narrow_n<S, B>(s, d, n); }
};
template <> struct Io<Bf16> : Io16<Widen::bf16> {};
template <> struct Io<F16> : Io16<Widen::f16> {};
template <class T> using Compute = typename Io<T>::C;

// ---- packing ----------------------------------------------------------------------------------

/// Where (b, h)'s rows are and how wide the packed operands are.
struct Layout {
  const AttentionGeometry& g;
  const std::uint8_t* mask;
  std::int64_t dp, dvp;  // head_dim and value_dim rounded up to whole vectors
  std::int64_t tqp, tkp;  // q_len and kv_len rounded up to whole tiles

  Layout(const AttentionGeometry& geometry, const std::uint8_t* m, std::int64_t lanes)
      : g(geometry), mask(m), dp(up(geometry.head_dim, lanes)), dvp(up(geometry.value_dim, lanes)),
        tqp(up(geometry.q_len, kBq)), tkp(up(geometry.kv_len, kBk)) {}
  static std::int64_t up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

  std::int64_t q_at(std::int64_t b, std::int64_t h, std::int64_t i) const { return ((b * g.q_len + i) * g.heads + h); }
  std::int64_t k_at(std::int64_t b, std::int64_t h, std::int64_t j) const { return ((b * g.kv_len + j) * g.heads + h); }

  /// Whether the block of queries [i0, i0 + nq) and keys [j0, j0 + nk) has masked pairs.
  bool partly_masked(std::int64_t i0, std::int64_t j0, std::int64_t nk) const {
    return mask || (g.causal && j0 + nk - 1 > i0);
  }
  /// s[r · kBk + c] = -inf where query i0 + r does not attend to key j0 + c, or c >= nk.
  template <class C>
  void mask_tile(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t nq, std::int64_t j0, std::int64_t nk,
                 C* s) const {
    const C ninf = -std::numeric_limits<C>::infinity();
    const bool inner = partly_masked(i0, j0, nk);
    for (std::int64_t r = 0; r < nq; ++r) {
      C* sr = s + r * kBk;
      std::int64_t first = nk;  // the first masked column from which all are masked
      if (inner && !mask) {     // causal alone: keys after the query's own
        first = std::clamp<std::int64_t>(i0 + r - j0 + 1, 0, nk);
      } else if (inner) {
        for (std::int64_t c = 0; c < nk; ++c)
          if (!common::attends(g, mask, b, h, i0 + r, j0 + c)) sr[c] = ninf;
      }
      std::fill(sr + first, sr + kBk, ninf);
    }
  }
  /// Asks for rows [r0, r1) of `width` values (row r at base + at(r) · width) in the L2 cache
  /// ahead of their use, Rw 1 to be written. The rows of one (batch, head) are short runs a
  /// head's width apart: packed or written when they are needed, they had waited on memory
  /// (a quarter of the backward).
  template <int Rw, class T, class At>
  [[gnu::always_inline]] static void prefetch_rows(const T* base, At at, std::int64_t r0, std::int64_t r1,
                                                   std::int64_t width) {
    const std::int64_t bytes = width * static_cast<std::int64_t>(sizeof(T));
    for (std::int64_t r = r0; r < r1; ++r) {
      const char* p = reinterpret_cast<const char*>(base + at(r) * width);
      for (std::int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, Rw, 2);
    }
  }
  /// Part `part` of `parts` of n rows: [n · part / parts, n · (part + 1) / parts).
  static std::int64_t share(std::int64_t n, std::int64_t part, std::int64_t parts) { return n * part / parts; }

  /// The keys a block of queries [i0, i0 + nq) can attend to: [0, key_end).
  std::int64_t key_end(std::int64_t i0, std::int64_t nq) const {
    return g.causal ? std::min(g.kv_len, i0 + nq) : g.kv_len;
  }

  /// n rows of `width` values (row r at src + at(r) · width) as C times mul into rows of ld
  /// (dst), zero beyond width; rows [n, rows) zero.
  template <int B, class T, class At>
  [[gnu::always_inline]] static void pack_rows(const T* src, At at, std::int64_t n, std::int64_t width, std::int64_t rows, std::int64_t ld,
                        Compute<T>* dst, Compute<T> mul = 1) {
    using C = Compute<T>;
    for (std::int64_t r = 0; r < rows; ++r) {
      C* d = dst + r * ld;
      if (r < n) {
        Io<T>::template in<B>(src + at(r) * width, d, width, mul);
        std::fill(d + width, d + ld, C(0));
      } else {
        std::fill(d, d + ld, C(0));
      }
    }
  }
  /// The transpose of rows packed by pack_rows (n rows of ld, of which `width` columns are
  /// wanted): dst[d · ldt + r] for d < width, r < rows (ldt >= rows: the packed length), zero for
  /// r >= n.
  /// float32 rows of whole vectors (ld a multiple of the tier's lanes: dp and dvp are) go W x W
  /// squares at a time through registers (transpose_square), the rows past n being pack_rows's
  /// zeros (dst's rows [width, ld) get the zero columns); other element types one value at a time.
  template <int B, class C>
  MPT_KERNEL static void transpose(const C* rows, std::int64_t n, std::int64_t width, std::int64_t ld, std::int64_t ldt,
                                   C* dst) {
    if constexpr (std::is_same_v<C, float>) {
      constexpr std::int64_t W = Lanes<float, B>::W;
      if (ld % W == 0 && ldt % W == 0) {
        for (std::int64_t r0 = 0; r0 < ldt; r0 += W)
          for (std::int64_t d0 = 0; d0 < ld; d0 += W) transpose_square<B>(rows + r0 * ld + d0, ld, dst + d0 * ldt + r0, ldt);
        return;
      }
    }
    constexpr std::int64_t kB = 16;
    for (std::int64_t r0 = 0; r0 < ldt; r0 += kB)
      for (std::int64_t d = 0; d < width; ++d) {
        C* o = dst + d * ldt + r0;
        for (std::int64_t r = 0; r < kB; ++r) o[r] = r0 + r < n ? rows[(r0 + r) * ld + d] : C(0);
      }
  }
};

/// Scratch of one thread: tiles, and the packed operands of the (batch, head) it holds.
template <class C>
struct Scratch {
  std::int64_t bh = -1;  // the forward's: the (batch, head) packed in k, kt and v
  std::vector<C> q, k, kt, vt, v, dout, dq, s, dp, o, dk, dv, m, l, delta, row;
};

/// Forward of query rows [i0, i0 + nq) of (b, h).
template <class T, int B>
MPT_KERNEL void forward_tile(const Layout& t, const T* q, const T* k, const T* v, T* out, Compute<T>* lse,
                             std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t next_bh,
                             Scratch<Compute<T>>& w) {
  using C = Compute<T>;
  constexpr std::int64_t W = Simd<C, B>::W;
  const AttentionGeometry& g = t.g;
  const std::int64_t nq = std::min(kBq, g.q_len - i0), D = g.head_dim, Dv = g.value_dim;
  const C inf = std::numeric_limits<C>::infinity();
  const std::int64_t bh = b * g.heads + h;
  if (w.bh != bh) {  // pack this (batch, head)'s keys (transposed) and values once
    auto key = [&](std::int64_t j) { return t.k_at(b, h, j); };
    Layout::pack_rows<B>(k, key, g.kv_len, D, t.tkp, t.dp, w.k.data());
    Layout::transpose<B>(w.k.data(), g.kv_len, D, t.dp, t.tkp, w.kt.data());
    Layout::pack_rows<B>(v, key, g.kv_len, Dv, t.tkp, t.dvp, w.v.data());
    w.bh = bh;
  }
  Layout::pack_rows<B>(q, [&](std::int64_t r) { return t.q_at(b, h, i0 + r); }, nq, D, kBq, t.dp, w.q.data(),
                    C(g.scale));
  {  // ahead of their use: this tile's output rows, the next tile's queries, a share of the next pair's keys and values
    auto query = [&](std::int64_t i) { return t.q_at(b, h, i); };
    Layout::prefetch_rows<1>(out, query, i0, i0 + nq, Dv);
    if (i0 + nq < g.q_len) Layout::prefetch_rows<0>(q, query, i0 + nq, std::min(g.q_len, i0 + nq + kBq), D);
    if (next_bh >= 0) {
      const std::int64_t nb = next_bh / g.heads, nh = next_bh % g.heads, blocks = (g.q_len + kBq - 1) / kBq,
                         part = i0 / kBq;
      auto key = [&](std::int64_t j) { return t.k_at(nb, nh, j); };
      const std::int64_t j0 = Layout::share(g.kv_len, part, blocks), j1 = Layout::share(g.kv_len, part + 1, blocks);
      Layout::prefetch_rows<0>(k, key, j0, j1, D);
      Layout::prefetch_rows<0>(v, key, j0, j1, Dv);
      if (part + 1 == blocks) Layout::prefetch_rows<0>(q, [&](std::int64_t i) { return t.q_at(nb, nh, i); }, 0, std::min(g.q_len, kBq), D);
    }
  }
  std::fill(w.o.begin(), w.o.end(), C(0));
  std::fill(w.m.begin(), w.m.end(), -inf);
  std::fill(w.l.begin(), w.l.end(), C(0));
  const std::int64_t end = t.key_end(i0, nq);
  for (std::int64_t j0 = 0; j0 < end; j0 += kBk) {
    const std::int64_t nk = std::min(kBk, end - j0);
    C* s = w.s.data();
    const bool diagonal = g.causal && j0 == i0;
    row_groups(diagonal, nq, [&](std::int64_t r0, std::int64_t m, std::int64_t reach) MPT_INLINE_LAMBDA {
      gemm<C, B, false, false>(m, reach, D, w.q.data() + r0 * t.dp, t.dp, w.kt.data() + j0, t.tkp, s + r0 * kBk, kBk);
    });
    if (nk < kBk || t.partly_masked(i0, j0, nk)) t.mask_tile(b, h, i0, nq, j0, nk, s);
    for (std::int64_t r = 0; r < nq; ++r) {
      C* sr = s + r * kBk;
      V<C, B> mx = vload<B>(sr);
      for (std::int64_t c = W; c < kBk; c += W) {
        const V<C, B> x = vload<B>(sr + c);
        mx = vselect<C, B>(x > mx, x, mx);
      }
      const C m_new = std::max(w.m[r], hmax<C, B>(mx));
      if (m_new == -inf) {  // nothing attended yet: this block's probabilities are 0
        std::fill(sr, sr + kBk, C(0));
        continue;
      }
      const V<C, B> mv = vsplat<B>(m_new);
      V<C, B> sum{};
      for (std::int64_t c = 0; c < kBk; c += W) {
        const V<C, B> p = vexp<B>(vload<B>(sr + c) - mv);
        vstore<B>(sr + c, p);
        sum += p;
      }
      if (w.m[r] != m_new) {  // a new maximum: rescale what was summed so far
        const C corr = std::exp(w.m[r] - m_new);
        w.l[r] *= corr;
        const V<C, B> cv = vsplat<B>(corr);
        for (std::int64_t d = 0; d < t.dvp; d += W) vstore<B>(&w.o[r * t.dvp + d], vload<B>(&w.o[r * t.dvp + d]) * cv);
        w.m[r] = m_new;
      }
      w.l[r] += hsum<C, B>(sum);
    }
    row_groups(diagonal, nq, [&](std::int64_t r0, std::int64_t m, std::int64_t reach) MPT_INLINE_LAMBDA {
      gemm<C, B, true, false>(m, t.dvp, std::min(nk, reach), s + r0 * kBk, kBk, w.v.data() + j0 * t.dvp, t.dvp,
                              w.o.data() + r0 * t.dvp, t.dvp);
    });
  }
  for (std::int64_t r = 0; r < nq; ++r) {
    T* o = out + t.q_at(b, h, i0 + r) * Dv;
    C& l = lse[bh * g.q_len + i0 + r];
    C* row = w.row.data();
    if (!(w.l[r] > C(0))) {  // attends to nothing
      std::fill(row, row + Dv, C(0));
      l = -inf;
    } else {
      const C inv = C(1) / w.l[r];
      for (std::int64_t d = 0; d < Dv; ++d) row[d] = w.o[r * t.dvp + d] * inv;
      l = w.m[r] + std::log(w.l[r]);
    }
    Io<T>::template out<B>(row, o, Dv);
  }
}

/// Backward of (b, h): its rows of dq, dk and dv (overwritten).
template <class T, int B>
MPT_KERNEL void backward_pair(const Layout& t, const T* q, const T* k, const T* v, const T* out,
                              const Compute<T>* lse, const T* dout, T* dq, T* dk, T* dv, std::int64_t b,
                              std::int64_t h, std::int64_t next_bh, Scratch<Compute<T>>& w) {
  using C = Compute<T>;
  constexpr std::int64_t W = Simd<C, B>::W;
  const AttentionGeometry& g = t.g;
  const std::int64_t D = g.head_dim, Dv = g.value_dim, dp = t.dp, dvp = t.dvp;
  const C scale = C(g.scale), inf = std::numeric_limits<C>::infinity();
  const C* lse_bh = lse + (b * g.heads + h) * g.q_len;
  auto query = [&](std::int64_t i) { return t.q_at(b, h, i); };
  auto key = [&](std::int64_t j) { return t.k_at(b, h, j); };
  // This (batch, head)'s operands, packed once: q·scale, do, k, kᵀ, vᵀ; dq's float sums.
  Layout::pack_rows<B>(q, query, g.q_len, D, t.tqp, dp, w.q.data(), scale);
  Layout::pack_rows<B>(dout, query, g.q_len, Dv, t.tqp, dvp, w.dout.data());
  Layout::pack_rows<B>(k, key, g.kv_len, D, t.tkp, dp, w.k.data());
  Layout::transpose<B>(w.k.data(), g.kv_len, D, dp, t.tkp, w.kt.data());
  Layout::pack_rows<B>(v, key, g.kv_len, Dv, t.tkp, dvp, w.v.data());
  Layout::transpose<B>(w.v.data(), g.kv_len, Dv, dvp, t.tkp, w.vt.data());
  std::fill(w.dq.begin(), w.dq.end(), C(0));
  C* o = w.row.data();
  std::fill(o + Dv, o + dvp, C(0));  // do's packed rows are zero there too
  for (std::int64_t i = 0; i < g.q_len; ++i) {  // δ_i = do_i · o_i, on the lanes (a scalar chain had been 7 % of the backward)
    Io<T>::template in<B>(out + query(i) * Dv, o, Dv, C(1));
    const C* d = w.dout.data() + i * dvp;
    V<C, B> acc{};
    for (std::int64_t c = 0; c < dvp; c += W) acc += vload<B>(d + c) * vload<B>(o + c);
    w.delta[static_cast<std::size_t>(i)] = hsum<C, B>(acc);
  }
  const std::int64_t kblocks = (g.kv_len + kBk - 1) / kBk;
  for (std::int64_t j0 = 0; j0 < g.kv_len; j0 += kBk) {
    const std::int64_t nk = std::min(kBk, g.kv_len - j0), part = j0 / kBk;
    {  // ahead of their use: this block's rows of dk and dv (dq's with the last), a share of the next pair's inputs
      Layout::prefetch_rows<1>(dk, key, j0, j0 + nk, D);
      Layout::prefetch_rows<1>(dv, key, j0, j0 + nk, Dv);
      if (part + 1 == kblocks) Layout::prefetch_rows<1>(dq, query, 0, g.q_len, D);
      if (next_bh >= 0) {
        const std::int64_t nb = next_bh / g.heads, nh = next_bh % g.heads;
        auto nquery = [&](std::int64_t i) { return t.q_at(nb, nh, i); };
        auto nkey = [&](std::int64_t j) { return t.k_at(nb, nh, j); };
        const std::int64_t i0 = Layout::share(g.q_len, part, kblocks), i1 = Layout::share(g.q_len, part + 1, kblocks);
        const std::int64_t k0 = Layout::share(g.kv_len, part, kblocks), k1 = Layout::share(g.kv_len, part + 1, kblocks);
        Layout::prefetch_rows<0>(q, nquery, i0, i1, D);
        Layout::prefetch_rows<0>(dout, nquery, i0, i1, Dv);
        Layout::prefetch_rows<0>(out, nquery, i0, i1, Dv);
        Layout::prefetch_rows<0>(k, nkey, k0, k1, D);
        Layout::prefetch_rows<0>(v, nkey, k0, k1, Dv);
      }
    }
    std::fill(w.dk.begin(), w.dk.end(), C(0));
    std::fill(w.dv.begin(), w.dv.end(), C(0));
    // Causal: queries before j0 attend to none of these keys.
    for (std::int64_t i0 = g.causal ? j0 / kBq * kBq : 0; i0 < g.q_len; i0 += kBq) {
      const std::int64_t nq = std::min(kBq, g.q_len - i0);
      const C *qs = w.q.data() + i0 * dp, *dob = w.dout.data() + i0 * dvp;
      C *s = w.s.data(), *dpr = w.dp.data();
      const bool diagonal = g.causal && j0 == i0;
      row_groups(diagonal, nq, [&](std::int64_t r0, std::int64_t m, std::int64_t reach) MPT_INLINE_LAMBDA {
        gemm<C, B, false, false>(m, reach, D, qs + r0 * dp, dp, w.kt.data() + j0, t.tkp, s + r0 * kBk, kBk);  // s = (scale q) kᵀ
        gemm<C, B, false, false>(m, reach, Dv, dob + r0 * dvp, dvp, w.vt.data() + j0, t.tkp, dpr + r0 * kBk, kBk);  // dp = do vᵀ
        if (reach < kBk)  // ds = p (dp - δ) is 0 there: dp must not be stale
          for (std::int64_t r = r0; r < r0 + m; ++r) std::fill(dpr + r * kBk + reach, dpr + (r + 1) * kBk, C(0));
      });
      if (nk < kBk || t.partly_masked(i0, j0, nk)) t.mask_tile(b, h, i0, nq, j0, nk, s);
      for (std::int64_t r = 0; r < nq; ++r) {
        C *sr = s + r * kBk, *dr = dpr + r * kBk;
        const C l = lse_bh[i0 + r];
        if (l == -inf) {  // attends to nothing: no gradient
          std::fill(sr, sr + kBk, C(0));
          std::fill(dr, dr + kBk, C(0));
          continue;
        }
        const V<C, B> lv = vsplat<B>(l), dv_ = vsplat<B>(w.delta[static_cast<std::size_t>(i0 + r)]);
        for (std::int64_t c = 0; c < kBk; c += W) {
          const V<C, B> p = vexp<B>(vload<B>(sr + c) - lv);
          vstore<B>(sr + c, p);                          // p
          vstore<B>(dr + c, p * (vload<B>(dr + c) - dv_));  // ds
        }
      }
      key_groups(diagonal, nk, nq, [&](std::int64_t c0, std::int64_t m) MPT_INLINE_LAMBDA {
        gemm<C, B, true, true>(m, dvp, nq - c0, s + c0 * kBk + c0, kBk, dob + c0 * dvp, dvp, w.dv.data() + c0 * dvp,
                               dvp);  // dv += pᵀ do
        gemm<C, B, true, true>(m, dp, nq - c0, dpr + c0 * kBk + c0, kBk, qs + c0 * dp, dp, w.dk.data() + c0 * dp,
                               dp);  // dk += dsᵀ (scale q)
      });
      row_groups(diagonal, nq, [&](std::int64_t r0, std::int64_t m, std::int64_t reach) MPT_INLINE_LAMBDA {  // Σ ds k
        gemm<C, B, true, false>(m, dp, std::min(nk, reach), dpr + r0 * kBk, kBk, w.k.data() + j0 * dp, dp,
                                w.dq.data() + (i0 + r0) * dp, dp);
      });
    }
    for (std::int64_t c = 0; c < nk; ++c) {
      Io<T>::template out<B>(&w.dk[c * dp], dk + key(j0 + c) * D, D);
      Io<T>::template out<B>(&w.dv[c * dvp], dv + key(j0 + c) * Dv, Dv);
    }
  }
  for (std::int64_t i = 0; i < g.q_len; ++i) {  // dq = scale · Σ_j ds_ij k_j
    C* row = w.row.data();
    for (std::int64_t c = 0; c < D; ++c) row[c] = w.dq[i * dp + c] * scale;
    Io<T>::template out<B>(row, dq + query(i) * D, D);
  }
}

template <class C>
Scratch<C> scratch_for(const Layout& t, bool backward) {
  Scratch<C> w;
  const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  const std::int64_t qrows = backward ? t.tqp : kBq;
  w.q.resize(n(qrows * t.dp)), w.k.resize(n(t.tkp * t.dp)), w.kt.resize(n(t.dp * t.tkp));
  w.v.resize(n(t.tkp * t.dvp)), w.s.resize(n(kBq * kBk)), w.row.resize(n(std::max(t.dp, t.dvp)));
  if (backward) {
    w.vt.resize(n(t.dvp * t.tkp)), w.dout.resize(n(t.tqp * t.dvp)), w.dq.resize(n(t.tqp * t.dp));
    w.dp.resize(n(kBq * kBk)), w.dk.resize(n(kBk * t.dp)), w.dv.resize(n(kBk * t.dvp));
    w.delta.resize(n(t.g.q_len));
  } else {
    w.o.resize(n(kBq * t.dvp)), w.m.resize(n(kBq)), w.l.resize(n(kBq));
  }
  return w;
}

/// Calls f(T{}) with q's element type: float, double, Bf16 or F16.
template <class F>
void with_element_type(DType d, F&& f) {
  if (d == float64) f(double{});
  else if (d == bfloat16) f(Bf16{});
  else if (d == float16) f(F16{});
  else f(float{});
}

template <class T>
void run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const AttentionGeometry& g,
                 Tensor& out, Tensor& lse) {
  using C = Compute<T>;
  const Layout t(g, mask.defined() ? static_cast<const std::uint8_t*>(mask.data_ptr()) : nullptr,
                 isa_native_bytes() / static_cast<std::int64_t>(sizeof(C)));
  const T *pq = static_cast<const T*>(q.data_ptr()), *pk = static_cast<const T*>(k.data_ptr()),
          *pv = static_cast<const T*>(v.data_ptr());
  T* po = static_cast<T*>(out.data_ptr());
  C* pl = static_cast<C*>(lse.data_ptr());
  const std::int64_t blocks = (g.q_len + kBq - 1) / kBq;
  // Each thread takes consecutive items, so it packs each (batch, head) it meets once.
  parallel_for(g.batch * g.heads * blocks, 1, [&](std::int64_t lo, std::int64_t hi) {
    Scratch<C> w = scratch_for<C>(t, false);
    for (std::int64_t item = lo; item < hi; ++item) {
      const std::int64_t bh = item / blocks;
      // The next (batch, head) this thread will pack, if any: its rows are fetched meanwhile.
      const std::int64_t next_bh = (bh + 1) * blocks < hi ? bh + 1 : -1;
      isa_call_native<forward_tile<T, 64>, forward_tile<T, 32>, forward_tile<T, 16>>(
          t, pq, pk, pv, po, pl, bh / g.heads, bh % g.heads, item % blocks * kBq, next_bh, w);
    }
  });
}

template <class T>
void run_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& out,
                  const Tensor& lse, const Tensor& dout, const AttentionGeometry& g, Tensor& dq, Tensor& dk,
                  Tensor& dv) {
  using C = Compute<T>;
  const Layout t(g, mask.defined() ? static_cast<const std::uint8_t*>(mask.data_ptr()) : nullptr,
                 isa_native_bytes() / static_cast<std::int64_t>(sizeof(C)));
  auto in = [](const Tensor& x) { return static_cast<const T*>(x.data_ptr()); };
  auto io = [](Tensor& x) { return static_cast<T*>(x.data_ptr()); };
  const T *pq = in(q), *pk = in(k), *pv = in(v), *po = in(out), *pd = in(dout);
  const C* pl = static_cast<const C*>(lse.data_ptr());
  T *pdq = io(dq), *pdk = io(dk), *pdv = io(dv);
  parallel_for(g.batch * g.heads, 1, [&](std::int64_t lo, std::int64_t hi) {
    Scratch<C> w = scratch_for<C>(t, true);
    for (std::int64_t bh = lo; bh < hi; ++bh)
      isa_call_native<backward_pair<T, 64>, backward_pair<T, 32>, backward_pair<T, 16>>(
          t, pq, pk, pv, po, pl, pd, pdq, pdk, pdv, bh / g.heads, bh % g.heads, bh + 1 < hi ? bh + 1 : -1, w);
  });
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                           const AttentionGeometry& g, Tensor& out, Tensor& lse) {
  // float32 or float64 operands (ops casts other dtypes first).
  with_element_type(q.dtype() == float64 ? float64 : float32,
                    [&](auto e) { run_forward<decltype(e)>(q, k, v, mask, g, out, lse); });
}

void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout,
                                    const AttentionGeometry& g, Tensor& dq, Tensor& dk, Tensor& dv) {
  with_element_type(q.dtype() == float64 ? float64 : float32,
                    [&](auto e) { run_backward<decltype(e)>(q, k, v, mask, out, lse, dout, g, dq, dk, dv); });
}

// 16-bit q, k, v: the same kernels, widening while packing and rounding the results once.
bool CpuBackend::fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                 const AttentionGeometry& g, Tensor& out, Tensor& lse) {
  if (!is_half(q.dtype()) || k.dtype() != q.dtype() || v.dtype() != q.dtype()) return false;
  with_element_type(q.dtype(), [&](auto e) { run_forward<decltype(e)>(q, k, v, mask, g, out, lse); });
  return true;
}

bool CpuBackend::fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                          const Tensor& out, const Tensor& lse, const Tensor& dout,
                                          const AttentionGeometry& g, Tensor& dq, Tensor& dk, Tensor& dv) {
  if (!is_half(q.dtype()) || k.dtype() != q.dtype() || v.dtype() != q.dtype() || out.dtype() != q.dtype() ||
      dout.dtype() != q.dtype())
    return false;
  with_element_type(q.dtype(),
                    [&](auto e) { run_backward<decltype(e)>(q, k, v, mask, out, lse, dout, g, dq, dk, dv); });
  return true;
}

}  // namespace mpt::cpu

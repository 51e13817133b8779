// Softmax, log-softmax and the fused softmax-cross-entropy: float32 islands (float64 for
// float64 inputs), whatever the storage dtype.
#include <limits>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/vector_types.hpp"
#include "backend/common/unary_ops.hpp"  // float_math.hpp's exp_f32

namespace mpt::cpu {
namespace {

template <class C>
using Buf = std::vector<C>;

/// Gathers one softmax row (n elements at stride `inner`) into row[0..n) as C.
template <class C>
void gather(const Tensor& t, std::int64_t o, std::int64_t j, std::int64_t n, std::int64_t inner,
            C* row) {
  if (inner == 1) {
    for (std::int64_t i = 0; i < n; i += kBlock) {
      std::int64_t m = std::min(kBlock, n - i);
      const C* p = load<C>(t, o * n + i, m, row + i);
      if (p != row + i) std::copy(p, p + m, row + i);
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    C v;
    row[i] = *load<C>(t, (o * n + i) * inner + j, 1, &v);
  }
}

template <class C>
void scatter(Tensor& t, std::int64_t o, std::int64_t j, std::int64_t n, std::int64_t inner,
             const C* row) {
  const std::size_t sz = itemsize(t.dtype());
  char* base = static_cast<char*>(t.data_ptr());
  if (inner == 1) {
    detail::convert(row, compute_dtype_of<C>(), base + o * n * sz, t.dtype(), n);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i)
    detail::convert(row + i, compute_dtype_of<C>(), base + ((o * n + i) * inner + j) * sz,
                    t.dtype(), 1);
}

/// float32 rows on B bytes of lanes: the maximum, e^(x - max) by common/float_math.hpp's exp_f32
/// (the tail by its scalar form: the same bits), their sum in W partial sums, then the row. libm's
/// expf had run one value at a time (a cross-entropy over 128 classes: 2 % of a transformer step).
template <int B>
MPT_KERNEL void softmax_row_f32(float* row, std::int64_t n, bool log) {
  using L = LaneOpsN<B>;
  using V = typename L::T;
  constexpr std::int64_t W = Lanes<float, B>::W;
  float mx = row[0];
  std::int64_t i = 0;
  if (n >= W) {
    V m = load_lanes<V>(row);
    for (i = W; i + W <= n; i += W) m = L::select(load_lanes<V>(row + i) > m, load_lanes<V>(row + i), m);
    for (std::int64_t j = 0; j < W; ++j) mx = std::max(mx, m[j]);
  }
  for (; i < n; ++i) mx = std::max(mx, row[i]);
  const V mv = L::splat(mx);
  V acc{};
  for (i = 0; i + W <= n; i += W) {
    const V e = common::exp_f32<L>(load_lanes<V>(row + i) - mv);
    acc += e;
    if (!log) store_lanes(row + i, e);
  }
  float sum = 0;
  for (std::int64_t j = 0; j < W; ++j) sum += acc[j];
  for (std::int64_t k = i; k < n; ++k) {
    const float e = common::exp_f32<common::ScalarOps>(row[k] - mx);
    sum += e;
    if (!log) row[k] = e;
  }
  if (log) {
    const float lse = mx + std::log(sum);
    for (i = 0; i < n; ++i) row[i] -= lse;
  } else {
    for (i = 0; i < n; ++i) row[i] /= sum;
  }
}

/// In place: row <- softmax(row) or log_softmax(row).
template <class C>
void softmax_row(C* row, std::int64_t n, bool log) {
  if constexpr (std::is_same_v<C, float>) {
    isa_call_native<softmax_row_f32<64>, softmax_row_f32<32>, softmax_row_f32<16>>(row, n, log);
    return;
  }
  C mx = row[0];
  for (std::int64_t i = 1; i < n; ++i) mx = std::max(mx, row[i]);
  C sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += std::exp(row[i] - mx);
  if (log) {
    C lse = mx + std::log(sum);
    for (std::int64_t i = 0; i < n; ++i) row[i] -= lse;
  } else {
    for (std::int64_t i = 0; i < n; ++i) row[i] = std::exp(row[i] - mx) / sum;
  }
}

template <class F>
void for_rows(const Shape& s, std::int64_t axis, F f) {
  std::int64_t outer, n, inner;
  split_axis(s, axis, outer, n, inner);
  parallel_for(outer * inner, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(n, 1)),
               [&](std::int64_t b, std::int64_t e) {
                 for (std::int64_t u = b; u < e; ++u) f(u / inner, u % inner, n, inner);
               });
}

constexpr double kProbEpsilon = 1e-7;  // Keras's backend.epsilon()

}  // namespace

void CpuBackend::softmax(const Tensor& x, std::int64_t axis, bool log, Tensor& out) {
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    for_rows(x.shape(), axis, [&](std::int64_t o, std::int64_t j, std::int64_t n, std::int64_t inner) {
      Buf<C> row(n);
      gather(x, o, j, n, inner, row.data());
      softmax_row(row.data(), n, log);
      scatter(out, o, j, n, inner, row.data());
    });
  });
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, std::int64_t axis, bool log,
                                  Tensor& dx) {
  with_compute_type(y.dtype(), [&](auto c) {
    using C = decltype(c);
    for_rows(y.shape(), axis, [&](std::int64_t o, std::int64_t j, std::int64_t n, std::int64_t inner) {
      Buf<C> yr(n), gr(n);
      gather(y, o, j, n, inner, yr.data());
      gather(dy, o, j, n, inner, gr.data());
      if (log) {  // dx = g - exp(y) * sum(g)
        C s = 0;
        for (std::int64_t i = 0; i < n; ++i) s += gr[i];
        for (std::int64_t i = 0; i < n; ++i) gr[i] -= std::exp(yr[i]) * s;
      } else {  // dx = y * (g - sum(g * y))
        C s = 0;
        for (std::int64_t i = 0; i < n; ++i) s += gr[i] * yr[i];
        for (std::int64_t i = 0; i < n; ++i) gr[i] = yr[i] * (gr[i] - s);
      }
      scatter(dx, o, j, n, inner, gr.data());
    });
  });
}

namespace {
/// Row of targets as C: one-hot from an integer label, or the given distribution.
template <class C>
void target_row(const Tensor& labels, std::int64_t r, std::int64_t n, C* t) {
  if (is_integer(labels.dtype())) {
    std::int64_t k;
    detail::convert(static_cast<const char*>(labels.data_ptr()) + r * itemsize(labels.dtype()),
                    labels.dtype(), &k, int64, 1);
    // Ops check the range only where labels are host memory; elsewhere a label out of range
    // makes the row's loss and gradient NaN rather than touch memory outside the row.
    if (k < 0 || k >= n) {
      std::fill(t, t + n, std::numeric_limits<C>::quiet_NaN());
      return;
    }
    std::fill(t, t + n, C(0));
    t[k] = C(1);
    return;
  }
  gather(labels, r, 0, n, 1, t);
}

/// q = p / sum(p), and the clipped c = clip(q, eps, 1 - eps) used by Keras on probabilities.
template <class C>
C normalise(C* p, std::int64_t n) {
  C s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += p[i];
  for (std::int64_t i = 0; i < n; ++i) p[i] /= s;
  return s;
}
/// Runs f(r, row, t) for every row r of x [rows, n] with row = x[r] and t = its targets, both as C.
template <class C, class F>
void for_cross_entropy_rows(const Tensor& x, const Tensor& labels, F f) {
  const std::int64_t rows = x.shape()[0], n = x.shape()[1];
  parallel_for(rows, std::max<std::int64_t>(1, 8192 / n), [&](std::int64_t b, std::int64_t e) {
    Buf<C> row(n), t(n);
    for (std::int64_t r = b; r < e; ++r) {
      gather(x, r, 0, n, 1, row.data());
      target_row(labels, r, n, t.data());
      f(r, row.data(), t.data());
    }
  });
}
}  // namespace

void CpuBackend::cross_entropy(const Tensor& x, const Tensor& labels, bool from_logits,
                               Tensor& loss) {
  const std::int64_t n = x.shape()[1];
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    const C eps = C(kProbEpsilon);
    for_cross_entropy_rows<C>(x, labels, [&](std::int64_t r, C* row, const C* t) {
      if (from_logits) {
        softmax_row(row, n, /*log=*/true);
      } else {
        normalise(row, n);
        for (std::int64_t i = 0; i < n; ++i) row[i] = std::log(std::clamp(row[i], eps, C(1) - eps));
      }
      C l = 0;
      for (std::int64_t i = 0; i < n; ++i)
        if (t[i] != C(0)) l -= t[i] * row[i];  // a masked (-inf) logit without target weight adds nothing
      scatter(loss, r, 0, 1, 1, &l);
    });
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& x, const Tensor& labels, bool from_logits,
                                        const Tensor& dloss, Tensor& dx) {
  const std::int64_t n = x.shape()[1];
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    const C eps = C(kProbEpsilon);
    for_cross_entropy_rows<C>(x, labels, [&](std::int64_t r, C* row, const C* t) {
      C g;
      g = *load<C>(dloss, r, 1, &g);
      C tsum = 0;
      for (std::int64_t i = 0; i < n; ++i) tsum += t[i];
      if (from_logits) {  // d/dx = softmax(x) * sum(t) - t
        softmax_row(row, n, /*log=*/false);
        for (std::int64_t i = 0; i < n; ++i) row[i] = g * (row[i] * tsum - t[i]);
      } else {  // through q = p / S and the clip: dq_i = -t_i / q_i inside (eps, 1-eps)
        C s = normalise(row, n);
        C dot = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          C q = row[i];
          C dq = (q > eps && q < C(1) - eps) ? -t[i] / q : C(0);
          dot += dq * q;
          row[i] = dq;
        }
        for (std::int64_t i = 0; i < n; ++i) row[i] = g * (row[i] - dot) / s;
      }
      scatter(dx, r, 0, n, 1, row);
    });
  });
}

}  // namespace mpt::cpu

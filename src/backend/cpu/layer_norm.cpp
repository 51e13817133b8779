// Layer normalization over the last axis of x viewed as [rows, D]: per-row statistics in float64,
// elementwise work in float32 (float64 for float64 data), 16-bit data read and written directly.
// Each row's sums run on 8 float64 lanes (one AVX-512 register in the avx512f clone) and then
// across them: the same order, so the same bits, in every clone.
#include <cmath>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/cpu_common.hpp"
#include "backend/cpu/row_chunks.hpp"
#include "backend/cpu/vector_types.hpp"

namespace mpt::cpu {
namespace {

using D8 = double __attribute__((vector_size(64)));
template <class C> struct Lanes8;
template <> struct Lanes8<float> { using T = float __attribute__((vector_size(32))); };
template <> struct Lanes8<double> { using T = D8; };
template <class C> using L8 = typename Lanes8<C>::T;

// Always inlined into their caller's clone.
template <class C>
[[gnu::always_inline]] inline L8<C> load8(const C* p) {
  return load_lanes<L8<C>>(p);
}
template <class C>
[[gnu::always_inline]] inline D8 widen(L8<C> v) { return __builtin_convertvector(v, D8); }
[[gnu::always_inline]] inline double lane_sum(D8 v) {
  double s = 0;
  for (int j = 0; j < 8; ++j) s += v[j];
  return s;
}

/// One row: y = (x - mean) * rstd * g + b, with the row's mean and rstd (float64 sums).
template <class C>
MPT_KERNEL void forward_row(const C* x, const C* g, const C* b, double eps, std::int64_t d, C* y,
                                   double& mean, double& rstd) {
  D8 a{};
  std::int64_t i = 0;
  for (; i + 8 <= d; i += 8) a += widen<C>(load8(x + i));
  double s = lane_sum(a);
  for (; i < d; ++i) s += static_cast<double>(x[i]);
  const double m = s / static_cast<double>(d);
  D8 a2{};
  for (i = 0; i + 8 <= d; i += 8) {
    const D8 t = widen<C>(load8(x + i)) - m;
    a2 += t * t;
  }
  double s2 = lane_sum(a2);
  for (; i < d; ++i) s2 += (static_cast<double>(x[i]) - m) * (static_cast<double>(x[i]) - m);
  const double rs = 1.0 / std::sqrt(s2 / static_cast<double>(d) + eps);
  mean = m, rstd = rs;
  const C mc = static_cast<C>(m), rc = static_cast<C>(rs);
  for (i = 0; i < d; ++i) y[i] = (x[i] - mc) * rc * g[i] + b[i];
}

/// One row of the backward: xh and gg (scratch), the per-column sums sum(dy*xh) and sum(dy)
/// into acc[0, 2d) when acc is given, and dx when dx is given. One pass over the row computes xh,
/// gg, the column sums and the row's two sums on 8 float64 lanes (four passes had each loaded the
/// row again: a transformer's backward runs nine of these over [4096, 256] a step); the same
/// operations in the same order as before, so the same bits.
template <class C>
MPT_KERNEL void backward_row(const C* x, const C* dy, C m, C rs, const C* g, std::int64_t d, C* xh, C* gg,
                                    double* acc, C* dx) {
  D8 a1{}, a2{};
  std::int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const L8<C> dv = load8(dy + i), h = (load8(x + i) - m) * rs, q = dv * load8(g + i);
    store_lanes(xh + i, h);
    store_lanes(gg + i, q);
    if (acc) {
      store_lanes(acc + i, load_lanes<D8>(acc + i) + widen<C>(dv * h));
      store_lanes(acc + d + i, load_lanes<D8>(acc + d + i) + widen<C>(dv));
    }
    a1 += widen<C>(q);
    a2 += widen<C>(q * h);
  }
  double m1 = lane_sum(a1), m2 = lane_sum(a2);
  for (; i < d; ++i) {
    xh[i] = (x[i] - m) * rs;
    gg[i] = dy[i] * g[i];
    if (acc) {
      acc[i] += static_cast<double>(dy[i] * xh[i]);
      acc[d + i] += static_cast<double>(dy[i]);
    }
    m1 += static_cast<double>(gg[i]);
    m2 += static_cast<double>(gg[i] * xh[i]);
  }
  if (!dx) return;
  const C a = static_cast<C>(m1 / static_cast<double>(d)), c2 = static_cast<C>(m2 / static_cast<double>(d));
  for (i = 0; i < d; ++i) dx[i] = rs * (gg[i] - a - xh[i] * c2);
}

template <class C>
void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& mean,
             Tensor& rstd) {
  const std::int64_t d = x.shape().back(), rows = x.numel() / std::max<std::int64_t>(d, 1);
  const auto g = values_of<C>(gamma, d, C(1)), bt = values_of<C>(beta, d, C(0));
  std::vector<double> means(rows), rstds(rows);
  parallel_for(rows, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(d, 1)), [&](std::int64_t b, std::int64_t e) {
    std::vector<C> sx(d), sy(d);
    for (std::int64_t r = b; r < e; ++r) {
      const C* px = load<C>(x, r * d, d, sx.data());
      C* py = store_target<C>(y, r * d, sy.data());
      isa_call<forward_row<C>>(px, g.data(), bt.data(), eps, d, py, means[r], rstds[r]);
      store<C>(y, r * d, d, py);
    }
  });
  write_values(means, mean);
  write_values(rstds, rstd);
}

template <class C>
void backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd, const Tensor& gamma,
              Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const std::int64_t d = x.shape().back(), rows = x.numel() / std::max<std::int64_t>(d, 1);
  const auto g = values_of<C>(gamma, d, C(1));
  const auto m = values_of<C>(mean, rows, C(0)), rs = values_of<C>(rstd, rows, C(1));
  const int chunks = row_chunks(rows, d);
  const bool params = dgamma.defined() || dbeta.defined();
  std::vector<double> part(params ? static_cast<std::size_t>(chunks) * 2 * d : 0, 0.0);  // sum(dy*xhat), sum(dy)
  for_row_chunks(chunks, rows, [&](int t, std::int64_t b, std::int64_t e) {
    std::vector<C> sx(d), sd(d), so(d), xh(d), gg(d);
    double* acc = params ? part.data() + static_cast<std::size_t>(t) * 2 * d : nullptr;
    for (std::int64_t r = b; r < e; ++r) {
      const C* px = load<C>(x, r * d, d, sx.data());
      const C* pd = load<C>(dy, r * d, d, sd.data());
      C* po = dx.defined() ? store_target<C>(dx, r * d, so.data()) : nullptr;
      isa_call<backward_row<C>>(px, pd, m[r], rs[r], g.data(), d, xh.data(), gg.data(), acc, po);
      if (po) store<C>(dx, r * d, d, po);
    }
  });
  if (!params) return;
  for (int t = 1; t < chunks; ++t)
    for (std::int64_t i = 0; i < 2 * d; ++i) part[i] += part[static_cast<std::size_t>(t) * 2 * d + i];
  write_values(std::vector<double>(part.begin(), part.begin() + d), dgamma);
  write_values(std::vector<double>(part.begin() + d, part.begin() + 2 * d), dbeta);
}

}  // namespace

void CpuBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y,
                            Tensor& mean, Tensor& rstd) {
  if (x.numel() == 0) return;
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    if constexpr (std::is_floating_point_v<C>) forward<C>(x, gamma, beta, eps, y, mean, rstd);
  });
}

void CpuBackend::layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  if (x.numel() == 0) {
    if (dgamma.defined()) fill(dgamma, 0.0);
    if (dbeta.defined()) fill(dbeta, 0.0);
    return;
  }
  with_compute_type(x.dtype(), [&](auto c) {
    using C = decltype(c);
    if constexpr (std::is_floating_point_v<C>) backward<C>(x, dy, mean, rstd, gamma, dx, dgamma, dbeta);
  });
}

}  // namespace mpt::cpu
